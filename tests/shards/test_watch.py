"""WatchHub in-process: order, catch-up without gap or duplicate, bounded outboxes."""
from __future__ import annotations

import asyncio
import random

from proto.kv_pb2 import KeyValue
from shards.record import DELETE, PUT
from shards.types import DeleteReq, PutReq, TxnReq
from shards.watch import PROGRESS_WATCH_ID, WatchSpec
from tests.shards.store_helpers import open_store

PODS, LEASES = b"/registry/pods/", b"/registry/leases/"


def drain(stream):
    msgs = []
    while stream.outbox:
        msgs.append(stream.outbox.popleft())
    stream.outbox_events = stream.outbox_bytes = 0
    stream._drained.set()
    return msgs


def events_of(msgs, wid=None):
    return [
        (KeyValue.FromString(e.kv).mod_revision, e.kind, KeyValue.FromString(e.kv).key, e.prev_kv)
        for m in msgs
        if wid is None or m.watch_id == wid
        for e in m.events
    ]


def test_live_events_across_shards_in_revision_order(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        stream = store.hub.open_stream()
        stream.create(WatchSpec(b"/registry/", b"/registry0", prev_kv=True))
        await store.put(PutReq(PODS + b"a", b"1"))
        await store.txn(TxnReq(success=(PutReq(LEASES + b"l", b"x"), PutReq(PODS + b"a", b"2"))))
        await store.delete_range(DeleteReq(PODS, b"/registry/pods0"))
        msgs = drain(stream)
        assert msgs[0].created and msgs[0].revision == 1
        evs = events_of(msgs[1:])
        assert [(r, k, key) for r, k, key, _ in evs] == [
            (2, PUT, PODS + b"a"), (3, PUT, LEASES + b"l"), (3, PUT, PODS + b"a"), (4, DELETE, PODS + b"a"),
        ]
        assert evs[0][3] is None and KeyValue.FromString(evs[2][3]).value == b"1"
        assert KeyValue.FromString(evs[3][3]).value == b"2"
        # the txn's two events are in one response
        assert [len(m.events) for m in msgs[1:]] == [1, 2, 1]
        await store.close()

    run(go())


def test_history_then_live_no_gap_no_duplicate(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        store.hub.catchup_revs_max = 7  # many small catch-up batches
        for i in range(60):
            await store.put(PutReq(PODS + b"k%d" % (i % 5), b"%d" % i))
        stream = store.hub.open_stream()
        stream.create(WatchSpec(PODS, b"/registry/pods0", start_revision=2))
        stream.create(WatchSpec(PODS + b"k3", start_revision=30, watch_id=9))
        writer = asyncio.ensure_future(asyncio.gather(*(store.put(PutReq(PODS + b"k%d" % i, b"live")) for i in range(40))))
        msgs = []
        while not writer.done() or stream.unsynced or stream.outbox:
            msgs += drain(stream)
            await asyncio.sleep(0)
        await writer
        msgs += drain(stream)
        revs = [r for r, *_ in events_of(msgs, 0)]
        assert revs == list(range(2, store.committed + 1))
        k3 = [r for r, *_ in events_of(msgs, 9)]
        assert k3 == [r for r in range(30, 62) if (r - 2) % 5 == 3] + [65]
        await store.close()

    run(go())


def test_slow_reader_is_bounded_and_catches_up(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        store.hub.outbox_events_max = 50
        slow = store.hub.open_stream()
        fast = store.hub.open_stream()
        slow.create(WatchSpec(b"\x00", b"\x00"))
        fast.create(WatchSpec(b"\x00", b"\x00"))
        rng = random.Random(1)
        got_fast = []
        peak = 0
        for i in range(600):
            key = rng.choice([PODS, LEASES, b"/other/"]) + b"%d" % rng.randrange(30)
            await store.put(PutReq(key, b"v"))
            got_fast += drain(fast)
            peak = max(peak, slow.outbox_events)
        assert peak <= 50, "a slow reader's outbox must stay bounded"
        assert slow.unsynced, "the slow watcher must have fallen behind"
        got_slow = []
        while slow.unsynced or slow.outbox:
            got_slow += drain(slow)
            await asyncio.sleep(0)
        want = list(range(2, store.committed + 1))
        assert [r for r, *_ in events_of(got_slow)] == want
        assert [r for r, *_ in events_of(got_fast)] == want
        await store.close()

    run(go())


def test_a_reader_taking_messages_one_by_one_lets_a_fallen_behind_watcher_catch_up(tmp_path, run):
    """The gRPC layer reads a stream through get(), one message at a time: a watcher that fell
    behind while nobody read is caught up once get() has taken the outbox down, and a reader
    waiting on an empty outbox wakes for the next message."""
    async def go():
        store = await open_store(tmp_path)
        store.hub.outbox_events_max = 20
        stream = store.hub.open_stream()
        stream.create(WatchSpec(b"k", b"l"))
        for i in range(200):
            await store.put(PutReq(b"k%d" % i, b"v"))
        assert stream.unsynced  # nobody read: it fell behind
        got = []
        want = list(range(2, store.committed + 1))
        async with asyncio.timeout(10):
            while [r for r, *_ in events_of(got)] != want:
                got.append(await stream.get())
            waiting = asyncio.ensure_future(stream.get())  # the outbox is empty now
            await asyncio.sleep(0.01)
            assert not waiting.done()
            await store.put(PutReq(b"k", b"last"))
            last = await waiting
        assert not stream.unsynced and [r for r, *_ in events_of([last])] == [store.committed]
        await store.close()

    run(go())


def test_a_stream_not_read_holds_a_bounded_number_of_bytes_and_catches_up_in_bounded_batches(tmp_path, run):
    """Large values: a stream nobody reads holds at most its byte bound (past it by one
    message), its watchers fall behind, and catching up from the store reads batches of whole
    revisions bounded the same way: a one-key watcher, a range watcher with prev_kv over a txn
    of two keys a revision, and a watcher from a past revision, all without gap or duplicate."""
    async def go():
        store = await open_store(tmp_path)
        hub = store.hub
        value = b"v" * 10_000
        hub.outbox_bytes_max = 100_000  # ten values
        past = hub.open_stream()
        past.create(WatchSpec(PODS, b"/registry/pods0", start_revision=2, watch_id=3))
        live = hub.open_stream()
        live.create(WatchSpec(PODS + b"a", watch_id=1))
        live.create(WatchSpec(b"/registry/", b"/registry0", prev_kv=True, watch_id=2))
        for i in range(40):
            await store.put(PutReq(PODS + b"a", value))
            await store.txn(TxnReq(success=(PutReq(PODS + b"b", value), PutReq(LEASES + b"l", value))))
        assert live.unsynced, "the watchers must have fallen behind"
        got = {1: [], 2: [], 3: []}
        peak = {live: 0, past: 0}
        async with asyncio.timeout(10):
            while any(sum(len(m.events) for m in got[w]) < n for w, n in ((1, 40), (2, 120), (3, 80))):
                for stream in (live, past):
                    peak[stream] = max(peak[stream], stream.outbox_bytes)
                    if stream.outbox:
                        msg = await stream.get()
                        got[msg.watch_id].append(msg)
                await asyncio.sleep(0)
        assert max(peak.values()) <= 100_000 + 3 * 20_000, peak
        assert [r for r, *_ in events_of(got[1])] == list(range(2, 82, 2))
        txn = list(range(3, 82, 2))
        assert [(r, key) for r, _, key, _ in events_of(got[2])] == [
            x for t in txn for x in ((t - 1, PODS + b"a"), (t, PODS + b"b"), (t, LEASES + b"l"))]
        assert all(prev is not None for r, _, _, prev in events_of(got[2]) if r > 3)
        # a revision's two events are never split between two responses
        for m in got[2]:
            revs = [r for r, *_ in events_of([m])]
            assert all(revs.count(r) == 2 for r in revs if r % 2), revs
        assert [(r, key) for r, _, key, _ in events_of(got[3])] == [
            x for t in txn for x in ((t - 1, PODS + b"a"), (t, PODS + b"b"))]
        assert len(got[3]) > 4, "the catch-up from a past revision must come in several batches"
        await store.close()

    run(go())


def test_many_changes_at_once_are_delivered_in_slices_in_order_exactly_once(tmp_path, run, monkeypatch):
    """A DeleteRange of many keys is one revision: its events are matched to the watchers in
    slices by a task, the loop serving between them. Meanwhile a put's event queues behind them,
    a watcher created from now gets none of them and one from their revision gets each once, a
    progress response is never ahead of an event still to come on its stream, and a compaction
    waits: the events carry the previous values, read as they are matched."""
    from shards import watch

    monkeypatch.setattr(watch, "NOTIFY_STEP", 50)

    async def go():
        store = await open_store(tmp_path, slice_ms=0.01)
        hub = store.hub
        for i in range(500, -1, -100):  # compaction walks the keys from k599 down, the delivery up from k000
            await store.txn(TxnReq(success=tuple(PutReq(PODS + b"k%03d" % j, b"v%d" % j)
                                                 for j in range(i + 99, i - 1, -1))))
        a, b, c, d, e = (hub.open_stream() for _ in range(5))
        a.create(WatchSpec(PODS, b"/registry/pods0", prev_kv=True))
        b.create(WatchSpec(PODS + b"k005"))
        e.create(WatchSpec(PODS, b"/registry/pods0", watch_id=5))
        del_rev = (await store.delete_range(DeleteReq(PODS, b"/registry/pods0"))).revision
        assert hub._queue and hub.sent_through == del_rev - 1
        gate = asyncio.Event()  # the delivery's next slice waits here (the delete's own slices are done)

        async def held() -> None:
            await gate.wait()

        store._pause = held
        c.create(WatchSpec(PODS, b"/registry/pods0"))  # from now on
        d.create(WatchSpec(PODS, b"/registry/pods0", start_revision=del_rev, watch_id=4))
        a.request_progress()
        e.cancel(5)  # its events are being matched: none is sent after its cancel
        after = (await store.put(PutReq(PODS + b"after", b"x"))).revision
        await store.compact(after)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(hub._queue) == 2 and not any(m.events for m in a.outbox)  # the put's event waits its turn
        gate.set()
        async with asyncio.timeout(10):
            while hub._queue or d.unsynced:
                await asyncio.sleep(0)
            await store.compacted(after)
        got = {s: drain(s) for s in (a, b, c, d, e)}
        assert [(m.created, m.canceled, len(m.events)) for m in got[e]] == [(True, False, 0), (False, True, 0)]
        deletes = [(del_rev, DELETE, PODS + b"k%03d" % j) for j in range(600)]
        put = [(after, PUT, PODS + b"after")]
        for s, want in ((a, deletes + put), (b, [deletes[5]]), (c, put), (d, deletes + put)):
            assert [(r, k, key) for r, k, key, _ in events_of(got[s])] == want
        assert [KeyValue.FromString(prev).value for *_, prev in events_of(got[a])[:600]] == [b"v%d" % j for j in range(600)]
        msgs = got[a]
        progress = [i for i, m in enumerate(msgs) if m.watch_id == PROGRESS_WATCH_ID]
        assert len(progress) == 1 and msgs[progress[0]].revision == del_rev - 1
        assert all(KeyValue.FromString(e.kv).mod_revision > del_rev - 1 for m in msgs[progress[0] + 1:] for e in m.events)
        assert not store._reads and store.failure is None
        await store.close()

    run(go())


def test_compacted_start_revision_is_canceled(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        for i in range(5):
            await store.put(PutReq(b"k", b"%d" % i))
        await store.compact(4)
        stream = store.hub.open_stream()
        stream.create(WatchSpec(b"k", start_revision=3))
        stream.create(WatchSpec(b"k", start_revision=4))
        await asyncio.sleep(0.05)
        msgs = drain(stream)
        canceled = [m for m in msgs if m.canceled]
        assert [(m.watch_id, m.compact_revision) for m in canceled] == [(0, 4)]
        assert [r for r, *_ in events_of(msgs, 1)] == [4, 5, 6]
        await store.close()

    run(go())


def test_progress_waits_until_every_watcher_is_synced(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        for i in range(20):
            await store.put(PutReq(b"k", b"%d" % i))
        stream = store.hub.open_stream()
        stream.create(WatchSpec(b"k", start_revision=2))
        stream.request_progress()  # the watcher is unsynced: no answer yet
        assert not any(m.watch_id == PROGRESS_WATCH_ID for m in stream.outbox)
        await asyncio.sleep(0.05)
        msgs = drain(stream)
        progress = [i for i, m in enumerate(msgs) if m.watch_id == PROGRESS_WATCH_ID]
        assert len(progress) == 1 and msgs[progress[0]].revision == store.committed
        last_event = max(i for i, m in enumerate(msgs) if m.events)
        assert progress[0] > last_event, "progress must come after every event up to its revision"
        await store.close()

    run(go())


def test_duplicate_watch_id_and_cancel(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        stream = store.hub.open_stream()
        stream.create(WatchSpec(b"a", watch_id=5))
        stream.create(WatchSpec(b"b", watch_id=5))
        stream.cancel(5)
        stream.cancel(77)  # unknown: no answer, as etcd
        await store.put(PutReq(b"a"))
        msgs = drain(stream)
        assert [(m.watch_id, m.created, m.canceled, m.cancel_reason) for m in msgs] == [
            (5, True, False, ""),
            (-1, True, True, "mvcc: duplicate watch ID provided on the WatchStream"),
            (5, False, True, ""),
        ]
        assert not store.hub.active
        stream.close()
        await store.close()

    run(go())
