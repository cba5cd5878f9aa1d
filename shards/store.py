"""The store: one etcd revision space over independent shards.

Write path (all in the event loop, no await between check and apply):
validate → evaluate against the latest state (pending writes included) →
take the next revision → apply to shard state as pending rows → hand each
involved shard its journal record → wait until the *committed* revision
(every revision up to it durable on every shard it touched) reaches ours.

Reads are served at the committed revision, so they never show a write
that a crash could still lose (DESIGN.md invariants 1–4).
"""
from __future__ import annotations

import asyncio
import heapq
import logging
from operator import attrgetter
from collections import Counter, deque
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from journal import JournalConfig, failpoints
from journal.errors import JournalFailed, JournalGap
from journal.jetstream import JetStreamConfig, meta_bucket
from journal.journal import LocalLog
from journal.tail import LocalFollowLog
from journal.tasks import cancel_and_wait, together
from journal.watermark import FILE_NAME as WATERMARK_FILE, WatermarkWriter

from . import collector
from .auth import AuthStore
from .tokens import parse_auth_token
from .datadir import DataDir, acknowledged_on_disk
from .follow import FollowStats
from .errors import (
    CompactedError,
    DataDirError,
    FutureRevisionError,
    KeyNotFoundError,
    LeaseExistsError,
    LeaseNotFoundError,
    LeaseTTLTooLargeError,
    NotTheWriterError,
    RequestTimeoutError,
    StateStoreError,
    StoreFailedError,
)
from .lease import GRANT, MAX_TTL_S, REVOKE, LeaseTable, encode_lease_record
from .layout import Layout, Router
from .read import range_at, range_key, range_steps
from .record import Change, encode_extra_meta
from .shard import Shard
from .types import DeleteReq, DeleteResult, PutReq, PutResult, RangeReq, RangeResult, TxnReq, TxnResult
from .watch import WatchHub
from .steps import Steps, T
from .counts import MvccCounts
from .write import STEP_KEYS, WriteTxn, is_write, single_key_writes

# what a write's own checks refuse before it changes anything: answered to that write alone
REFUSALS = (LeaseNotFoundError, KeyNotFoundError, CompactedError, FutureRevisionError)

logger = logging.getLogger(__name__)
SORT_RUN = 4096  # keys of a revoked lease sorted in one step
IDLE_TURN_S = 50e-6  # an event-loop turn shorter than this ran (next to) nothing but the one yielding
TAKEOVER_TRIES = 3  # a takeover whose journals the writer being replaced released as it read rebuilds and tries again
_BYTES_HIGH = attrgetter("bytes_high")
ACKNOWLEDGED_EVERY_S = 1.0  # how often a replicated journal's writer publishes its committed revision

# A fresh etcd 3.5's backend file before any key: 20,480 bytes, 16,384 of them in use (bbolt's
# meta, freelist and bucket pages; etcdctl endpoint status). Reported on an empty store too, so
# that tools which divide by the size (fragmentation ratios) find what etcd gives them.
EMPTY_BACKEND_BYTES, EMPTY_BACKEND_IN_USE = 20_480, 16_384


@dataclass(frozen=True)
class StoreConfig:
    data_dir: Path
    layout: Layout
    state_dir: Path | None = None  # default: under /dev/shm when present
    journal: JournalConfig = field(default_factory=JournalConfig)
    checkpoint_journal_bytes: int = 256 * 1024 * 1024
    slice_ms: float = 5.0  # longest a compaction or one large request holds the event loop before yielding
    request_timeout_s: float = 7.0  # etcd's: 5 s + 2 election timeouts; then "request timed out"
    pause_ms: float = 2.0  # how long it then lets others run: a gRPC call needs several loop turns
    bcrypt_cost: int = 10  # etcd's --bcrypt-cost
    auth_token_ttl_s: float = 300.0  # etcd's --auth-token-ttl
    auth_token: str = "simple"  # etcd's --auth-token: "simple" or "jwt,sign-method=...,priv-key=...,..."
    jetstream: JetStreamConfig | None = None  # journals on NATS JetStream instead of local segments
    wal_dir: Path | None = None  # the local journals in this dir (etcd's --wal-dir) instead of the data dir


