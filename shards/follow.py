"""A follower: applies another process's journal records to this process's
state as they are stored, up to the longest prefix of revisions that is whole
on every shard (DESIGN.md invariants 5, 6 and 10).

Each shard's journal is read on its own, so the follower can read one stream
ahead of another.  What keeps it right is the writer's epoch on every record
(the revision of the writer lease, which grows from one writer to the next)
and the cut marker every writer publishes on every stream before its first
record: ``cut(E, R)`` says that records of epochs before E tagged above R are
void.  The marker comes before E's own records on each stream, so by the time
a record of E is read the follower knows E's cut, and a record of an older
epoch read later on another stream is dropped by the same rule.

A revision R is applied once every shard it names has its part of R from one
epoch (or a checkpoint at or above R), and every revision below it is applied.
Such a revision is never cut by a later writer: that writer reads every stream
to its end before it decides where to cut, so it sees at least what the
follower saw.

Worked example, shards A and B, writer F (epoch 3), then writer E (epoch 7):

    A: [F rev 10 part (A,B)] [E cut 9] [E rev 10 part (A)]
    B:                       [E cut 9]

F crashed before B's part of 10.  Reading B first, the follower learns
cut(7, 9); F's part of 10 on A is then void when it is read (3 < 7, 10 > 9);
E's rev 10 is whole once A's E part is read.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .lease import GRANT, decode_lease_record
from .record import (AUTH, COMPACT, LEASE, TOKEN, WRITE, WRITE_LAST, WRITE_PART, Change, WriteParts, decode_compact, decode_write,
                     write_changes_in_steps, write_participants)

if TYPE_CHECKING:
    from journal.follow import Message
    from journal.record import Record

    from .store import Store

logger = logging.getLogger(__name__)

# A write of many changes (a DeleteRange or a lease revoke of thousands of keys is one revision)
# is applied in steps while the journals are followed, the event loop serving reads, watches and
# forwarded calls between them: its record is kept undecoded and its changes decoded and applied
# STEP_CHANGES at a time, no revision counting as applied before all of its changes are (reads are
# at the applied revision; the state holds rows above it as a writer's does while it journals).
BIG_WRITE_BYTES = 64 << 10  # a WRITE record at least this large is decoded as it is applied
STEP_CHANGES = 256  # changes applied between two looks at the clock
BACKLOG_MAX = 10_000  # revisions read and not applied past which a message is applied at once (its reader waits)
STUCK_WARN_S = 10.0  # records read above the applied revision, none applied for this long: a warning names why


class FollowerDiverged(RuntimeError):
    """A newer writer cut below what this follower had applied: its state is not
    the log's history (a broken invariant); it must be rebuilt."""


@dataclass
class FollowStats:
    """What /metrics shows of a follower: how far behind the writer it is."""

    writer_rev: int = 0  # the writer's committed revision, as last learned (read index, forwarded answers)
    resyncs: int = 0  # rebuilds from a checkpoint (resync.py)
    last_lag_s: float = 0.0  # the last journal message applied: from when it was stored to when it was applied
    on_lag: Callable[[float], None] | None = None  # told each message's lag (the metrics histogram)
    read_index_failures: int = 0  # read index requests to the writer that failed (etcd_server_read_indexes_failed)
    slow_read_indexes: int = 0  # ... answered after READ_INDEX_SLOW_S or more (etcd_server_slow_read_indexes)

    def learned(self, rev: int) -> None:
        if rev > self.writer_rev:
            self.writer_rev = rev


