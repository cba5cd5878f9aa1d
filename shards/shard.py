"""A shard: its MVCC state, its journal, its checkpoints.

The shard owns bytes on disk and rows in memory for its keys; the store
(``store.py``) decides revisions and drives writes.  Everything the store
sends a shard is a plain message (a revision and its changes), so a shard
could later sit behind a process boundary.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from journal import Journal
from journal.checkpoint import Checkpoint
from journal.record import Record
from proto.kv_pb2 import KeyValue

from .errors import DataDirError, StateStoreError
from .record import (AUTH, COMPACT, DELETE, LEASE, TOKEN, WRITE, WRITE_LAST, WRITE_PART, Change, WriteParts, encode_compact, encode_write,
                     split_write, write_participants)
from .progress import Progress
from .state import ShardState

logger = logging.getLogger(__name__)

_CKPT_META = struct.Struct("<QqI")  # committed rev, compact rev, shard id
# recovery yields to the event loop after about this many rows, so the writer
# lease is renewed however long it takes
YIELD_EVERY = 8192
CHECKPOINT_RETRY_S = 30.0  # after a failed checkpoint: the next one tried this long after, not a threshold later


def checkpoint_revision(ckpt: Checkpoint | None) -> int:
    """The revision a shard's checkpoint holds the state at (0: none)."""
    return 0 if ckpt is None else _CKPT_META.unpack_from(ckpt.meta)[0]


def checkpoint_meta(rev: int, compact_rev: int, sid: int, extra_meta: bytes = b"") -> bytes:
    """A shard checkpoint's meta: its revision, the compacted revision, the shard's
    id, then what the store keeps beside it (``record.encode_extra_meta``)."""
    return _CKPT_META.pack(rev, compact_rev, sid) + extra_meta


@dataclass(slots=True)
class Recovered:
    """What a shard found on disk, before the store decides what to keep:
    journal records above its checkpoint, sorted by type."""

    checkpoint_rev: int
    compact_rev: int
    # (rev, participants, WRITE payload, epoch) above it; the changes are read when applied (``decode_write``)
    writes: list[tuple[int, tuple[int, ...], bytes, int]]
    compacts: list[Record]
    leases: list[Record]
    extra_meta: bytes  # what the store saved beside this shard's last checkpoint
    auths: list[Record] = field(default_factory=list)
    below: list[int] = field(default_factory=list)  # the revisions of the write records at or below it, in order


