"""Requests whose work is bounded run at once, not as steps: a txn whose every compare and op
names one key (``WriteTxn.txn_now``) and a range of one key (``range_key``).  Both ways must
agree exactly: the result or the error, etcd's metric counts, the rows and the revision.
Hypothesis drives the same random requests both ways after the same random history (a txn into
two stores, one through ``Store.txn`` and one through the steps, ``Store._run``)."""
from __future__ import annotations

import asyncio

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from shards.read import range_at, range_key, range_steps
from shards.steps import drain
from shards import types as t
from shards.types import Compare, DeleteReq, PutReq, RangeReq, TxnReq
from shards.write import WriteTxn, single_key_writes
from tests.shards.store_helpers import open_store

KEYS = [b"/registry/pods/a", b"/registry/pods/b", b"/registry/leases/a", b"other"]
LEASE = 7  # granted; lease 8 is not
keys = st.sampled_from(KEYS)
numbers = st.integers(min_value=0, max_value=12)
compares = st.builds(
    Compare,
    st.sampled_from([t.CMP_VERSION, t.CMP_CREATE, t.CMP_MOD, t.CMP_VALUE, t.CMP_LEASE]),
    st.sampled_from([t.RESULT_EQUAL, t.RESULT_NOT_EQUAL, t.RESULT_GREATER, t.RESULT_LESS]),
    keys,
    st.just(b""),
    st.sampled_from([b"", b"v1", b"v2"]),
    numbers,
)
puts = st.builds(PutReq, keys, st.sampled_from([b"", b"v1", b"v2"]), st.sampled_from([0, LEASE, 8]), st.booleans(),
                 st.booleans(), st.booleans())
ranges = st.builds(RangeReq, keys, st.just(b""), st.integers(0, 2), st.integers(0, 8), keys_only=st.booleans(),
                   count_only=st.booleans())
full_ranges = st.builds(RangeReq, keys, st.just(b""), st.integers(0, 2), st.integers(0, 40), st.integers(0, 2),
                        st.integers(0, 5), st.booleans(), st.booleans(), numbers, numbers, numbers, numbers)
deletes = st.builds(DeleteReq, keys, st.just(b""), st.booleans())
ops = st.one_of(puts, ranges, deletes)
txns = st.builds(TxnReq, st.lists(compares, max_size=3).map(tuple), st.lists(ops, max_size=3).map(tuple),
                 st.lists(ops, max_size=3).map(tuple))


async def _by_steps(store, req: TxnReq):
    w = WriteTxn(store)
    return await store._run(w, w.txn_steps(req))


async def _outcome(call):
    try:
        return await call
    except Exception as exc:  # noqa: BLE001 - the error's kind is what is compared
        return type(exc).__name__


def _counts(store) -> dict:
    """etcd's request counts (not the compaction's: it runs in the background, and is timed)."""
    c = store.counts
    return {name: getattr(c, name) for name in type(c).__slots__ if name not in ("rows_compacted", "compacted_at")}


def _everything(store) -> list[bytes]:
    return range_at(store, RangeReq(b"\x00", b"\x00"), store.committed).kvs


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two stores that are given the same requests; the first takes its txns at once, the second
    by steps.  Shared by every example: they must agree whatever came before."""
    tmp = tmp_path_factory.mktemp("txn-now")
    loop = asyncio.new_event_loop()
    now, steps = loop.run_until_complete(open_store(tmp / "now")), loop.run_until_complete(open_store(tmp / "steps"))
    for store in (now, steps):
        loop.run_until_complete(store.lease_grant(LEASE, 600))
    yield loop, now, steps
    for store in (now, steps):
        loop.run_until_complete(store.close())
    loop.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(history=st.lists(st.one_of(puts, deletes), max_size=4), batch=st.lists(txns, min_size=1, max_size=4))
def test_a_single_key_txn_at_once_agrees_with_its_steps(pair, history, batch):
    loop, now, steps = pair
    loop.run_until_complete(_compare(now, steps, history, batch))


async def _compare(now, steps, history, batch) -> None:
    for store in (now, steps):
        for req in history:
            await _outcome(store.put(PutReq(req.key, req.value)) if isinstance(req, PutReq) else store.delete_range(req))
        await _outcome(store.compact(max(store.committed - 3, 1)))
    for req in batch:
        assert single_key_writes(req) is not None
        a = await _outcome(now.txn(req))
        b = await _outcome(_by_steps(steps, req))
        assert a == b, req
        assert _counts(now) == _counts(steps), req
        assert (now.rev, now.committed, now.compact_rev) == (steps.rev, steps.committed, steps.compact_rev)
    assert _everything(now) == _everything(steps)


def test_a_txn_over_a_range_or_nested_takes_the_steps():
    put = PutReq(b"a", b"v")
    assert single_key_writes(TxnReq((), (put,), (RangeReq(b"a"),))) is True
    assert single_key_writes(TxnReq((), (RangeReq(b"a"),), (RangeReq(b"b"),))) is False
    assert single_key_writes(TxnReq((), (None,), ())) is True  # etcd: anything but a Range writes
    assert single_key_writes(TxnReq((Compare(t.CMP_MOD, t.RESULT_EQUAL, b"a", b"b"),), (put,), ())) is None
    assert single_key_writes(TxnReq((), (RangeReq(b"a", b"b"),), ())) is None
    assert single_key_writes(TxnReq((), (), (DeleteReq(b"a", b"\x00"),))) is None
    assert single_key_writes(TxnReq((), (TxnReq(),), ())) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(history=st.lists(st.one_of(puts, deletes), max_size=4), reads=st.lists(full_ranges, min_size=1, max_size=8))
def test_a_range_of_one_key_at_once_agrees_with_its_steps(pair, history, reads):
    loop, store, other = pair
    for each in (store, other):  # the pair stays alike for the txn test
        for req in history:
            loop.run_until_complete(_outcome(each.put(req) if isinstance(req, PutReq) else each.delete_range(req)))
        loop.run_until_complete(_outcome(each.compact(max(each.committed - 5, 1))))
    for req in reads:
        for current in (store.committed, store.committed - 1):
            assert _result(lambda: range_key(store, req, current)) == _result(
                lambda: drain(range_steps(store, req, current))), req


def _result(read):
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - the error's kind is what is compared
        return type(exc).__name__