class Follower:
    def __init__(self, store: Store, applied: int, floors: list[int]) -> None:
        self.store = store
        self.unapplied: deque[tuple[int, float]] = deque()  # (top tag, when stored) of messages read, not applied
        self.applied = applied  # every revision <= applied is in the state
        self.floors = floors  # per shard: its checkpoint's revision (its parts up to there are in the state)
        self.parts: dict[int, dict[int, tuple[int, tuple[int, ...], list[Change]]]] = {}  # rev -> sid -> part
        self.metas: list[deque[tuple[int, int, int, bytes]]] = [deque() for _ in floors]  # (tag, epoch, type, payload)
        self.cuts: dict[int, int] = {}  # epoch -> the revision its writer recovered to
        self.applied_tops: dict[int, int] = {}  # epoch -> the highest revision applied from its records
        self.joined = [WriteParts() for _ in floors]  # per shard: a large write's records read so far
        # the revision being applied in steps: its steps (their value: its changes by shard), its
        # revision and the epochs of its parts; None while none is
        self._applying: Generator[None, None, dict[int, list[Change]]] | None = None
        self._applying_rev = 0
        self._applying_epochs: tuple[int, ...] = ()
        self._more = asyncio.Event()  # work left for run(): a revision half applied, or whole ones next
        self._since = (-1, 0.0)  # records waiting above this applied revision since then (-1: none wait)
        self._warned = 0  # the applied revision a warning was logged at
        self._running = False  # run() is going on (follow_journals): advance may leave work to it

    # -- input ------------------------------------------------------------

    def on_message(self, sid: int, msg: Message) -> None:
        if msg.epoch > self.store.writer_epoch:  # a new writer: its term is every member's
            self.store.saw_writer_epoch(msg.epoch)
        if msg.cut is not None:
            self.cut(msg.epoch, msg.cut)
        for rec in msg.records:
            self.take(sid, rec)
        if msg.stored and msg.top:
            self.unapplied.append((msg.top, msg.stored))
        if self._running and len(self.parts) < BACKLOG_MAX:
            self.advance(self.store.config.slice_ms / 1000)
        else:
            self.advance()
        if self.unapplied and self.unapplied[0][0] <= self.applied:
            self._applied_messages()
        if not self.parts or self._applying is not None:  # nothing waits (or it is being applied)
            self._since = (-1, 0.0)
        elif self._since[0] != self.applied:  # a wait begins (the clock is read only then)
            self._since = (self.applied, time.monotonic())
        elif self._warned != self.applied:
            self._stuck_warning()

    def _stuck_warning(self) -> None:
        """Records above the applied revision read, none applied for STUCK_WARN_S: which revision
        is not whole, and what of it was read (a record of a shard that never came, a large write's
        last without its parts), once per applied revision."""
        held = time.monotonic() - self._since[1]
        if held < STUCK_WARN_S:
            return
        self._warned, rev = self.applied, self.applied + 1
        got = self.parts.get(rev, {})
        participants = next(iter(got.values()))[1] if got else ()
        names = [shard.name for shard in self.store.shards]
        logger.warning("follower applied nothing for %.0f s: revision %d is not whole, later ones wait behind it "
                       "read_for_it=%s participants=%s epochs=%s large_write_parts_held=%s read_up_to=%d",
                       held, rev, [names[sid] for sid in sorted(got)], [names[sid] for sid in participants],
                       sorted({part[0] for part in got.values()}),
                       [names[sid] for sid, j in enumerate(self.joined) if j.held], max(self.parts))

    async def run(self) -> None:
        """Go on with what ``advance`` left (a write of many changes, a long run of whole
        revisions), a slice at a time, between turns of the event loop; until cancelled
        (``Store.follow_journals`` runs it beside the journals' readers, so that what it
        raises ends the following as what they raise does)."""
        self._running = True
        try:
            while True:
                await self._more.wait()
                await self.store._pause()
                self._more.clear()
                self.advance(self.store.config.slice_ms / 1000)
                if self.unapplied and self.unapplied[0][0] <= self.applied:
                    self._applied_messages()
        finally:
            self._running = False

    def _applied_messages(self) -> None:
        """Lag of the messages whose every record is applied now (a record of another
        epoch that was void counts as applied once a later revision is)."""
        now = time.time()
        stats = self.store.follow_stats
        unapplied, applied = self.unapplied, self.applied
        while unapplied and unapplied[0][0] <= applied:
            lag = now - unapplied.popleft()[1]
            stats.last_lag_s = lag
            if stats.on_lag is not None:
                stats.on_lag(lag)

    def oldest_unapplied_s(self) -> float:
        """How long ago the oldest message read but not yet applied was stored (0: none)."""
        return time.time() - self.unapplied[0][1] if self.unapplied else 0.0

    def cut(self, epoch: int, rev: int) -> None:
        """Writer ``epoch`` recovered to ``rev``: older epochs' records above it are void."""
        if self.cuts.get(epoch) == rev:
            return
        if any(e < epoch and top > rev for e, top in self.applied_tops.items()) or (
                self._applying is not None and self._applying_rev > rev and min(self._applying_epochs) < epoch):
            raise FollowerDiverged(f"writer epoch {epoch} cut above revision {rev}, below revisions of an "
                                   f"earlier writer this follower had applied (up to {self.applied})")
        self.cuts[epoch] = rev
        for r in [r for r in self.parts if r > rev]:
            kept = {sid: part for sid, part in self.parts[r].items() if part[0] >= epoch}
            if kept:
                self.parts[r] = kept
            else:
                del self.parts[r]
        for i, metas in enumerate(self.metas):
            if any(tag > rev and e < epoch for tag, e, _, _ in metas):
                self.metas[i] = deque(m for m in metas if not (m[0] > rev and m[1] < epoch))

    def take(self, sid: int, rec: Record) -> None:
        if self._void(rec.epoch, rec.rev):
            return
        if rec.rtype == WRITE or rec.rtype == WRITE_LAST:
            if rec.rev <= self.applied or rec.rev == self._applying_rev:
                return  # an older writer's part of a revision a newer one wrote again
            payload = self.joined[sid].whole(rec.rtype, rec.rev, rec.epoch, rec.payload)
            if payload is None:
                return  # the last of a write whose parts were not read: never whole
            if len(payload) >= BIG_WRITE_BYTES:  # decoded as it is applied
                self.parts.setdefault(rec.rev, {})[sid] = (rec.epoch, write_participants(payload), payload)
            else:
                participants, changes = decode_write(payload)
                self.parts.setdefault(rec.rev, {})[sid] = (rec.epoch, participants, changes)
        elif rec.rtype == WRITE_PART:
            if rec.rev > self.applied and rec.rev != self._applying_rev:
                self.joined[sid].part(rec.rev, rec.epoch, rec.payload)
        elif rec.rtype in (LEASE, AUTH, COMPACT, TOKEN):
            self.metas[sid].append((rec.rev, rec.epoch, rec.rtype, rec.payload))

    def _void(self, epoch: int, rev: int) -> bool:
        return any(e > epoch and rev > r for e, r in self.cuts.items())

    # -- applying -----------------------------------------------------------

    def advance(self, slice_s: float | None = None) -> int:
        """Apply every revision that is now whole and next in line; the new applied revision.
        With ``slice_s``, for about that long: what is left (the rest of a write of many
        changes, more whole revisions) goes on in ``run``."""
        first = self.applied + 1
        deadline = None if slice_s is None else time.perf_counter() + slice_s
        store = self.store
        self._apply_metas()
        cut_short = False  # stopped by the deadline with something whole left to apply
        while True:
            if self._applying is None:
                rev = self.applied + 1
                parts = self.parts.get(rev)
                if parts is None or not self._whole(rev, parts):
                    break
                if deadline is not None and self.applied >= first and time.perf_counter() >= deadline:
                    cut_short = True  # a whole revision waits for run() (each call applies one at least)
                    break
                del self.parts[rev]
                if all(type(part[2]) is list for part in parts.values()):  # most revisions: at once
                    for sid, (epoch, _, changes) in parts.items():
                        store.shards[sid].apply_recovered(rev, changes)
                        self.applied_tops[epoch] = rev
                    if store.hub.active:
                        store._changes[rev] = {sid: part[2] for sid, part in parts.items()}
                    self.applied = rev
                    self._apply_metas()
                else:
                    self._applying = self._apply_steps(rev, parts)
                    self._applying_rev, self._applying_epochs = rev, tuple({part[0] for part in parts.values()})
            if self._applying is not None and not self._step(deadline):
                cut_short = True
                break
        if self.applied >= first:
            store.rev = store.committed = self.applied
            store.follow_stats.learned(self.applied)
            if store.hub.active:
                store.hub.notify(store._committed_changes(first, self.applied), self.applied)
            store._release_waiters(self.applied)  # reads waiting for a revision to be applied
        if cut_short:
            self._more.set()
        return self.applied

    def _apply_steps(self, rev: int, parts: dict) -> Generator[None, None, dict[int, list[Change]]]:
        """Apply revision ``rev``'s parts, a record kept undecoded STEP_CHANGES changes at a
        time, yielding between them; its changes by shard."""
        done: dict[int, list[Change]] = {}
        for sid, (_, _, changes) in parts.items():
            shard = self.store.shards[sid]
            if type(changes) is list:
                shard.apply_recovered(rev, changes)
                done[sid] = changes
                continue
            applied: list[Change] = []
            for step in write_changes_in_steps(changes, STEP_CHANGES):
                shard.apply_recovered(rev, step)
                applied += step
                yield
            done[sid] = applied
        for epoch, _, _ in parts.values():
            self.applied_tops[epoch] = rev
        return done

    def _step(self, deadline: float | None) -> bool:
        """Go on applying the revision being applied in steps, until ``deadline`` (None: to its
        end); whether it is applied now."""
        steps = self._applying
        try:
            while True:
                next(steps)
                if deadline is not None and time.perf_counter() >= deadline:
                    return False
        except StopIteration as end:
            self._applying, self._applying_rev, self._applying_epochs = None, 0, ()
            self._applied(self.applied + 1, end.value)
            return True
        except BaseException:
            self._applying, self._applying_rev, self._applying_epochs = None, 0, ()
            raise

    def _applied(self, rev: int, changes: dict[int, list[Change]]) -> None:
        if self.store.hub.active:
            self.store._changes[rev] = changes
        self.applied = rev
        self._apply_metas()

    def _whole(self, rev: int, parts: dict) -> bool:
        epochs = {part[0] for part in parts.values()}
        if len(epochs) != 1:
            return False
        participants = next(iter(parts.values()))[1]
        return all(p in parts or self.floors[p] >= rev for p in participants)

    def _apply_metas(self) -> None:
        """Lease, auth, token and compaction records tagged at or below the applied revision, in journal order."""
        store = self.store
        for metas in self.metas:
            while metas and metas[0][0] <= self.applied:
                tag, epoch, rtype, payload = metas.popleft()
                if rtype == LEASE:
                    op, lease_id, ttl = decode_lease_record(payload)
                    if op == GRANT:
                        store.leases.grant(lease_id, ttl)
                    else:
                        store.leases.remove(lease_id)
                elif rtype == AUTH:
                    store.auth.replay(payload)
                elif rtype == TOKEN:
                    store.auth.learn_token(payload)
                elif rtype == COMPACT:
                    compact = decode_compact(payload)
                    if compact > store.compact_rev:
                        store.compact_rev = compact
                        store._start_compaction()

    def pending(self) -> int:
        """Records read but not applied (above the applied revision): a takeover cuts them."""
        return sum(len(p) for p in self.parts.values()) + sum(len(m) for m in self.metas)