class Store:
    def __init__(self, config: StoreConfig, datadir: DataDir, shards: list[Shard]) -> None:
        self.config = config
        self.datadir = datadir
        self.router = Router(config.layout)
        self.shards = shards
        self.states = [s.state for s in shards]
        self.rev = 1  # latest assigned revision (pending included)
        self.committed = 1  # every revision <= committed is durable
        self.compact_rev = -1  # etcd's compactMainRev
        self.failure: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self._pending: dict[int, int] = {}  # revision -> journal parts not yet durable
        self._grants_in_flight: dict[int, asyncio.Future] = {}  # lease id -> resolved once its grant is durable
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._deadlines: deque[tuple[float, asyncio.Future]] = deque()  # (loop time, waiter), in arrival order
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._waiter_seq = 0
        self.proposals_failed = 0  # writes that timed out waiting for their commit (etcd_server_proposals_failed_total)
        self._compaction: asyncio.Task | None = None
        self._gate: asyncio.Future | None = None  # set while a sliced write holds other writes back
        self._reads: Counter[int] = Counter()  # revisions of sliced reads in flight
        self._reads_done = asyncio.Event()
        self._compacted_through = -1  # history up to here is physically gone
        self._changes: dict[int, dict[int, list[Change]]] = {}  # pending revision -> shard parts
        self.hub = WatchHub(self)
        self.leases = LeaseTable(datadir.member_id)
        self.lease_shard = shards[-1]  # lease and auth records live in the default shard's journal
        self.auth = AuthStore(self._journal_auth, config.bcrypt_cost, config.auth_token_ttl_s,
                              parse_auth_token(config.auth_token, config.auth_token_ttl_s), self._journal_token)
        self._expiry_task: asyncio.Task | None = None
        # whether keep-alives can be answered now (the shim's: not while a writer's lease is unsure)
        self.leases_answerable: Callable[[], bool] = lambda: True
        self.log = None  # where the journals live (set by open)
        self._owns_log = True
        self.follower = None  # set while this store follows another writer's journals
        self.writer_epoch = 0  # following: the newest writer epoch seen in the journals
        self.on_term: Callable[[int], None] | None = None  # told the new term when a follower sees a new writer
        # before answering a write that only read: None, or what to await first (a writer under a lease
        # that is not sure must confirm it; shim.context.Member.unsure_writer)
        self.read_guard: Callable[[], Awaitable[None] | None] | None = None
        self.follow_stats = FollowStats()
        self.watermark: WatermarkWriter | None = None  # a local journal's durable position, for local followers
        self.acknowledged = 0  # the revision up to which the last writer acknowledged writes (0: unknown)
        self.acknowledged_where = ("", "")  # where that was read, and how an operator drops it
        self._acknowledging: asyncio.Task | None = None  # a replicated journal's writer: publishes it
        self._published = 0  # the acknowledged revision last published
        self.lease_renewals = 0  # leases renewed by keep-alives (etcd_debugging_lease_renewed_total)
        self.counts = MvccCounts()
        self.on_lease_granted: Callable[[int], None] | None = None  # told each granted TTL (a histogram)
        # told each finished compaction's timings (seconds): the loop held by all its slices, each slice
        # followed by a pause (etcd's full batches), and the whole compaction
        self.on_compaction: Callable[[float, list[float], float], None] | None = None
        for state in self.states:
            state.on_failure = self._fail

    # -- lifecycle ------------------------------------------------------

    @classmethod
    async def open(cls, config: StoreConfig, log=None, follow: bool = False) -> Store:
        """Open the data dir and the journals (in ``log``, or a log of the
        config's own), recover, and start writing; with ``follow``, load what
        the journals hold and keep applying what another process writes to them
        (``follow_journals``) until ``take_over``."""
        from .recovery import recover, recover_to_follow

        datadir = DataDir.open(config.data_dir, config.layout, config.wal_dir)
        collector.store_opened()
        shards: list[Shard] = []
        owns_log = log is None
        watermark = None
        try:
            datadir.check_journal(journal_name(config))
            if log is None:
                log = await open_log(config)
            acknowledged = 0
            if isinstance(log, LocalLog) and not follow:  # before recovery touches a segment
                acknowledged = _acknowledged_before(datadir, config.journal)
                watermark = WatermarkWriter(datadir.path / WATERMARK_FILE, len(config.layout.shards),
                                            datadir.member_id, acknowledged)
            extra = {"follow": True} if follow else {}
            specs = config.layout.shards
            shard_dirs = [datadir.shard_dir(spec.name) for spec in specs]  # made (and linked to --wal-dir) once
            # opened at once: a replicated journal's are round trips to NATS (making a stream and its
            # checkpoint bucket is a few of them each), a local one's are file reads
            journals = await together(*(log.open_journal(spec.name, shard_dir, config.journal, **extra)
                                        for spec, shard_dir in zip(specs, shard_dirs)))
            for sid, (spec, shard_dir, journal) in enumerate(zip(specs, shard_dirs, journals)):
                state_dir = datadir.state_dir(config.state_dir, spec.name)
                shards.append(Shard(sid, spec.name, shard_dir, state_dir, journal))
            store = cls(config, datadir, shards)
            store.log, store._owns_log, store.watermark = log, owns_log, watermark
            if watermark is not None:
                store.acknowledged = acknowledged
                store.acknowledged_where = _watermark_where(datadir.path)
            if hasattr(log, "agree"):  # a replicated journal keeps the cluster's identity
                key = f"cluster-id.{journal_role(config.layout)}"
                datadir.adopt_cluster_id(int(await log.agree(key, str(datadir.cluster_id))))
                if hasattr(log, "put_meta"):  # replicated (a local follower checks the writer's data dir)
                    await check_journal_layout(log, config.layout)
                if not follow:
                    await store.read_acknowledged()
            if follow:
                store.follower = await recover_to_follow(store)
            else:
                await recover(store)
        except BaseException:
            for shard in shards:
                shard.state.close()
            if log is not None and owns_log:
                await log.close()
            if watermark is not None:
                watermark.close()
            datadir.close()
            collector.store_closed()
            raise
        if not follow:
            await store._start_writing()
        return store

    async def _start_writing(self) -> None:
        if self.watermark is not None:  # recovered: local followers may read up to here
            self.watermark.publish_all(self.datadir.meta["starts"], self.committed,
                                       [shard.journal.durable_tail for shard in self.shards])
        for shard in self.shards:
            shard.journal.on_durable = _durable_callback(self, shard)
            shard.journal.on_failure = self._fail
        await together(*(shard.journal.start() for shard in self.shards))  # a replicated one's cut: a round trip
        self._expiry_task = asyncio.get_running_loop().create_task(self._expire_leases())
        if hasattr(self.log, "put_meta"):
            self._acknowledging = asyncio.get_running_loop().create_task(self._publish_acknowledged())

    async def read_acknowledged(self) -> None:
        """The revision up to which the journals' last writer acknowledged writes, and where that was
        read: a replicated journal's meta bucket, where its writer (this process, or another on any
        machine) publishes it (``_publish_acknowledged``); a local writer's watermark, for a follower
        of its data dir (``acknowledged_on_disk``). 0: unknown (a writer's own local journal: read
        in ``open``)."""
        if isinstance(self.log, LocalFollowLog):
            self.acknowledged = acknowledged_on_disk(self.log.data_dir, self.log.writer_meta())
            self.acknowledged_where = _watermark_where(self.log.data_dir)
            return
        if not hasattr(self.log, "put_meta"):
            return
        key, bucket = acknowledged_key(self.config.layout), meta_bucket(self.config.jetstream.prefix)
        self.acknowledged = int(await self.log.get_meta(key) or 0)
        self.acknowledged_where = (f"key {key} of the JetStream bucket {bucket}",
                                   f"delete that key (`nats kv del {bucket} {key}`)")

    async def _publish_acknowledged(self) -> None:
        """A replicated journal's writer: the committed revision into the meta bucket, at most once
        every ACKNOWLEDGED_EVERY_S. A writer that starts later can then tell journal records that were
        acknowledged and are gone (a stream deleted or lost) from records never acknowledged, instead
        of cutting the other streams' acknowledged records above the hole (recovery)."""
        self._published = self.acknowledged
        while True:
            await asyncio.sleep(ACKNOWLEDGED_EVERY_S)
            await self._publish_committed()

    async def _publish_committed(self) -> None:
        """The committed revision, unless a later writer's is there already: a writer replaced while
        it still runs would set the new writer's back, and starts would check the journals only that
        far until the new writer commits more."""
        committed = self.committed
        if committed <= self._published:
            return
        try:
            await self.log.raise_meta(acknowledged_key(self.config.layout), committed)
            self._published = committed
        except Exception as exc:  # noqa: BLE001 - NATS away: the writes wait too; tried again next time
            logger.debug("acknowledged revision not published rev=%d error=%s", committed, exc)

    # -- following another writer ------------------------------------------

    async def follow_journals(self) -> None:
        """Apply what the writer stores, as it is stored, until cancelled; raises
        (JournalGap, FollowerDiverged, JournalCorrupt) when the state must be rebuilt."""
        follower = self.follower

        async def follow(sid: int, shard: Shard) -> None:
            await shard.journal.follow(lambda msg: follower.on_message(sid, msg), self._covered_by_checkpoint(shard))

        tasks = [asyncio.create_task(follow(sid, shard)) for sid, shard in enumerate(self.shards)]
        tasks.append(asyncio.create_task(follower.run()))  # a write of many changes, applied in steps
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            await cancel_and_wait(*tasks)

    @staticmethod
    def _covered_by_checkpoint(shard: Shard) -> Callable[[int, int], Awaitable[bool]]:
        """Whether messages released before this store read them are in the checkpoint it loaded
        (no newer checkpoint released them). Messages are released only once a checkpoint holds
        them: with none in the bucket (or a listing that missed it) they are not covered, and the
        caller rebuilds from the checkpoints rather than skip them."""
        async def covered(expected: int, got: int) -> bool:
            return 0 < await shard.journal.newest_checkpoint_rev() <= shard.checkpoint_rev

        return covered

    async def _catch_up_with_checkpoints(self) -> None:
        """Before a takeover: a follower that fell behind the journals' checkpoints (messages it
        had not read were released, a newer checkpoint holds them) rebuilds its state from the
        newest checkpoints first, as a follower does when it finds the gap itself; taking over
        from the state it has would cut every revision in the gap, acknowledged writes included."""
        from .resync import resync

        for attempt in range(1, 4):
            gap = None
            for shard in self.shards:
                found = await shard.journal.unread_gap()  # a replicated journal: only those are taken over
                if found is not None and not await self._covered_by_checkpoint(shard)(*found):
                    gap = JournalGap(shard.journal.stream, *found)
                    break
            if gap is None:
                return
            logger.warning("behind the journals' checkpoints at takeover, rebuilding the state first error=%s", gap)
            await resync(self, gap)
        raise gap

    async def take_over(self) -> int:
        """Become the writer of the journals this store follows (the caller holds
        the writer lease): fence each journal after what was read, apply what
        was stored meanwhile, cut what is not whole (recorded in every journal),
        and start writing.  Returns the revision taken over at."""
        from .recovery import check_acknowledged, settle_leases
        from .resync import resync

        started = time.monotonic()
        for attempt in range(1, TAKEOVER_TRIES + 1):
            await self._catch_up_with_checkpoints()
            try:
                await self._fence_journals_after_what_was_read()
                break
            except JournalGap as gap:  # released under the tail's read: by the writer being replaced, still running
                if attempt == TAKEOVER_TRIES:
                    raise
                logger.warning("journal released under the takeover's read, rebuilding the state first attempt=%d "
                               "error=%s", attempt, gap)
                for shard in self.shards:  # every one is read again by the rebuild, and fenced again after it
                    shard.journal.following = True
                await resync(self, gap)
        follower = self.follower
        rev = follower.advance()  # a revision half applied in steps, and what is whole after it, applied
        await self.read_acknowledged()  # (a standby's journals are replicated: their meta bucket's word)
        check_acknowledged(self, rev)  # before anything is cut
        dropped = follower.pending()
        for shard in self.shards:
            shard.journal.truncate_after(rev)
        if dropped:
            logger.warning("discarded records that were not whole on every shard records=%d above_rev=%d", dropped, rev)
        self.follower = None
        self.rev = self.committed = rev
        settle_leases(self)
        await self._start_writing()
        logger.warning("took over as the writer rev=%d seconds=%.3f", rev, time.monotonic() - started)
        return rev

    async def _fence_journals_after_what_was_read(self) -> None:
        """Each journal fenced after its last message read, what was stored before the fence applied
        (JournalGap if some of it was released unread: the state loaded does not hold it)."""
        follower = self.follower
        for sid, shard in enumerate(self.shards):
            await shard.journal.take_over(lambda msg, sid=sid: follower.on_message(sid, msg),
                                          self._covered_by_checkpoint(shard))

    async def fence_journals(self) -> None:
        """A writer that took its lapsed writer lease again: fence every journal again after
        what it stored (JournalFenced, and fail-stop, if another process appended meanwhile)."""
        await asyncio.gather(*(shard.journal.fence_again() for shard in self.shards))

    async def close(self) -> None:
        self.hub.close()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        # (both await the journal, and a cancel can be lost in NATS's waits: journal/tasks.py)
        await cancel_and_wait(self._expiry_task, self._acknowledging)
        if self._acknowledging is not None and self.failure is None:  # a clean stop: the last second's too
            try:
                async with asyncio.timeout(ACKNOWLEDGED_EVERY_S):
                    await self._publish_committed()
            except TimeoutError:
                pass
        await cancel_and_wait(self._compaction)
        for shard in self.shards:
            await shard.close()
        if self._owns_log:
            await self.log.close()
        if self.watermark is not None:
            self.watermark.close()
        self.datadir.close()
        collector.store_closed()

    @property
    def term(self) -> int:
        """etcd's raft term: with a replicated journal, from the writer's epoch (it
        grows with every takeover; a follower's from the newest writer it has seen, so
        every member reports the writer's term, as etcd's members report one term);
        else the data dir's (+1 per restart)."""
        epoch = getattr(self.log, "epoch", 0) or self.writer_epoch
        return epoch + 1 if epoch else self.datadir.term

    def saw_writer_epoch(self, epoch: int) -> None:
        """Following: the journals carry records of writer ``epoch``."""
        if epoch > self.writer_epoch:
            self.writer_epoch = epoch
            if self.on_term is not None:
                self.on_term(self.term)

    def db_size(self) -> int:
        """Like etcd's backend file size: the most row bytes held since the last
        defragment (space freed by compaction is reused, but only a
        defragment gives it back), over what a fresh etcd's file holds."""
        return EMPTY_BACKEND_BYTES + sum(map(_BYTES_HIGH, self.states))  # (every write's quota asks)

    def db_size_in_use(self) -> int:
        """Row bytes held now, history included, over what a fresh etcd's file uses."""
        return EMPTY_BACKEND_IN_USE + sum(s.bytes_in_use for s in self.states)

    def checkpoint_extra(self, shard: Shard, rev: int) -> bytes:
        """What ``shard``'s checkpoint at ``rev`` keeps beside its rows: the
        lease and auth tables, on the default shard."""
        if shard is not self.lease_shard:
            return b""
        return encode_extra_meta(self.leases.encode_table(rev), self.auth.encode_table())

    @property
    def compacted_through(self) -> int:
        """The highest compaction whose rows are all gone (-1: none yet); below
        ``compact_rev`` while a compaction is under way."""
        return self._compacted_through

    def lease_exists(self, lease_id: int) -> bool:
        return lease_id in self.leases

    # -- reads ----------------------------------------------------------

    def range(self, req: RangeReq) -> RangeResult:
        if self.failure is not None and isinstance(self.failure, StateStoreError):
            raise StoreFailedError(str(self.failure))  # the index may no longer match the rows
        self.counts.ranges += 1
        return range_at(self, req, self.committed)

    @property
    def reads_in_flight(self) -> int:
        """Reads served in slices that have not ended: the only reads open between two loop turns
        (etcd_mvcc_db_open_read_transactions)."""
        return sum(self._reads.values())

    async def range_async(self, req: RangeReq, current: int | None = None) -> RangeResult:
        """``range``, yielding to the event loop between slices of a large read;
        ``current``: the revision to read as the latest (a follower's read index),
        at most the committed revision.

        While a read that yielded is in flight, compaction does not go past its
        revision (the rows it is about to fetch stay)."""
        if self.failure is not None and isinstance(self.failure, StateStoreError):
            raise StoreFailedError(str(self.failure))
        self.counts.ranges += 1
        current = self.committed if current is None else min(current, self.committed)
        if not req.range_end:
            return range_key(self, req, current)
        rev = req.revision if req.revision > 0 else current
        return await self._in_slices(range_steps(self, req, current), rev)

    async def in_slices(self, steps: Steps[T]) -> T:
        """Run ``steps`` that read nothing of the store (encoding a large answer, say) in
        slices of about ``slice_ms``, yielding to the event loop between them."""
        return await self._in_slices(steps, None)

    async def _in_slices(self, steps: Steps[T], hold: int | None) -> T:
        """Run a read's ``steps``, yielding to the event loop between slices of about
        ``slice_ms``. While it has yielded, compaction does not go past ``hold`` (the
        rows it is about to fetch stay), and it counts as a read in flight; None: neither."""
        slice_s = self.config.slice_ms / 1000
        deadline = time.perf_counter() + slice_s
        held = False
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as stop:
                    return stop.value
                if time.perf_counter() >= deadline:
                    if not held and hold is not None:
                        held = True
                        self.hold_compaction(hold)
                    await self._pause()
                    deadline = time.perf_counter() + slice_s
        finally:
            if held:
                self.release_compaction(hold)

    def hold_compaction(self, rev: int) -> None:
        """Compaction goes no further than ``rev`` until ``release_compaction(rev)``: rows at
        or below it that a read in slices (or a watch delivery) is about to fetch stay."""
        self._reads[rev] += 1

    def release_compaction(self, rev: int) -> None:
        self._reads[rev] -= 1
        if not self._reads[rev]:
            del self._reads[rev]
        self._reads_done.set()

    # -- writes ---------------------------------------------------------

    # The three writes test the failure and the gate inline (no call, no coroutine
    # when nothing is wrong): they are the per-request path.

    async def put(self, req: PutReq) -> PutResult:
        if self.failure is not None:
            self._check_alive()
        if req.lease and self._grants_in_flight:
            await self._grants_durable((req.lease,))
        if self._gate is not None:
            await self._gate_open()
        w = WriteTxn(self)
        w.check_put(req)
        result = w.put(req)
        if w.ops > 1:  # it read the previous value: etcd counts a txn (counts.py)
            self.counts.txns += 1
        await self.wait_committed(self._append(w))
        return result

    async def put_many(self, reqs: Sequence[PutReq]) -> list[PutResult | Exception]:
        """Puts that arrived together (shim.handlers.batched), each its own revision, in order, and
        waited for as one: committed once the last is. A put its checks refuse (an unknown lease, a
        missing key for ignore_value) has that error in its place and takes no revision; an error
        of the store itself (failed, timed out) is raised for all."""
        if self.failure is not None:
            self._check_alive()
        if self._grants_in_flight:
            await self._grants_durable([req.lease for req in reqs if req.lease])
        if self._gate is not None:
            await self._gate_open()
        results: list[PutResult | Exception] = []
        rev = 0
        for req in reqs:
            w = WriteTxn(self)
            try:
                w.check_put(req)
            except REFUSALS as exc:
                results.append(exc)
                continue
            results.append(w.put(req))
            if w.ops > 1:  # it read the previous value: etcd counts a txn (counts.py)
                self.counts.txns += 1
            rev = self._append(w)
        if rev:
            await self.wait_committed(rev)
        return results

    async def delete_range(self, req: DeleteReq) -> DeleteResult:
        if self.failure is not None:
            self._check_alive()
        if self._gate is not None:
            await self._gate_open()
        w = WriteTxn(self)
        return await self._run(w, w.delete_steps(req))

    async def txn(self, req: TxnReq) -> TxnResult:
        if self.failure is not None:
            self._check_alive()
        if self._grants_in_flight:
            await self._grants_durable(_txn_leases(req))
        if self._gate is not None:
            await self._gate_open()
        writes = single_key_writes(req)
        if writes is None:
            w = WriteTxn(self)
            if is_write(req):
                return await self._run(w, w.txn_steps(req))
            return await self._read_only_txn(w, req)
        w, result, rev = self._txn_now(req, writes)
        await self._answerable(w, rev)
        return result

    async def _read_only_txn(self, w: WriteTxn, req: TxnReq) -> TxnResult:
        """A txn of compares and ranges only, in slices as a Range is: beside writes, not
        holding them back as a write's slices do. Every read is at the revision it began at
        (or an op's own), compaction held at the oldest of them while it has yielded."""
        oldest = min([w.rev - 1, *(op.revision for op in (*req.success, *req.failure) if op.revision > 0)])
        try:
            result = await self._in_slices(w.txn_steps(req), oldest)
        finally:
            w.end_metrics_txn()
        await self._answerable(w, w.rev - 1)
        return result

    async def txn_many(self, reqs: Sequence[TxnReq]) -> list[TxnResult | Exception]:
        """Txns that arrived together, as put_many: those on one key each (single_key_writes) run at
        once, in order, and are waited for as one; any other runs as ``txn`` runs it, beside them,
        with whatever it raises in its place. A txn its checks refuse has that error in its place;
        an error of the store itself is raised for all."""
        if self.failure is not None:
            self._check_alive()
        if self._grants_in_flight:
            await self._grants_durable([lease for req in reqs for lease in _txn_leases(req)])
        if self._gate is not None:
            await self._gate_open()
        results: list = []
        others = []
        rev = None
        read_only = False
        for req in reqs:
            writes = single_key_writes(req)
            if writes is None:
                others.append((len(results), req))
                results.append(None)
                continue
            try:
                w, result, rev_w = self._txn_now(req, writes)
            except REFUSALS as exc:
                results.append(exc)
                continue
            results.append(result)
            rev = rev_w  # revisions only grow: a read-only txn's is the latest
            read_only = read_only or not w.sub
        if others:
            done = await asyncio.gather(*(self.txn(req) for _, req in others), return_exceptions=True)
            for (i, _), result in zip(others, done):
                results[i] = result
        if rev is not None:
            await self.wait_committed(rev)
            if read_only and self.read_guard is not None and (unsure := self.read_guard()) is not None:
                await unsure
        return results

    def _txn_now(self, req: TxnReq, writes: bool) -> tuple[WriteTxn, TxnResult, int]:
        """A txn on one key each (single_key_writes gave ``writes``) run and journaled at once:
        its write txn, its result and the revision to wait for."""
        w = WriteTxn(self)
        try:
            result = w.txn_now(req, writes)
            rev = self._append(w)
        finally:
            w.end_metrics_txn()
        return w, result, rev

    async def _pause(self) -> None:
        """Between two slices of long work: let the loop run what else is ready, turn after
        turn (a gRPC call takes several), until two turns in a row found next to nothing to do
        or ``pause_ms`` has passed. A fixed sleep kept the work waiting on an idle loop: a
        lease revoked with 50,000 keys spent half its time (and other writes' wait) asleep."""
        now = time.perf_counter()
        end = now + self.config.pause_ms / 1000
        idle = 0
        while idle < 2 and now < end:
            before = now
            await asyncio.sleep(0)
            now = time.perf_counter()
            idle = idle + 1 if now - before < IDLE_TURN_S else 0

    async def _gate_open(self) -> None:
        """Wait while a sliced write holds every other write back."""
        while self._gate is not None:
            await asyncio.shield(self._gate)

    async def _run(self, w: WriteTxn, steps: Steps[T]) -> T:
        """Run a write's steps, journal it and wait for its commit.

        A write that takes longer than a slice (a compare or a delete over a
        large range) closes the write gate, so no other write or compaction
        step changes the state it is reading, and yields to the event loop
        between slices: reads, keep-alives and watches keep flowing, as the
        loop never waits longer than a slice for it.  The gate opens once the
        write is journaled (its revision taken)."""
        slice_s = self.config.slice_ms / 1000
        deadline = time.perf_counter() + slice_s
        gate = None
        cancelled = False
        try:
            while True:
                try:
                    next(steps)
                except StopIteration as stop:
                    result = stop.value
                    break
                if time.perf_counter() >= deadline:
                    if gate is None:
                        gate = self._gate = asyncio.get_running_loop().create_future()
                    w.encode_ahead()  # its journal record so far, rather than all of it at the end
                    try:
                        await self._pause()
                    except asyncio.CancelledError:
                        # the caller went away, but changes are in the state
                        # already: finish and journal them, or the revision
                        # would be handed out twice
                        cancelled = True
                    self._check_alive()
                    deadline = time.perf_counter() + slice_s
            rev = self._append(w)
        finally:
            w.end_metrics_txn()
            if gate is not None:
                self._gate = None
                gate.set_result(None)
        if cancelled:
            raise asyncio.CancelledError
        await self._answerable(w, rev)
        return result

    async def _answerable(self, w: WriteTxn, rev: int) -> None:
        """Until the journaled write ``w`` (revision ``rev``) may be answered: committed, and if it
        only read (a compare failed, nothing to delete), confirmed as a linearizable read."""
        await self.wait_committed(rev)
        if not w.sub and self.read_guard is not None and (unsure := self.read_guard()) is not None:
            await unsure

    async def compact(self, rev: int, physical: bool = False) -> int:
        """etcd's Compact; returns the header revision."""
        self._check_writable()
        if rev <= self.compact_rev:
            raise CompactedError
        if rev > self.committed:
            raise FutureRevisionError
        self.compact_rev = rev
        tag = self.rev
        for shard in self.shards:
            shard.append_compact(tag, rev)
        header = self.committed
        await self._synced_then_committed(tag, together(*(s.journal.sync() for s in self.shards)))
        self.counts.ranges += 1  # etcd reads the key "compaction" for the answer's header
        task = self._start_compaction()
        if physical:
            await asyncio.shield(task)
        return header

    @property
    def pending_writes(self) -> int:
        """Revisions journaled but not yet committed on every shard they touch."""
        return len(self._pending)

    def _check_alive(self) -> None:
        if self.failure is not None:
            raise StoreFailedError(str(self.failure))

    def _check_writable(self) -> None:
        """Alive, and the writer: a follower's state is what the writer's journals say, so
        nothing is written here (it would show reads a revision no journal holds)."""
        self._check_alive()
        if self.follower is not None:
            raise NotTheWriterError

    def _append(self, w: WriteTxn) -> int:
        """Hand each shard its part of ``w``; return the revision to wait for."""
        if not w.sub:
            return self.rev  # read-only: wait until what it read is committed
        rev = w.rev
        self.rev = rev
        participants = tuple(w.parts) if len(w.parts) == 1 else tuple(sorted(w.parts))
        try:
            for i, sid in enumerate(participants):
                if i:
                    failpoints.hit("store.between_txn_parts")
                self.shards[sid].append_write(rev, participants, w.parts[sid],
                                              None if w.ahead is None else w.ahead.get(sid))
        except Exception as exc:  # the state holds a write its journals did not all take: nothing after
            self._fail(exc)  # it could commit, so fail-stop rather than time every later write out
            raise StoreFailedError(str(exc)) from exc
        self._pending[rev] = len(participants)
        self._changes[rev] = w.parts
        return rev

    # -- commit tracking ------------------------------------------------

    def wait_committed(self, rev: int) -> asyncio.Future:
        loop = asyncio.get_running_loop()  # once: on CPython 3.11 each call is a getpid() system call
        fut = loop.create_future()
        if self.failure is not None:
            fut.set_exception(StoreFailedError(str(self.failure)))
        elif rev <= self.committed:
            fut.set_result(None)
        else:
            self._waiter_seq += 1
            heapq.heappush(self._waiters, (rev, self._waiter_seq, fut))
            # one timer for every waiter (they all wait request_timeout_s), not one each
            deadlines = self._deadlines
            while deadlines and deadlines[0][1].done():
                deadlines.popleft()
            deadlines.append((loop.time() + self.config.request_timeout_s, fut))
            if self._deadline_timer is None:
                self._deadline_timer = loop.call_at(deadlines[0][0], self._time_out_waiters)
        return fut

    def _time_out_waiters(self) -> None:
        """etcd's "request timed out" for waiters past their deadline; re-armed for the next one."""
        self._deadline_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= now or deadlines[0][1].done()):
            fut = deadlines.popleft()[1]
            if not fut.done():
                fut.set_exception(RequestTimeoutError())
                fut.exception()  # retrieved: the caller may be gone
                self.proposals_failed += 1
        if deadlines:
            self._deadline_timer = loop.call_at(deadlines[0][0], self._time_out_waiters)

    def _durable(self, shard: Shard, seq: int) -> None:
        inflight, pending = shard.inflight, self._pending
        while inflight and inflight[0][0] <= seq:
            rev = inflight.popleft()[1]
            pending[rev] -= 1
        c = self.committed
        while pending.get(c + 1, -1) == 0:
            c += 1
            del pending[c]
        if c == self.committed:
            return
        first = self.committed + 1
        self.committed = c
        self.leases.settle(c)
        if self.hub.active:
            self.hub.notify(self._committed_changes(first, c), c)
        else:
            for rev in range(first, c + 1):
                del self._changes[rev]
        self._release_waiters(c)
        if shard.wants_checkpoint(self.config.checkpoint_journal_bytes):
            shard.start_checkpoint(c, self.compact_rev, self.checkpoint_extra(shard, c))

    def _release_waiters(self, committed: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= committed:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)

    def _committed_changes(self, first: int, last: int) -> list[tuple[int, int, Change]]:
        """(rev, shard id, change) of revisions first..last in (rev, sub) order; forgets them."""
        out: list[tuple[int, int, Change]] = []
        pop = self._changes.pop
        for rev in range(first, last + 1):
            parts = pop(rev)
            if len(parts) == 1:
                ((sid, changes),) = parts.items()
                out.extend((rev, sid, ch) for ch in changes)
            else:
                merged = sorted(((ch.sub, sid, ch) for sid, changes in parts.items() for ch in changes), key=lambda t: t[0])
                out.extend((rev, sid, ch) for _, sid, ch in merged)
        return out

    def _fail(self, exc: BaseException) -> None:
        """Fail-stop (DESIGN.md invariant 7): a journal or state-store error
        ends acknowledgements; a state-store error also ends reads and watches,
        since the in-memory index may no longer match the rows."""
        if self.failure is not None:
            return
        self.failure = exc
        source = self.failure_source
        logger.critical("%s failure, no longer acknowledging writes error=%s", source, exc)
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(StoreFailedError(str(exc)))
                fut.exception()  # retrieved: the caller may be gone
        self._waiters.clear()
        if source == "state":
            self.hub.close()
        if self.on_failure is not None:
            self.on_failure(exc)

    @property
    def failure_source(self) -> str | None:
        """What stopped the store: "state", "journal", or None while healthy."""
        if self.failure is None:
            return None
        return "state" if isinstance(self.failure, StateStoreError) else "journal"

    # -- maintenance ----------------------------------------------------

    def hash_kv(self, rev: int) -> tuple[int, int]:
        from .hashkv import hash_kv

        return hash_kv(self, rev)

    async def hash_kv_async(self, rev: int) -> tuple[int, int]:
        """``hash_kv``, yielding to the event loop between slices (hashing a million rows
        takes seconds). Meanwhile no compaction drops a row: the hash covers history."""
        from .hashkv import hash_kv_steps

        return await self._in_slices(hash_kv_steps(self, rev), self.compact_rev - 1)

    async def defragment(self) -> None:
        """Give back the space of deleted and compacted rows (RocksDB flush + full compaction)."""
        self._check_alive()
        for state in self.states:
            try:
                await asyncio.to_thread(state.defragment)
            except StateStoreError as exc:
                self._fail(exc)
                raise StoreFailedError(str(exc)) from exc

    # -- leases ---------------------------------------------------------

    async def lease_grant(self, lease_id: int, ttl: int) -> tuple[int, int, int]:
        """etcd's LeaseGrant; returns (id, granted TTL, header revision)."""
        self._check_writable()
        if ttl > MAX_TTL_S:
            raise LeaseTTLTooLargeError
        if lease_id == 0:
            lease_id = self.leases.new_id()
        elif lease_id in self.leases:
            raise LeaseExistsError
        lease = self.leases.grant(lease_id, ttl, tag=self.rev)
        self.counts.leases_granted += 1
        if self.on_lease_granted is not None:
            self.on_lease_granted(lease.ttl)
        durable = self._grants_in_flight[lease_id] = asyncio.get_running_loop().create_future()
        try:
            await self._journal_lease(encode_lease_record(GRANT, lease_id, lease.ttl))
        finally:
            if self._grants_in_flight.get(lease_id) is durable:
                del self._grants_in_flight[lease_id]
            durable.set_result(None)
        return lease_id, lease.ttl, self.committed

    async def _grants_durable(self, lease_ids) -> None:
        """Wait until the grants of these leases are durable, if they are on their way.

        A write attaching keys to a lease must not reach disk before the
        lease's grant: a crash in between would leave keys held by a lease that
        never existed, which never expire.  Only a client-chosen lease id can be
        named before its grant is acknowledged.
        """
        for lease_id in lease_ids:
            durable = self._grants_in_flight.get(lease_id)
            if durable is not None:
                await asyncio.shield(durable)

    async def lease_revoke(self, lease_id: int) -> int:
        """Delete every key the lease holds, in one revision, then forget the
        lease; returns the header revision.

        The revocation and its deletions are one unit: the REVOKE record is
        tagged with the deletions' revision R and written to the lease shard's
        journal just before that shard's part of R (empty if it holds none of
        the keys), so R is recovered only with the record, and the record is
        replayed only with R.  A lease without keys makes no revision."""
        self._check_writable()
        await self._gate_open()
        lease = self.leases.leases.get(lease_id)
        if lease is None:
            raise LeaseNotFoundError
        record = encode_lease_record(REVOKE, lease_id)
        self.counts.leases_revoked += 1
        if not lease.keys:
            self.leases.remove(lease_id, tag=self.rev)
            await self._journal_lease(record)
            return self.committed
        w = WriteTxn(self)

        def steps() -> Steps[None]:
            keys, runs = list(lease.keys), []
            for i in range(0, len(keys), SORT_RUN):  # in key order, sorted in steps (at once, 50,000
                runs.append(sorted(keys[i : i + SORT_RUN]))  # keys held the event loop ~30 ms)
                yield
            for i, key in enumerate(heapq.merge(*runs), 1):
                w.delete_key(key)
                if not i % STEP_KEYS:
                    yield
            self.leases.remove(lease_id, tag=w.rev)
            w.parts.setdefault(self.lease_shard.sid, [])
            self.lease_shard.append_lease(w.rev, record)  # just before the parts of w.rev

        await self._run(w, steps())
        return self.committed

    async def _journal_lease(self, payload: bytes) -> None:
        await self._journal_meta(self.lease_shard.append_lease, payload)

    async def _journal_auth(self, payload: bytes) -> None:
        self._check_writable()
        await self._journal_meta(self.lease_shard.append_auth, payload)

    def _journal_token(self, payload: bytes) -> Awaitable[None]:
        """Append a TOKEN record now; the awaitable ends once it is durable."""
        self._check_writable()
        tag = self.rev
        self.lease_shard.append_token(tag, payload)
        return self._synced_then_committed(tag, self.lease_shard.journal.sync())

    async def _journal_meta(self, append: Callable[[int, bytes], None], payload: bytes) -> None:
        """Journal a LEASE or AUTH record and wait until it and every revision before it are durable."""
        tag = self.rev
        append(tag, payload)
        await self._synced_then_committed(tag, self.lease_shard.journal.sync())

    async def _synced_then_committed(self, tag: int, synced: Awaitable[None]) -> None:
        """Await ``synced`` (journal syncs: what was appended is durable), then revision ``tag``
        committed. A journal that failed instead (fail-stop) is answered as every write then is
        ("server stopped")."""
        try:
            await synced
        except JournalFailed as exc:
            raise StoreFailedError(str(exc)) from exc
        await self.wait_committed(tag)

    def lease_renew(self, lease_id: int) -> int:
        ttl = self.leases.renew(lease_id)
        if ttl:  # etcd counts the leases renewed, not the keep-alives of unknown ones
            self.lease_renewals += 1
        return ttl

    async def _expire(self, lease_id: int) -> int:
        """Revoke an expired lease. Its revoke runs in steps, maybe behind other writes: a
        keep-alive meanwhile is answered not found, as etcd answers one for an expired lease
        (renewed and answered with its TTL, the lease was gone a moment later all the same)."""
        lease = self.leases.leases.get(lease_id)
        if lease is not None:
            lease.expiring = True
        try:
            return await self.lease_revoke(lease_id)
        finally:
            if lease is not None:
                lease.expiring = False  # a revoke that failed: the next tick tries again

    async def _expire_leases(self, interval_s: float = 0.5, per_tick: int = 500) -> None:
        """Revoke expired leases; at most ``per_tick`` per tick, so a mass expiry
        is spread out instead of stalling the server (etcd: 1,000/s).

        A tick that comes late by more than a tick means the event loop was
        held (a long request, a pause of the process) or the revokes of the tick
        before waited that long on the journal: keep-alives may not have been
        answered meanwhile, so that time is given back to every lease before
        anything is expired, as etcd extends leases after a leader change.  So
        is the time keep-alives were refused (``leases_answerable``: a writer
        whose lease NATS could not confirm, e.g. while JetStream had no
        quorum), where etcd, without a leader, expires nothing either."""
        loop = asyncio.get_running_loop()
        refused_since: float | None = None
        due = loop.time() + interval_s
        while True:
            # from the tick before: time spent waiting on that tick's revokes counts as late too (the
            # journal stalled, as when JetStream has no quorum: keep-alives are refused meanwhile)
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            late, due = now - due, now + interval_s
            if late > interval_s:
                self.leases.extend_all(late)
                logger.warning("lease expiry ran late, lease deadlines extended seconds=%.3f", late)
                continue
            if not self.leases_answerable():
                if refused_since is None:  # counted from this tick: a moment of it between two ticks is not
                    refused_since = loop.time()
                continue
            if refused_since is not None:
                refused, refused_since = loop.time() - refused_since, None
                self.leases.extend_all(refused)
                logger.warning("keep-alives could not be answered, lease deadlines extended seconds=%.3f", refused)
                continue
            expired = self.leases.expired(per_tick)
            if not expired or self.failure is not None:
                continue
            results = await asyncio.gather(*(self._expire(i) for i in expired), return_exceptions=True)
            for lease_id, r in zip(expired, results):
                if not isinstance(r, BaseException):
                    self.counts.leases_expired += 1
                elif not isinstance(r, LeaseNotFoundError):
                    logger.warning("lease expiry failed lease=%x error=%r", lease_id, r)

    # -- compaction -----------------------------------------------------

    async def compacted(self, rev: int) -> None:
        """Until the compaction under way here has physically dropped history up to ``rev``
        (a follower's answer to a physical Compact it forwarded, once it has read the record)."""
        if self.compact_rev >= rev > self._compacted_through:
            await asyncio.wait({self._start_compaction()})  # a failed or cancelled compaction ends the wait too

    def _start_compaction(self) -> asyncio.Task:
        if self._compaction is None or self._compaction.done():
            self._compaction = asyncio.get_running_loop().create_task(self._compact_loop())
        return self._compaction

    async def _compact_loop(self) -> None:
        """Drop history up to compact_rev, shard by shard, in slices of about
        ``slice_ms`` that yield to the event loop between them."""
        slice_s = self.config.slice_ms / 1000
        while self._compacted_through < self.compact_rev:
            target = self.compact_rev
            began = time.perf_counter()
            held, paused = 0.0, []
            for state in self.states:
                while True:
                    await self._gate_open()  # a sliced write may be walking the keys
                    while self._reads and min(self._reads) < target:  # nor rows a sliced read will fetch
                        self._reads_done.clear()
                        await self._reads_done.wait()
                    start = time.perf_counter()
                    done = state.compact_slice(target, start + slice_s)
                    took = time.perf_counter() - start
                    held += took
                    if done:
                        break
                    paused.append(took)
                    await self._pause()
            self._compacted_through = target
            self.counts.compacted_at = int(time.time())
            if self.on_compaction is not None:
                self.on_compaction(held, paused, time.perf_counter() - began)
            logger.info("compaction finished rev=%d", target)


