"""The thread side of the journal writer: encode, write, fdatasync, roll segments.

A SegmentWriter owns the file descriptor of the segment being appended to.
Its methods do blocking I/O and are called from one worker thread at a time
(the journal's writer task awaits each call before making the next).

Segments are written ahead with zeros, as etcd preallocates its WAL files: a
write + fdatasync that grows a file must also commit the file's new size and
blocks to the filesystem's own journal, one that lands on blocks already
written only flushes the data (on this machine's ext4, ~20 % less time per
fdatasync for a 200-byte batch, ~40 % for an 8 KB one: bench/README.md). So
before a batch would pass the zeros written so far, the zeros are extended (by
as much as the segment holds, from 64 KiB up to 1 MiB at a time, never past
segment_bytes_max, a page per write: see zeros_ahead) in the same fdatasync as
the batch. Readers take a frame boundary followed by nothing but zeros as the
end of the frames (journal/reader.py). A clean close cuts the zeros off the segment being
written; the segments it rolled past keep theirs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from journal import failpoints
from journal.config import JournalConfig
from journal.fsutil import fdatasync, fsync_dir, pwrite_all
from journal.record import HEADER_BYTES, frame_header
from journal.segment import SegmentInfo, segment_name

logger = logging.getLogger(__name__)

ZEROS_AHEAD_MIN = 64 * 1024
ZEROS_AHEAD_MAX = 1024 * 1024


PAGE = 4096
_PAGE_OF_ZEROS = memoryview(bytes(PAGE))


def zeros_ahead(fd: int, end: int, limit: int) -> int:
    """Zeros written into ``fd`` from ``end`` (where the batch about to be written ends) on, as much
    again as the file holds within the bounds above, not past ``limit``; where they end.

    A page at a time, each write within one page: Linux (6.x, ext4 with large folios) may cache
    one write of many pages as one large folio, and then every later fdatasync over a byte of it
    writes the whole folio back. Zeros written 1 MiB at once made each 326-byte batch write 1–2 MiB
    to the disk (126 KB per put through the server at one client, against 4.4 KB appending);
    page by page, 4 KiB as appending does, and the fdatasync as short."""
    target = max(end, min(end + min(max(end, ZEROS_AHEAD_MIN), ZEROS_AHEAD_MAX), limit))
    at = end
    while at < target:
        upto = min(at - at % PAGE + PAGE, target)
        pwrite_all(fd, _PAGE_OF_ZEROS[:upto - at], at)
        at = upto
    return target


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class PendingRecord:
    """An appended record waiting for the writer."""

    seq: int
    rtype: int
    rev: int
    payload: bytes

    @property
    def frame_bytes(self) -> int:
        return HEADER_BYTES + len(self.payload)


class SegmentWriter:
    """Appends batches of records to the newest segment, rolling to new segments as they fill."""

    def __init__(self, directory: Path, config: JournalConfig, tail: SegmentInfo | None) -> None:
        self._directory = directory
        self._config = config
        self._info = tail
        self._fd: int | None = None
        self._next_seq = tail.seq + 1 if tail is not None else 0
        self._written = 0  # the segment's bytes so far, data and zeros ahead of it

    def open_tail(self) -> None:
        """Open the existing last segment (if any) for appending (after the zeros a process that
        died may have left ahead of its records: recovery counted the records only)."""
        if self._info is not None and self._fd is None:
            self._fd = os.open(self._info.path, os.O_WRONLY)
            self._written = os.fstat(self._fd).st_size

    def write_batch(self, batch: Sequence[PendingRecord]) -> list[SegmentInfo]:
        """Write (and, per policy, fdatasync) a batch; return the final state of each segment touched."""
        touched: list[SegmentInfo] = []
        parts: list[bytes] = []
        for record in batch:
            if self._needs_roll(record.frame_bytes):
                self._flush(parts)
                parts = []
                if self._info is not None:
                    touched.append(self._info)
                self._roll(record.rev)
            parts += (frame_header(record.rtype, record.rev, record.payload), record.payload)
            self._info = self._info.with_record(record.rev, record.frame_bytes)
        self._flush(parts)
        touched.append(self._info)
        failpoints.hit("journal.after_fsync_before_ack")
        return touched

    def close(self, trim: bool = False) -> None:
        """Close the segment; ``trim``: cut the zeros ahead of its records first (a clean close; after a
        failure the file is left as it is, for recovery to read)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if trim and self._written > self._info.size:
                    os.ftruncate(fd, self._info.size)
            finally:
                os.close(fd)

    def _needs_roll(self, frame_bytes: int) -> bool:
        if self._info is None:
            return True
        size = self._info.size
        return size > 0 and size + frame_bytes > self._config.segment_bytes_max

    def _flush(self, parts: list[bytes]) -> None:
        if not parts:
            return
        failpoints.hit("journal.before_write")
        data = b"".join(parts)
        start = self._info.size - len(data)  # _info already counts these records
        end = self._info.size
        if end > self._written:
            self._written = zeros_ahead(self._fd, end, self._config.segment_bytes_max)
        pwrite_all(self._fd, data, start)
        failpoints.hit("journal.after_write_before_fsync")
        if self._config.sync_writes:
            fdatasync(self._fd)

    def _roll(self, first_rev: int) -> None:
        self.close()  # the zeros ahead stay: the file is no longer written, readers stop at them
        path = self._directory / segment_name(self._next_seq, first_rev)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        self._fd = os.open(path, flags, 0o600)  # the keyspace: this user's alone, as etcd's WAL files
        self._written = 0
        self._info = SegmentInfo(path=path, seq=self._next_seq)
        self._next_seq += 1
        failpoints.hit("segment.after_create_before_dirsync")
        if self._config.sync_writes:
            fsync_dir(self._directory)
        logger.debug("journal segment created file=%s seq=%d first_rev=%d",
                    path.name, self._info.seq, first_rev)
