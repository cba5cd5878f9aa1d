"""Progress lines for long start-up loops (checkpoint load, journal replay).

Quiet for short loops: the first line comes only after ``interval_s``.
"""
from __future__ import annotations

import logging
import time

logger = logging.getLogger("shardetcd.progress")


class Progress:
    __slots__ = ("what", "fields", "interval_s", "count", "started", "next_at")

    def __init__(self, what: str, interval_s: float = 5.0, **fields) -> None:
        self.what, self.fields, self.interval_s = what, fields, interval_s
        self.count = 0
        self.started = time.monotonic()
        self.next_at = self.started + interval_s

    def tick(self, n: int = 1) -> None:
        self.count += n
        if self.count & 1023 == 0:  # a clock read per 1,024 items, not per item
            now = time.monotonic()
            if now >= self.next_at:
                self.next_at = now + self.interval_s
                self._log(now, "progress")

    def add(self, n: int) -> None:
        """``n`` items at once (a batch of them): the clock is read every time."""
        self.count += n
        now = time.monotonic()
        if now >= self.next_at:
            self.next_at = now + self.interval_s
            self._log(now, "progress")

    def done(self) -> None:
        now = time.monotonic()
        if now - self.started >= self.interval_s:  # only loops that said something already
            self._log(now, "done")

    def _log(self, now: float, state: str) -> None:
        extra = " ".join(f"{k}={v}" for k, v in self.fields.items())
        logger.info("%s %s %s items=%d elapsed_s=%.1f", self.what, state, extra, self.count, now - self.started)
