"""A gzip request message taken apart as etcd's server (grpc-go's gzip codec over Go's
compress/gzip) takes it, so that a bad one is refused with the same words.

grpc-go reads the gzip header first (``gzip.NewReader``), then compares the size the
member's trailer declares (its last four bytes) with the receive limit, and only then
inflates, at most one byte past the limit; Go's gzip reader goes on to further members
until the input ends, and checks each member's CRC-32 and size.
"""
from __future__ import annotations

import zlib

_FTEXT, _FHCRC, _FEXTRA, _FNAME, _FCOMMENT = 1, 2, 4, 8, 16


class GzipError(Exception):
    """The message is not gzip as Go reads it; ``str()`` is Go's error text."""


class TooLarge(Exception):
    """The message is, or says it is, larger than the limit once inflated."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def gunzip(raw: bytes, limit: int) -> bytes:
    """``raw`` inflated; GzipError or TooLarge as grpc-go's codec would fail."""
    pos = _header(raw, 0, first=True)
    if len(raw) >= 4 and int.from_bytes(raw[-4:], "little") > limit:
        raise TooLarge(int.from_bytes(raw[-4:], "little"))
    out = bytearray()
    while True:
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            data = inflater.decompress(raw[pos:], limit + 1 - len(out))
        except zlib.error:
            raise GzipError(f"flate: corrupt input before offset {_corrupt_offset(raw[pos:])}") from None
        out += data
        if len(out) > limit:
            raise TooLarge(len(out))
        if not inflater.eof:
            raise GzipError("unexpected EOF")
        pos = len(raw) - len(inflater.unused_data)
        if len(raw) - pos < 8:
            raise GzipError("unexpected EOF")
        crc, size = int.from_bytes(raw[pos:pos + 4], "little"), int.from_bytes(raw[pos + 4:pos + 8], "little")
        pos += 8
        if crc != zlib.crc32(data) or size != len(data) & 0xFFFFFFFF:
            raise GzipError("gzip: invalid checksum")
        if pos == len(raw):
            return bytes(out)
        pos = _header(raw, pos, first=False)


def _header(raw: bytes, pos: int, first: bool) -> int:
    """Where the deflate data of the member whose header starts at ``pos`` begins."""
    head = raw[pos:pos + 10]
    if len(head) < 10:
        raise GzipError("EOF" if first and not head else "unexpected EOF")
    if head[0] != 0x1F or head[1] != 0x8B or head[2] != 8:
        raise GzipError("gzip: invalid header")
    flags, start, pos = head[3], pos, pos + 10
    if flags & _FEXTRA:
        if len(raw) < pos + 2:
            raise GzipError("unexpected EOF")
        pos += 2 + int.from_bytes(raw[pos:pos + 2], "little")
        if len(raw) < pos:
            raise GzipError("unexpected EOF")
    for flag in (_FNAME, _FCOMMENT):
        if flags & flag:
            end = raw.find(b"\0", pos)
            if end < 0:
                raise GzipError("EOF")  # Go reads these strings up to a NUL, and passes io.EOF on
            pos = end + 1
    if flags & _FHCRC:
        if len(raw) < pos + 2:
            raise GzipError("unexpected EOF")
        if int.from_bytes(raw[pos:pos + 2], "little") != zlib.crc32(raw[start:pos]) & 0xFFFF:
            raise GzipError("gzip: invalid header")
        pos += 2
    return pos


def _corrupt_offset(deflated: bytes) -> int:
    """How many bytes of the deflate data Go's reader had taken when it found them corrupt: those
    up to the first byte after which the data can no longer be a deflate stream."""
    inflater, step = zlib.decompressobj(-zlib.MAX_WBITS), 4096
    for start in range(0, len(deflated), step):  # a block at a time, then its bytes one by one
        before = inflater.copy()
        try:
            inflater.decompress(deflated[start:start + step])
            continue
        except zlib.error:
            pass
        for i in range(start, min(start + step, len(deflated))):
            try:
                before.decompress(deflated[i:i + 1])
            except zlib.error:
                return i + 1
    return len(deflated)
