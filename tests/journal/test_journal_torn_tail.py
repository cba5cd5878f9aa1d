from __future__ import annotations

import pytest

from journal import Journal, JournalConfig


def build(jdir, write_journal, make_items, config=JournalConfig()):
    items = make_items(4, payload_bytes=23)
    write_journal(jdir, items, config)
    journal = Journal.open(jdir, config)
    last = list(journal.records())[-1]
    return items, last, last.segment.read_bytes()


def test_every_cut_inside_the_last_record_is_a_torn_tail(tmp_path, jdir, write_journal, make_items):
    items, last, pristine = build(jdir, write_journal, make_items)
    assert len(pristine) == last.offset + 20 + 23
    for cut in range(last.offset + 1, len(pristine)):  # header and payload
        case = tmp_path / f"cut{cut}"
        case.mkdir()
        segment = case / last.segment.name
        segment.write_bytes(pristine[:cut])
        journal = Journal.open(case)
        got = [(r.rtype, r.rev, r.payload) for r in journal.records()]
        assert got == items[:-1], cut
        assert segment.stat().st_size == last.offset
        broken = case / f"{last.segment.name}.broken-{last.offset}"
        assert broken.read_bytes() == pristine[last.offset:cut]
        assert journal.last_rev == items[-2][1]


def test_torn_tail_in_last_of_several_segments(tmp_path, jdir, write_journal, make_items):
    config = JournalConfig(segment_bytes_max=100)  # two 43-byte frames per segment
    items, last, pristine = build(jdir, write_journal, make_items, config)
    assert len(Journal.open(jdir, config).segments) == 2
    last.segment.write_bytes(pristine[:last.offset + 7])
    journal = Journal.open(jdir, config)
    assert [r.rev for r in journal.records()] == [rev for _, rev, _ in items[:-1]]


@pytest.mark.parametrize("zeros", [1, 19, 20, 4096])
def test_zero_filled_tail_is_torn(jdir, write_journal, make_items, reopen_records, zeros):
    items = make_items(3)
    write_journal(jdir, items)
    segment = Journal.open(jdir).segments[-1]
    size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\x00" * zeros)
    assert reopen_records(jdir) == items
    assert segment.stat().st_size == size
    assert segment.with_name(f"{segment.name}.broken-{size}").read_bytes() == b"\x00" * zeros


def test_partial_record_then_zeros_is_torn(jdir, write_journal, make_items, reopen_records):
    items, last, pristine = build(jdir, write_journal, make_items)
    last.segment.write_bytes(pristine[:last.offset + 30] + b"\x00" * 500)
    assert reopen_records(jdir) == items[:-1]


def test_appending_after_repair_and_reopening(jdir, write_journal, make_items, reopen_records):
    items, last, pristine = build(jdir, write_journal, make_items)
    last.segment.write_bytes(pristine[:-1])
    write_journal(jdir, [(9, 100, b"after repair")])
    assert reopen_records(jdir) == items[:-1] + [(9, 100, b"after repair")]


def test_fully_torn_first_record_leaves_empty_segment_that_is_reused(jdir, write_journal, reopen_records):
    write_journal(jdir, [(1, 1, b"only")])
    segment = Journal.open(jdir).segments[0]
    segment.write_bytes(segment.read_bytes()[:10])
    journal = Journal.open(jdir)
    assert list(journal.records()) == [] and journal.segments == [segment]
    write_journal(jdir, [(1, 1, b"again")])
    assert reopen_records(jdir) == [(1, 1, b"again")]


def test_only_the_newest_torn_tail_copies_are_kept(jdir, write_journal, make_items):
    """Six repairs in a row leave three .broken copies, the newest ones (issue 18)."""
    import os

    from journal.recovery import BROKEN_COPIES_KEPT

    write_journal(jdir, make_items(3))
    segment = Journal.open(jdir).segments[-1]
    made = []
    for i in range(6):
        write_journal(jdir, [(1, 10 + i, b"more")])  # each tear at a new offset
        size = segment.stat().st_size
        with open(segment, "ab") as f:
            f.write(b"\x00" * (100 + i))
        Journal.open(jdir)
        copy = segment.with_name(f"{segment.name}.broken-{size}")
        assert copy.read_bytes() == b"\x00" * (100 + i)
        os.utime(copy, ns=(i * 10**9, i * 10**9))  # distinct ages even on a coarse clock
        made.append(copy.name)
    assert BROKEN_COPIES_KEPT == 3
    assert sorted(p.name for p in jdir.glob("*.broken-*")) == sorted(made[-3:])
