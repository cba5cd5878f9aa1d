"""Who may write to the JetStream journals: a lease in a JetStream KV bucket.

The bucket ``<prefix>-writer`` keeps one key per writer role (``writer``, or
the partition's name under ``shardetcd cluster``), whose value names the
process holding the lease; entries expire ``ttl_s`` after they were
written (the bucket's max age).  The holder rewrites it every ``ttl_s / 3``
with a compare-and-set on its last revision.  A standby waits until the key
is gone (deleted, or expired because its holder stopped renewing) and
creates it.

For writes, the lease only decides who *tries* to write.  What makes a
second writer harmless is the journals' fence (expected last sequence, and
the fence message every journal publishes when it is opened): a process that
lost the lease but still appends is refused by JetStream.  A holder that
finds the lease held by someone else stops at once; a holder that cannot
reach NATS keeps trying (without a quorum nobody can take the lease from it,
and its writes time out meanwhile).

Reads are another matter: a writer cut off from NATS (or paused past its
TTL) still has its state, and nothing JetStream refuses stops it from
answering a linearizable read from it while a standby has taken over and
acknowledges newer writes.  So a linearizable read on the writer is answered
only while the lease is *sure* (etcd's lease-based read): within
``SURE_FOR`` of the TTL after the moment a renewal that succeeded was sent.
The entry was stored after that moment and lives a whole TTL, so nobody can
take the lease before the sure time is over, with a third of the TTL to spare
for the clocks of NATS and this host; and every writer fences the journals
after taking the lease, so what an earlier holder acknowledged was read
before.  Past that time, ``confirm`` renews at once and the read waits for it.
A lease found lapsed and taken again is sure only after ``refence`` (the
journals fenced again after the last message this writer stored): another
process may have held it meanwhile.

A lease can also lapse while its holder is well: when the NATS server leading
the bucket's stream is lost, the others wait 4-9 s (nats-server's Raft election
timeout) before they elect a leader, longer than the default TTL, and nobody can
renew or take the lease meanwhile.  The journals take no writes then either, so
a takeover would only add churn (watches ended, clients re-listing).  So a
standby that NATS failed to answer since it last saw the lease held leaves a
free lease to its holder until NATS has answered the standby for a whole TTL;
the holder, retrying its renewal every ``RETRY_S`` with requests that give up
after a third of the TTL, takes its lease back well before.  A standby that saw
NATS answer all along takes a lapsed lease at once: its holder stopped renewing
while it could have.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Awaitable, Callable

from journal.errors import JournalFailed, JournalUnreachable
from journal.tasks import cancel_and_wait, unheard

logger = logging.getLogger(__name__)

KEY = "writer"  # the key of a server that is not a partition
# the lease's clock: one that also counts time the host spent suspended (CLOCK_MONOTONIC does not),
# so a writer suspended past its TTL does not think its lease is still sure (tests replace it)
_clock = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
SURE_FOR = 2 / 3  # of the TTL: how long after a renewal was sent the lease is surely still ours
RETRY_S = 0.2  # after a renewal NATS did not answer: the next one this soon (else every third of the TTL)


async def _once(what: str, op):
    """One try of ``op()`` (``retrying``'s signature, without its retries)."""
    return await op()


def _fence_ended(fence: asyncio.Future) -> None:
    if not fence.cancelled() and (exc := fence.exception()) is not None:
        logger.warning("writer lease: fencing the journals again failed, retried with the next renewal error=%r", exc)


def bucket_name(prefix: str) -> str:
    """The KV bucket of the writer leases of the journals under ``prefix``."""
    return f"{prefix}-writer"


class LeaseLost(JournalFailed):
    """Another process holds the writer lease now."""


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
        # after taking a lapsed lease again: fence the journals after what this writer stored
        self.refence: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task | None = None
        self._sure_until = 0.0  # _clock() up to which nobody else can hold the lease
        self._renewing: asyncio.Future | None = None  # the renewal in flight, shared by its callers
        self._fence_owed = False  # taken again after a lapse: not sure until the journals are fenced again
        self._owed_until = 0.0  # ... then sure up to this time
        self._fencing: asyncio.Task | None = None  # that fence, while it is published
        self.lapses = 0  # times the lease was taken again after a lapse
        self.renewal_failures = 0  # renewals NATS did not answer (or refused), since the start

    async def _bucket(self):
        if self.kv is None:
            from nats.js.api import KeyValueConfig
            from nats.js.errors import BucketNotFoundError

            name = bucket_name(self.log.config.prefix)
            bucket = await self.log.open_or_create(
                f"writer lease bucket {name}", lambda: self.log.js.key_value(name),
                lambda: self.log.js.create_key_value(KeyValueConfig(
                    bucket=name, ttl=self.ttl_s, history=1, replicas=self.log.config.replicas)),
                BucketNotFoundError)
            self._take_bucket_ttl(name, (await self.log.retrying(f"writer lease bucket {name}", bucket.status)).ttl)
            # a renewal not answered within a third of the TTL is sent again rather than awaited
            js = self.log.nc.jetstream(timeout=min(self.log.config.publish_timeout_s, self.ttl_s / 3))
            self.kv = await self.log.retrying(f"writer lease bucket {name}", lambda: js.key_value(name))
        return self.kv

    def _take_bucket_ttl(self, name: str, kept_s: float | None) -> None:
        """The lease lives as long as the bucket keeps an entry, whatever this process was told:
        the bucket's TTL was set by the process that made it. Renewing on another TTL's cadence
        would let the entry expire between renewals (a standby taking over while this process
        still counts on the lease, if its TTL is the longer) or hold a dead writer's lease longer
        than the standbys expect."""
        if not kept_s or kept_s <= 0:
            raise JournalUnreachable(f"the writer lease bucket {name} keeps entries for ever (no TTL): a lease in "
                                     "it could never lapse; delete the bucket while no server runs on this prefix")
        if abs(kept_s - self.ttl_s) > 1e-3:
            logger.warning("writer lease TTL is the bucket's bucket=%s ttl_s=%.3g asked_ttl_s=%.3g (to change it, "
                           "delete the bucket while no server runs on this prefix)", name, kept_s, self.ttl_s)
            self.ttl_s = kept_s

    async def holder(self) -> str | None:
        """Who holds the lease now (None: nobody)."""
        entry = await self._entry(self.log.retrying)
        return entry.value.decode() if entry is not None and entry.value else None

    async def _entry(self, attempt=_once):
        """The lease's entry (None: nobody holds it), read with ``attempt``."""
        from nats.js.errors import KeyNotFoundError

        kv = await self._bucket()
        try:
            return await attempt("writer lease get", lambda: kv.get(self.key))
        except KeyNotFoundError:
            return None

    async def held(self, timeout_s: float) -> bool:
        """Whether NATS says, within ``timeout_s``, that some process holds the lease: a
        follower's way of knowing it has a leader (False too if NATS does not answer)."""
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can lose a cancel (journal/tasks.py)
                return await self.holder() is not None
        except Exception as exc:  # noqa: BLE001 - NATS unreachable, slow, or not answering consistently
            logger.debug("writer lease not readable error=%r", exc)
            return False

    async def try_acquire(self, attempt=None) -> bool:
        """Create the lease's entry if nobody holds it; ``attempt``: how each NATS call is
        tried (default: ``retrying`` while JetStream is unavailable)."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        attempt = attempt or self.log.retrying
        kv = await self._bucket()
        sent = _clock()
        try:
            self.revision = await attempt("writer lease create", lambda: kv.create(self.key, self.me.encode()))
        except KeyNotFoundError:
            # nats-py's create re-reads a key it found deleted; an entry that expired
            # in between is not there any more: nobody holds it, try again later
            return False
        except KeyWrongLastSequenceError:
            entry = await self._entry(attempt)
            if entry is None or entry.value.decode() != self.me:
                return False
            self.revision = entry.revision  # a retried create found its own first try
        self._sure_until = sent + self.ttl_s * SURE_FOR  # whichever try stored it, it was sent after this
        self._acquired()
        return True

    def _acquired(self) -> None:
        logger.warning("writer lease acquired holder=%s ttl_s=%.1f", self.me, self.ttl_s)

    async def acquire(self, poll_s: float = 0.2) -> None:
        """Take the lease, waiting at most one TTL (a holder that died lets it
        lapse by then: a restart after a crash gets it); else say who holds it."""
        await self._bucket()  # its TTL is the lease's
        deadline = _clock() + self.ttl_s + 1.0
        while not await self.try_acquire():
            if _clock() > deadline:
                raise JournalUnreachable(
                    f"another shardetcd ({await self.holder()}) holds the writer lease {self.key} of "
                    f"{self.log.config.prefix}; start this one with --standby to take over when it stops")
            await asyncio.sleep(poll_s)

    async def wait(self, poll_s: float = 0.2) -> float:
        """A standby: wait until the lease is free and take it; returns seconds waited.

        If NATS failed to answer since the lease was last seen held, a free lease is
        taken only once NATS has answered for a whole TTL (the module's note)."""
        from journal.jetstream import unavailable

        started = _clock()
        holder = None
        doubt = False  # NATS failed to answer since the lease was last seen held
        answering_since = _clock()  # NATS has answered every call since
        failures = 0
        while True:
            try:
                entry = await self._entry()
                now = entry.value.decode() if entry is not None and entry.value else None
                if now is None and (not doubt or _clock() - answering_since >= self.ttl_s):
                    if await self.try_acquire(_once):
                        return _clock() - started
                elif now == self.me:  # a create whose answer was lost stored it: ours, sure once renewed
                    self.revision, self._sure_until = entry.revision, 0.0
                    self._acquired()
                    return _clock() - started
            except Exception as exc:
                if not unavailable(exc):
                    raise
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    logger.warning("writer lease not readable, standing by failures=%d error=%r", failures, exc)
                doubt, answering_since = True, float("inf")
            else:
                if answering_since == float("inf"):
                    answering_since = _clock()
                if now is not None:
                    doubt = False
                if now != holder:
                    holder = now
                    logger.warning("standing by writer=%s", holder)
            await asyncio.sleep(poll_s)

    def start_renewing(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew())

    def sure(self) -> bool:
        """Nobody else can hold the lease now (see the module's note on reads)."""
        return _clock() < self._sure_until

    async def confirm(self, timeout_s: float) -> None:
        """Return once the lease is sure, renewing it now if it is not; JournalUnreachable
        if NATS does not let that happen within ``timeout_s``, LeaseLost if another holds it."""
        deadline = _clock() + timeout_s
        while not self.sure():
            if self.lost is not None:
                raise LeaseLost(str(self.lost))
            left = deadline - _clock()
            if left <= 0:
                raise JournalUnreachable(f"writer lease {self.key} not confirmed within {timeout_s:.1f} s")
            try:
                async with asyncio.timeout(left):
                    if self._fencing is not None and not self._fencing.done():
                        await asyncio.shield(self._fencing)  # taken again after a lapse: sure once fenced
                    else:
                        await asyncio.shield(self.renew_now())
                if self.sure():
                    return
            except (LeaseLost, asyncio.CancelledError):
                raise
            except Exception:  # noqa: BLE001 - NATS not answering (yet): try again until the deadline
                pass
            # not sure yet (a renewal found its own earlier one stored, or NATS did not answer)
            await asyncio.sleep(min(0.1, max(deadline - _clock(), 0)))

    def renew_now(self) -> asyncio.Future:
        """One renewal, shared by everyone who asks while it is in flight."""
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew_once())
            self._renewing.add_done_callback(unheard)  # read by whoever waits
        return self._renewing

    async def _renew_once(self) -> None:
        """Rewrite the entry with a compare-and-set on our last revision: the lease is sure
        again from the moment this was sent.  Raises LeaseLost (after ``on_lost``) if another
        process holds it; any other exception: NATS did not answer, nothing is known."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        kv = await self._bucket()
        sent = _clock()
        try:
            self.revision = await kv.update(self.key, self.me.encode(), last=self.revision)
            if self._fence_owed:
                self._owed_until = sent + self.ttl_s * SURE_FOR
                self._start_fence()  # (again, if the last one ended without fencing)
            else:
                self._sure_until = sent + self.ttl_s * SURE_FOR
            return
        except KeyWrongLastSequenceError:
            pass
        try:
            entry = await kv.get(self.key)
            holder = entry.value.decode()
        except KeyNotFoundError:
            entry, holder = None, None
        if holder == self.me:  # our last renewal was stored although its answer was lost: sure after the next
            self.revision = entry.revision
            return
        if holder is None:  # it lapsed while NATS could not be reached
            if not await self.try_acquire():  # no holder to be read, yet not free: NATS is not consistent yet
                raise JournalFailed("lease entry neither readable nor free")
            self._taken_again()
            return
        self._lost(LeaseLost(f"lost the writer lease to {holder}"))
        raise self.lost

    def _taken_again(self) -> None:
        """Taken again after a lapse: another process may have held the lease meanwhile and
        written, so the lease is sure only once the journals are fenced again after the last
        message this writer stored (which fails if anyone else appended since). The fence runs
        beside the renewals: it waits for the journals' stream leaders, which after a NATS fault
        can take longer than a TTL, and the lease must not lapse again meanwhile (it did, and a
        standby took it, while the renewal waited for the fence)."""
        logger.warning("writer lease taken again after it lapsed holder=%s", self.me)
        self.lapses += 1
        self._fence_owed, self._owed_until, self._sure_until = True, self._sure_until, 0.0
        self._start_fence()

    def _start_fence(self) -> asyncio.Future | None:
        """The fence owed, started unless it runs already (None: the journals are not being
        written yet, ``fence_with`` starts it once they are)."""
        if self.refence is None or self.lost is not None:
            return None
        if self._fencing is None or self._fencing.done():
            self._fencing = asyncio.ensure_future(self._fence())
            self._fencing.add_done_callback(_fence_ended)
        return self._fencing

    async def _fence(self) -> None:
        """Fence the journals again, until no lapse happened while a fence was published;
        then the lease is sure up to what the last renewal made it (LeaseLost if another
        process appended meanwhile)."""
        while True:
            lapses = self.lapses
            try:
                await self.refence()
            except JournalFailed as exc:
                self._lost(LeaseLost(f"lost the writer lease while it had lapsed: {exc}"))
                return
            if lapses == self.lapses:
                break
        self._fence_owed, self._sure_until = False, self._owed_until

    async def fence_with(self, refence: Callable[[], Awaitable[None]]) -> None:
        """The journals are being written: ``refence`` fences them after what this writer
        stored, after any later lapse, and now if the lease lapsed and was taken again
        before (LeaseLost if another process appended meanwhile)."""
        self.refence = refence
        if self._fence_owed and (fencing := self._start_fence()) is not None:
            await asyncio.shield(fencing)
        if self.lost is not None:
            raise self.lost

    async def _renew(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(min(RETRY_S, self.ttl_s / 3) if failures else self.ttl_s / 3)
            if self.lost is not None:  # (a fence after a lapse found another writer's appends)
                return
            try:
                await self.renew_now()
            except LeaseLost:
                return
            except Exception as exc:  # noqa: BLE001 - NATS unreachable: if the lease lapses meanwhile, the fence still holds
                failures += 1
                self.renewal_failures += 1
                if failures == 1 or failures % 10 == 0:
                    logger.warning("writer lease not renewed, retrying failures=%d error=%r", failures, exc)
                continue
            if failures:
                logger.warning("writer lease renewed again failures=%d", failures)
                failures = 0

    def _lost(self, exc: BaseException) -> None:
        self.lost = exc
        logger.critical("writer lease lost error=%s", exc)
        if self.on_lost is not None:
            self.on_lost(exc)

    async def release(self) -> None:
        """On a clean stop: give the lease back so a standby need not wait for it to expire."""
        await cancel_and_wait(self._task, self._fencing)
        if self.kv is not None and self.revision:
            try:
                await self.kv.delete(self.key, last=self.revision)
            except Exception as exc:  # noqa: BLE001 - it expires anyway
                logger.info("writer lease not released error=%r", exc)
