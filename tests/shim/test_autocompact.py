"""Automatic compaction: etcd's periodic and revision compactors, on a fake clock."""
from __future__ import annotations

import asyncio

import pytest

from shards.errors import CompactedError
from shim.autocompact import AutoCompaction, run_periodic, run_revision


def rev_at(t: float) -> int:
    return 1 + int(round(t * 10, 6))


class FakeTime:
    """A clock that moves only when the compactor sleeps; the revision grows 10 per second."""

    def __init__(self, stop_at: float) -> None:
        self.now = 0.0
        self.stop_at = stop_at

    def clock(self) -> float:
        return self.now

    def rev(self) -> int:
        return rev_at(self.now)

    async def sleep(self, s: float) -> None:
        self.now = round(self.now + s, 6)
        if self.now > self.stop_at:
            raise asyncio.CancelledError


def run(coro) -> None:
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(coro)


@pytest.mark.parametrize("mode, text, want", [
    ("periodic", "0", 0.0), ("periodic", "1", 3600.0), ("periodic", "72", 72 * 3600.0), ("periodic", "30m", 1800.0),
    ("periodic", "1h30m", 5400.0), ("periodic", "500ms", 0.5), ("revision", "1000", 1000.0), ("revision", "0", 0.0),
])
def test_retention_is_read_as_etcd_reads_it(mode, text, want):
    assert AutoCompaction.parse(mode, text).retention == want


@pytest.mark.parametrize("mode, text", [("periodic", "soon"), ("periodic", "-1h"), ("revision", "10m"),
                                        ("revision", "-5"), ("hourly", "1")])
def test_unreadable_settings_are_refused(mode, text):
    with pytest.raises(ValueError):
        AutoCompaction.parse(mode, text)


def test_periodic_waits_one_period_then_compacts_to_the_revision_seen_a_period_before():
    t = FakeTime(stop_at=10.0)
    done: list[tuple[float, int]] = []

    async def compact(rev: int) -> None:
        done.append((t.now, rev))

    run(run_periodic(2.0, t.rev, compact, sleep=t.sleep, clock=t.clock))
    # samples every 0.2 s; first compaction once 2 s have passed, then every 2 s after the last one
    assert [when for when, _ in done] == [2.0, 4.0, 6.0, 8.0, 10.0]
    # to the oldest sample in the window: the revision of one period (plus at most one 0.2 s tick) before
    assert done[0][1] == rev_at(0.0)
    for when, rev in done[1:]:
        assert rev == rev_at(when - 2.2)


def test_periodic_over_an_hour_compacts_hourly_keeping_the_whole_window():
    t = FakeTime(stop_at=5 * 3600.0)
    done: list[tuple[float, int]] = []

    async def compact(rev: int) -> None:
        done.append((t.now, rev))

    run(run_periodic(3 * 3600.0, t.rev, compact, sleep=t.sleep, clock=t.clock))
    assert [when / 3600 for when, _ in done] == [3.0, 4.0, 5.0]
    # never anything newer than 3 h ago; the window slides by the 6-minute samples kept
    for when, rev in done:
        assert rev_at(when - 3 * 3600.0 - 360.0) <= rev <= rev_at(when - 3 * 3600.0)


def test_periodic_retries_a_failed_compaction_on_the_next_tick_and_takes_compacted_as_done():
    t = FakeTime(stop_at=4.5)
    calls: list[float] = []

    async def compact(rev: int) -> None:
        calls.append(t.now)
        if len(calls) == 1:
            raise RuntimeError("disk on fire")
        if len(calls) == 2:
            raise CompactedError

    run(run_periodic(2.0, t.rev, compact, sleep=t.sleep, clock=t.clock))
    assert calls == [2.0, 2.2, 4.2]  # failed at 2.0, retried at 2.2 (compacted counts as done), next 2 s later


def test_revision_mode_keeps_the_last_n_revisions_every_five_minutes():
    t = FakeTime(stop_at=1800.0)
    done: list[tuple[float, int]] = []

    async def compact(rev: int) -> None:
        done.append((t.now, rev))

    run(run_revision(1000, t.rev, compact, sleep=t.sleep))
    assert [when for when, _ in done] == [300.0, 600.0, 900.0, 1200.0, 1500.0, 1800.0]
    assert all(rev == rev_at(when) - 1000 for when, rev in done)


def test_revision_mode_skips_when_nothing_new_to_compact():
    t = FakeTime(stop_at=1500.0)
    done: list[int] = []

    async def compact(rev: int) -> None:
        done.append(rev)

    frozen = iter([500, 5000, 5000, 5000, 7000, 7000])
    run(run_revision(1000, lambda: next(frozen), compact, sleep=t.sleep))
    assert done == [4000, 6000]  # 500-1000 <= 0 skipped; the same target is not compacted twice
