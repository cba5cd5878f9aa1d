"""Writes that arrived together (``Store.put_many``, ``Store.txn_many``: the native gRPC server's
batches, shim.handlers.batched) must do exactly what the same writes do one by one: the same
result or error for each, the same revisions, etcd's counts, rows, and events. Hypothesis drives a
random batch into one store whole and into a twin one write at a time, after the same random
history, and compares; the twin's order is the batch's (txn_many runs the txns on one key each
first, then the others), which is all a batch may change."""
from __future__ import annotations

import asyncio

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from shards.errors import RequestTimeoutError, StoreFailedError
from shards import types as t
from shards.types import Compare, DeleteReq, PutReq, RangeReq, TxnReq
from shards.watch import WatchSpec
from shards.write import single_key_writes
from tests.shards.store_helpers import open_store
from tests.shards.test_at_once import LEASE, _counts, _everything, _outcome, compares, deletes, keys, ops, puts

# txns on one key each (at once in a batch) and txns over a range (by steps, beside them)
wide = st.one_of(st.builds(DeleteReq, keys, st.just(b"\x00"), st.booleans()),
                 st.builds(RangeReq, keys, st.just(b"\x00")))
txns = st.builds(TxnReq, st.lists(compares, max_size=2).map(tuple), st.lists(st.one_of(ops, wide), max_size=3).map(tuple),
                 st.lists(ops, max_size=2).map(tuple))
SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two stores given the same requests, the first in batches, the second one by one, each
    with a watch on everything: shared by every example, so they must agree whatever came before."""
    tmp = tmp_path_factory.mktemp("many")
    loop = asyncio.new_event_loop()
    stores = [loop.run_until_complete(open_store(tmp / name)) for name in ("batched", "alone")]
    watches = []
    for store in stores:
        loop.run_until_complete(store.lease_grant(LEASE, 600))
        stream = store.hub.open_stream()
        stream.create(WatchSpec(b"\x00", b"\x00", prev_kv=True))
        watches.append(stream)
    yield loop, stores, watches
    for store in stores:
        loop.run_until_complete(store.close())
    loop.close()


def _events(stream) -> list:
    """The events sent since the last call (not how they were grouped into messages, nor those
    messages' header revisions: writes committed together are sent together, batched or not)."""
    out = []
    while stream.outbox:
        out.extend((e.kind, e.kv, e.prev_kv) for e in stream.outbox.popleft().events)
    stream.outbox_events = 0
    return out


async def _history(stores, history) -> None:
    for store in stores:
        for req in history:
            await _outcome(store.put(PutReq(req.key, req.value)) if isinstance(req, PutReq) else store.delete_range(req))
        await _outcome(store.compact(max(store.committed - 3, 1)))


def _named(results: list) -> list:
    return [type(r).__name__ if isinstance(r, Exception) else r for r in results]


def _agree(stores, watches) -> None:
    batched, alone = stores
    assert _counts(batched) == _counts(alone)
    assert (batched.rev, batched.committed) == (alone.rev, alone.committed)
    assert _everything(batched) == _everything(alone)
    assert _events(watches[0]) == _events(watches[1])


@SETTINGS
@given(history=st.lists(st.one_of(puts, deletes), max_size=4), batch=st.lists(puts, min_size=1, max_size=6))
def test_puts_in_a_batch_do_what_they_do_one_by_one(pair, history, batch):
    loop, stores, watches = pair

    async def run() -> None:
        await _history(stores, history)
        many = await stores[0].put_many(batch)
        alone = [await _outcome(stores[1].put(req)) for req in batch]
        assert _named(many) == alone, batch
        _agree(stores, watches)

    loop.run_until_complete(run())


@SETTINGS
@given(history=st.lists(st.one_of(puts, deletes), max_size=4), batch=st.lists(txns, min_size=1, max_size=6))
def test_txns_in_a_batch_do_what_they_do_one_by_one(pair, history, batch):
    loop, stores, watches = pair

    async def run() -> None:
        await _history(stores, history)
        many = await stores[0].txn_many(batch)
        order = sorted(range(len(batch)), key=lambda i: single_key_writes(batch[i]) is None)  # at once first
        alone = {i: await _outcome(stores[1].txn(batch[i])) for i in order}
        assert _named(many) == [alone[i] for i in range(len(batch))], batch
        _agree(stores, watches)

    loop.run_until_complete(run())


def test_a_batch_takes_one_revision_per_write_and_none_for_a_refused_one(tmp_path):
    """Three puts, the second on a lease that does not exist: the first and the third get
    revisions one apart, the second its error, and every answer waits for the last commit."""
    async def run() -> None:
        store = await open_store(tmp_path)
        try:
            before = store.rev
            first, refused, third = await store.put_many(
                [PutReq(b"a", b"1"), PutReq(b"b", b"2", lease=99), PutReq(b"c", b"3")])
            assert (first.revision, third.revision) == (before + 1, before + 2)
            assert type(refused).__name__ == "LeaseNotFoundError"
            assert store.committed == before + 2
        finally:
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("failure", ["timed out", "store failed"])
def test_an_error_of_the_store_is_every_writes_error(tmp_path, failure):
    """When the wait for the commit fails, no write of the batch is answered as done."""
    async def run() -> None:
        store = await open_store(tmp_path)
        try:
            error = RequestTimeoutError() if failure == "timed out" else StoreFailedError("gone")

            def failing(rev):
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(error)
                return fut

            store.wait_committed = failing
            with pytest.raises(type(error)):
                await store.put_many([PutReq(b"a", b"1"), PutReq(b"b", b"2")])
            with pytest.raises(type(error)):
                await store.txn_many([TxnReq((), (PutReq(b"a", b"1"),), ())])
        finally:
            del store.wait_committed
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("read_only", [True, False], ids=["a txn only read", "every txn wrote"])
def test_a_batch_with_a_txn_that_only_read_waits_for_the_read_guard(tmp_path, read_only):
    """A txn that only read (its compare failed, no put on its path) is a linearizable read: a writer
    whose lease is unsure answers it only once the lease is confirmed (Store.read_guard), and so
    the batch it is in; a batch that only wrote does not ask."""
    async def run() -> None:
        store = await open_store(tmp_path)
        try:
            confirmed = asyncio.get_running_loop().create_future()
            asked = []
            store.read_guard = lambda: asked.append(1) or confirmed
            compare = Compare(t.CMP_VERSION, t.RESULT_EQUAL, b"a", b"", 7)  # fails: "a" has no version 7
            txns = [TxnReq((), (PutReq(b"a", b"1"),), ()), TxnReq((compare,), (PutReq(b"a", b"2"),),
                                                                    () if read_only else (PutReq(b"b", b"3"),))]
            batch = asyncio.ensure_future(store.txn_many(txns))
            if read_only:
                for _ in range(20):
                    await asyncio.sleep(0.01)
                assert not batch.done() and asked == [1]
            else:  # done without the guard, however long the machine takes to write it
                await asyncio.wait_for(asyncio.shield(batch), 60)
                assert not asked
            confirmed.set_result(None)
            wrote, failed = await batch
            assert wrote.succeeded and not failed.succeeded
        finally:
            store.read_guard = None
            await store.close()

    asyncio.run(run())
