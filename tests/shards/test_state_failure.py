"""A state-store (RocksDB) error is fail-stop (DESIGN.md invariant 7).

Before this, a put whose RocksDB write failed stayed half-applied in the
in-memory index and its revision was reused: lists returned a key twice,
counts were off, the key could never be written again, and /health said
true.  Now nothing half-applied is visible: the store refuses reads and
writes from the first error on, /health says false, and a reopened store
(the process exits and restarts) serves every acknowledged write and
nothing of the failed one.
"""
from __future__ import annotations

import pytest

from journal import failpoints
from shards.errors import StoreFailedError
from shards.types import PutReq, RangeReq, TxnReq
from shim.config import ServerConfig
from shim.context import Member
from shim.http import HttpEndpoint

from .store_helpers import open_store

PODS = b"/registry/pods/default/"
LEASES = b"/registry/leases/kube-node-lease/"


@pytest.fixture(autouse=True)
def _disarm():
    yield
    failpoints.disarm()


def _keys(store, prefix: bytes) -> list[tuple[bytes, int]]:
    r = store.range(RangeReq(prefix, prefix[:-1] + b"0"))
    from proto.kv_pb2 import KeyValue

    return [(kv.key, kv.mod_revision) for kv in map(KeyValue.FromString, r.kvs)]


def test_state_write_error_stops_the_store_with_nothing_half_applied(tmp_path, run):
    async def scenario():
        store = await open_store(tmp_path)
        try:
            acked = [(PODS + b"a", (await store.put(PutReq(PODS + b"a", b"1"))).revision),
                     (LEASES + b"n1", (await store.put(PutReq(LEASES + b"n1", b"1"))).revision)]
            failpoints.arm("state.write", "raise@3")  # the txn's third row write fails
            txn = TxnReq((), tuple(PutReq(k, b"2") for k in (PODS + b"b", LEASES + b"n2", PODS + b"c", PODS + b"a")), ())
            with pytest.raises(StoreFailedError):
                await store.txn(txn)
            failpoints.disarm()
            assert store.failure_source == "state"
            health = HttpEndpoint(Member(store, ServerConfig(data_dir=tmp_path / "data")), None, None).health()
            assert health == (False, "state failure")
            with pytest.raises(StoreFailedError):
                store.range(RangeReq(PODS, b""))  # reads too: the index may not match the rows
            with pytest.raises(StoreFailedError):
                await store.put(PutReq(PODS + b"d", b"1"))
        finally:
            await store.close()
        return acked

    acked = run(scenario())

    async def reopened():
        store = await open_store(tmp_path)
        try:
            got = _keys(store, PODS) + _keys(store, LEASES)
            assert sorted(got) == sorted(acked)
            # the keys of the failed txn take writes again, at the next revision
            r = await store.put(PutReq(PODS + b"b", b"3"))
            assert r.revision == max(rev for _, rev in acked) + 1
        finally:
            await store.close()

    run(reopened())


def test_state_error_in_compaction_stops_the_store(tmp_path, run):
    async def scenario():
        store = await open_store(tmp_path)
        try:
            for i in range(5):
                await store.put(PutReq(PODS + b"k", b"%d" % i))
            failpoints.arm("state.write", "raise")
            with pytest.raises(StoreFailedError):
                await store.compact(store.committed, physical=True)
            assert store.failure_source == "state"
        finally:
            await store.close()

    run(scenario())
