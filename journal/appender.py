"""What every journal backend shares on its write side: append bookkeeping,
durability waiters, callbacks, and fail-stop.

A backend (journal.Journal on local segments, JetStreamJournal on a stream)
queues records in ``append`` after ``_next_seq`` has numbered them, makes
batches durable its own way, then calls ``_durable_through(seq)``; any write
error goes to ``_fail``, after which nothing is ever acknowledged again.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

from journal.errors import JournalFailed
from journal.record import HEADER_BYTES, REV_MAX, RTYPE_MAX, check_fields

logger = logging.getLogger("journal.journal")


class Appender:
    def __init__(self, name: str, last_rev: int) -> None:
        self.name = name  # how logs and errors name this journal (a directory, a stream)
        self.durable_seq = 0
        self.bytes_appended = 0  # frame bytes appended since open; never shrinks (releases do not count)
        self.on_durable: Callable[[int], None] | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        # told after each batch: (bytes written, seconds for write + sync)
        self.on_batch: Callable[[int, float], None] | None = None
        self._last_rev = last_rev
        self._last_seq = 0
        self._queued_bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._failure: BaseException | None = None

    @property
    def last_rev(self) -> int:
        """Revision tag of the last record appended or found (0 if none)."""
        return self._last_rev

    @property
    def queued_bytes(self) -> int:
        """Payload bytes appended but not yet handed to the writer."""
        return self._queued_bytes

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def _next_seq(self, rtype: int, rev: int, payload_bytes: int, record_bytes_max: int) -> int:
        """Check one append and number it (the caller queues the record)."""
        if self._failure is not None or self._closing:
            self._check_writable()
        if self._task is None:
            raise RuntimeError("append() before start()")
        if not (1 <= rtype <= RTYPE_MAX and 0 <= rev <= REV_MAX and payload_bytes <= record_bytes_max):
            check_fields(rtype, rev, payload_bytes, record_bytes_max)  # which one, in its words
        if rev < self._last_rev:
            raise ValueError(f"revision tag {rev} is below the last appended tag {self._last_rev}")
        self._last_seq += 1
        self._last_rev = rev
        self._queued_bytes += payload_bytes
        self.bytes_appended += HEADER_BYTES + payload_bytes
        return self._last_seq

    async def sync(self) -> None:
        """Wait until everything appended so far is durable; raise JournalFailed if it never will be."""
        self._check_not_failed()
        target = self._last_seq
        if self.durable_seq >= target:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((target, future))
        await future

    async def close(self) -> None:
        """Write out everything queued, then stop the writer task (which owns the
        backend's ``_wakeup`` event)."""
        self._closing = True
        if self._task is not None:
            self._wakeup.set()
            await asyncio.wait([self._task])

    def _durable_through(self, seq: int) -> None:
        self.durable_seq = seq
        while self._waiters and self._waiters[0][0] <= seq:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
        self._notify(self.on_durable, seq)

    def _drop_queue(self) -> int:
        """Forget the records not yet written; how many (the backend's queue)."""
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        if self._failure is not None:
            return
        self._failure = exc
        dropped = self._drop_queue()
        self._queued_bytes = 0
        logger.error("journal failed dir=%s durable_seq=%d dropped_records=%d error=%r",
                     self.name, self.durable_seq, dropped, exc)
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(self._failed_error())
        self._notify(self.on_failure, exc)

    def _notify(self, callback: Callable | None, arg: object) -> None:
        if callback is None:
            return
        try:
            callback(arg)
        except Exception:  # noqa: BLE001 - a caller's bug must not kill the writer
            logger.exception("journal callback raised dir=%s callback=%r", self.name, callback)

    def _check_not_failed(self) -> None:
        if self._failure is not None:
            raise self._failed_error()

    def _check_writable(self) -> None:
        self._check_not_failed()
        if self._closing:
            raise JournalFailed(f"journal is closed: {self.name}")

    def _failed_error(self) -> JournalFailed:
        error = JournalFailed(f"journal failed: {self.name}: {self._failure!r}")
        error.__cause__ = self._failure
        return error
