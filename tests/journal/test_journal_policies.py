from __future__ import annotations

import asyncio

import pytest

from journal import Journal, JournalConfig


def append_and_close(directory, config: JournalConfig, count: int) -> list[int]:
    durable: list[int] = []

    async def go() -> None:
        journal = Journal.open(directory, config)
        journal.on_durable = durable.append
        await journal.start()
        for rev in range(1, count + 1):
            journal.append(1, rev, b"v" * 10)
            if rev % 10 == 0:
                await journal.sync()
        await journal.close()

    asyncio.run(go())
    return durable


def test_policy_off_never_fsyncs(jdir, count_fdatasync, reopen_records):
    config = JournalConfig(fsync="off", segment_bytes_max=200)
    durable = append_and_close(jdir, config, 50)
    assert count_fdatasync[0] == 0
    assert durable[-1] == 50
    assert [rev for _, rev, _ in reopen_records(jdir, config)] == list(range(1, 51))


def test_policy_batch_lingers_to_gather(jdir, count_fdatasync, reopen_records):
    config = JournalConfig(fsync="batch", batch_linger_s=0.05)

    async def go() -> None:
        journal = Journal.open(jdir, config)
        await journal.start()
        for rev in range(1, 21):
            journal.append(1, rev, b"b")
            await asyncio.sleep(0)  # appends trickle in while the writer lingers
        await journal.sync()
        await journal.close()

    asyncio.run(go())
    assert count_fdatasync[0] <= 2  # normally 1; 2 tolerates a stalled test machine
    assert len(reopen_records(jdir)) == 20


def test_policy_always_fsyncs_every_batch(jdir, count_fdatasync):
    durable = append_and_close(jdir, JournalConfig(fsync="always"), 30)
    assert count_fdatasync[0] == len(durable) >= 3


@pytest.mark.parametrize("kwargs", [
    {"fsync": "sometimes"},
    {"segment_bytes_max": 0},
    {"batch_bytes_max": -1},
    {"record_bytes_max": 2**32},
    {"batch_linger_s": -0.1},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        JournalConfig(**kwargs)