def journal_role(layout: Layout) -> str:
    """Which writer's journals these are: the default shard's name (a partition's name under ``cluster``)."""
    return layout.shards[-1].name


def acknowledged_key(layout: Layout) -> str:
    """The meta bucket's key for the revision a replicated journal's writer acknowledged writes up to."""
    return f"acknowledged.{journal_role(layout)}"


def layout_key(layout: Layout) -> str:
    """The meta bucket's key for the shard layout the journals of a role were written with."""
    return f"layout.{journal_role(layout)}"


async def check_journal_layout(log, layout: Layout) -> None:
    """The layout a replicated journal's first process recorded (``Layout.describe``; a restore
    records its own) must be this one: with another, keys would be looked for in streams that do
    not hold them, and the resources of a stream no shard reads any more would be answered as
    absent. Recorded by the first process to ask (as the cluster id)."""
    written = await log.agree(layout_key(layout), layout.describe())
    if written != layout.describe():
        raise DataDirError(f"the journals of {journal_role(layout)} ({log.config.prefix}) were written with the shard "
                           f"layout {written} (shard, resources), not {layout.describe()}: moving keys between shards "
                           "is not supported. Start with the layout they were written with (--shard-layout), or take "
                           "a snapshot and restore it into the new layout under a new --journal-prefix")


