"""A follower applies a write of many changes in steps, serving between them.

A DeleteRange or a lease revoke of thousands of keys is one revision: applied at once, a
follower held its event loop for the whole of it (0.9 s for 100,000 keys, its reads waiting),
where the writer deletes in slices. Now its record is decoded and applied a few hundred changes
at a time; reads between the steps see the revision before it whole, and none sees part of it.
"""
from __future__ import annotations

import asyncio

import pytest

from proto.kv_pb2 import KeyValue
from shards import follow
from shards.record import DELETE
from shards.store import Store
from shards.types import DeleteReq, PutReq, RangeReq, TxnReq
from shards.watch import WatchSpec
from tests.shards.store_helpers import count_under as count, following, open_store
from tests.shards.test_takeover import config
from tests.shards.test_watch import drain, events_of

PODS, CMS = b"/registry/pods/ns/p%05d", b"/registry/configmaps/ns/c%05d"
KEYS = 1500  # per prefix: each shard's part of the delete is a record of ~100 KB, past BIG_WRITE_BYTES
PADDING = b"-" * 40


async def write_keys(writer: Store) -> None:
    for i in range(0, KEYS, 100):
        await writer.txn(TxnReq(success=tuple(PutReq(key % j + PADDING, b"v") for key in (PODS, CMS)
                                              for j in range(i, i + 100))))


def test_a_write_of_many_changes_on_two_shards_is_applied_in_steps_and_read_whole_or_not_at_all(tmp_path):
    async def go():
        writer = await open_store(tmp_path / "w")
        await write_keys(writer)
        async with following(tmp_path / "f", writer, slice_ms=0.5) as follower:
            await asyncio.wait_for(follower.wait_committed(writer.committed), 10)
            before = follower.committed
            stream = follower.hub.open_stream()
            stream.create(WatchSpec(b"/registry/", b"/registry0"))
            seen = []  # (committed, pods, configmaps, a revision half applied) at each turn of the loop
            deleted = asyncio.ensure_future(writer.txn(TxnReq(success=(
                DeleteReq(b"/registry/pods/", b"/registry/pods0"),
                DeleteReq(b"/registry/configmaps/", b"/registry/configmaps0")))))
            async with asyncio.timeout(30):
                while not deleted.done() or follower.committed < writer.committed or follower.hub._queue:
                    seen.append((follower.committed, count(follower, PODS), count(follower, CMS),
                                 follower.follower._applying is not None))
                    await asyncio.sleep(0)
            rev = (await deleted).revision
            assert rev == before + 1 and follower.committed == rev
            assert {(c, p, m) for c, p, m, _ in seen} <= {(before, KEYS, KEYS), (rev, 0, 0)}
            halfway = [s for s in seen if s[3]]
            assert len(halfway) > 3, "the loop must have run between the steps of the delete"
            assert all(s[:3] == (before, KEYS, KEYS) for s in halfway)
            assert (count(follower, PODS), count(follower, CMS)) == (0, 0)
            events = events_of(drain(stream))
            assert [(r, kind) for r, kind, _, _ in events] == [(rev, DELETE)] * (2 * KEYS)
            assert sorted(key for _, _, key, _ in events) == sorted(key % i + PADDING for key in (PODS, CMS)
                                                                     for i in range(KEYS))
            await writer.put(PutReq(PODS % 0, b"after"))  # and it goes on following
            await asyncio.wait_for(follower.wait_committed(writer.committed), 10)
            assert [KeyValue.FromString(kv).value for kv in follower.range(RangeReq(PODS % 0)).kvs] == [b"after"]

    asyncio.run(go())


def test_a_standby_taking_over_halfway_through_a_write_applies_the_rest_first(nats, tmp_path, monkeypatch):
    monkeypatch.setattr(follow, "STEP_CHANGES", 16)

    async def go():
        writer = await Store.open(config(tmp_path / "w", nats))
        standby = await Store.open(config(tmp_path / "s", nats, slice_ms=0.2), follow=True)
        try:
            await write_keys(writer)
            following = asyncio.ensure_future(standby.follow_journals())
            await asyncio.wait_for(standby.wait_committed(writer.committed), 30)
            rev = (await writer.delete_range(DeleteReq(b"/registry/pods/", b"/registry/pods0"))).revision
            async with asyncio.timeout(30):
                while standby.follower._applying is None:
                    await asyncio.sleep(0)
            following.cancel()  # as a standby taking over stops following
            await asyncio.gather(following, return_exceptions=True)
            assert standby.committed == rev - 1 and count(standby, PODS) == KEYS
            assert await asyncio.wait_for(standby.take_over(), 60) == rev
            assert (count(standby, PODS), count(standby, CMS)) == (0, KEYS)
            assert (await standby.put(PutReq(PODS % 0, b"new writer"))).revision == rev + 1
        finally:
            await standby.close()
            await writer.close()

    asyncio.run(go())


@pytest.mark.parametrize("step", [1, 7, 1000])
def test_a_write_record_decoded_in_steps_is_the_record_decoded_at_once(step):
    from shards.record import PUT, Change, decode_write, encode_write, write_changes_in_steps

    changes = [Change(PUT if i % 3 else DELETE, i, b"k%d" % i, b"row%d" % i * (i % 5)) for i in range(50)]
    payload = encode_write((0, 3), changes)
    steps = list(write_changes_in_steps(payload, step))
    assert all(len(s) == step for s in steps[:-1]) and 0 < len(steps[-1]) <= step
    assert [c for s in steps for c in s] == decode_write(payload)[1] == changes
    with pytest.raises(ValueError):
        list(write_changes_in_steps(payload + b"x", step))
