"""A lone writer's batches are written on the event loop (Journal._write_inline);
anything else goes through the writer thread. Either way: a record is
acknowledged only after an fdatasync covering it returned, acknowledgements
come in order, and a failure is fail-stop."""
from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import pytest

from journal import Journal, JournalConfig, JournalFailed, failpoints
from journal import journal as journal_module

QUICK_S = 0.2  # what counts as a quick fsync here: a loaded CI machine's fsyncs stay well below it


@pytest.fixture(autouse=True)
def _quick_fsync_bound(monkeypatch):
    monkeypatch.setattr(journal_module, "INLINE_FSYNC_MAX_S", QUICK_S)


@pytest.fixture
def syncs(monkeypatch):
    """Every os.fdatasync: (thread name, ms slept before it). `slow_next[0]` > 0 makes the next one that slow."""
    calls: list[str] = []
    slow_next = [0.0]
    real = os.fdatasync

    def recording(fd: int) -> None:
        if slow_next[0]:
            time.sleep(slow_next[0])
            slow_next[0] = 0.0
        real(fd)
        calls.append(threading.current_thread().name)

    monkeypatch.setattr(os, "fdatasync", recording)
    recording.calls, recording.slow_next = calls, slow_next
    return recording


def on_loop(names: list[str]) -> list[bool]:
    return [n == "MainThread" for n in names]


async def started(jdir, config: JournalConfig = JournalConfig()) -> tuple[Journal, list[int]]:
    """A started journal and the list its acknowledged sequence numbers go to."""
    journal = Journal.open(jdir, config)
    durable: list[int] = []
    journal.on_durable = durable.append
    await journal.start()
    return journal, durable


async def lone(journal: Journal, revs, durable: list[int]) -> None:
    """One writer: append, wait until durable, next; each is acknowledged on its own fdatasync."""
    for rev in revs:
        seq = journal.append(1, rev, b"x%d" % rev)
        await journal.sync()
        assert journal.durable_seq == seq and durable[-1] == seq


async def until_inline(journal: Journal, durable: list[int], syncs, first_rev: int = 1) -> int:
    """Lone writes until one was written on the loop (the thread may still be on its way back
    to sleep when the next append comes, on a loaded machine); the next free revision."""
    rev = first_rev
    while rev < first_rev + 500:
        await lone(journal, [rev], durable)
        rev += 1
        if on_loop(syncs.calls)[-1]:
            return rev
    raise AssertionError(f"no write went to the loop: {syncs.calls[-5:]}")


