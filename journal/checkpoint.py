"""Checkpoint files: a point-in-time dump of opaque rows, written atomically.

A checkpoint is `checkpoint-{rev:016x}.ckpt`, a sequence of frames (see
record.py) whose revision tag is the checkpoint revision:

    HEADER  (rtype 1)  payload = caller's meta bytes
    ROWS    (rtype 2)  payload = rows, each as u32 length (little-endian) + bytes;
                       rows are packed until a frame reaches frame_bytes_target
                       (a larger row gets a frame of its own)
    ...
    TRAILER (rtype 3)  payload = u64 row count; always the last 28 bytes

A file is written to `<name>.tmp`, fsynced, renamed into place and the
directory fsynced; older checkpoints are deleted afterwards. A checkpoint whose
last 28 bytes are not a valid trailer is incomplete and skipped by the loader.
Callers must not write two checkpoints into one directory concurrently.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from journal import failpoints
from journal.config import CheckpointConfig
from journal.errors import JournalCorrupt
from journal.fsutil import ensure_dir, fsync_dir
from journal.reader import checked_frames
from journal.record import HEADER_BYTES, Frame, FrameError, check_fields, decode_frame, frame_header

logger = logging.getLogger(__name__)

RTYPE_HEADER = 1
RTYPE_ROWS = 2
RTYPE_TRAILER = 3
_ROW_LEN = struct.Struct("<I")
ROW_LEN = _ROW_LEN  # each row of a ROWS frame: this length, then the row
_COUNT = struct.Struct("<Q")
TRAILER_BYTES = HEADER_BYTES + _COUNT.size
_NAME = re.compile(r"^checkpoint-([0-9a-f]{16})\.ckpt$")
_TMP_SUFFIX = ".tmp"


def checkpoint_name(rev: int) -> str:
    return f"checkpoint-{rev:016x}.ckpt"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk; rows() streams and verifies its body."""

    rev: int
    meta: bytes
    path: Path
    row_count: int
    _rows_start: int = field(repr=False, default=0)
    _rows_end: int = field(repr=False, default=0)
    _config: CheckpointConfig = field(repr=False, default=CheckpointConfig())

    def rows(self) -> Iterator[bytes]:
        """Every row in write order; raises JournalCorrupt if the body is damaged."""
        seen = 0
        for frame in self.row_frames():
            for row in _unpack_rows(frame, self.path):
                seen += 1
                yield row
        self.check_row_count(seen)

    def row_frames(self) -> Iterator[Frame]:
        """The body's ROWS frames in write order, each checked as ``rows`` checks
        it (its ``payload`` as bytes), for a caller that reads the rows in place
        (``ROW_LEN`` length + row each; at a million rows, ~1 µs a row less than
        ``rows``).  The caller checks what it reads: ``check_frame_rows`` raises
        the error of a frame whose rows do not add up to its payload, and
        ``check_row_count`` compares the rows read with the trailer's count."""
        cfg = self._config
        with open(self.path, "rb") as f:
            for frame in checked_frames(f, self.path, self._rows_start, self._rows_end,
                                        cfg.record_bytes_max, cfg.read_chunk_bytes):
                _expect(frame, RTYPE_ROWS, self.rev, self.path)
                yield Frame(frame.rtype, frame.rev, bytes(frame.payload), frame.offset)

    def check_frame_rows(self, frame: Frame) -> None:
        """Raise JournalCorrupt if the rows of a ``row_frames`` frame do not add up to its payload."""
        for _ in _unpack_rows(frame, self.path):
            pass

    def check_row_count(self, seen: int) -> None:
        if seen != self.row_count:
            raise JournalCorrupt(self.path, self._rows_end,
                                 f"trailer says {self.row_count} rows, body holds {seen}")


# --------------------------------------------------------------------- writing