class Shard:
    def __init__(self, sid: int, name: str, data_dir: Path, state_dir: Path, journal: Journal) -> None:
        """``journal`` is this shard's, opened by the store's log (local or JetStream)."""
        self.sid = sid
        self.name = name
        self.dir = data_dir
        self.journal = journal
        self.state = ShardState(state_dir)
        self.inflight: deque[tuple[int, int]] = deque()  # (journal seq, revision)
        self.checkpoint_rev = 0
        self.checkpoint_task: asyncio.Task | None = None
        self.checkpoints_written = 0  # by this process, since its start (/metrics)
        self.checkpoint_failures = 0
        self.checkpoint_retry_at = 0.0  # after a failure: time.monotonic() from which one is tried again
        self.checkpoint_failed_bytes = 0  # ... or once another threshold of bytes came after the failed one
        self.bytes_at_checkpoint = 0
        self.writes = 0  # WRITE records appended since start
        # told of every row replayed: (key, lease id of a put, or -1 for a delete)
        self.on_replay: Callable[[bytes, int], None] = lambda key, lease: None
        # while a checkpoint loads before the lease table: {key: lease id} kept by the rows directly,
        # instead of on_replay per row (each lease's key set is rebuilt from it afterwards)
        self.replay_key_lease: dict[bytes, int] | None = None

    # -- recovery -------------------------------------------------------

    async def read_disk(self, ckpt: Checkpoint | None) -> Recovered:
        return await self.collect(*await self.load_checkpoint(ckpt))

    async def load_checkpoint(self, ckpt: Checkpoint | None) -> tuple[int, int, bytes]:
        """Load the rows of ``ckpt``, the journal's newest checkpoint (``journal.load_checkpoint()``,
        fetched by the caller for every shard at once), into the state: (its revision, compact
        revision, extra meta)."""
        ckpt_rev, compact_rev, extra = 0, -1, b""
        if ckpt is not None:
            ckpt_rev, compact_rev, sid = _CKPT_META.unpack_from(ckpt.meta)
            extra = ckpt.meta[_CKPT_META.size :]
            if sid != self.sid:
                raise DataDirError(f"checkpoint {ckpt.path} belongs to shard {sid}, not to {self.name} "
                                   f"(shard {self.sid}): the data dir was put together wrongly")
            await self._load_checkpoint_rows(ckpt)
        self.checkpoint_rev = ckpt_rev
        return ckpt_rev, compact_rev, extra

    async def collect(self, ckpt_rev: int, compact_rev: int, extra: bytes) -> Recovered:
        """What the journal holds above the checkpoint, sorted by record type."""
        writes, compacts, leases, auths, below = [], [], [], [], []
        progress = Progress("journal read", shard=self.name)
        budget = YIELD_EVERY
        joined = WriteParts()
        for rec in self.journal.records(after_rev=0):
            progress.tick()
            budget -= 1
            if rec.rtype == WRITE or rec.rtype == WRITE_LAST:
                if rec.rev > ckpt_rev:
                    payload = joined.whole(rec.rtype, rec.rev, rec.epoch, rec.payload)
                    if payload is not None:  # (None: the last of a write whose parts are not here)
                        writes.append((rec.rev, write_participants(payload), payload, rec.epoch))
                    budget -= len(rec.payload) >> 12  # read and checked, not yet decoded: yield every ~32 MB
                else:
                    below.append(rec.rev)
            elif rec.rtype == WRITE_PART:
                if rec.rev > ckpt_rev:
                    joined.part(rec.rev, rec.epoch, rec.payload)
            elif rec.rtype == COMPACT:
                compacts.append(rec)
            elif rec.rtype == LEASE:
                leases.append(rec)
            elif rec.rtype == AUTH:
                auths.append(rec)
            if budget <= 0:
                budget = YIELD_EVERY
                await asyncio.sleep(0)
        progress.done()
        return Recovered(ckpt_rev, compact_rev, writes, compacts, leases, extra, auths, below)

    async def _load_checkpoint_rows(self, ckpt) -> None:
        progress = Progress("checkpoint load", shard=self.name)
        seen = 0
        for frame in ckpt.row_frames():
            payload, pos = frame.payload, 0
            while pos < len(payload):
                try:
                    n, pos = self.state.load_rows(payload, pos, YIELD_EVERY, self.on_replay, progress,
                                                  self.replay_key_lease)
                except Exception:
                    ckpt.check_frame_rows(frame)  # rows that do not add up to their frame: the checkpoint's error
                    raise
                seen += n
                await asyncio.sleep(0)
        ckpt.check_row_count(seen)
        progress.done()

    def apply_recovered(self, rev: int, changes: list[Change]) -> None:
        state, on_replay = self.state, self.on_replay
        for c in changes:
            if c.kind == DELETE:
                state.delete(c.key, rev, c.sub, c.row)
                on_replay(c.key, -1)
            else:
                state.put(c.key, rev, c.sub, c.row)
                on_replay(c.key, KeyValue.FromString(c.row).lease)

    # -- writes ---------------------------------------------------------

    def append_write(self, rev: int, participants: tuple[int, ...], changes: list[Change],
                     ahead: tuple[int, list[bytes]] | None = None) -> None:
        payload = encode_write(participants, changes, ahead)
        limit = self.journal.config.record_bytes_max
        if len(payload) <= limit:
            seq = self.journal.append(WRITE, rev, payload)
        else:  # WRITE_PART records, then a WRITE_LAST: committed once the last is durable
            for rtype, part in split_write(payload, limit):
                seq = self.journal.append(rtype, rev, part)
        self.inflight.append((seq, rev))
        self.writes += 1

    def append_compact(self, tag_rev: int, compact_rev: int) -> None:
        self.journal.append(COMPACT, tag_rev, encode_compact(compact_rev))

    def append_lease(self, tag_rev: int, payload: bytes) -> None:
        self.journal.append(LEASE, tag_rev, payload)

    def append_auth(self, tag_rev: int, payload: bytes) -> None:
        self.journal.append(AUTH, tag_rev, payload)

    def append_token(self, tag_rev: int, payload: bytes) -> None:
        self.journal.append(TOKEN, tag_rev, payload)

    # -- checkpoints ----------------------------------------------------

    def wants_checkpoint(self, journal_bytes_max: int) -> bool:
        return (
            self.checkpoint_task is None
            and self.journal.bytes_appended - self.bytes_at_checkpoint >= journal_bytes_max
            and (not self.checkpoint_retry_at or time.monotonic() >= self.checkpoint_retry_at
                 or self.journal.bytes_appended - self.checkpoint_failed_bytes >= journal_bytes_max)
        )

    def checkpoint_source(self, committed: int, compact_rev: int, extra_meta: bytes = b""):
        """(meta, rows) of a checkpoint at ``committed``, frozen now; rows may be read in a thread."""
        return checkpoint_meta(committed, compact_rev, self.sid, extra_meta), self.state.snapshot_rows(committed)

    def start_checkpoint(self, committed: int, compact_rev: int, extra_meta: bytes = b"") -> None:
        """Snapshot rows <= committed now; write and fsync them in a thread."""
        meta, rows = self.checkpoint_source(committed, compact_rev, extra_meta)
        since = self.bytes_at_checkpoint
        self.bytes_at_checkpoint = self.journal.bytes_appended
        self.checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint(committed, meta, rows, since))

    async def _checkpoint(self, rev: int, meta: bytes, rows, since: int) -> None:
        """Write checkpoint ``rev`` and release the journal below it. One that fails is logged and
        counted, and tried again ``CHECKPOINT_RETRY_S`` later or after another threshold of journal
        bytes, whichever comes first (``since``: where the journal stood at the last one written), so
        a transient failure does not let the journal grow to twice its bound."""
        failed = True
        try:
            path = await self.journal.save_checkpoint(rev, meta, rows)
            failed = False
            self.checkpoint_rev = rev
            self.checkpoints_written += 1
            self.checkpoint_retry_at = 0.0
            # Records tagged `rev` itself may have been appended after the
            # snapshot (a Compact tags the latest revision), so keep them.
            try:
                released = await self.journal.release(rev - 1)
            except Exception:  # noqa: BLE001 - the checkpoint stands; the next one releases
                logger.exception("journal not released after a checkpoint shard=%s rev=%d", self.name, rev)
                return
            logger.info("checkpoint written shard=%s rev=%d path=%s segments_released=%d", self.name, rev, path, released)
        except StateStoreError as exc:  # reading the rows failed: the state is not to be trusted
            self.checkpoint_failures += 1
            self.state.on_failure(exc)
        except Exception as exc:  # one line each time (tried again every CHECKPOINT_RETRY_S); the traceback at debug
            self.checkpoint_failures += 1
            logger.error("checkpoint failed shard=%s rev=%d retry_in_s=%g error=%r", self.name, rev, CHECKPOINT_RETRY_S,
                         exc)
            logger.debug("checkpoint failure shard=%s", self.name, exc_info=True)
        finally:
            if failed:
                self.checkpoint_failed_bytes, self.bytes_at_checkpoint = self.bytes_at_checkpoint, since
                self.checkpoint_retry_at = time.monotonic() + CHECKPOINT_RETRY_S
            self.checkpoint_task = None

    async def close(self) -> None:
        if self.checkpoint_task is not None:
            await asyncio.gather(self.checkpoint_task, return_exceptions=True)
        await self.journal.close()
        self.state.close()
