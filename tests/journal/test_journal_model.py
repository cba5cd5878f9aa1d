"""Property test: whatever is appended (across tiny segments and batches) replays identically."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from journal import Journal, JournalConfig

steps = st.lists(
    st.tuples(st.integers(1, 255), st.integers(0, 3), st.binary(max_size=120), st.booleans()),
    min_size=1, max_size=40)


@settings(max_examples=25, deadline=None)
@given(steps=steps, segment_bytes_max=st.integers(1, 400), batch_bytes_max=st.integers(1, 300),
       fsync=st.sampled_from(["always", "batch", "off"]), reopen_at=st.integers(0, 40))
def test_replay_matches_appends(steps, segment_bytes_max, batch_bytes_max, fsync, reopen_at):
    config = JournalConfig(segment_bytes_max=segment_bytes_max, batch_bytes_max=batch_bytes_max,
                           fsync=fsync, batch_linger_s=0)
    expected, rev = [], 0
    for rtype, rev_step, payload, _ in steps:
        rev += rev_step
        expected.append((rtype, rev, payload))
    sync_after = [do_sync for *_, do_sync in steps]

    async def append_range(directory: Path, start: int, stop: int) -> None:
        journal = Journal.open(directory, config)
        await journal.start()
        for index in range(start, stop):
            journal.append(*expected[index])
            if sync_after[index]:
                await journal.sync()
        await journal.close()

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        split = min(reopen_at, len(expected))
        asyncio.run(append_range(directory, 0, split))
        asyncio.run(append_range(directory, split, len(expected)))
        journal = Journal.open(directory, config)
        assert [(r.rtype, r.rev, r.payload) for r in journal.records(after_rev=-1)] == expected
        assert journal.bytes_total == sum(20 + len(p) for _, _, p in expected)
