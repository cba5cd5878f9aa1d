"""A write too large for one journal record goes in several.

A DeleteRange or a lease revoke is one revision whatever the number of keys, and its record
holds every deletion: past the journal's record limit (a JetStream message holds a few MiB,
tens of thousands of keys) the append was refused and the store fail-stopped, at every start
again for an expired lease. Its first changes now go in WRITE_PART records and its last in a
WRITE_LAST; every reader joins them again, and parts whose WRITE_LAST never came are cut with it.
"""
from __future__ import annotations

import asyncio

import pytest

from journal import JournalConfig
from shards.record import DELETE, WRITE_LAST, WRITE_PART, Change, decode_write, encode_write, split_write, tombstone_row
from shards.store import Store
from shards.types import DeleteReq, PutReq, TxnReq
from tests.shards.store_helpers import count_under as count, following, open_store
from tests.shards.test_takeover import config

SMALL = JournalConfig(segment_bytes_max=1 << 20, record_bytes_max=20_000)
PODS, EVENTS = b"/registry/pods/ns/p%05d", b"/registry/events/ns/e%05d"
N = 2000


async def fill(store: Store) -> int:
    lease = (await store.lease_grant(0, 3600))[0]
    for i in range(0, N, 100):
        await store.txn(TxnReq(success=tuple(PutReq(PODS % j, b"v" * 20) for j in range(i, i + 100))))
        await store.txn(TxnReq(success=tuple(PutReq(EVENTS % j, b"e" * 20, lease=lease) for j in range(i, i + 100))))
    return lease


def every_pod_deleted(sid: int) -> bytes:
    """The WRITE payload of a deletion of every pod ``fill`` wrote (shard ``sid``): large enough
    to be split into records."""
    return encode_write((sid,), [Change(DELETE, i, PODS % i, tombstone_row(PODS % i)) for i in range(N)])


def types_of(store: Store, rev: int) -> dict[str, list[int]]:
    """The types of the records of revision ``rev`` each journal held when ``store`` opened."""
    return {s.name: [r.rtype for r in s.journal.records(after_rev=0) if r.rev == rev] for s in store.shards}


def test_a_write_too_large_for_one_record_is_journaled_in_parts_and_read_back_whole(tmp_path, run):
    async def go():
        store = await open_store(tmp_path / "w", journal=SMALL)
        lease = await fill(store)
        async with following(tmp_path / "f", store) as follower:
            deleted = await store.delete_range(DeleteReq(b"/registry/pods/", b"/registry/pods0"))
            await store.lease_revoke(lease)
            revoked = store.committed
            assert deleted.deleted == N and store.failure is None
            await asyncio.wait_for(follower.wait_committed(revoked), 10)
            assert (count(follower, PODS), count(follower, EVENTS), follower.committed) == (0, 0, revoked)
            assert (await store.put(PutReq(PODS % 0, b"after"))).revision == revoked + 1
            await asyncio.wait_for(follower.wait_committed(revoked + 1), 10)
            assert count(follower, PODS) == 1
        again = await open_store(tmp_path / "w", journal=SMALL)  # recovered from the journal
        try:
            assert (count(again, PODS), count(again, EVENTS), again.committed) == (1, 0, revoked + 1)
            pods, events = types_of(again, deleted.revision)["pods"], types_of(again, revoked)["events"]
            assert pods[-1] == events[-1] == WRITE_LAST and pods.count(WRITE_PART) >= 3 and events.count(WRITE_PART) >= 3
        finally:
            await again.close()

    run(go())


def test_parts_whose_write_never_came_are_cut_at_the_next_start(tmp_path, run):
    """The writer stopped between a large write's records: its revision was never acknowledged,
    and the next start cuts its parts as it cuts any write that is not whole."""
    async def go():
        store = await open_store(tmp_path, journal=SMALL)
        await fill(store)
        rev = store.committed
        pods = next(s for s in store.shards if s.name == "pods")
        doomed = every_pod_deleted(pods.sid)
        for rtype, payload in split_write(doomed, SMALL.record_bytes_max)[:-1]:  # all but its WRITE_LAST
            pods.journal.append(rtype, rev + 1, payload)
        await pods.journal.sync()
        await store.close()
        again = await open_store(tmp_path, journal=SMALL)
        try:
            assert (again.committed, count(again, PODS)) == (rev, N)
            assert (await again.put(PutReq(PODS % 0, b"after"))).revision == rev + 1
            assert all(r.rtype != WRITE_PART for s in again.shards for r in s.journal.records(after_rev=rev))
        finally:
            await again.close()
        last = await open_store(tmp_path, journal=SMALL)
        try:
            assert (last.committed, count(last, PODS)) == (rev + 1, N)
        finally:
            await last.close()

    run(go())


