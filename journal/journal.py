"""Journal: an append-only, segmented, group-committed log of opaque records.

Lifecycle:
    j = Journal.open(directory, config)   # sync: scan, repair a torn tail
    for r in j.records(after_rev): ...    # replay what was found at open()
    j.truncate_after(rev)                 # optional, only before start()
    await j.start()                       # one writer thread owns the file
    seq = j.append(rtype, rev, payload)   # non-blocking, from the event loop
    await j.sync()                        # wait for durability
    await j.close()

Sequence numbers restart at 1 with every open(): they number this process's
appends, not records on disk. durable_seq starts at 0.

The append queue is unbounded: append() never blocks. Callers that need
backpressure should watch `queued_bytes` (or await sync()).

Failure is fail-stop: when a write or fsync fails the journal never retries on
that fd and never acknowledges anything again; on_failure is called once and
every pending or later append()/sync() raises JournalFailed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from pathlib import Path
from queue import SimpleQueue
from typing import Callable, Iterator

import aiofiles.os

from journal import failpoints
from journal.appender import Appender
from journal.checkpoint import Checkpoint, load_latest_checkpoint, write_checkpoint
from journal.config import JournalConfig
from journal.errors import JournalCorrupt, JournalFailed
from journal.fsutil import ensure_dir, fsync_dir
from journal.reader import iter_frames
from journal.record import HEADER_BYTES, FrameError, Record
from journal.recovery import recover, truncate_segments
from journal.segment import RELEASED_FILE, SegmentInfo, write_released
from journal.writer import PendingRecord, SegmentWriter

logger = logging.getLogger(__name__)


def _call(fn: Callable, *args: object) -> object:
    return fn(*args)


_in_thread = aiofiles.os.wrap(_call)


INLINE_FSYNC_MAX_S = 0.001  # a batch written inline holds the event loop this long at most (see _write_inline)


class Journal(Appender):
    """One journal directory. Create with Journal.open()."""

    def __init__(self, directory: Path, config: JournalConfig, segments: list[SegmentInfo]) -> None:
        super().__init__(str(directory), _last_rev(segments))
        self.directory = directory
        self.config = config
        self._segments = segments
        self._replay = list(segments)
        # records read by the open scan, by segment path, for the first replay (see open's keep_records)
        self._kept: dict[Path, list[Record]] = {}
        self._queue: deque[PendingRecord] = deque()
        self._writer: SegmentWriter | None = None
        self._idle = False  # the writer thread is (about to be) asleep in _kick.get()
        self._kick: SimpleQueue[None] = SimpleQueue()
        # Whoever writes (the writer thread, or the loop inline) holds this; batches taken by
        # the thread and batches acknowledged on the loop are counted apart (each side counts its own).
        self._write_lock = threading.Lock()
        self._taken = 0
        self._acked = 0
        self._lone = False  # the last batch was one record, nothing else came meanwhile, its fsync was quick
        self._inline_due = False  # a _write_inline is scheduled on the loop
        self.inline_writes = config.inline_lone_writes and config.fsync != "batch"
        # may the loop be held for a write now? (the server: no other call is being handled)
        self.inline_gate: Callable[[], bool] | None = None

    # ----------------------------------------------------------------- open / replay

    @classmethod
    def open(cls, directory: Path, config: JournalConfig = JournalConfig(), keep_records: bool = False) -> Journal:
        """Scan `directory` (created if missing); repair a torn tail; raise JournalCorrupt on damage.

        With `keep_records`, the records the scan read stay in memory for the first
        `records()` over each segment (a start replays what it opened: the scan
        checks and reads every frame anyway, so they are not read twice); they go
        as that replay passes them, or at `truncate_after`/`start`."""
        directory = Path(directory)
        ensure_dir(directory)
        kept: dict[Path, list[Record]] | None = {} if keep_records else None
        segments = recover(directory, config, kept)
        if segments and segments[0].seq == 0 and not (directory / RELEASED_FILE).exists():
            write_released(directory, 0)  # never released: kept from segment 0, so head_lost holds it from now on
        journal = cls(directory, config, segments)
        if kept:
            journal._kept = kept
        logger.debug("journal opened dir=%s segments=%d records=%d bytes=%d last_rev=%d",
                    directory, len(segments), sum(s.count for s in segments),
                    journal.bytes_total, journal._last_rev)
        return journal

    def records(self, after_rev: int = 0) -> Iterator[Record]:
        """Records with rev tag > after_rev, in file order, as found at open() (after truncate_after).

        Records appended after open() are not included. Records with rev tag 0
        are only returned for after_rev=-1.
        """
        todo = [s for s in self._replay if not s.covered_by(after_rev)]
        total = sum(s.size for s in todo)
        progress = _Progress(total, self.config.replay_progress_bytes)
        cfg = self.config
        add = progress.add
        for info in todo:
            path = info.path
            kept = self._kept.pop(path, None)
            if kept is not None and len(kept) == info.count:  # read by the open scan: not again
                for rec in kept:
                    add(HEADER_BYTES + len(rec.payload))
                    if rec.rev > after_rev:
                        yield rec
                continue
            with open(path, "rb") as f:  # iter_frames straight, not checked_frames: one generator less per record
                try:
                    for frame in iter_frames(f, 0, info.size, cfg.record_bytes_max, cfg.read_chunk_bytes):
                        payload = frame.payload
                        add(HEADER_BYTES + len(payload))
                        if frame.rev > after_rev:
                            yield Record(frame.rtype, frame.rev, bytes(payload), path, frame.offset)
                except FrameError as exc:
                    raise JournalCorrupt(path, exc.offset, exc.reason) from exc
        progress.finish()

    def truncate_after(self, rev: int) -> int:
        """Before start(): physically remove every record with rev tag > rev; return how many."""
        if self._task is not None or self._closing:
            raise RuntimeError("truncate_after() is only allowed before start()")
        self._segments, removed = truncate_segments(self._segments, rev, self.config)
        self._replay = list(self._segments)
        self._kept = {}
        self._last_rev = _last_rev(self._segments)
        return removed

    # ----------------------------------------------------------------- introspection

    @property
    def segments(self) -> list[Path]:
        return [s.path for s in self._segments]

    @property
    def released_before(self) -> bool:
        """Were records released (so a checkpoint must cover them)? The first segment is no longer number 0."""
        return bool(self._segments) and self._segments[0].seq > 0

    @property
    def bytes_total(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def durable_tail(self) -> tuple[int, int]:
        """(seq, byte length) of the newest segment as far as it is durable (every journal byte
        before that position is), as of the last on_durable; (0, 0) before the first segment."""
        last = self._segments[-1] if self._segments else None
        return (last.seq, last.size) if last is not None else (0, 0)

    # ----------------------------------------------------------------- writing

    async def start(self) -> None:
        """Start the writer thread; it owns the segment file from now on."""
        if self._task is not None or self._closing:
            raise RuntimeError("journal already started or closed")
        self._kept = {}
        tail = self._segments[-1] if self._segments else None
        writer = SegmentWriter(self.directory, self.config, tail)
        await _in_thread(writer.open_tail)
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._thread = threading.Thread(target=self._thread_main, name=f"journal-writer:{self.directory.parent.name}",
                                        daemon=True)
        self._thread.start()
        # the writer's lifetime as a task: close() and failure handling await it; cancelling it fails the journal
        self._task = asyncio.create_task(self._supervise(), name=f"journal-writer:{self.directory}")
        self._task.add_done_callback(self._supervisor_done)

    def append(self, rtype: int, rev: int, payload: bytes) -> int:
        """Queue one record; return its sequence number. Never blocks."""
        seq = self._next_seq(rtype, rev, len(payload), self.config.record_bytes_max)
        if not isinstance(payload, bytes):
            payload = bytes(payload)
        self._queue.append(PendingRecord(seq, rtype, rev, payload))
        if self._idle and not self._inline_due:
            if self._lone and self.inline_writes and self._inline_allowed():
                self._inline_due = True
                self._loop.call_soon(self._write_inline)
            else:
                self._idle = False
                self._kick.put(None)
        return seq

    def release_through(self, rev: int) -> int:
        """Delete whole segments whose records all have rev tag <= rev (never the newest one)."""
        doomed = self._doomed(rev)
        if doomed:
            _remove_segments(self.directory, doomed, self._segments[len(doomed)].seq)
            self._forget(rev, doomed)
        return len(doomed)

    def _doomed(self, rev: int) -> list[SegmentInfo]:
        doomed: list[SegmentInfo] = []
        for info in self._segments[:-1]:
            if not info.covered_by(rev):
                break
            doomed.append(info)
        return doomed

    def _forget(self, rev: int, doomed: list[SegmentInfo]) -> None:
        """Segments that were deleted go from the lists (by path: the writer's acknowledgements
        may have replaced the newest one's summary or appended others meanwhile)."""
        gone = {info.path for info in doomed}
        self._segments = [s for s in self._segments if s.path not in gone]
        self._replay = [s for s in self._replay if s.path not in gone]
        logger.info("journal segments released through_rev=%d count=%d first=%s last=%s",
                    rev, len(doomed), doomed[0].path.name, doomed[-1].path.name)

    # ----------------------------------------------------------------- release and checkpoints

    @property
    def checkpoint_dir(self) -> Path:
        """Checkpoints live beside the journal directory (in the shard's dir)."""
        return self.directory.parent

    async def release(self, rev: int) -> int:
        """The contract's release: segments wholly at or below ``rev`` go, ``release_through``
        with the files removed in a thread: ext4 takes tens of milliseconds to unlink a full
        64 MiB segment, and a checkpoint releases several (0.13 s with the event loop held)."""
        doomed = self._doomed(rev)
        if doomed:
            await _in_thread(_remove_segments, self.directory, doomed, self._segments[len(doomed)].seq)
            self._forget(rev, doomed)
        return len(doomed)

    async def save_checkpoint(self, rev: int, meta: bytes, rows) -> str:
        """Write checkpoint ``rev`` (in a thread; rows may be read there); older ones go."""
        return str(await asyncio.to_thread(write_checkpoint, self.checkpoint_dir, rev, meta, rows))

    async def load_checkpoint(self) -> Checkpoint | None:
        return load_latest_checkpoint(self.checkpoint_dir)

    # ----------------------------------------------------------------- writer thread
    #
    # One thread per journal takes what is queued, writes it and fdatasyncs it
    # (group commit: everything appended while a batch is being written goes
    # into the next one), then tells the event loop with one
    # call_soon_threadsafe per batch. The loop never waits for the disk, and
    # nothing on the loop runs per batch but the acknowledgement itself.
    #
    # A lone writer (one record per batch, nothing appended while it was
    # written) gains nothing from the thread: every batch pays two wake-ups
    # across CPUs (loop -> thread, thread -> loop) and two GIL hand-offs, which
    # on this VM cost more CPU than the write. While that pattern holds and the
    # fsyncs are quick, the loop writes the batch itself, after the current
    # turn's callbacks (so whatever they append joins it); a batch of more than
    # one record, or an fsync slower than INLINE_FSYNC_MAX_S, hands writing
    # back to the thread.

    def _thread_main(self) -> None:
        loop = self._loop
        queue = self._queue
        try:
            while self._wait_for_records():
                with self._write_lock:
                    batch = self._take_batch()
                    if not batch:  # the loop wrote it inline meanwhile
                        continue
                    self._taken += 1
                    started = time.monotonic()
                    touched = self._writer.write_batch(batch)
                    seconds = time.monotonic() - started
                    lone = len(batch) == 1 and not queue
                loop.call_soon_threadsafe(self._batch_written, batch, touched, seconds, lone)
        except BaseException as exc:  # noqa: BLE001 - every write error is fatal by design
            self._call_loop(self._fail, exc)
        finally:
            self._call_loop(self._thread_exited)

    def _wait_for_records(self) -> bool:
        """In the writer thread: sleep until records are queued; False once closing with
        nothing left, or failed."""
        queue = self._queue
        while not queue:
            if self._closing or self._failure is not None:
                return False
            self._idle = True
            if queue or self._closing:  # appended (or closed) before it saw _idle: do not sleep
                self._idle = False
                continue
            self._kick.get()
        return self._failure is None

    def _take_batch(self) -> list[PendingRecord]:
        """Under the write lock: take up to batch_bytes_max of what is queued."""
        queue = self._queue
        if not queue or self._failure is not None:
            return []
        if self.config.fsync == "batch" and not self._closing and self._queued_bytes < self.config.batch_bytes_max:
            time.sleep(self.config.batch_linger_s)  # let more appends join (the writer thread's own time)
        batch = [queue.popleft()]
        size = batch[0].frame_bytes
        limit = self.config.batch_bytes_max
        while queue and size + queue[0].frame_bytes <= limit:
            record = queue.popleft()
            batch.append(record)
            size += record.frame_bytes
        return batch

    def _inline_allowed(self) -> bool:
        gate = self.inline_gate
        return (gate is None or gate()) and not failpoints.sleep_armed()

    def _write_inline(self) -> None:
        """On the loop: write what is queued here and now, if the thread is idle and
        nothing it wrote still waits for its acknowledgement; else leave it to the thread."""
        self._inline_due = False
        if not self._queue or self._failure is not None:
            return
        if (self._closing or not self._idle or not self._inline_allowed()
                or not self._write_lock.acquire(blocking=False)):
            self._wake_if_idle()
            return
        batch: list[PendingRecord] = []
        try:
            if self._taken == self._acked:  # acknowledgements stay in write order
                batch = self._take_batch()
                started = time.monotonic()
                touched = self._writer.write_batch(batch)
                seconds = time.monotonic() - started
        except BaseException as exc:  # noqa: BLE001 - every write error is fatal by design
            self._fail(exc)
            self._wake_thread()  # it sees the failure and ends
            return
        finally:
            self._write_lock.release()
        if not batch:
            self._wake_if_idle()
            return
        self._batch_written(batch, touched, seconds, len(batch) == 1 and not self._queue, inline=True)
        self._wake_if_idle()  # more than a batch's bytes were queued: the rest goes to the thread

    def _wake_if_idle(self) -> None:
        if self._idle and self._queue:
            self._wake_thread()

    def _call_loop(self, fn: Callable, *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _batch_written(self, batch: list[PendingRecord], touched: list[SegmentInfo], seconds: float,
                       lone: bool, inline: bool = False) -> None:
        if not inline:
            self._acked += 1
        if self._failure is not None:  # failed meanwhile: its queue (and count) are gone, nothing is acknowledged
            return
        self._lone = lone and seconds < INLINE_FSYNC_MAX_S
        payload = len(batch[0].payload) if len(batch) == 1 else sum(len(r.payload) for r in batch)
        self._queued_bytes -= payload
        if self.on_batch is not None:
            self.on_batch(payload + HEADER_BYTES * len(batch), seconds)
        self._acknowledge(batch[-1].seq, touched)

    def _thread_exited(self) -> None:
        self._writer.close(trim=self._failure is None)  # a failed journal's file is left for recovery as it is
        if not self._stopped.done():
            self._stopped.set_result(None)

    async def _supervise(self) -> None:
        await asyncio.shield(self._stopped)

    def _supervisor_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # the thread sees the failure and stops after the batch it may be writing
            self._fail(JournalFailed("journal writer task cancelled"))
            self._wake_thread()

    def _wake_thread(self) -> None:
        self._idle = False
        self._kick.put(None)

    async def close(self) -> None:
        """Write out everything queued, then stop the writer thread."""
        self._closing = True
        if self._task is not None:
            self._wake_thread()
            await asyncio.wait([self._task])

    def _acknowledge(self, seq: int, touched: list[SegmentInfo]) -> None:
        for info in touched:
            # the same segment's summary carries the same Path object: `is` spares Path.__eq__ (~2 µs)
            if self._segments and (self._segments[-1].path is info.path or self._segments[-1].path == info.path):
                self._segments[-1] = info
            else:
                self._segments.append(info)
        self._durable_through(seq)

    def _drop_queue(self) -> int:
        dropped = len(self._queue)
        self._queue.clear()
        return dropped


def _remove_segments(directory: Path, doomed: list[SegmentInfo], first_kept: int) -> None:
    """The files of released segments go, after the number of the first one kept is durable. Blocking."""
    write_released(directory, first_kept)
    for info in doomed:
        info.path.unlink(missing_ok=True)  # missing: a release that failed after it, tried again
    fsync_dir(directory)


class LocalLog:
    """Journals in local directories: ``<dir>/journal`` segments, checkpoints in ``<dir>``."""

    async def open_journal(self, name: str, directory: Path, config: JournalConfig = JournalConfig()) -> Journal:
        return Journal.open(Path(directory) / "journal", config, keep_records=True)  # a start replays it next

    async def close(self) -> None:
        pass


class _Progress:
    """Info-level replay progress: every `step_bytes` and once at the end."""

    def __init__(self, total_bytes: int, step_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.step_bytes = step_bytes
        self.read_bytes = 0
        self._next_log = step_bytes

    def add(self, nbytes: int) -> None:
        self.read_bytes += nbytes
        if self.read_bytes >= self._next_log:
            self._log()
            self._next_log = (self.read_bytes // self.step_bytes + 1) * self.step_bytes

    def finish(self) -> None:
        if self.total_bytes >= self.step_bytes:  # small journals replay silently
            self._log()

    def _log(self) -> None:
        logger.info("journal replay progress read_bytes=%d total_bytes=%d", self.read_bytes, self.total_bytes)


def _last_rev(segments: list[SegmentInfo]) -> int:
    revs = [s.last_rev for s in segments if s.last_rev is not None]
    return revs[-1] if revs else 0
