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
