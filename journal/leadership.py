"""Who may write to the JetStream journals: a lease in a JetStream KV bucket.

The bucket ``<prefix>-writer`` keeps one key per writer role (``writer``, or
the partition's name under ``shardetcd cluster``), whose value names the
process holding the lease; entries expire ``ttl_s`` after they were
written (the bucket's max age).  The holder rewrites it every ``ttl_s / 3``
with a compare-and-set on its last revision.  A standby waits until the key
is gone (deleted, or expired because its holder stopped renewing) and
creates it.

The lease only decides who *tries* to write.  What makes a second writer
harmless is the journals' fence (expected last sequence, and the fence
message every journal publishes when it is opened): a process that lost the
lease but still appends is refused by JetStream.  A holder that finds the
lease held by someone else stops at once; a holder that cannot reach NATS
keeps trying (without a quorum nobody can take the lease from it, and its
writes time out meanwhile).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from journal.errors import JournalFailed, JournalUnreachable

logger = logging.getLogger(__name__)

KEY = "writer"  # the key of a server that is not a partition


class WriterLease:
    def __init__(self, log, ttl_s: float = 3.0, key: str = KEY) -> None:
        self.log = log  # a connected journal.jetstream.JetStreamLog
        self.ttl_s = ttl_s
        self.key = key
        self.me = f"{log.writer_id}"
        self.kv = None
        self.revision = 0
        self.on_lost: Callable[[BaseException], None] | None = None
        self.lost: BaseException | None = None  # set once the lease was found held by another
        self._task: asyncio.Task | None = None

    async def _bucket(self):
        if self.kv is None:
            from nats.js.api import KeyValueConfig
            from nats.js.errors import BucketNotFoundError

            from journal.jetstream import open_or_create

            name = f"{self.log.config.prefix}-writer"
            self.kv = await open_or_create(
                f"writer lease bucket {name}", lambda: self.log.js.key_value(name),
                lambda: self.log.js.create_key_value(KeyValueConfig(
                    bucket=name, ttl=self.ttl_s, history=1, replicas=self.log.config.replicas)),
                BucketNotFoundError)
        return self.kv

    async def holder(self) -> str | None:
        """Who holds the lease now (None: nobody)."""
        from nats.js.errors import KeyNotFoundError

        from journal.jetstream import retrying

        kv = await self._bucket()
        try:
            entry = await retrying("writer lease get", lambda: kv.get(self.key))
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None

    async def try_acquire(self) -> bool:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        from journal.jetstream import retrying

        kv = await self._bucket()
        try:
            self.revision = await retrying("writer lease create", lambda: kv.create(self.key, self.me.encode()))
        except KeyNotFoundError:
            # nats-py's create re-reads a key it found deleted; an entry that expired
            # in between is not there any more: nobody holds it, try again later
            return False
        except KeyWrongLastSequenceError:
            if await self.holder() != self.me:
                return False
            try:
                self.revision = (await kv.get(self.key)).revision  # a retried create found its own first try
            except KeyNotFoundError:
                return False

        logger.warning("writer lease acquired holder=%s ttl_s=%.1f", self.me, self.ttl_s)
        return True

    async def acquire(self, poll_s: float = 0.2) -> None:
        """Take the lease, waiting at most one TTL (a holder that died lets it
        lapse by then: a restart after a crash gets it); else say who holds it."""
        deadline = time.monotonic() + self.ttl_s + 1.0
        while not await self.try_acquire():
            if time.monotonic() > deadline:
                raise JournalUnreachable(
                    f"another shardetcd ({await self.holder()}) holds the writer lease {self.key} of "
                    f"{self.log.config.prefix}; start this one with --standby to take over when it stops")
            await asyncio.sleep(poll_s)

    async def wait(self, poll_s: float = 0.2) -> float:
        """A standby: wait until the lease is free and take it; returns seconds waited."""
        started = time.monotonic()
        holder = None
        while not await self.try_acquire():
            now = await self.holder()
            if now != holder:
                holder = now
                logger.warning("standing by writer=%s", holder)
            await asyncio.sleep(poll_s)
        return time.monotonic() - started

    def start_renewing(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        from journal.jetstream import transient_errors

        kv = await self._bucket()
        failures = 0

        def not_renewed(exc: BaseException) -> None:
            nonlocal failures
            failures += 1
            if failures == 1 or failures % 10 == 0:
                logger.warning("writer lease not renewed, retrying failures=%d error=%r", failures, exc)

        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                self.revision = await kv.update(self.key, self.me.encode(), last=self.revision)
                if failures:
                    logger.warning("writer lease renewed again failures=%d", failures)
                    failures = 0
                continue
            except KeyWrongLastSequenceError:
                pass
            except Exception as exc:  # noqa: BLE001 - NATS unreachable: if the lease lapses meanwhile, the fence still holds
                not_renewed(exc)
                continue
            try:
                try:
                    entry = await kv.get(self.key)
                    holder = entry.value.decode()
                except KeyNotFoundError:
                    entry, holder = None, None
                if holder == self.me:  # our last renewal was stored although its answer was lost
                    self.revision, failures = entry.revision, 0
                    continue
                if holder is None:
                    if await self.try_acquire():  # it lapsed while NATS could not be reached
                        failures = 0
                    else:  # no holder to be read, yet not free: NATS is not answering consistently yet
                        not_renewed(JournalFailed("lease entry neither readable nor free"))
                    continue
            except (JournalFailed, *transient_errors()) as exc:  # NATS still unreachable: try again next round
                not_renewed(exc)
                continue
            self._lost(JournalFailed(f"lost the writer lease to {holder or 'another process'}"))
            return

    def _lost(self, exc: BaseException) -> None:
        self.lost = exc
        logger.critical("writer lease lost error=%s", exc)
        if self.on_lost is not None:
            self.on_lost(exc)

    async def release(self) -> None:
        """On a clean stop: give the lease back so a standby need not wait for it to expire."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.kv is not None and self.revision:
            try:
                await self.kv.delete(self.key, last=self.revision)
            except Exception as exc:  # noqa: BLE001 - it expires anyway
                logger.info("writer lease not released error=%r", exc)
