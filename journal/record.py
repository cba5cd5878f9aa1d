"""The frame: the unit of bytes on disk for journal segments and checkpoints.

Every record is written as one self-checking frame. All integers are
little-endian.

    +--------+------+-------------------------------------------------------+
    | offset | size | field                                                 |
    +--------+------+-------------------------------------------------------+
    |      0 |    2 | magic: 0x53 0x4A ("SJ")                               |
    |      2 |    1 | record type (u8); chosen by the caller, 0 is reserved |
    |      3 |    1 | flags (u8); always 0                                  |
    |      4 |    4 | payload length N (u32)                                |
    |      8 |    8 | revision tag (u64); caller-supplied, non-decreasing   |
    |        |      | within one journal                                    |
    |     16 |    4 | CRC32 (zlib.crc32) of bytes 2..15, continued over the |
    |        |      | payload                                               |
    |     20 |    N | payload                                               |
    +--------+------+-------------------------------------------------------+

A frame is valid when the magic matches, the type is non-zero, the flags are
zero, N does not exceed the configured record_bytes_max, all 20 + N bytes are
present, and the CRC matches. Anything else is a bad frame; whether a bad
frame is a torn tail or corruption is decided by the reader (see recovery.py).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"SJ"
HEADER = struct.Struct("<2sBBIQI")
HEADER_BYTES = HEADER.size
_CHECKED = struct.Struct("<BBIQ")  # bytes 2..15: the CRC-covered part of the header
_CRC = struct.Struct("<I")
_CHECKED_SPAN = (2, 16)

RTYPE_MAX = 0xFF
REV_MAX = 0xFFFF_FFFF_FFFF_FFFF
PAYLOAD_BYTES_LIMIT = 0xFFFF_FFFF


class FrameError(Exception):
    """A bad frame at an absolute file offset."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"offset {offset}: {reason}")
        self.reason = reason
        self.offset = offset


class FrameTruncated(FrameError):
    """The buffer ends before the frame does; `needed` is the frame's full size so far as known."""

    def __init__(self, reason: str, offset: int, needed: int) -> None:
        super().__init__(reason, offset)
        self.needed = needed


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class Frame:
    """A decoded frame; `payload` may be a view into the read buffer."""

    rtype: int
    rev: int
    payload: bytes | memoryview
    offset: int

    @property
    def size(self) -> int:
        return HEADER_BYTES + len(self.payload)

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class Record:
    """A journal record as returned by Journal.records()."""

    rtype: int
    rev: int
    payload: bytes
    segment: Path
    offset: int
    epoch: int = 0  # the writer that appended it, where the journal tells (JetStream); 0 otherwise


def check_fields(rtype: int, rev: int, length: int, record_bytes_max: int) -> None:
    """Raise ValueError unless the fields fit the frame format and the size limit."""
    if not 1 <= rtype <= RTYPE_MAX:
        raise ValueError(f"record type must be in 1..{RTYPE_MAX}, got {rtype}")
    if not 0 <= rev <= REV_MAX:
        raise ValueError(f"revision tag must be a u64, got {rev}")
    if length > record_bytes_max:
        raise ValueError(f"payload of {length} bytes exceeds record_bytes_max={record_bytes_max}")


def frame_header(rtype: int, rev: int, payload: bytes | memoryview) -> bytes:
    """The 20 header bytes for a frame carrying `payload` (fields are not range-checked)."""
    checked = _CHECKED.pack(rtype, 0, len(payload), rev)
    crc = zlib.crc32(payload, zlib.crc32(checked))
    return MAGIC + checked + _CRC.pack(crc)


def encode_frame(rtype: int, rev: int, payload: bytes,
                 record_bytes_max: int = PAYLOAD_BYTES_LIMIT) -> bytes:
    """One complete frame as bytes."""
    check_fields(rtype, rev, len(payload), record_bytes_max)
    return frame_header(rtype, rev, payload) + payload


def decode_frame(buf: bytes, pos: int, record_bytes_max: int, base: int = 0) -> Frame:
    """Decode the frame starting at buf[pos]; offsets are reported as base + pos.

    Raises FrameTruncated when buf ends early and FrameError for any other defect.
    """
    offset = base + pos
    available = len(buf) - pos
    if available < HEADER_BYTES:
        raise FrameTruncated("truncated header", offset, HEADER_BYTES)
    magic, rtype, flags, length, rev, crc = HEADER.unpack_from(buf, pos)
    _check_header(magic, rtype, flags, length, record_bytes_max, offset)
    if available < HEADER_BYTES + length:
        raise FrameTruncated("truncated payload", offset, HEADER_BYTES + length)
    view = memoryview(buf)
    start, stop = pos + HEADER_BYTES, pos + HEADER_BYTES + length
    checked = view[pos + _CHECKED_SPAN[0]:pos + _CHECKED_SPAN[1]]
    if zlib.crc32(view[start:stop], zlib.crc32(checked)) != crc:
        raise FrameError("crc mismatch", offset)
    return Frame(rtype, rev, view[start:stop], offset)


def _check_header(magic: bytes, rtype: int, flags: int, length: int,
                  record_bytes_max: int, offset: int) -> None:
    if magic != MAGIC:
        raise FrameError("bad magic", offset)
    if length > record_bytes_max:
        raise FrameError(f"payload length {length} exceeds record_bytes_max={record_bytes_max}", offset)
    if rtype == 0:
        raise FrameError("reserved record type 0", offset)
    if flags != 0:
        raise FrameError(f"unknown flags 0x{flags:02x}", offset)
