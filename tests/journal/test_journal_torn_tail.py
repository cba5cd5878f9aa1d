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
def test_zeros_after_the_last_record_end_the_records_and_are_written_over(jdir, write_journal, make_items,
                                                                          reopen_records, zeros):
    """The zeros a writer writes ahead of its records (left there when it died) are where the records
    end, not a torn tail: nothing is cut or copied, and the next writer writes over them; its clean
    close leaves the file its records' length."""
    items = make_items(3)
    write_journal(jdir, items)
    segment = Journal.open(jdir).segments[-1]
    size = segment.stat().st_size
    assert size == 3 * (20 + 16)  # a clean close cut the zeros ahead
    with open(segment, "ab") as f:
        f.write(b"\x00" * zeros)
    assert reopen_records(jdir) == items
    assert segment.stat().st_size == size + zeros and not list(jdir.glob("*.broken-*"))
    write_journal(jdir, [(1, 9, b"after the zeros")])
    assert reopen_records(jdir) == items + [(1, 9, b"after the zeros")]
    assert segment.stat().st_size == size + 20 + 15 and not list(jdir.glob("*.broken-*"))


def test_a_writer_keeps_zeros_ahead_of_its_records_while_it_writes(jdir, make_items, reopen_records):
    """While a journal is written (as a process that died leaves it) its segment runs on in zeros
    past the records, from 64 KiB, and the records read back whole; a clean close cuts the zeros."""
    import asyncio

    from journal.writer import ZEROS_AHEAD_MIN

    items = make_items(5)
    used = 5 * (20 + 16)

    async def go():
        journal = Journal.open(jdir)
        await journal.start()
        for rtype, rev, payload in items:
            journal.append(rtype, rev, payload)
        await journal.sync()
        segment = journal.segments[-1]
        data = segment.read_bytes()
        assert len(data) == used + ZEROS_AHEAD_MIN and data[used:] == bytes(ZEROS_AHEAD_MIN)
        assert reopen_records(jdir) == items
        await journal.close()
        return segment

    segment = asyncio.run(go())
    assert segment.stat().st_size == used and reopen_records(jdir) == items


def test_a_small_batch_over_the_zeros_ahead_writes_about_a_page_to_the_disk(jdir):
    """Lone 300-byte records, each its own write + fdatasync, over zeros written ahead up to 1 MiB:
    each costs the disk about a page (the kernel's write_bytes for this process), as appending
    did. Zeros written in one write of many pages were cached by Linux as large folios, and each
    later fdatasync wrote the whole folio back: 1-2 MiB per record on this machine's kernel."""
    import asyncio

    def written_to_disk() -> int:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("write_bytes"))

    async def go() -> float:
        journal = Journal.open(jdir)
        await journal.start()
        for rev in range(1, 3500):  # past 1 MiB of records: zeros written ahead up to their bound
            journal.append(1, rev, bytes(300))
        await journal.sync()
        before = written_to_disk()
        for rev in range(3500, 3700):
            journal.append(1, rev, bytes(300))
            await journal.sync()
        after = written_to_disk()
        await journal.close()
        return (after - before) / 200

    assert asyncio.run(go()) <= 16 * 1024


def torn_in_the_middle(jdir, write_journal, make_items, damage):
    """Four 1,020-byte frames; ``damage`` changes the second one's bytes from 1,536 to 2,048 (a
    512-byte sector; the third frame starts at 2,040); the fourth stays whole."""
    items = make_items(4, payload_bytes=1000)
    write_journal(jdir, items)
    segment = Journal.open(jdir).segments[-1]
    data = bytearray(segment.read_bytes())
    assert len(data) == 4 * 1020
    data[1536:2048] = damage
    written = bytes(data) + bytes(4096)
    segment.write_bytes(written)
    return items, segment, written


def test_a_sector_of_zeros_in_the_last_write_is_a_torn_tail_even_with_whole_frames_after_it(
        jdir, write_journal, make_items, reopen_records):
    """A batch written over the zeros ahead and cut short by a crash can leave a sector the disk
    had not written yet (still zeros) before one it had: the write never finished, so what follows
    the bad frame is cut (and copied) as a torn tail, not refused as corruption."""
    from journal.verify import verify

    items, segment, written = torn_in_the_middle(jdir, write_journal, make_items, bytes(512))
    assert [r.status for r in verify(jdir)] == ["torn tail"]
    assert reopen_records(jdir) == items[:1]
    assert segment.stat().st_size == 1020
    assert segment.with_name(f"{segment.name}.broken-1020").read_bytes() == written[1020:]


@pytest.mark.parametrize("damage", [b"\x00" * 511 + b"\x01", b"\xaa" * 512], ids=["all-but-one-zero", "garbage"])
def test_a_bad_frame_without_a_sector_of_zeros_before_a_whole_one_is_corruption(jdir, write_journal, make_items,
                                                                                 damage):
    """The same damage without a whole sector of zeros is not what an unfinished write leaves:
    with a whole frame after it, it is corruption, as before."""
    from journal.errors import JournalCorrupt
    from journal.verify import verify

    torn_in_the_middle(jdir, write_journal, make_items, damage)
    assert [r.status for r in verify(jdir)] == ["corrupt"]
    with pytest.raises(JournalCorrupt, match="valid frame follows at offset 3060"):
        Journal.open(jdir)


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
            f.write(b"\xff" * (100 + i))
        Journal.open(jdir)
        copy = segment.with_name(f"{segment.name}.broken-{size}")
        assert copy.read_bytes() == b"\xff" * (100 + i)
        os.utime(copy, ns=(i * 10**9, i * 10**9))  # distinct ages even on a coarse clock
        made.append(copy.name)
    assert BROKEN_COPIES_KEPT == 3
    assert sorted(p.name for p in jdir.glob("*.broken-*")) == sorted(made[-3:])
