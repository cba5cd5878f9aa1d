"""The writer's durable position, published for followers on the same machine.

``<data-dir>/watermark`` is a small file the writer maps into memory (a
shared mapping: its stores are the page cache a follower's mapping reads, no
syscall per update) and updates after every durable journal batch:

    offset  size  field (little-endian u64s)
         0     8  magic "SDWMARK1"
         8     8  update counter: odd while an update is being written (a seqlock)
        16     8  generation: the writer's start count (data dir meta "starts"); 0 while it recovers
        24     8  the writer's member id
        32     8  committed revision: every revision <= it is durable on every shard
        40     8  shard count
        48  16*n  per shard, in layout order: (segment seq, byte length) of its newest segment as far
                  as it is durable: every journal byte before that position is on disk

A follower reads only frames below its shard's position and applies only
revisions <= committed (DESIGN.md invariant 11): what it shows is durable, and
recovery never cuts it (invariant 5: a restarted writer keeps every revision
<= committed and every durable record tagged at or below it).

A writer sets the generation to 0 before its recovery touches a segment (a
torn tail cut, records above the whole prefix truncated) and publishes its new
generation once recovered; a reader checks the generation again after reading
segment bytes and throws away what it read if it changed meanwhile.
"""
from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from journal.fsutil import PRIVATE_FILE

FILE_NAME = "watermark"
MAGIC = b"SDWMARK2"  # 2: with the CRC
_HEAD = struct.Struct("<8sQQQQQ")
_U64 = struct.Struct("<Q")
_POS = struct.Struct("<QQ")
COUNTER_AT, GENERATION_AT, COMMITTED_AT, POSITIONS_AT = 8, 16, 32, _HEAD.size
UPDATE_WAITS, UPDATE_WAIT_S = 100, 0.002  # how long a start waits for an update to end: 0.2 s


@dataclass(frozen=True, slots=True)
class Mark:
    """One consistent reading of the watermark."""

    counter: int
    generation: int  # 0: the writer is recovering (positions may be about to move back)
    member_id: int
    committed: int
    tails: tuple[tuple[int, int], ...]  # per shard: (segment seq, durable byte length)


def _crc_at(shards: int) -> int:
    return _HEAD.size + shards * _POS.size


def _size(shards: int) -> int:
    return _crc_at(shards) + _U64.size


def _mark(raw: bytes, mid_update: bool = False) -> Mark | None:
    """The watermark in ``raw`` if it is whole (magic, an even counter, its CRC), else None;
    ``mid_update``: an odd counter too, when the CRC holds."""
    if len(raw) < _HEAD.size or raw[:8] != MAGIC:
        return None
    _, counter, generation, member_id, committed, shards = _HEAD.unpack_from(raw, 0)
    if (counter & 1 and not mid_update) or _size(shards) > len(raw):
        return None
    crc_at = _crc_at(shards)
    if zlib.crc32(raw[GENERATION_AT:crc_at]) != _U64.unpack_from(raw, crc_at)[0]:
        return None
    tails = tuple(_POS.unpack_from(raw, POSITIONS_AT + i * _POS.size) for i in range(shards))
    return Mark(counter, generation, member_id, committed, tails)


