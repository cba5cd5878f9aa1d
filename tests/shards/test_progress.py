"""Progress lines of long start-up loops: periodic, structured, silent for short loops."""
from __future__ import annotations

import logging

from shards.progress import Progress


def test_long_loops_log_progress_and_short_ones_stay_quiet(caplog):
    caplog.set_level(logging.INFO, logger="shardetcd.progress")
    p = Progress("journal replay", interval_s=0.0, shard="pods", records=3000)
    for _ in range(3000):
        p.tick()
    p.done()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[:2] == [
        f"journal replay progress shard=pods records=3000 items={n} elapsed_s={lines[i].rsplit('=', 1)[1]}"
        for i, n in enumerate((1024, 2048))
    ]
    assert lines[2].startswith("journal replay done shard=pods records=3000 items=3000 ")
    caplog.clear()
    q = Progress("checkpoint load", shard="pods")  # default 5 s: a fast loop says nothing
    for _ in range(5000):
        q.tick()
    q.done()
    assert caplog.records == []


def test_batches_of_items_log_progress_by_the_clock(caplog, monkeypatch):
    """A loop that counts many items at a time (a checkpoint frame's rows) logs every interval."""
    caplog.set_level(logging.INFO, logger="shardetcd.progress")
    now = [100.0]
    monkeypatch.setattr("shards.progress.time.monotonic", lambda: now[0])
    p = Progress("checkpoint load", interval_s=5.0, shard="events")
    for _ in range(12):
        p.add(2900)
        now[0] += 1.0
    p.done()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" items=")[1].split()[0] for line in lines] == ["17400", "31900", "34800"]
    assert lines[0].startswith("checkpoint load progress shard=events") and lines[-1].startswith("checkpoint load done")