def write_checkpoint(directory: Path, rev: int, meta: bytes, rows: Iterable[bytes], *,
                     config: CheckpointConfig = CheckpointConfig()) -> Path:
    """Atomically write checkpoint `rev` into `directory`; delete older ones. Blocking."""
    ckpt = CheckpointFile(directory, rev, meta, config=config)
    try:
        ckpt.add_all(rows)
    except BaseException:
        ckpt.drop()
        raise
    return ckpt.finish()


class CheckpointFile:
    """One checkpoint being written, rows added in order (several can be written at once, each into
    a directory of its own, from one pass over their rows); ``finish`` makes it whole and puts it in
    place, ``drop`` removes what was written. Blocking."""

    def __init__(self, directory: Path, rev: int, meta: bytes, *,
                 config: CheckpointConfig = CheckpointConfig()) -> None:
        directory = Path(directory)
        ensure_dir(directory)
        check_fields(RTYPE_HEADER, rev, len(meta), config.record_bytes_max)
        self.directory, self.rev, self.config = directory, rev, config
        self.final = directory / checkpoint_name(rev)
        self.tmp = self.final.with_name(self.final.name + _TMP_SUFFIX)
        self.count = 0
        self._placed = False  # renamed into place
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        # the keyspace: this user's alone, as etcd's db file
        self._f: BinaryIO | None = os.fdopen(os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        try:
            _write_frame(self._f, RTYPE_HEADER, rev, meta)
        except BaseException:
            self.drop()
            raise

    def add(self, row: bytes) -> None:
        entry_bytes = _ROW_LEN.size + len(row)
        if entry_bytes > self.config.record_bytes_max:
            raise ValueError(f"checkpoint row of {len(row)} bytes exceeds record_bytes_max")
        if self._pending and self._pending_bytes + entry_bytes > self.config.frame_bytes_target:
            self._flush_rows()
        self._pending += (_ROW_LEN.pack(len(row)), row)
        self._pending_bytes += entry_bytes
        self.count += 1

    def add_all(self, rows: Iterable[bytes]) -> None:
        """``add`` for each of ``rows`` (the loop inlined: a state's every row goes through it)."""
        f, rev, limit, target = self._f, self.rev, self.config.record_bytes_max, self.config.frame_bytes_target
        pending, pending_bytes, count = self._pending, self._pending_bytes, self.count
        for row in rows:
            entry_bytes = _ROW_LEN.size + len(row)
            if entry_bytes > limit:
                raise ValueError(f"checkpoint row of {len(row)} bytes exceeds record_bytes_max")
            if pending and pending_bytes + entry_bytes > target:
                _write_frame(f, RTYPE_ROWS, rev, b"".join(pending))
                pending.clear()
                pending_bytes = 0
            pending += (_ROW_LEN.pack(len(row)), row)
            pending_bytes += entry_bytes
            count += 1
        self._pending_bytes, self.count = pending_bytes, count

    def _flush_rows(self) -> None:
        _write_frame(self._f, RTYPE_ROWS, self.rev, b"".join(self._pending))
        self._pending.clear()
        self._pending_bytes = 0

    def finish(self) -> Path:
        """The trailer, fsync, rename into place, directory fsync; older checkpoints there go."""
        try:
            if self._pending:
                self._flush_rows()
            f = self._f
            _write_frame(f, RTYPE_TRAILER, self.rev, _COUNT.pack(self.count))
            f.flush()
            os.fsync(f.fileno())
            nbytes = f.tell()
            f.close()
            self._f = None
            failpoints.hit("checkpoint.before_rename")
            os.replace(self.tmp, self.final)
            self._placed = True
        except BaseException:
            self.drop()
            raise
        failpoints.hit("checkpoint.after_rename_before_dirsync")
        fsync_dir(self.directory)
        logger.info("checkpoint written file=%s rev=%d rows=%d bytes=%d", self.final, self.rev, self.count, nbytes)
        _delete_older(self.directory, self.rev)
        return self.final

    def drop(self) -> None:
        """What was written goes (nothing, once in place)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if not self._placed:
            self.tmp.unlink(missing_ok=True)


def _write_frame(f: BinaryIO, rtype: int, rev: int, payload: bytes) -> None:
    f.write(frame_header(rtype, rev, payload))
    f.write(payload)


def _delete_older(directory: Path, rev: int) -> None:
    for older_rev, path in _list_checkpoints(directory):
        if older_rev < rev:
            path.unlink(missing_ok=True)
            logger.debug("checkpoint deleted file=%s rev=%d", path, older_rev)


# --------------------------------------------------------------------- loading

def load_latest_checkpoint(directory: Path, *,
                           config: CheckpointConfig = CheckpointConfig()) -> Checkpoint | None:
    """The newest complete checkpoint in `directory`, or None. Removes leftover .tmp files."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    _remove_leftovers(directory)
    for rev, path in sorted(_list_checkpoints(directory), reverse=True):
        try:
            return _load(path, rev, config)
        except JournalCorrupt as exc:
            logger.warning("checkpoint invalid, skipping file=%s offset=%d reason=%s",
                           path, exc.offset, exc.reason)
    return None


def _load(path: Path, rev: int, config: CheckpointConfig) -> Checkpoint:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_BYTES + TRAILER_BYTES:
            raise JournalCorrupt(path, 0, f"too short for a checkpoint ({size} bytes)")
        rows_end = size - TRAILER_BYTES
        count = _read_trailer(f, path, rev, rows_end)
        header = _read_header(f, path, rev, rows_end, config)
    return Checkpoint(rev, bytes(header.payload), path, count, header.end, rows_end, config)


def _read_trailer(f: BinaryIO, path: Path, rev: int, offset: int) -> int:
    f.seek(offset)
    try:
        frame = decode_frame(f.read(TRAILER_BYTES), 0, _COUNT.size, base=offset)
    except FrameError as exc:
        raise JournalCorrupt(path, offset, f"no valid trailer: {exc.reason}") from exc
    _expect(frame, RTYPE_TRAILER, rev, path)
    if frame.size != TRAILER_BYTES:
        raise JournalCorrupt(path, offset,
                             f"trailer payload is {len(frame.payload)} bytes, expected {_COUNT.size}")
    return _COUNT.unpack(frame.payload)[0]


def _read_header(f: BinaryIO, path: Path, rev: int, end: int, config: CheckpointConfig) -> Frame:
    frames = checked_frames(f, path, 0, end, config.record_bytes_max, config.read_chunk_bytes)
    header = next(frames, None)
    if header is None:
        raise JournalCorrupt(path, 0, "missing header frame")
    _expect(header, RTYPE_HEADER, rev, path)
    return header


def _expect(frame: Frame, rtype: int, rev: int, path: Path) -> None:
    if frame.rtype != rtype:
        raise JournalCorrupt(path, frame.offset, f"expected record type {rtype}, found {frame.rtype}")
    if frame.rev != rev:
        raise JournalCorrupt(path, frame.offset, f"expected revision tag {rev}, found {frame.rev}")


def _unpack_rows(frame: Frame, path: Path) -> Iterator[bytes]:
    payload, pos = frame.payload, 0
    while pos < len(payload):
        if pos + _ROW_LEN.size > len(payload):
            raise JournalCorrupt(path, frame.offset, "row length prefix cut short")
        (length,) = _ROW_LEN.unpack_from(payload, pos)
        pos += _ROW_LEN.size
        if pos + length > len(payload):
            raise JournalCorrupt(path, frame.offset, "row overruns its frame")
        yield bytes(payload[pos:pos + length])
        pos += length


def _list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match is not None:
            found.append((int(match.group(1), 16), path))
    return found


def _remove_leftovers(directory: Path) -> None:
    for path in directory.iterdir():
        if path.name.endswith(".ckpt" + _TMP_SUFFIX) and path.name.startswith("checkpoint-"):
            path.unlink(missing_ok=True)
            logger.info("checkpoint leftover removed file=%s", path)