class WatermarkWriter:
    """The writer's side: one per data dir, updated from the event loop."""

    def __init__(self, path: Path, shards: int, member_id: int, acknowledged: int = 0) -> None:
        """``acknowledged``: what the last writer acknowledged, as ``acknowledged_revision`` read it
        (0 when its journal policy did not sync), published again until this writer recovered."""
        self.path = path
        size = _size(shards)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        try:
            if os.fstat(fd).st_size < size:  # never shrunk: a reader's mapping must stay valid
                os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        counter = _U64.unpack_from(self._mm, COUNTER_AT)[0] if self._mm[:8] == MAGIC else 0
        self._counter = counter + (counter & 1)  # a writer killed mid-update left it odd
        self._shards = shards
        self._member_id = member_id
        self._crc_at = _crc_at(shards)
        # what the last writer of this data dir acknowledged stays readable while this one recovers (and
        # after a start that refused to recover): see acknowledged_revision
        self._kept = acknowledged
        self.recovering()

    def recovering(self) -> None:
        """Before recovery changes any segment: readers stop until ``publish_all`` (generation 0)."""
        self._update(lambda mm: _HEAD.pack_into(mm, 0, MAGIC, self._counter + 1, 0, self._member_id, self._kept,
                                                self._shards))

    def publish_all(self, generation: int, committed: int, tails: list[tuple[int, int]]) -> None:
        """Once recovered: every shard's durable position, the committed revision, the new generation."""
        def write(mm: mmap.mmap) -> None:
            for sid, (seq, length) in enumerate(tails):
                _POS.pack_into(mm, POSITIONS_AT + sid * _POS.size, seq, length)
            _U64.pack_into(mm, COMMITTED_AT, committed)
            _U64.pack_into(mm, GENERATION_AT, generation)

        self._update(write)

    def durable(self, committed: int, sid: int, seq: int, length: int) -> None:
        """After a durable batch of shard ``sid``: its position and the committed revision (hot path)."""
        mm, c, crc_at = self._mm, self._counter + 1, self._crc_at
        _U64.pack_into(mm, COUNTER_AT, c)
        _POS.pack_into(mm, POSITIONS_AT + sid * 16, seq, length)
        _U64.pack_into(mm, COMMITTED_AT, committed)
        _U64.pack_into(mm, crc_at, zlib.crc32(mm[GENERATION_AT:crc_at]))
        _U64.pack_into(mm, COUNTER_AT, c + 1)
        self._counter = c + 1

    def _update(self, write) -> None:
        c = self._counter + 1
        if self._mm[:8] == MAGIC:
            _U64.pack_into(self._mm, COUNTER_AT, c)
        write(self._mm)
        _U64.pack_into(self._mm, self._crc_at, zlib.crc32(self._mm[GENERATION_AT:self._crc_at]))
        _U64.pack_into(self._mm, COUNTER_AT, c + 1)
        self._counter = c + 1

    def close(self) -> None:
        self._mm.close()


def acknowledged_revision(path: Path, member_id: int) -> int:
    """The committed revision a writer of this data dir (``member_id``) last published, read before
    a new writer resets the file: every revision up to it was acknowledged, so durable. 0 when
    unknown (no file, another data dir's, torn). An update left half-done by a writer that died in
    it still counts when its CRC holds: the fields are then all from before the update or all from
    after it, and an update publishes only what is durable already."""
    try:
        reader = WatermarkReader(path)
    except (OSError, ValueError):
        return 0
    try:
        for _ in range(UPDATE_WAITS):  # a live writer preempted in an update: it ends it
            mark = reader.read()
            if mark is not None:
                break
            time.sleep(UPDATE_WAIT_S)
        else:  # a writer that died in an update
            mark = reader.read_as_left()
    finally:
        reader.close()
    if mark is None or mark.member_id != member_id:
        return 0
    return mark.committed  # generation 0 too: a writer that was recovering (or refused to) kept it


class WatermarkReader:
    """A follower's side: read-only, never blocks the writer."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < _HEAD.size:
                raise ValueError(f"{path}: not a watermark ({size} bytes)")
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)
        if self._mm[:8] != MAGIC:
            self._mm.close()
            raise ValueError(f"{path}: not a watermark (bad magic)")
        self.path = path

    def counter(self) -> int:
        """Changes with every update: cheap enough to poll."""
        return _U64.unpack_from(self._mm, COUNTER_AT)[0]

    def read(self, tries: int = 100) -> Mark | None:
        """A consistent reading, or None while an update stays half-written (its writer died in it)."""
        mm = self._mm
        for _ in range(tries):
            c1 = _U64.unpack_from(mm, COUNTER_AT)[0]
            if c1 & 1:
                continue
            raw = mm[:]
            if _U64.unpack_from(mm, COUNTER_AT)[0] != c1:
                continue
            mark = _mark(raw)
            if mark is not None:
                return mark
            # torn: stores seen out of order (or a writer that died in an update)
        return None

    def read_as_left(self) -> Mark | None:
        """What a writer that died in an update left: whole if its CRC holds, the counter odd or
        not (only once no writer can be updating it)."""
        return _mark(self._mm[:], mid_update=True)

    def close(self) -> None:
        self._mm.close()
