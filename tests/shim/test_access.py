"""While auth is off a request costs one flag check: no service reads its metadata."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from proto import rpc_pb2 as pb
from shim.auth import AuthService
from shim.config import ServerConfig
from shim.context import Member
from shim.kv import KVService
from shim.lease_auth import CheckedLeaseService
from shim.maintenance import MaintenanceService
from tests.shards.store_helpers import open_store


class Aborted(Exception):
    pass


class NoMetadata:
    """A servicer context that fails the test if anyone reads the request's metadata."""

    def invocation_metadata(self):
        raise AssertionError("metadata read while auth is off")

    async def abort(self, code: grpc.StatusCode, details: str):
        raise Aborted(code, details)


class Metadata(NoMetadata):
    def __init__(self, *pairs) -> None:
        self.pairs = pairs

    def invocation_metadata(self):
        return self.pairs


def test_no_metadata_is_read_while_auth_is_off(tmp_path):
    async def go():
        store = await open_store(tmp_path, bcrypt_cost=4)
        try:
            m = Member(store, ServerConfig())
            kv, lease, mt, auth = KVService(m), CheckedLeaseService(m), MaintenanceService(m), AuthService(m)
            ctx = NoMetadata()
            await kv.Put(pb.PutRequest(key=b"k", value=b"v"), ctx)
            await kv.Range(pb.RangeRequest(key=b"k"), ctx)
            await kv.Txn(pb.TxnRequest(compare=[pb.Compare(key=b"k")]), ctx)
            await kv.DeleteRange(pb.DeleteRangeRequest(key=b"k"), ctx)
            await kv.Compact(pb.CompactionRequest(revision=1), ctx)
            granted = await lease.LeaseGrant(pb.LeaseGrantRequest(TTL=60), ctx)
            await lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=granted.ID, keys=True), ctx)
            await lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=granted.ID), ctx)
            await mt.Hash(pb.HashRequest(), ctx)
            await mt.Alarm(pb.AlarmRequest(), ctx)
            await auth.UserAdd(pb.AuthUserAddRequest(name="root", password="pw"), ctx)
            await auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), ctx)
            await auth.AuthEnable(pb.AuthEnableRequest(), ctx)

            # now on: the same calls read the token, and refuse a caller without one
            assert m.auth.enabled
            with pytest.raises(Aborted, match="user name is empty"):
                await kv.Range(pb.RangeRequest(key=b"k"), Metadata())
            token = (await auth.Authenticate(pb.AuthenticateRequest(name="root", password="pw"), Metadata())).token
            await kv.Range(pb.RangeRequest(key=b"k"), Metadata(("token", token)))
            with pytest.raises(Aborted, match="invalid auth token"):
                await kv.Compact(pb.CompactionRequest(revision=2), Metadata(("token", "nosuchtoken.9")))
        finally:
            await store.close()

    asyncio.run(go())
