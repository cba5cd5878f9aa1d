"""Automatic compaction, as etcd's --auto-compaction-mode / --auto-compaction-retention.

periodic (etcd's default mode): keep the history of the last ``retention``
(a Go duration, or a whole number of hours). The revision is sampled every
tenth of min(retention, 1 h); once ``retention`` has passed since the start
(afterwards: since the last compaction, every min(retention, 1 h)), history is
compacted to the oldest sample still inside the window.

revision: every 5 minutes, compact to (current revision - retention) unless
that is not positive or was the last one compacted.

An already-compacted revision counts as done, any other error is logged and
tried again on the next tick. Retention 0 turns automatic compaction off.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from shards.errors import CompactedError
from shards.durations import go_duration_s

logger = logging.getLogger(__name__)

HOUR_S = 3600.0
REVISION_INTERVAL_S = 300.0  # etcd's revInterval
RETRY_DIVISOR = 10


@dataclass(frozen=True)
class AutoCompaction:
    mode: str  # "periodic" | "revision"
    retention: float  # seconds (periodic) or revisions (revision); 0 = off

    @classmethod
    def parse(cls, mode: str, retention: str) -> AutoCompaction:
        """etcd's parsing: a bare number is hours in periodic mode, revisions in revision mode."""
        if mode not in ("periodic", "revision"):
            raise ValueError(f"unsupported compaction mode {mode!r}: periodic or revision")
        try:
            number = int(retention)
        except ValueError:
            number = None
        if number is not None and not -(2**63) <= number < 2**63:
            number = None  # beyond Go's int64: etcd reads it as a duration, and refuses it
        if mode == "revision":
            if number is None or number < 0:
                raise ValueError(f"invalid revision retention {retention!r}: want a whole number of revisions")
            return cls(mode, float(number))
        if number is not None:
            return cls(mode, number * HOUR_S)
        try:
            seconds = go_duration_s(retention)
        except ValueError:
            seconds = -1.0
        if seconds < 0:
            raise ValueError(f"invalid periodic retention {retention!r}: want e.g. 1h, 30m or a number of hours")
        return cls(mode, seconds)

    @property
    def enabled(self) -> bool:
        return self.retention > 0


Compact = Callable[[int], Awaitable[object]]


async def run_periodic(period_s: float, current_rev: Callable[[], int], compact: Compact,
                       sleep=asyncio.sleep, clock=time.monotonic) -> None:
    """Compact to the revision seen ``period_s`` ago, as etcd's Periodic compactor."""
    base = min(period_s, HOUR_S)
    retry_s = base / RETRY_DIVISOR
    keep = int(period_s / retry_s) + 1
    revs: list[int] = []
    last_success = clock()
    wait = period_s  # the first compaction waits a whole period, later ones min(period, 1 h)
    while True:
        revs.append(current_rev())
        if len(revs) > keep:
            del revs[0]  # revs[0] is the revision of about one period ago
        await sleep(retry_s)
        if clock() - last_success < wait:
            continue
        wait = base
        rev = revs[0]
        if await _compact(compact, rev, f"period={period_s:g}s"):
            last_success = clock()


async def run_revision(retention: int, current_rev: Callable[[], int], compact: Compact,
                       sleep=asyncio.sleep, interval_s: float = REVISION_INTERVAL_S) -> None:
    """Every 5 minutes keep only the last ``retention`` revisions, as etcd's Revision compactor."""
    prev = 0
    while True:
        await sleep(interval_s)
        rev = current_rev() - retention
        if rev <= 0 or rev == prev:
            continue
        if await _compact(compact, rev, f"retention={retention} revisions"):
            prev = rev


async def _compact(compact: Compact, rev: int, what: str) -> bool:
    started = time.monotonic()
    logger.info("auto compaction starting revision=%d %s", rev, what)
    try:
        await compact(rev)
    except CompactedError:
        pass
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - logged, retried on the next tick, as etcd does
        logger.warning("auto compaction failed revision=%d %s error=%r", rev, what, exc)
        return False
    logger.info("auto compaction done revision=%d took_s=%.3f", rev, time.monotonic() - started)
    return True


def start(config: AutoCompaction, current_rev: Callable[[], int], compact: Compact) -> asyncio.Task | None:
    if not config.enabled:
        return None
    loop = asyncio.get_running_loop()
    if config.mode == "periodic":
        return loop.create_task(run_periodic(config.retention, current_rev, compact), name="auto-compaction")
    return loop.create_task(run_revision(int(config.retention), current_rev, compact), name="auto-compaction")
