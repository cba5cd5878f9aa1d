"""Open-time scan of a journal directory: validate every frame, cut a torn tail.

Rules:
  * Segments must have contiguous sequence numbers, from at most the first
    segment the writer's last release kept (its `released` marker) on.
  * Revision tags must never decrease, within or across segments.
  * A frame boundary followed by nothing but zeros ends a segment's frames:
    the zeros its writer writes ahead (journal/writer.py).
  * A bad frame in the last segment with no valid frame anywhere after it, or
    with a whole sector of zeros in it, is a torn tail (an interrupted write:
    journal/reader.corrupt_unless_torn): the tail is copied to
    `<segment>.broken-<offset>` and the segment is truncated at the bad frame.
    Only the newest BROKEN_COPIES_KEPT copies are kept in a directory.
  * Any other bad frame raises JournalCorrupt.
  * Unless the fsync policy is "off", every segment found is fdatasynced, so
    whatever is replayed is durable even if its writer died before fsyncing.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from journal.config import JournalConfig
from journal.errors import JournalCorrupt, JournalHeadLost
from journal.fsutil import fdatasync, fsync_dir
from journal.reader import checked_frames, corrupt_unless_torn, iter_frames
from journal.record import HEADER_BYTES, FrameError, Record
from journal.segment import RELEASED_FILE, SegmentInfo, head_lost, list_segments

logger = logging.getLogger(__name__)


def recover(directory: Path, config: JournalConfig,
            kept: dict[Path, list[Record]] | None = None) -> list[SegmentInfo]:
    """Scan every segment in `directory`, repairing a torn tail; return their summaries.
    With `kept`, also the records of each segment's valid frames, by segment path (read
    once here for a replay that follows: the scan reads every payload anyway)."""
    listed = list_segments(directory)
    _check_contiguous(listed)
    if (why := head_lost(directory, listed)) is not None:
        raise JournalHeadLost(
            f"journal {directory}: {why}. Refusing to open it, and nothing was cut. Put the segments back; or, to "
            f"serve without them, delete {directory / RELEASED_FILE} and start again (the start then refuses "
            "acknowledged revisions it can tell are gone)")
    infos: list[SegmentInfo] = []
    prev_rev = 0
    for index, (seq, path) in enumerate(listed):
        is_last = index == len(listed) - 1
        keep = None if kept is None else kept.setdefault(path, [])
        info = _recover_segment(path, seq, prev_rev, is_last, config, keep)
        infos.append(info)
        prev_rev = info.last_rev if info.last_rev is not None else prev_rev
    if config.sync_writes and infos:
        _make_durable(infos, directory)
    return infos


def _make_durable(infos: list[SegmentInfo], directory: Path) -> None:
    """fdatasync what recovery found: a previous process may have died before its fsync,
    and records about to be replayed must not vanish in a later OS crash."""
    for info in infos:
        fd = os.open(info.path, os.O_RDONLY)
        try:
            fdatasync(fd)
        finally:
            os.close(fd)
    fsync_dir(directory)


def sequence_gaps(listed: list[tuple[int, Path]]) -> dict[Path, str]:
    """Each listed segment whose number does not follow the one before it, with why (``journal
    verify`` reports them all; opening a journal refuses at the first)."""
    return {path: f"segment sequence gap: expected seq {prev_seq + 1}, found {seq}"
            for (prev_seq, _), (seq, path) in zip(listed, listed[1:]) if seq != prev_seq + 1}


def _check_contiguous(listed: list[tuple[int, Path]]) -> None:
    """JournalCorrupt at the first segment that does not follow the one before it."""
    if gaps := sequence_gaps(listed):
        path, why = next(iter(gaps.items()))
        raise JournalCorrupt(path, 0, why)


def _recover_segment(path: Path, seq: int, prev_rev: int, is_last: bool,
                     config: JournalConfig, keep: list[Record] | None = None) -> SegmentInfo:
    with open(path, "rb") as f:
        file_bytes = os.fstat(f.fileno()).st_size
        info, bad = scan_segment(f, path, seq, file_bytes, prev_rev, config, keep)
        if bad is None:
            return info
        if not is_last:
            raise JournalCorrupt(path, bad.offset, f"{bad.reason} (not in the last segment)")
        later = corrupt_unless_torn(f, bad.offset, file_bytes, config.record_bytes_max)
        if later is not None:
            raise JournalCorrupt(path, bad.offset, f"{bad.reason}; valid frame follows at offset {later}")
        cut_torn_tail(f, path, bad.offset, file_bytes, bad.reason)
    return info


def scan_segment(f, path: Path, seq: int, end: int, prev_rev: int, config: JournalConfig,
                 keep: list[Record] | None = None) -> tuple[SegmentInfo, FrameError | None]:
    """Summarise the valid prefix of a segment; also return the first bad frame, if any.
    With `keep`, the valid prefix's records are appended to it."""
    size = count = 0
    first_rev = last_rev = None
    bad = None
    append = keep.append if keep is not None else None
    try:
        for frame in iter_frames(f, 0, end, config.record_bytes_max, config.read_chunk_bytes):
            rev = frame.rev
            if rev < prev_rev:
                raise JournalCorrupt(path, frame.offset, f"revision tag goes backwards: {rev} after {prev_rev}")
            if not count:
                first_rev = rev
            count += 1
            size += HEADER_BYTES + len(frame.payload)
            last_rev = prev_rev = rev
            if append is not None:
                append(Record(frame.rtype, rev, bytes(frame.payload), path, frame.offset))
    except FrameError as exc:
        bad = exc
    return SegmentInfo(path, seq, size, count, first_rev, last_rev), bad


