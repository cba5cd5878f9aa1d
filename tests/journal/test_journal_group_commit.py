from __future__ import annotations

import asyncio

import pytest

from journal import Journal, JournalConfig

WRITERS = 200


def run_concurrent_writers(directory, config: JournalConfig) -> list[int]:
    durable: list[int] = []

    async def one(journal: Journal, rev: int) -> None:
        journal.append(1, rev, b"r" * 100)
        await journal.sync()

    async def go() -> None:
        journal = Journal.open(directory, config)
        journal.on_durable = durable.append
        await journal.start()
        revs = iter(range(1, WRITERS + 1))
        tasks = []
        for _ in range(WRITERS):
            tasks.append(asyncio.create_task(one(journal, next(revs))))
            if len(tasks) % 20 == 0:
                await asyncio.sleep(0)  # let the writer run while appends keep arriving
        await asyncio.gather(*tasks)
        assert journal.durable_seq == WRITERS
        await journal.close()

    asyncio.run(go())
    return durable


@pytest.mark.parametrize("policy", ["always", "batch"])
def test_concurrent_appends_share_fdatasyncs(jdir, count_fdatasync, reopen_records, policy):
    durable = run_concurrent_writers(jdir, JournalConfig(fsync=policy))
    assert 1 <= count_fdatasync[0] <= WRITERS // 10
    assert count_fdatasync[0] == len(durable)  # one fdatasync per batch, one ack per batch
    assert len(reopen_records(jdir)) == WRITERS


def test_batch_bytes_max_bounds_a_batch_but_never_below_one_record(jdir, count_fdatasync, reopen_records):
    config = JournalConfig(batch_bytes_max=10)  # smaller than any frame
    async def go() -> None:
        journal = Journal.open(jdir, config)
        await journal.start()
        for rev in range(1, 6):
            journal.append(1, rev, b"0123456789")
        await journal.close()

    asyncio.run(go())
    assert count_fdatasync[0] == 5
    assert len(reopen_records(jdir)) == 5
