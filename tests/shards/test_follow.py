"""The follower against random histories of writers that crash mid-txn.

A simulated log: each writer (epoch 1, 2, ...) reads every stream, keeps the
longest whole prefix (the store's own ``recovered_revision``), publishes its
cut on every stream, then writes revisions across random shards and may
crash between the parts of one.  The follower reads the streams in a random
interleaving (each stream in order, as JetStream delivers it) and must only
ever apply what the final history holds at that revision, and in the end
everything whole.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings, strategies as st

from journal.jetstream import Message
from journal.record import Record
from shards import follow
from shards.follow import Follower, FollowerDiverged, FollowStats
from shards.recovery import recovered_revision
from shards.record import PUT, WRITE, Change, encode_write
from shards.shard import Recovered

SHARDS = 3


@dataclass
class FakeShard:
    applied: dict[int, list] = field(default_factory=dict)
    name: str = "fake"  # (a follower's warning names shards)

    def apply_recovered(self, rev: int, changes: list) -> None:
        assert rev not in self.applied, f"revision {rev} applied twice"
        self.applied[rev] = changes


class FakeHub:
    active = False


class FakeStore:
    config = type("Config", (), {"slice_ms": 0.0})  # a follower applying in steps: one step a call

    def __init__(self) -> None:
        self.shards = [FakeShard() for _ in range(SHARDS)]
        self.hub = FakeHub()
        self.rev = self.committed = 1
        self.compact_rev = -1
        self.released = 1  # reads waiting for a revision are let go once it is applied
        self.follow_stats = FollowStats()
        self.writer_epoch = 0  # the newest writer epoch the follower reported (its term is every member's)

    def saw_writer_epoch(self, epoch: int) -> None:
        assert epoch > self.writer_epoch  # told once per newer writer, never of an older one
        self.writer_epoch = epoch

    def _release_waiters(self, rev: int) -> None:
        assert rev == self.committed >= self.released
        self.released = rev


def part(rev: int, participants: tuple[int, ...], epoch: int, sid: int) -> Record:
    changes = [Change(PUT, 0, b"k%d" % sid, b"e%d" % epoch)]  # the value names the writer
    return Record(WRITE, rev, encode_write(participants, changes), None, 0, epoch)


def in_stream(messages: list[Message]) -> list[Record]:
    """One stream as a reader of it alone sees it: cuts drop what came before them."""
    out: list[Record] = []
    for m in messages:
        if m.cut is not None:
            out = [r for r in out if r.rev <= m.cut]
        out.extend(m.records)
    return out


def whole_prefix(streams: list[list[Message]]) -> tuple[int, dict[int, dict[int, bytes]]]:
    """What a writer opening these streams keeps: (revision, rev -> sid -> value)."""
    from shards.record import decode_write

    found = []
    history: dict[int, dict[int, bytes]] = {}
    for sid, messages in enumerate(streams):
        writes = []
        for rec in in_stream(messages):
            participants, changes = decode_write(rec.payload)
            writes.append((rec.rev, participants, changes, rec.epoch))
            history.setdefault(rec.rev, {})[sid] = changes[0].row
        found.append(Recovered(0, -1, writes, [], [], b""))
    rev = recovered_revision(found)
    return rev, {r: parts for r, parts in history.items() if r <= rev}


def simulate(rng: random.Random, writers: int) -> list[list[Message]]:
    streams: list[list[Message]] = [[] for _ in range(SHARDS)]
    seq = 0

    def publish(sid: int, **kw) -> None:
        nonlocal seq
        seq += 1
        streams[sid].append(Message(seq, **kw))

    for epoch in range(1, writers + 1):
        rev, _ = whole_prefix(streams)
        for sid in range(SHARDS):
            publish(sid, epoch=epoch, cut=rev)
        for _ in range(rng.randint(0, 8)):
            rev += 1
            participants = tuple(sorted(rng.sample(range(SHARDS), rng.randint(1, SHARDS))))
            crash = epoch < writers and rng.random() < 0.2
            written = participants[: rng.randint(0, len(participants) - 1)] if crash else participants
            for sid in written:
                publish(sid, epoch=epoch, records=(part(rev, participants, epoch, sid),), top=rev)
            if crash:
                break
    return streams


def follow_interleaved(rng: random.Random, streams: list[list[Message]], truth: dict[int, dict[int, bytes]],
                       stepped: bool = False) -> Follower:
    """Messages to a follower in a random interleaving of the streams; ``stepped``: as it follows
    with run() beside it, each message applied a step at a time (every record a write of many
    changes), run() going on a random number of steps between messages."""
    store = FakeStore()
    follower = Follower(store, 1, [0] * SHARDS)
    follower._running = stepped
    queues = [deque(s) for s in streams]

    def check() -> None:
        for shard_id, shard in enumerate(store.shards):  # never anything the final history lacks
            for rev, changes in shard.applied.items():
                assert truth.get(rev, {}).get(shard_id) == changes[0].row, (rev, shard_id)
        assert store.committed == follower.applied

    while any(queues):
        sid = rng.choice([i for i, q in enumerate(queues) if q])
        follower.on_message(sid, queues[sid].popleft())
        check()
        for _ in range(rng.randint(0, 2) if stepped else 0):
            follower.advance(0.0)
            check()
    follower.advance()
    check()
    return follower


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), writers=st.integers(1, 5), stepped=st.booleans())
def test_a_follower_applies_exactly_the_final_history_whatever_the_interleaving(seed, writers, stepped):
    rng = random.Random(seed)
    streams = simulate(rng, writers)
    final_rev, truth = whole_prefix(streams)
    big = follow.BIG_WRITE_BYTES
    follow.BIG_WRITE_BYTES = 0 if stepped else big  # every write decoded and applied in steps
    try:
        follower = follow_interleaved(rng, streams, truth, stepped)
    finally:
        follow.BIG_WRITE_BYTES = big
    assert follower.applied == final_rev
    applied = {}
    for sid, shard in enumerate(follower.store.shards):
        for rev, changes in shard.applied.items():
            applied.setdefault(rev, {})[sid] = changes[0].row
    assert applied == truth


def test_an_older_writers_part_read_after_a_newer_cut_is_void():
    """The module docstring's example: F (epoch 3) wrote A's part of 10 and
    crashed; E (epoch 7) cut above 9 and wrote 10 on A alone.  Read B first."""
    f_part = Message(1, 3, (part(10, (0, 1), 3, 0),), top=10)
    e_cut_a, e_cut_b = Message(2, 7, cut=9), Message(3, 7, cut=9)
    e_part = Message(4, 7, (part(10, (0,), 7, 0),), top=10)
    store = FakeStore()
    follower = Follower(store, 9, [0] * SHARDS)
    follower.on_message(1, e_cut_b)
    follower.on_message(0, f_part)
    assert follower.applied == 9 and not follower.parts  # F's part is void on arrival
    follower.on_message(0, e_cut_a)
    follower.on_message(0, e_part)
    assert follower.applied == 10 and store.shards[0].applied[10][0].row == b"e7"
    assert store.writer_epoch == 7  # E's term, though F's part came later


def test_a_cut_below_what_was_applied_from_an_older_writer_is_a_divergence():
    store = FakeStore()
    follower = Follower(store, 1, [0] * SHARDS)
    follower.on_message(0, Message(1, 3, (part(2, (0,), 3, 0),), top=2))
    assert follower.applied == 2
    with pytest.raises(FollowerDiverged):
        follower.on_message(0, Message(2, 7, cut=1))


def test_a_cut_below_a_revision_being_applied_in_steps_is_a_divergence(monkeypatch):
    monkeypatch.setattr(follow, "BIG_WRITE_BYTES", 0)
    store = FakeStore()
    follower = Follower(store, 1, [0] * SHARDS)
    follower._running = True
    follower.on_message(1, Message(1, 3, (part(2, (0, 1), 3, 1),), top=2))
    follower.on_message(0, Message(2, 3, (part(2, (0, 1), 3, 0),), top=2))
    assert follower.applied == 1 and follower._applying_rev == 2  # one of its two parts applied
    with pytest.raises(FollowerDiverged):
        follower.on_message(2, Message(3, 7, cut=1))


def test_a_part_read_again_while_its_revision_is_applied_in_steps_is_dropped(monkeypatch):
    """As one read again after its revision was applied (a stream read again from an earlier
    message): it is not kept as a part still to apply, which a takeover would count as cut."""
    monkeypatch.setattr(follow, "BIG_WRITE_BYTES", 0)
    store = FakeStore()
    follower = Follower(store, 1, [0] * SHARDS)
    follower._running = True
    first, second = Message(1, 3, (part(2, (0, 1), 3, 1),), top=2), Message(2, 3, (part(2, (0, 1), 3, 0),), top=2)
    follower.on_message(1, first)
    follower.on_message(0, second)
    assert follower._applying_rev == 2
    follower.on_message(1, first)
    follower.advance()
    assert follower.applied == 2 and follower.pending() == 0


def test_run_rests_while_the_next_revision_waits_for_a_part():
    """run() goes on only while there is something whole to apply: a revision waiting for its
    part on another stream leaves it waiting, not turning the loop over and over."""
    import asyncio

    async def go():
        store = FakeStore()
        turns = []

        async def pause() -> None:
            turns.append(1)
            await asyncio.sleep(0)

        store._pause = pause
        follower = Follower(store, 1, [0] * SHARDS)
        runner = asyncio.ensure_future(follower.run())
        await asyncio.sleep(0)
        follower.on_message(0, Message(1, 3, (part(2, (0,), 3, 0), part(3, (0, 1), 3, 0)), top=3))
        for _ in range(50):
            await asyncio.sleep(0)
        assert follower.applied == 2 and len(turns) <= 2
        follower.on_message(1, Message(2, 3, (part(3, (0, 1), 3, 1),), top=3))
        for _ in range(50):
            await asyncio.sleep(0)
        assert follower.applied == 3
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        assert not follower._running

    asyncio.run(go())


def test_a_revision_that_stays_incomplete_is_named_in_a_warning_once(monkeypatch, caplog):
    """Records above the applied revision read and none applied for STUCK_WARN_S: one warning names
    the revision that is not whole and what of it was read, so that a follower stuck behind it
    (a shard's record that never came; chaos: a large write's last without its parts) says why
    in its log, not only in its lag gauges. Nothing while it is idle, or before that long, and a
    wait counts from when records began to wait (not from before a cut voided earlier ones)."""
    now = [1000.0]
    monkeypatch.setattr(follow.time, "monotonic", lambda: now[0])
    store = FakeStore()
    for i, shard in enumerate(store.shards):
        shard.name = f"s{i}"
    f = Follower(store, 1, [1] * SHARDS)
    now[0] += 60  # idle: nothing read, nothing to say
    f.on_message(1, Message(1, 1, (part(3, (1,), 1, 1),), top=3))  # revision 2 not read yet
    f.on_message(0, Message(1, 1, (part(2, (0, 2), 1, 0),), top=2))  # half of it
    now[0] += follow.STUCK_WARN_S - 1
    f.on_message(1, Message(2, 1, (part(4, (1,), 1, 1),), top=4))
    assert not [r for r in caplog.records if "applied nothing" in r.getMessage()]
    now[0] += 2
    f.on_message(1, Message(3, 1, (part(5, (1,), 1, 1),), top=5))
    f.on_message(1, Message(4, 1, (part(6, (1,), 1, 1),), top=6))
    warned = [r.getMessage() for r in caplog.records if "applied nothing" in r.getMessage()]
    assert len(warned) == 1 and "revision 2 is not whole" in warned[0], warned
    assert "read_for_it=['s0'] participants=['s0', 's2']" in warned[0] and "read_up_to=5" in warned[0], warned
    f.on_message(2, Message(1, 1, (part(2, (0, 2), 1, 2),), top=2))  # the missing half: all applied
    assert f.applied == 6
    f.on_message(0, Message(2, 1, (part(8, (0,), 1, 0),), top=8))  # 7 not read: a wait begins
    now[0] += 2 * follow.STUCK_WARN_S
    f.on_message(0, Message(3, 2, cut=6))  # a new writer voids it: nothing waits any more
    f.on_message(0, Message(4, 2, (part(8, (0,), 2, 0),), top=8))  # a new wait, begun now
    now[0] += 1
    f.on_message(0, Message(5, 2, (part(9, (0,), 2, 0),), top=9))
    assert len([r for r in caplog.records if "applied nothing" in r.getMessage()]) == 1