BROKEN_COPIES_KEPT = 3


def cut_torn_tail(f, path: Path, offset: int, file_bytes: int, reason: str) -> None:
    """Keep a copy of path[offset:] as <path>.broken-<offset>, then truncate path at offset."""
    broken = path.with_name(f"{path.name}.broken-{offset}")
    f.seek(offset)
    with open(broken, "wb") as out:
        shutil.copyfileobj(f, out)
        out.flush()
        os.fsync(out.fileno())
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, offset)
        fdatasync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)
    logger.warning("journal torn tail truncated file=%s offset=%d bytes_cut=%d reason=%s copy=%s",
                   path, offset, file_bytes - offset, reason, broken.name)
    _prune_broken_copies(path.parent)


def _prune_broken_copies(directory: Path) -> None:
    """Repeated repairs must not fill the disk with old torn tails: keep the newest few."""
    copies = sorted(directory.glob("*.broken-*"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    for old in copies[:-BROKEN_COPIES_KEPT]:
        size = old.stat().st_size
        old.unlink()
        logger.warning("journal torn tail copy removed file=%s bytes=%d kept=%d", old.name, size, BROKEN_COPIES_KEPT)


def truncate_segments(segments: list[SegmentInfo], rev: int,
                      config: JournalConfig) -> tuple[list[SegmentInfo], int]:
    """Physically drop every record with rev tag > rev; return (remaining segments, records removed)."""
    for index, info in enumerate(segments):
        if not info.covered_by(rev):
            break
    else:
        return segments, 0
    kept, removed_here = _truncate_segment(info, rev, config)
    later = segments[index + 1:]
    for doomed in later:
        doomed.path.unlink()
    fsync_dir(info.path.parent)
    removed = removed_here + sum(doomed.count for doomed in later)
    logger.info("journal truncated after_rev=%d file=%s offset=%d records_removed=%d segments_removed=%d",
                rev, info.path, kept.size, removed, len(later))
    return segments[:index] + [kept], removed


def _truncate_segment(info: SegmentInfo, rev: int, config: JournalConfig) -> tuple[SegmentInfo, int]:
    kept = SegmentInfo(path=info.path, seq=info.seq)
    with open(info.path, "rb") as f:
        for frame in checked_frames(f, info.path, 0, info.size, config.record_bytes_max,
                                    config.read_chunk_bytes):
            if frame.rev > rev:
                break
            kept = kept.with_record(frame.rev, frame.size)
    fd = os.open(info.path, os.O_WRONLY)
    try:
        os.ftruncate(fd, kept.size)
        fdatasync(fd)
    finally:
        os.close(fd)
    return kept, info.count - kept.count
