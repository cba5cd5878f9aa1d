from __future__ import annotations

import asyncio
import errno
import os

import pytest

from journal import Journal, JournalConfig, JournalFailed, failpoints


def eio(*_args) -> None:
    raise OSError(errno.EIO, "injected")


def run_failing_journal(jdir, break_io, config=JournalConfig()):
    """Append 3 healthy records, break I/O, then append 3 more; return what was observed."""
    seen = {"durable": [], "failures": []}

    async def waiter(journal: Journal, rev: int) -> BaseException | None:
        journal.append(1, rev, b"doomed")
        try:
            await journal.sync()
        except JournalFailed as exc:
            return exc
        return None

    async def go() -> None:
        journal = Journal.open(jdir, config)
        journal.on_durable = seen["durable"].append
        journal.on_failure = seen["failures"].append
        await journal.start()
        for rev in (1, 2, 3):
            journal.append(1, rev, b"fine")
        await journal.sync()
        break_io()
        results = await asyncio.gather(*(waiter(journal, rev) for rev in (4, 5, 6)))
        seen["waiters"] = results
        seen["durable_seq"] = journal.durable_seq
        with pytest.raises(JournalFailed):
            journal.append(1, 7, b"later")
        with pytest.raises(JournalFailed):
            await journal.sync()
        await journal.close()
        assert journal.failed

    asyncio.run(go())
    return seen


def assert_fail_stop(seen) -> None:
    assert len(seen["failures"]) == 1 and isinstance(seen["failures"][0], OSError)
    assert all(isinstance(r, JournalFailed) for r in seen["waiters"])
    assert seen["durable_seq"] == 3
    assert seen["durable"][-1] == 3  # nothing acknowledged after the failure


def test_fdatasync_failure_is_fail_stop(jdir, monkeypatch, reopen_records):
    seen = run_failing_journal(jdir, lambda: monkeypatch.setattr(os, "fdatasync", eio))
    assert_fail_stop(seen)
    monkeypatch.undo()
    assert reopen_records(jdir)[:3] == [(1, r, b"fine") for r in (1, 2, 3)]


def test_write_failure_is_fail_stop(jdir, monkeypatch, reopen_records):
    seen = run_failing_journal(jdir, lambda: monkeypatch.setattr(os, "pwrite", eio))
    assert_fail_stop(seen)
    monkeypatch.undo()
    assert reopen_records(jdir) == [(1, r, b"fine") for r in (1, 2, 3)]


def test_failure_after_fsync_is_never_acknowledged(jdir, reopen_records):
    seen = run_failing_journal(jdir, lambda: failpoints.arm("journal.after_fsync_before_ack", "raise"))
    assert_fail_stop(seen)
    failpoints.disarm()
    # The bytes reached the disk, but nobody was told: replay may return them.
    assert len(reopen_records(jdir)) >= 3


def test_failure_creating_a_segment_is_fail_stop(jdir, reopen_records):
    config = JournalConfig(segment_bytes_max=1)
    arm = lambda: failpoints.arm("segment.after_create_before_dirsync", "raise")  # noqa: E731
    seen = run_failing_journal(jdir, arm, config)
    assert_fail_stop(seen)


def test_failing_callbacks_do_not_stop_the_writer(jdir, reopen_records):
    async def go() -> None:
        journal = Journal.open(jdir)
        journal.on_durable = lambda seq: 1 / 0
        await journal.start()
        journal.append(1, 1, b"a")
        await journal.sync()
        journal.append(1, 2, b"b")
        await journal.close()

    asyncio.run(go())
    assert len(reopen_records(jdir)) == 2


def test_cancelled_writer_fails_the_journal(jdir):
    failures = []

    async def go() -> None:
        journal = Journal.open(jdir)
        journal.on_failure = failures.append
        await journal.start()
        journal._task.cancel()
        await asyncio.wait([journal._task])
        with pytest.raises(JournalFailed):
            journal.append(1, 1, b"x")
        await journal.close()

    asyncio.run(go())
    assert len(failures) == 1
