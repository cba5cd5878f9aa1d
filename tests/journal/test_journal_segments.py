from __future__ import annotations

import asyncio
import re

import pytest

from journal import Journal, JournalConfig

# 23-byte payloads make 43-byte frames: two per 100-byte segment.
TINY = JournalConfig(segment_bytes_max=100)


def revs_per_segment(journal: Journal) -> list[list[int]]:
    by_segment: dict = {path: [] for path in journal.segments}
    for record in journal.records():
        by_segment[record.segment].append(record.rev)
    return list(by_segment.values())


def test_rollover_names_and_sizes(jdir, write_journal, make_items, reopen_records):
    items = make_items(10, payload_bytes=23)
    write_journal(jdir, items, TINY)
    journal = Journal.open(jdir, TINY)
    assert revs_per_segment(journal) == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    for seq, path in enumerate(journal.segments):
        assert re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{16}\.wal", path.name)
        assert path.name == f"{seq:016x}-{2 * seq + 1:016x}.wal"
        assert path.stat().st_size <= TINY.segment_bytes_max
    assert journal.bytes_total == 10 * 43
    assert reopen_records(jdir, TINY) == items


def test_rollover_continues_after_reopen(jdir, write_journal, make_items):
    write_journal(jdir, make_items(3, payload_bytes=23), TINY)
    write_journal(jdir, make_items(3, payload_bytes=23, first_rev=4), TINY)
    assert revs_per_segment(Journal.open(jdir, TINY)) == [[1, 2], [3, 4], [5, 6]]


def test_oversized_record_gets_its_own_segment(jdir, write_journal, reopen_records):
    items = [(1, 1, b"a"), (1, 2, b"b" * 500), (1, 3, b"c")]
    write_journal(jdir, items, TINY)
    assert revs_per_segment(Journal.open(jdir, TINY)) == [[1], [2], [3]]
    assert reopen_records(jdir, TINY) == items


def test_release_through_deletes_exactly_covered_segments(jdir, write_journal, make_items, reopen_records):
    write_journal(jdir, make_items(10, payload_bytes=23), TINY)
    journal = Journal.open(jdir, TINY)
    paths = journal.segments
    assert journal.release_through(4) == 2
    assert [p.exists() for p in paths] == [False, False, True, True, True]
    assert journal.release_through(5) == 0  # segment [5, 6] is only partly covered
    assert journal.release_through(6) == 1
    assert journal.release_through(10**6) == 1  # never the newest segment
    assert journal.segments == [paths[4]]
    assert [rev for _, rev, _ in reopen_records(jdir, TINY)] == [9, 10]


async def five_written(jdir, make_items) -> Journal:
    """A started journal with five records written and synced: three segments ([1, 2], [3, 4], [5])."""
    journal = Journal.open(jdir, TINY)
    await journal.start()
    for rtype, rev, payload in make_items(5, payload_bytes=23):
        journal.append(rtype, rev, payload)
    await journal.sync()
    return journal


def test_release_through_while_writing_keeps_the_active_segment(jdir, make_items, reopen_records):
    async def go() -> None:
        journal = await five_written(jdir, make_items)
        assert len(journal.segments) == 3
        assert journal.release_through(5) == 2
        journal.append(1, 6, b"z" * 23)
        await journal.close()

    asyncio.run(go())
    assert [rev for _, rev, _ in reopen_records(jdir, TINY)] == [5, 6]


def test_release_removes_the_files_off_the_event_loop_while_writes_go_on(jdir, make_items, reopen_records,
                                                                         monkeypatch):
    """A checkpoint's release (the contract's async release) unlinks its segments in a thread:
    ext4 takes tens of milliseconds per full 64 MiB segment, which held the event loop. Records
    appended meanwhile (a new segment in the list while the files go) are kept."""
    import os
    import threading

    unlinked_in: list[int] = []
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).endswith(".wal"):
            unlinked_in.append(threading.get_ident())
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)

    async def go() -> None:
        journal = await five_written(jdir, make_items)
        paths = journal.segments
        release = asyncio.ensure_future(journal.release(4))
        await asyncio.sleep(0)
        journal.append(1, 6, b"z" * 23)
        journal.append(1, 7, b"y" * 23)
        await journal.sync()
        assert await release == 2
        assert [p.exists() for p in paths] == [False, False, True]
        assert journal.segments[0] == paths[2] and len(journal.segments) == 2  # 6 joined it, 7 began another
        assert await journal.release(4) == 0
        await journal.close()

    asyncio.run(go())
    loop_thread = threading.get_ident()
    assert len(unlinked_in) == 2 and loop_thread not in unlinked_in
    assert [rev for _, rev, _ in reopen_records(jdir, TINY)] == [5, 6, 7]


