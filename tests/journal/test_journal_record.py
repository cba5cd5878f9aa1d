from __future__ import annotations

import io
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.reader import find_valid_frame, iter_frames
from journal.record import (HEADER_BYTES, MAGIC, FrameError, FrameTruncated, decode_frame,
                            encode_frame)

LIMIT = 1 << 20
rtypes = st.integers(min_value=1, max_value=255)
revs = st.integers(min_value=0, max_value=2**64 - 1)
payloads = st.binary(max_size=600)


@settings(max_examples=200, deadline=None)
@given(rtype=rtypes, rev=revs, payload=payloads)
def test_round_trip(rtype, rev, payload):
    raw = encode_frame(rtype, rev, payload)
    assert raw[:2] == MAGIC and len(raw) == HEADER_BYTES + len(payload)
    frame = decode_frame(raw, 0, LIMIT)
    assert (frame.rtype, frame.rev, bytes(frame.payload), frame.offset, frame.end) == (
        rtype, rev, payload, 0, len(raw))


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(st.tuples(rtypes, revs, payloads), max_size=12),
       chunk=st.integers(min_value=1, max_value=64))
def test_stream_of_frames_with_tiny_read_chunks(frames, chunk):
    raw = b"".join(encode_frame(*f) for f in frames)
    decoded = iter_frames(io.BytesIO(raw), 0, len(raw), LIMIT, chunk)
    got = [(f.rtype, f.rev, bytes(f.payload)) for f in decoded]
    assert got == frames


def test_layout_matches_documented_table():
    raw = encode_frame(7, 0x0102030405060708, b"abc")
    assert raw[0:2] == b"\x53\x4a"
    assert raw[2] == 7 and raw[3] == 0
    assert struct.unpack_from("<I", raw, 4)[0] == 3
    assert struct.unpack_from("<Q", raw, 8)[0] == 0x0102030405060708
    assert struct.unpack_from("<I", raw, 16)[0] == zlib.crc32(raw[2:16] + b"abc")
    assert raw[20:] == b"abc"


def test_rejects_bad_magic():
    raw = bytearray(encode_frame(1, 1, b"payload"))
    raw[0] ^= 0xFF
    with pytest.raises(FrameError, match="bad magic"):
        decode_frame(bytes(raw), 0, LIMIT)


def test_rejects_every_single_bit_flip_after_magic():
    raw = encode_frame(3, 99, b"some payload bytes")
    for bit in range(16, len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FrameError) as info:
            decode_frame(bytes(damaged), 0, LIMIT)
        assert info.value.offset == 0


def test_rejects_oversize_length_before_reading_payload():
    raw = encode_frame(1, 1, b"x" * 100)
    with pytest.raises(FrameError, match="exceeds record_bytes_max") as info:
        decode_frame(raw, 0, 99)
    assert not isinstance(info.value, FrameTruncated)


def test_rejects_reserved_type_and_flags_even_with_valid_crc():
    def forged(rtype: int, flags: int) -> bytes:
        checked = struct.pack("<BBIQ", rtype, flags, 1, 5)
        return MAGIC + checked + struct.pack("<I", zlib.crc32(checked + b"z")) + b"z"

    with pytest.raises(FrameError, match="reserved"):
        decode_frame(forged(0, 0), 0, LIMIT)
    with pytest.raises(FrameError, match="flags"):
        decode_frame(forged(1, 1), 0, LIMIT)


def test_truncation_reports_needed_size():
    raw = encode_frame(1, 1, b"x" * 10)
    with pytest.raises(FrameTruncated) as info:
        decode_frame(raw[:5], 0, LIMIT, base=100)
    assert (info.value.offset, info.value.needed) == (100, HEADER_BYTES)
    with pytest.raises(FrameTruncated) as info:
        decode_frame(raw[:-1], 0, LIMIT)
    assert info.value.needed == len(raw)


@pytest.mark.parametrize("rtype, rev", [(0, 1), (256, 1), (1, -1), (1, 2**64)])
def test_encode_rejects_out_of_range_fields(rtype, rev):
    with pytest.raises(ValueError):
        encode_frame(rtype, rev, b"")


def test_encode_rejects_oversize_payload():
    with pytest.raises(ValueError):
        encode_frame(1, 1, b"x" * 11, record_bytes_max=10)


def test_find_valid_frame_skips_fake_magic():
    good = encode_frame(2, 9, b"hello")
    raw = b"\x00" * 5 + b"SJ garbage SJ" + good + b"tail"
    start = raw.index(good)
    assert find_valid_frame(io.BytesIO(raw), 0, len(raw), LIMIT) == start
    assert find_valid_frame(io.BytesIO(raw), start, len(raw), LIMIT) is None
    assert find_valid_frame(io.BytesIO(raw), 0, len(raw) - 5, LIMIT) is None


def _reference_frames(raw: bytes, limit: int):
    """Frames of raw as decode_frame reads them one by one, then the error that ends them (None: none)."""
    out, pos = [], 0
    while pos < len(raw):
        try:
            frame = decode_frame(raw, pos, limit)
        except FrameError as exc:
            return out, (type(exc), exc.reason, exc.offset)
        out.append((frame.rtype, frame.rev, bytes(frame.payload), frame.offset))
        pos = frame.end
    return out, None


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.tuples(rtypes, revs, st.binary(max_size=80)), min_size=1, max_size=8),
       damage=st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
       cut=st.integers(min_value=0, max_value=40), chunk=st.integers(min_value=1, max_value=64),
       limit=st.sampled_from([LIMIT, 40]))
def test_iter_frames_reads_damaged_streams_as_decode_frame_does(frames, damage, cut, chunk, limit):
    """iter_frames checks frames inline (decode_frame only for the error): the same frames, then
    the same error at the same offset, whatever byte is damaged or however short the stream is."""
    raw = bytearray(b"".join(encode_frame(*f) for f in frames))
    where, value = damage
    raw[where % len(raw)] = value
    raw = bytes(raw[:max(0, len(raw) - cut)])
    want, error = _reference_frames(raw, limit)
    got = []
    try:
        for f in iter_frames(io.BytesIO(raw), 0, len(raw), limit, chunk):
            got.append((f.rtype, f.rev, bytes(f.payload), f.offset))
    except FrameError as exc:
        assert (type(exc), exc.reason, exc.offset) == error
    else:
        assert error is None
    assert got == want
