"""shim/gogzip.py: a gzip request message read as Go's compress/gzip reads it (the differential
against etcd is tests/integration/test_http2_differential.py; these are the shapes Python's gzip
module writes and the limits, checked without a server)."""
from __future__ import annotations

import gzip
import struct
import zlib

import pytest

from shim.gogzip import GzipError, TooLarge, gunzip

LIMIT = 1 << 20


def member(data: bytes, name: bytes = b"", extra: bytes = b"", comment: bytes = b"", header_crc: bool = False) -> bytes:
    """One gzip member with the optional header fields RFC 1952 allows."""
    flags = (8 if name else 0) | (4 if extra else 0) | (16 if comment else 0) | (2 if header_crc else 0)
    head = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\xff"
    if extra:
        head += struct.pack("<H", len(extra)) + extra
    if name:
        head += name + b"\0"
    if comment:
        head += comment + b"\0"
    if header_crc:
        head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    deflater = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflater.compress(data) + deflater.flush()
    return head + body + struct.pack("<II", zlib.crc32(data), len(data))


def refusal(raw: bytes, limit: int = LIMIT) -> str:
    with pytest.raises(GzipError) as info:
        gunzip(raw, limit)
    return str(info.value)


def test_members_with_every_header_field_and_several_members():
    assert gunzip(gzip.compress(b"hello"), LIMIT) == b"hello"
    assert gunzip(member(b"a", name=b"f.txt", extra=b"xy", comment=b"c", header_crc=True), LIMIT) == b"a"
    assert gunzip(member(b"one ") + member(b"two", name=b"n") + gzip.compress(b""), LIMIT) == b"one two"


def test_headers_go_does_not_take():
    assert refusal(b"") == "EOF"
    assert refusal(b"\x1f\x8b\x08\0") == "unexpected EOF"
    assert refusal(b"\x1f\x8c" + bytes(30)) == "gzip: invalid header"
    assert refusal(b"\x1f\x8b\x07" + bytes(30)) == "gzip: invalid header"  # not deflate
    bad_crc = bytearray(member(b"a", header_crc=True))
    bad_crc[10] ^= 1
    assert refusal(bytes(bad_crc)) == "gzip: invalid header"
    assert refusal(member(b"a", name=b"f")[:11]) == "EOF"  # the name never ends: Go passes io.EOF on
    # after a whole member (the limit above any size its last four bytes could declare)
    assert refusal(gzip.compress(b"a") + b"\x1f", limit=1 << 32) == "unexpected EOF"  # a second header cut short
    assert refusal(gzip.compress(b"a") + b"x" * 12, limit=1 << 32) == "gzip: invalid header"


def test_data_and_trailer_damage():
    whole = gzip.compress(b"some data " * 50)
    assert refusal(whole[:-8] + b"\0\0\0\0" + whole[-4:]) == "gzip: invalid checksum"
    cut = whole[:20] + whole[-4:]  # the data cut short, the declared size kept
    assert refusal(cut) == "unexpected EOF"
    assert refusal(whole[:10] + b"\xff" + whole[11:]) == "flate: corrupt input before offset 1"  # a reserved block type


def test_limits():
    big = gzip.compress(bytes(LIMIT + 1))
    with pytest.raises(TooLarge) as info:
        gunzip(big, LIMIT)
    assert info.value.size == LIMIT + 1  # the size the trailer declares, before inflating
    lying = big[:-4] + (10).to_bytes(4, "little")
    with pytest.raises(TooLarge) as info:
        gunzip(lying, LIMIT)
    assert info.value.size == LIMIT + 1  # inflated one byte past the limit, no further
    assert len(gunzip(gzip.compress(bytes(LIMIT)), LIMIT)) == LIMIT
