from __future__ import annotations

import pytest

from journal import Journal, JournalConfig, JournalCorrupt
from journal.record import encode_frame


def flip(path, offset: int, bit: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 1 << bit
    path.write_bytes(bytes(raw))


def test_bit_flip_in_an_earlier_record_is_corruption(tmp_path, write_journal, make_items):
    pristine_dir = tmp_path / "pristine"
    write_journal(pristine_dir, make_items(5, payload_bytes=12))
    records = list(Journal.open(pristine_dir).records())
    victim = records[2]
    pristine = victim.segment.read_bytes()
    for index in range(victim.offset, victim.offset + 32):
        case = tmp_path / f"flip{index}"
        case.mkdir()
        segment = case / victim.segment.name
        segment.write_bytes(pristine)
        flip(segment, index, bit=index % 8)
        with pytest.raises(JournalCorrupt) as info:
            Journal.open(case)
        assert (info.value.path, info.value.offset) == (segment, victim.offset), index
        assert segment.name in str(info.value) and str(victim.offset) in str(info.value)
        assert segment.stat().st_size == len(pristine)  # nothing was truncated
        assert not list(case.glob("*.broken-*"))


def test_bit_flip_in_last_record_of_a_non_last_segment(jdir, write_journal, make_items):
    config = JournalConfig(segment_bytes_max=100)
    write_journal(jdir, make_items(6, payload_bytes=23), config)
    records = list(Journal.open(jdir, config).records())
    segments = Journal.open(jdir, config).segments
    victim = [r for r in records if r.segment == segments[0]][-1]
    flip(victim.segment, victim.offset + 25)
    with pytest.raises(JournalCorrupt, match="not in the last segment") as info:
        Journal.open(jdir, config)
    assert (info.value.path, info.value.offset) == (segments[0], victim.offset)


def test_truncated_non_last_segment_is_corruption(jdir, write_journal, make_items):
    config = JournalConfig(segment_bytes_max=100)
    write_journal(jdir, make_items(6, payload_bytes=23), config)
    journal = Journal.open(jdir, config)
    first = journal.segments[0]
    last = [r for r in journal.records() if r.segment == first][-1]
    first.write_bytes(first.read_bytes()[:last.offset + 20 + 23 - 3])  # its records' bytes, not the zeros after them
    with pytest.raises(JournalCorrupt):
        Journal.open(jdir, config)


def test_revision_going_backwards_is_corruption(jdir, write_journal):
    write_journal(jdir, [(1, 10, b"a")])
    segment = Journal.open(jdir).segments[0]
    size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(encode_frame(1, 9, b"b"))
    with pytest.raises(JournalCorrupt, match="backwards") as info:
        Journal.open(jdir)
    assert info.value.offset == size


def test_missing_middle_segment_is_corruption(jdir, write_journal, make_items):
    config = JournalConfig(segment_bytes_max=100)
    write_journal(jdir, make_items(6, payload_bytes=23), config)
    Journal.open(jdir, config).segments[1].unlink()
    with pytest.raises(JournalCorrupt, match="sequence gap"):
        Journal.open(jdir, config)


def test_garbage_between_valid_frames_in_last_segment(jdir, write_journal):
    write_journal(jdir, [(1, 1, b"a")])
    segment = Journal.open(jdir).segments[0]
    size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\x00" * 64 + encode_frame(1, 2, b"b"))
    with pytest.raises(JournalCorrupt, match="valid frame follows at offset") as info:
        Journal.open(jdir)
    assert info.value.offset == size