def journal_name(config: StoreConfig) -> str:
    """What the data dir records as its journal: "local", or the JetStream stream prefix."""
    return "local" if config.jetstream is None else f"nats:{config.jetstream.prefix}"


async def open_log(config: StoreConfig):
    """The journals' home: local segment dirs, or a connection to JetStream."""
    if config.jetstream is None:
        return LocalLog()
    from journal.jetstream import JetStreamLog

    return await JetStreamLog(config.jetstream).connect()


def _txn_leases(req: TxnReq):
    """Lease ids named by the puts of a txn, both branches, nested txns included."""
    for op in (*req.success, *req.failure):
        if isinstance(op, PutReq):
            if op.lease:
                yield op.lease
        elif isinstance(op, TxnReq):
            yield from _txn_leases(op)


def _watermark_where(data_dir: Path) -> tuple[str, str]:
    """``Store.acknowledged_where`` for a local writer's watermark in ``data_dir``."""
    path = data_dir / WATERMARK_FILE
    return f"the writer's watermark {path}", f"delete {path}"


def _acknowledged_before(datadir: DataDir, journal: JournalConfig) -> int:
    """What the last writer of this data dir acknowledged (``acknowledged_on_disk``), read before
    this start's journal policy is recorded in its place."""
    acknowledged = acknowledged_on_disk(datadir.path, datadir.meta)
    if datadir.meta.get("journal_fsync") != journal.fsync:
        datadir.meta["journal_fsync"] = journal.fsync
        datadir.save_meta()
    return acknowledged


def _durable_callback(store: Store, shard: Shard) -> Callable[[int], None]:
    if store.watermark is None:
        return lambda seq: store._durable(shard, seq)
    publish, journal, sid = store.watermark.durable, shard.journal, shard.sid

    def durable(seq: int) -> None:  # then tell local followers: a few stores into shared memory
        store._durable(shard, seq)
        publish(store.committed, sid, *journal.durable_tail)

    return durable