async def thread_asleep(journal: Journal) -> None:
    """Until the writer thread is back asleep after its last batch (on a loaded machine it may
    not have got there when the loop appends next, and then it takes that record itself)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if journal._idle:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the writer thread never went back to sleep")


def test_a_lone_writer_writes_on_the_loop_and_loses_nothing(jdir, syncs, reopen_records, monkeypatch):
    monkeypatch.setattr(journal_module, "INLINE_FSYNC_MAX_S", 60.0)  # a loaded disk's slow fsync is another test's

    async def go():
        journal, durable = await started(jdir)
        for rev in range(1, 41):
            await thread_asleep(journal)
            await lone(journal, [rev], durable)
        assert durable == list(range(1, 41))  # one acknowledgement per record, in order
        await journal.close()

    asyncio.run(go())
    # the first batch (new segment, directory fsync) goes through the thread; then the loop writes
    where = on_loop(syncs.calls)
    assert where[0] is False and all(where[-39:]), syncs.calls
    assert reopen_records(jdir) == [(1, rev, b"x%d" % rev) for rev in range(1, 41)]


def test_concurrent_writers_go_back_to_the_thread_and_acks_stay_in_order(jdir, syncs, reopen_records):
    async def go():
        journal, durable = await started(jdir)
        await until_inline(journal, durable, syncs)
        n_lone = len(syncs.calls)
        base = journal.durable_seq

        async def one(rev: int) -> None:
            journal.append(1, rev, b"x%d" % rev)
            await journal.sync()

        for burst in range(5):  # bursts of 30 writers, each burst appended in one loop turn
            first = base + 1 + burst * 30
            await asyncio.gather(*(one(rev) for rev in range(first, first + 30)))
        burst_syncs = syncs.calls[n_lone:]
        assert len(burst_syncs) < 5 * 30 / 3  # group commit: bursts share fdatasyncs
        assert not all(on_loop(burst_syncs)), burst_syncs  # and some went back to the thread
        last = await until_inline(journal, durable, syncs, base + 151) - 1  # alone again: back on the loop
        assert durable == sorted(durable) and len(set(durable)) == len(durable)
        assert journal.durable_seq == last
        await journal.close()
        return last

    last = asyncio.run(go())
    assert reopen_records(jdir) == [(1, rev, b"x%d" % rev) for rev in range(1, last + 1)]


def test_a_slow_fsync_hands_writing_back_to_the_thread(jdir, syncs):
    async def go():
        journal, durable = await started(jdir)
        rev = await until_inline(journal, durable, syncs)
        syncs.slow_next[0] = QUICK_S * 2
        await lone(journal, [rev], durable)  # written on the loop, but slow
        await lone(journal, [rev + 1], durable)  # so this one goes to the thread
        assert on_loop(syncs.calls)[-2:] == [True, False]
        await until_inline(journal, durable, syncs, rev + 2)  # quick again: back on the loop
        await journal.close()

    asyncio.run(go())


def test_an_armed_sleep_failpoint_keeps_writes_in_the_thread(jdir, syncs):
    async def go():
        journal, durable = await started(jdir)
        rev = await until_inline(journal, durable, syncs)
        failpoints.arm("journal.after_fsync_before_ack", "sleep:0.2")
        loop_ran = []
        ticker = asyncio.get_running_loop().call_later(0.05, loop_ran.append, True)
        await lone(journal, [rev], durable)  # held 0.2 s in the writer thread; the loop goes on
        assert loop_ran and on_loop(syncs.calls)[-1] is False
        ticker.cancel()
        await journal.close()

    asyncio.run(go())


def test_a_write_failure_on_the_loop_is_fail_stop(jdir, monkeypatch, syncs, reopen_records):
    failures: list[BaseException] = []

    async def go():
        journal, durable = await started(jdir)
        journal.on_failure = failures.append
        rev = await until_inline(journal, durable, syncs)
        last = rev - 1

        def eio(*_args):
            raise OSError(errno.EIO, "injected")

        monkeypatch.setattr(os, "pwrite", eio)
        journal.append(1, rev, b"doomed")
        with pytest.raises(JournalFailed):
            await journal.sync()
        assert journal.durable_seq == last and durable[-1] == last  # nothing acknowledged after the failure
        with pytest.raises(JournalFailed):
            journal.append(1, rev + 1, b"later")
        await asyncio.wait_for(journal.close(), 5)  # the writer thread saw it and ended
        assert journal.failed
        return last

    last = asyncio.run(go())
    monkeypatch.undo()
    assert len(failures) == 1 and isinstance(failures[0], OSError)
    assert reopen_records(jdir) == [(1, rev, b"x%d" % rev) for rev in range(1, last + 1)]


def test_disabled_inline_writes_keep_every_batch_in_the_thread(jdir, syncs):
    async def go():
        journal, durable = await started(jdir, JournalConfig(inline_lone_writes=False))
        await lone(journal, range(1, 11), durable)
        await journal.close()

    asyncio.run(go())
    assert not any(on_loop(syncs.calls))


def test_more_than_a_batch_queued_for_an_inline_write_is_all_written(jdir, syncs, reopen_records):
    """batch_bytes_max bounds what the loop writes; the rest goes to the thread, nothing waits forever."""
    async def go():
        journal, durable = await started(jdir, JournalConfig(batch_bytes_max=50))  # two 21-byte frames per batch
        first = await until_inline(journal, durable, syncs)
        for rev in range(first, first + 10):  # ten appends in one turn, for a lone writer's inline write
            journal.append(1, rev, b"x%d" % rev)
        await asyncio.wait_for(journal.sync(), 5)
        assert journal.durable_seq == first + 9 and durable == sorted(durable)
        await journal.close()
        return first + 9

    last = asyncio.run(go())
    assert reopen_records(jdir) == [(1, rev, b"x%d" % rev) for rev in range(1, last + 1)]
