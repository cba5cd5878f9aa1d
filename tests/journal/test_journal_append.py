from __future__ import annotations

import asyncio

import pytest

from journal import Journal, JournalConfig, JournalFailed

SMALL = JournalConfig(segment_bytes_max=4096)


def test_concurrent_appends_replay_in_order(jdir, reopen_records):
    expected = []
    counter = iter(range(1, 10_000))

    async def producer(journal: Journal, task_id: int) -> None:
        for i in range(40):
            rev = next(counter)
            payload = f"task={task_id} i={i}".encode()
            journal.append(1 + task_id % 5, rev, payload)
            expected.append((1 + task_id % 5, rev, payload))
            if i % 7 == 0:
                await journal.sync()
            await asyncio.sleep(0)

    async def go() -> None:
        journal = Journal.open(jdir, SMALL)
        await journal.start()
        await asyncio.gather(*(producer(journal, t) for t in range(8)))
        await journal.sync()
        await journal.close()

    asyncio.run(go())
    assert reopen_records(jdir, SMALL) == expected
    assert len(Journal.open(jdir, SMALL).segments) > 1


def test_record_locations_point_at_frames(jdir, write_journal, make_items):
    write_journal(jdir, make_items(30), SMALL)
    journal = Journal.open(jdir, SMALL)
    for record in journal.records():
        raw = record.segment.read_bytes()
        assert raw[record.offset:record.offset + 2] == b"SJ"
        assert raw[record.offset + 20:record.offset + 20 + len(record.payload)] == record.payload


def test_durable_seq_on_durable_and_sync(jdir):
    seen: list[int] = []

    async def go() -> None:
        journal = Journal.open(jdir)
        journal.on_durable = seen.append
        await journal.start()
        assert journal.durable_seq == 0
        seqs = [journal.append(1, rev, b"x") for rev in range(1, 6)]
        assert seqs == [1, 2, 3, 4, 5]
        assert journal.durable_seq == 0  # nothing is durable before the writer has run
        await journal.sync()
        assert journal.durable_seq == 5
        assert journal.append(1, 6, b"y") == 6
        await journal.sync()
        await journal.sync()  # nothing new: returns at once
        assert journal.durable_seq == 6
        await journal.close()

    asyncio.run(go())
    assert seen == sorted(set(seen)) and seen[-1] == 6


def test_seq_restarts_after_reopen_and_records_continue(jdir, write_journal, make_items, reopen_records):
    write_journal(jdir, make_items(3))

    async def go() -> int:
        journal = Journal.open(jdir)
        await journal.start()
        seq = journal.append(2, 4, b"more")
        await journal.close()
        return seq

    assert asyncio.run(go()) == 1
    assert reopen_records(jdir) == make_items(3) + [(2, 4, b"more")]


def test_records_after_rev(jdir, write_journal, make_items, reopen_records):
    write_journal(jdir, make_items(20), SMALL)
    assert [rev for _, rev, _ in reopen_records(jdir, SMALL, after_rev=12)] == list(range(13, 21))
    assert reopen_records(jdir, SMALL, after_rev=20) == []


def test_equal_revs_allowed_and_decreasing_rejected(jdir, write_journal, reopen_records):
    write_journal(jdir, [(1, 5, b"a"), (1, 5, b"b"), (1, 6, b"c")])
    assert [p for _, _, p in reopen_records(jdir)] == [b"a", b"b", b"c"]

    async def go() -> None:
        journal = Journal.open(jdir)
        await journal.start()
        with pytest.raises(ValueError, match="below the last"):
            journal.append(1, 5, b"old")  # on-disk last rev is 6
        journal.append(1, 6, b"same")
        await journal.close()

    asyncio.run(go())


def test_append_argument_and_state_errors(jdir):
    async def go() -> None:
        journal = Journal.open(jdir, JournalConfig(record_bytes_max=10))
        with pytest.raises(RuntimeError):
            journal.append(1, 1, b"early")
        await journal.start()
        with pytest.raises(ValueError):
            journal.append(0, 1, b"")
        with pytest.raises(ValueError):
            journal.append(1, 1, b"x" * 11)
        journal.append(1, 1, bytearray(b"copied"))
        await journal.close()
        with pytest.raises(JournalFailed, match="closed"):
            journal.append(1, 2, b"late")
        await journal.sync()  # everything appended before close is durable
        await journal.close()  # idempotent

    asyncio.run(go())


def test_close_flushes_queued_records(jdir, reopen_records):
    async def go() -> None:
        journal = Journal.open(jdir, JournalConfig(batch_bytes_max=64))
        await journal.start()
        for rev in range(1, 101):
            journal.append(1, rev, b"p" * 30)
        await journal.close()
        assert journal.durable_seq == 100

    asyncio.run(go())
    assert len(reopen_records(jdir)) == 100


def test_open_creates_directory(tmp_path):
    target = tmp_path / "a" / "b"
    journal = Journal.open(target)
    assert target.is_dir() and journal.segments == [] and journal.bytes_total == 0
    assert list(journal.records()) == []


def test_replay_logs_progress(jdir, write_journal, make_items, caplog):
    config = JournalConfig(replay_progress_bytes=100)
    write_journal(jdir, make_items(10, payload_bytes=30), config)  # 50-byte frames
    caplog.set_level("INFO", logger="journal.journal")
    assert len(list(Journal.open(jdir, config).records())) == 10
    progress = [r.getMessage() for r in caplog.records if "replay progress" in r.getMessage()]
    assert len(progress) == 6  # at 100, 200, 300, 400, 500 bytes and at the end
    assert progress[-1] == "journal replay progress read_bytes=500 total_bytes=500"


def test_open_fdatasyncs_what_it_found(jdir, write_journal, make_items, count_fdatasync):
    write_journal(jdir, make_items(3, payload_bytes=23), JournalConfig(segment_bytes_max=50, fsync="off"))
    assert count_fdatasync[0] == 0
    journal = Journal.open(jdir)
    assert count_fdatasync[0] == len(journal.segments) == 3
    Journal.open(jdir, JournalConfig(fsync="off"))
    assert count_fdatasync[0] == 3


def test_rev_zero_is_returned_only_from_after_rev_minus_one(jdir, write_journal):
    write_journal(jdir, [(1, 0, b"zero"), (1, 1, b"one")])
    journal = Journal.open(jdir)
    assert [r.rev for r in journal.records()] == [1]
    assert [r.rev for r in journal.records(after_rev=-1)] == [0, 1]
