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


class Certified(Metadata):
    """A call over a TLS connection whose client certificate names ``cn``."""

    def __init__(self, cn: str, *pairs) -> None:
        super().__init__(*pairs)
        self.cn = cn

    def auth_context(self):
        return {"x509_common_name": [self.cn.encode()]}


def test_a_forwarded_call_acts_as_the_client_the_follower_names_only_beside_the_writers_secret():
    """With --client-cert-auth, a call a follower hands on arrives over the follower's own
    connection (here its certificate names root): the caller is the client the follower names,
    or nobody; a call marked forwarded without this writer's secret (a follower of an earlier
    writer at this address, or anyone claiming to be a follower) is refused as not the writer's.
    Over a connection without a certificate no claim is believed (the secret travels over TLS only)."""
    from shards.errors import NotTheWriterError
    from shim.access import FORWARDED_CALLER, FORWARDED_METADATA_MARK, FORWARDED_SECRET, Access

    access = Access(auth=None, leases=None, cert_users=True, forward_secret="s3cret")
    mark, alice = FORWARDED_METADATA_MARK, (FORWARDED_CALLER, "alice")
    assert access.caller(Certified("root")) == "root"  # a client's own connection
    assert access.caller(Certified("root", alice, mark, (FORWARDED_SECRET, "s3cret"))) == "alice"
    assert access.caller(Certified("root", mark, (FORWARDED_SECRET, "s3cret"))) is None  # a client without a certificate
    for forged in ((alice, mark), (alice, mark, (FORWARDED_SECRET, "guess")), (mark, (FORWARDED_SECRET, ""))):
        with pytest.raises(NotTheWriterError):
            access.caller(Certified("root", *forged))
    # over a connection without a client certificate (plaintext), a claim names no one
    assert access.caller(Metadata(alice, mark, (FORWARDED_SECRET, "s3cret"))) is None
    # without a secret of its own (never the writer), nothing forwarded is believed
    with pytest.raises(NotTheWriterError):
        Access(auth=None, leases=None, cert_users=True).caller(Certified("root", alice, mark, (FORWARDED_SECRET, "")))
    # without --client-cert-auth a certificate names no one, forwarded or not
    assert Access(auth=None, leases=None).caller(Certified("root", alice, mark)) is None


def test_a_forged_forwarded_call_is_answered_as_a_member_that_is_not_the_writer(tmp_path):
    """What a follower's call with a stale secret gets from the writer's services: UNAVAILABLE
    "shardetcd: not the writer", the answer on which a follower looks the writer up again and
    sends the call once more (WriterLink.unary); with the writer's secret, the claimed client's
    permissions decide."""
    from shim.access import FORWARDED_CALLER, FORWARDED_METADATA_MARK, FORWARDED_SECRET
    from shim.errors import NOT_THE_WRITER

    async def go():
        store = await open_store(tmp_path, bcrypt_cost=4)
        try:
            m = Member(store, ServerConfig(client_cert_auth=True))
            kv, auth = KVService(m), AuthService(m)
            await auth.UserAdd(pb.AuthUserAddRequest(name="root", password="pw"), Metadata())
            await auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), Metadata())
            await auth.UserAdd(pb.AuthUserAddRequest(name="alice", password="pw"), Metadata())
            await auth.AuthEnable(pb.AuthEnableRequest(), Metadata())
            claim = (FORWARDED_METADATA_MARK, (FORWARDED_CALLER, "alice"))
            await kv.Put(pb.PutRequest(key=b"k", value=b"v"), Certified("root"))  # root's own connection
            with pytest.raises(Aborted) as refused:
                await kv.Put(pb.PutRequest(key=b"k", value=b"v"), Certified("root", *claim, (FORWARDED_SECRET, "old")))
            assert refused.value.args == (grpc.StatusCode.UNAVAILABLE, NOT_THE_WRITER)
            with pytest.raises(Aborted, match="permission denied"):
                await kv.Put(pb.PutRequest(key=b"k", value=b"v"),
                             Certified("root", *claim, (FORWARDED_SECRET, m.forward_secret)))
        finally:
            await store.close()

    asyncio.run(go())