def test_truncate_after(jdir, write_journal, make_items, reopen_records):
    items = make_items(10, payload_bytes=23)
    write_journal(jdir, items, TINY)
    journal = Journal.open(jdir, TINY)
    paths = journal.segments
    assert journal.truncate_after(10) == 0
    assert journal.truncate_after(5) == 5
    assert journal.segments == paths[:3] and not paths[3].exists() and not paths[4].exists()
    assert paths[2].stat().st_size == 43
    assert [r.rev for r in journal.records()] == [1, 2, 3, 4, 5]
    assert journal.last_rev == 5
    assert reopen_records(jdir, TINY) == items[:5]


def test_truncate_after_with_equal_revs_and_then_append(jdir, write_journal, reopen_records):
    items = [(1, 1, b"a"), (1, 2, b"b"), (1, 2, b"c"), (1, 3, b"d"), (1, 3, b"e")]
    write_journal(jdir, items, TINY)

    async def go() -> None:
        journal = Journal.open(jdir, TINY)
        assert journal.truncate_after(2) == 2
        await journal.start()
        with pytest.raises(RuntimeError):
            journal.truncate_after(0)
        journal.append(4, 3, b"new")
        await journal.close()

    asyncio.run(go())
    assert reopen_records(jdir, TINY) == items[:3] + [(4, 3, b"new")]


def test_truncate_everything(jdir, write_journal, make_items, reopen_records):
    write_journal(jdir, make_items(5, payload_bytes=23), TINY)
    journal = Journal.open(jdir, TINY)
    assert journal.truncate_after(0) == 5
    assert len(journal.segments) == 1 and journal.bytes_total == 0 and journal.last_rev == 0
    assert reopen_records(jdir, TINY) == []


def test_unrelated_files_are_ignored(jdir, write_journal, make_items, reopen_records):
    items = make_items(3)
    write_journal(jdir, items)
    (jdir / "checkpoint-0000000000000001.ckpt").write_bytes(b"not a segment")
    (jdir / "notes.txt").write_text("hello")
    assert reopen_records(jdir) == items


def _as_tuples(records):
    return [(r.rtype, r.rev, r.payload, r.segment, r.offset) for r in records]


@pytest.mark.parametrize("after_rev", [0, 3, 6, 10])
def test_records_kept_by_the_open_scan_are_the_records_read_again(jdir, write_journal, make_items, after_rev):
    """keep_records: the first replay of each segment gets the records the open scan read
    (a torn tail cut); later replays, and any after truncate_after, read the files."""
    write_journal(jdir, make_items(10, payload_bytes=23), TINY)
    last = sorted(jdir.glob("*.wal"))[-1]
    last.write_bytes(last.read_bytes()[:-5])  # a torn tail: record 10 is cut off at open
    kept = Journal.open(jdir, TINY, keep_records=True)
    assert len(kept._kept) == 5
    plain = Journal.open(jdir, TINY)
    want = _as_tuples(plain.records(after_rev))
    assert [r[1] for r in want] == list(range(after_rev + 1, 10))
    assert _as_tuples(kept.records(after_rev)) == want
    # what that replay passed is no longer held; segments wholly at or below after_rev were not passed
    assert set(kept._kept) == {s.path for s in kept._replay if s.covered_by(after_rev)}
    assert _as_tuples(kept.records(after_rev)) == want  # read from the files now
    kept = Journal.open(jdir, TINY, keep_records=True)
    assert kept.truncate_after(4) == 5 and not kept._kept
    assert [r.rev for r in kept.records()] == [1, 2, 3, 4]
