"""Streaming frame reads from a file region, and the search for a later valid frame."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from journal.errors import JournalCorrupt
from journal.record import HEADER, HEADER_BYTES, MAGIC, Frame, FrameError, FrameTruncated, decode_frame

SEARCH_CHUNK_BYTES = 1024 * 1024


def iter_frames(f: BinaryIO, start: int, end: int, record_bytes_max: int,
                chunk_bytes: int) -> Iterator[Frame]:
    """Yield the frames in f[start:end] in order.

    Raises FrameError (with the absolute offset) at the first bad frame; a
    frame cut short by `end` raises FrameTruncated. A frame boundary followed
    by nothing but zeros up to `end` is the end of the frames: the zeros the
    writer writes ahead of its records (journal/writer.py); a frame never
    starts with a zero byte (MAGIC).

    Each frame is read as its header, then its payload, straight from `f` (a
    buffered file serves small frames from its buffer; a large payload is read
    into its own bytes object, copied once): its ``payload`` is bytes.  The
    checks of ``decode_frame`` are made inline; a frame that fails any of them
    goes through ``decode_frame`` for its error.  (``chunk_bytes`` is unused: a
    file's own buffer sizes the reads.)
    """
    f.seek(start)
    read, unpack, crc32, hb = f.read, HEADER.unpack_from, zlib.crc32, HEADER_BYTES
    pos = start
    while pos < end:
        head = read(min(hb, end - pos))
        if len(head) == hb:
            magic, rtype, flags, length, rev, crc = unpack(head)
            if magic == MAGIC and rtype and not flags and length <= record_bytes_max:
                payload = read(min(length, end - pos - hb))
                if len(payload) == length and crc32(payload, crc32(head[2:16])) == crc:
                    yield Frame(rtype, rev, payload, pos)
                    pos += hb + length
                    continue
                head += payload
        if head and not head.strip(b"\0") and zeros_up_to(f, end):
            return
        decode_frame(head, 0, record_bytes_max, base=pos)  # raises this frame's error
        raise AssertionError(f"decode_frame accepted a frame iter_frames did not, at offset {pos}")


def zeros_up_to(f: BinaryIO, end: int) -> bool:
    """Whether ``f`` holds nothing but zeros from where it is to ``end`` (or to its end, if sooner)."""
    pos = f.tell()
    while pos < end:
        chunk = f.read(min(SEARCH_CHUNK_BYTES, end - pos))
        if not chunk:
            return True
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def checked_frames(f: BinaryIO, path: Path, start: int, end: int, record_bytes_max: int,
                   chunk_bytes: int) -> Iterator[Frame]:
    """iter_frames for data already validated once: any bad frame is JournalCorrupt."""
    try:
        yield from iter_frames(f, start, end, record_bytes_max, chunk_bytes)
    except FrameError as exc:
        raise JournalCorrupt(path, exc.offset, exc.reason) from exc


SECTOR_BYTES = 512  # what a disk writes whole, at least (etcd's WAL assumes the same)


def corrupt_unless_torn(f: BinaryIO, bad: int, end: int, record_bytes_max: int) -> int | None:
    """For the first bad frame (at offset ``bad``) of a journal's last segment: the offset of a
    valid frame after it that makes it corruption, or None when it is a write that never finished
    (a torn tail, to be cut). It is one when no valid frame follows it, or when a whole sector
    of the bad frame still holds zeros: every batch but the last was fdatasynced whole, so only
    the last one can be partly on disk, and since segments are written over zeros
    (journal/writer.py) a sector of it the disk had not written yet reads as zeros, even with a
    later sector of the same batch, valid frames and all, written before the process died."""
    later = find_valid_frame(f, bad, end, record_bytes_max)
    if later is None:
        return None
    f.seek(bad)
    head = f.read(HEADER_BYTES)
    stop = bad + len(head)
    if len(head) == HEADER_BYTES:
        magic, rtype, flags, length, _, _ = HEADER.unpack(head)
        if magic == MAGIC and rtype and not flags and length <= record_bytes_max:
            stop = min(end, bad + HEADER_BYTES + length)  # the frame as its header says it was meant
    return None if _zero_sector(f, bad, stop) else later


def _zero_sector(f: BinaryIO, start: int, stop: int) -> bool:
    """Whether a whole, aligned sector overlapping f[start:stop] holds nothing but zeros."""
    pos = start - start % SECTOR_BYTES
    f.seek(pos)
    while pos < stop:
        sector = f.read(SECTOR_BYTES)
        if len(sector) < SECTOR_BYTES:
            return False
        if sector.count(0) == SECTOR_BYTES:
            return True
        pos += SECTOR_BYTES
    return False


def find_valid_frame(f: BinaryIO, after: int, end: int, record_bytes_max: int) -> int | None:
    """Offset of the first valid frame starting in f[after + 1:end], or None.

    Every occurrence of the magic is tested for length and CRC.
    """
    for offset in _magic_offsets(f, after + 1, end):
        if _valid_frame_at(f, offset, end, record_bytes_max):
            return offset
    return None


def _magic_offsets(f: BinaryIO, start: int, end: int) -> Iterator[int]:
    pos = start
    while pos < end:
        f.seek(pos)
        chunk = f.read(min(SEARCH_CHUNK_BYTES, end - pos))
        if len(chunk) < len(MAGIC):
            return
        hit = chunk.find(MAGIC)
        while hit != -1:
            yield pos + hit
            hit = chunk.find(MAGIC, hit + 1)
        pos += len(chunk) - (len(MAGIC) - 1)


def _valid_frame_at(f: BinaryIO, offset: int, end: int, record_bytes_max: int) -> bool:
    f.seek(offset)
    head = f.read(min(end - offset, HEADER_BYTES))
    try:
        decode_frame(head, 0, record_bytes_max, base=offset)
        return True
    except FrameTruncated as exc:
        needed = exc.needed
    except FrameError:
        return False
    if needed == HEADER_BYTES or offset + needed > end:
        return False
    f.seek(offset)
    try:
        decode_frame(f.read(needed), 0, record_bytes_max, base=offset)
    except FrameError:
        return False
    return True