def test_a_standby_started_between_a_large_writes_records_applies_it_once_its_last_comes(nats, tmp_path):
    """On JetStream each record of a large write can be a message of its own, and a standby (or a
    follower resynchronising) can start after some of them were stored and before its last: it
    keeps those parts, and the last, read as it follows, completes the write. It dropped them,
    and a last alone is no write, so it applied nothing from that revision on (chaos: a follower
    resynchronised while 9 MiB transactions were written took no write for 60 s)."""
    from dataclasses import replace

    one_a_message = JournalConfig(record_bytes_max=20_000, batch_bytes_max=25_000)

    def conf(where):
        c = config(where, nats, journal=one_a_message)
        return replace(c, jetstream=replace(c.jetstream, prefix="partstart"))

    async def go():
        writer = await Store.open(conf(tmp_path / "w"))
        standby = None
        try:
            await fill(writer)
            rev = writer.committed
            pods = next(s for s in writer.shards if s.name == "pods")
            records = split_write(every_pod_deleted(pods.sid), one_a_message.record_bytes_max)
            assert len(records) > 3 and records[-1][0] == WRITE_LAST
            for rtype, payload in records[:-2]:  # stored so far (the writer's own path is not paused here)
                pods.journal.append(rtype, rev + 1, payload)
            await pods.journal.sync()
            standby = await Store.open(conf(tmp_path / "s"), follow=True)
            assert standby.committed == rev
            following_task = asyncio.ensure_future(standby.follow_journals())
            for rtype, payload in records[-2:]:
                pods.journal.append(rtype, rev + 1, payload)
            await pods.journal.sync()
            await asyncio.wait_for(standby.wait_committed(rev + 1), 30)
            assert (standby.committed, count(standby, PODS), count(standby, EVENTS)) == (rev + 1, 0, N)
            following_task.cancel()
            await asyncio.gather(following_task, return_exceptions=True)
        finally:
            if standby is not None:
                await standby.close()
            await writer.close()

    asyncio.run(go())


def test_on_jetstream_a_standby_follows_a_large_write_and_takes_over_with_it(nats, tmp_path):
    async def go():
        writer = await Store.open(config(tmp_path / "w", nats, journal=SMALL))
        standby = await Store.open(config(tmp_path / "s", nats, journal=SMALL), follow=True)
        try:
            await fill(writer)
            following_task = asyncio.ensure_future(standby.follow_journals())
            rev = (await writer.delete_range(DeleteReq(b"/registry/pods/", b"/registry/pods0"))).revision
            await asyncio.wait_for(standby.wait_committed(rev), 30)
            assert count(standby, PODS) == 0
            late = await Store.open(config(tmp_path / "late", nats, journal=SMALL), follow=True)  # reads it at start
            try:
                assert (late.committed, count(late, PODS), count(late, EVENTS)) == (rev, 0, N)
            finally:
                await late.close()
            following_task.cancel()
            await asyncio.gather(following_task, return_exceptions=True)
            assert await asyncio.wait_for(standby.take_over(), 60) == rev
            assert (count(standby, PODS), count(standby, EVENTS)) == (0, N)
            assert (await standby.put(PutReq(PODS % 0, b"new writer"))).revision == rev + 1
        finally:
            await standby.close()
            await writer.close()
        again = await Store.open(config(tmp_path / "s2", nats, journal=SMALL))  # a start reads it back whole
        try:
            assert (again.committed, count(again, PODS), count(again, EVENTS)) == (rev + 1, 1, N)
        finally:
            await again.close()

    asyncio.run(go())


@pytest.mark.parametrize("limit", [40, 200, 5_000])
def test_a_write_payload_split_into_records_joins_back_to_itself(limit):
    import random

    from shards.record import PUT, join_write

    rng = random.Random(limit)
    changes = [Change(rng.choice((PUT, DELETE)), i, b"k" * rng.randint(1, 30), b"v" * rng.randint(0, 90))
               for i in range(300)]
    payload = encode_write((0, 2, 4), changes)
    records = split_write(payload, limit)
    assert [t for t, _ in records] == [WRITE_PART] * (len(records) - 1) + [WRITE_LAST] and len(records) > 1
    assert all(len(p) <= limit for _, p in records if len(p) > 4 + 13 + 30 + 90)  # one change alone may be more
    assert decode_write(records[-1][1])[0] == (0, 2, 4)
    assert join_write([p for _, p in records[:-1]], records[-1][1]) == payload


def test_the_last_record_of_a_write_without_its_parts_is_no_write():
    """Read without the parts before it (never written, or not read), a WRITE_LAST is not taken
    for the whole write; a WRITE is what it is, and parts of another write are dropped."""
    from shards.record import WRITE, PUT, WriteParts

    payload = encode_write((1,), [Change(PUT, i, b"k%d" % i, b"v" * 50) for i in range(40)])
    records = split_write(payload, 500)
    joined = WriteParts()
    assert joined.whole(WRITE_LAST, 9, 3, records[-1][1]) is None
    for rtype, part in records[:-1]:
        joined.part(9, 3, part)
    assert joined.whole(WRITE_LAST, 9, 4, records[-1][1]) is None  # another writer's last
    for rtype, part in records[:-1]:
        joined.part(9, 3, part)
    assert joined.whole(WRITE, 10, 3, b"plain") == b"plain"
    assert joined.whole(WRITE_LAST, 9, 3, records[-1][1]) is None  # its parts were dropped
    for rtype, part in records[:-1]:
        joined.part(9, 3, part)
    assert joined.whole(WRITE_LAST, 9, 3, records[-1][1]) == payload
    assert split_write(encode_write((1,), [Change(PUT, 0, b"k", b"v" * 600)]), 500)[0][0] == WRITE  # one change
