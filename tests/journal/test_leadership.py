"""The writer lease (journal/leadership.py), on a fake KV bucket and a fake clock: when the
lease is sure, how a read confirms it, what a lapse costs before it is trusted, and when a
standby takes a lease it finds free."""
from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from journal import leadership
from journal.errors import JournalFenced, JournalUnreachable
from tests.lease_log import LeaseLog
from journal.leadership import SURE_FOR, LeaseLost, WriterLease

TTL = 3.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Entry:
    def __init__(self, value: bytes, revision: int) -> None:
        self.value, self.revision = value, revision


class KV:
    """A bucket with one key: ``holder`` (None: gone, lapsed), at ``revision``."""

    def __init__(self, clock: Clock, holder: str | None = "me") -> None:
        self.clock, self.holder, self.revision = clock, holder, 1
        self.updates = 0
        self.unreachable = False
        self.answer_lost = False
        self.delay = 0.0  # seconds of the fake clock an update takes

    async def update(self, key, value, last):
        self.updates += 1
        if self.unreachable:
            raise asyncio.TimeoutError()
        await asyncio.sleep(0)
        self.clock.now += self.delay
        if self.holder != value.decode() or last != self.revision:
            raise KeyWrongLastSequenceError()
        self.revision += 1
        return self.revision

    async def get(self, key):
        if self.unreachable:
            raise asyncio.TimeoutError()
        await asyncio.sleep(0)
        if self.holder is None:
            raise KeyNotFoundError()
        return Entry(self.holder.encode(), self.revision)

    async def create(self, key, value):
        if self.unreachable:
            raise asyncio.TimeoutError()
        if self.holder is not None:
            raise KeyWrongLastSequenceError()
        self.holder, self.revision = value.decode(), self.revision + 1
        if self.answer_lost:  # stored, but the answer never came
            raise asyncio.TimeoutError()
        return self.revision


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(leadership, "_clock", c)
    return c


def lease_on(kv: KV) -> WriterLease:
    lease = WriterLease(LeaseLog(), ttl_s=TTL)
    lease.kv = kv
    lease.revision = kv.revision
    return lease


def test_a_lease_is_sure_for_two_thirds_of_the_ttl_from_when_its_renewal_was_sent(clock):
    kv = KV(clock)
    kv.delay = 0.5  # the answer comes late: the time counts from the sending
    lease = lease_on(kv)
    assert not lease.sure()  # never renewed: nothing is known
    sent = clock.now
    asyncio.run(lease.confirm(timeout_s=7))
    assert kv.updates == 1
    clock.now = sent + TTL * SURE_FOR - 0.01
    assert lease.sure()
    clock.now = sent + TTL * SURE_FOR
    assert not lease.sure()


def test_reads_that_find_the_lease_unsure_share_one_renewal(clock):
    kv = KV(clock)
    lease = lease_on(kv)

    async def reads():
        await asyncio.gather(*(lease.confirm(timeout_s=7) for _ in range(20)))

    asyncio.run(reads())
    assert kv.updates == 1 and lease.sure()


def test_a_lease_another_process_holds_is_lost_and_reads_are_refused(clock):
    kv = KV(clock, holder="standby")
    lease = lease_on(kv)
    lost = []
    lease.on_lost = lost.append
    with pytest.raises(LeaseLost):
        asyncio.run(lease.confirm(timeout_s=7))
    assert lost and "standby" in str(lost[0])
    with pytest.raises(LeaseLost):  # and from then on, at once
        asyncio.run(lease.confirm(timeout_s=7))
    assert kv.updates == 1


def test_a_lease_nats_cannot_confirm_times_out(clock):
    kv = KV(clock)
    kv.unreachable = True
    lease = lease_on(kv)

    async def read():
        async def tick():  # the fake clock moves while confirm retries
            while True:
                await asyncio.sleep(0.01)
                clock.now += 0.5

        ticking = asyncio.ensure_future(tick())
        try:
            await lease.confirm(timeout_s=7)
        finally:
            ticking.cancel()

    with pytest.raises(JournalUnreachable):
        asyncio.run(read())
    assert kv.updates > 1 and not lease.sure()


def test_a_lapsed_lease_taken_again_is_sure_only_once_the_journals_are_fenced_again(clock):
    kv = KV(clock, holder=None)  # lapsed while NATS could not be reached; nobody took it
    lease = lease_on(kv)
    fenced = []

    async def refence():
        assert not lease.sure(), "trusted before the fence"
        fenced.append(clock.now)

    lease.refence = refence
    asyncio.run(lease.confirm(timeout_s=7))
    assert fenced and lease.sure() and kv.holder == "me"


def test_a_lapsed_lease_taken_again_after_another_process_wrote_is_lost(clock):
    kv = KV(clock, holder=None)
    lease = lease_on(kv)

    async def refence():
        raise JournalFenced("journal x: another writer appended to the stream")

    lease.refence = refence
    with pytest.raises(LeaseLost, match="while it had lapsed"):
        asyncio.run(lease.confirm(timeout_s=7))
    assert not lease.sure() and lease.lost is not None


def test_a_lapse_before_the_journals_are_written_is_fenced_once_they_are(clock):
    kv = KV(clock, holder=None)  # lapsed during recovery: no refence given yet
    lease = lease_on(kv)

    async def go():
        await lease.renew_now()
        assert not lease.sure()
        await lease.renew_now()  # renewing again does not make it sure: the fence is owed
        assert not lease.sure()
        fenced = []

        async def refence():
            fenced.append(True)

        await lease.fence_with(refence)
        assert fenced and lease.sure()

    asyncio.run(go())


class Standby:
    """``WriterLease.wait`` of the process "me" running on a fake bucket; ``polls(n)``
    lets it poll ``n`` times (each poll: a read and, if it decides to, a create)."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv
        self.lease = lease_on(kv)
        self.task = asyncio.ensure_future(self.lease.wait(poll_s=0))

    async def polls(self, n: int = 5) -> bool:
        """Whether the lease was taken within ``n`` polls."""
        for _ in range(5 * n):
            await asyncio.sleep(0)
        return self.task.done()


def standby_test(body):
    def run(clock):
        async def go():
            standby = Standby(KV(clock, holder="writer"))
            try:
                await body(standby, clock)
            finally:
                standby.task.cancel()

        asyncio.run(go())
    return run


@standby_test
async def test_a_standby_that_saw_nats_answer_takes_a_lapsed_lease_at_once(standby, clock):
    assert not await standby.polls()
    standby.kv.holder = None  # the writer stopped renewing while NATS answered: it lapsed
    assert await standby.polls() and standby.kv.holder == "me"
    assert standby.lease.sure()


@standby_test
async def test_a_standby_leaves_a_lease_that_lapsed_while_nats_did_not_answer_to_its_holder(standby, clock):
    kv = standby.kv
    assert not await standby.polls()
    kv.unreachable = True  # the bucket's stream leader lost: nobody can renew or take the lease
    assert not await standby.polls()
    clock.now += 6  # the election: the entry lapses meanwhile
    kv.unreachable, kv.holder = False, None  # a new leader, the entry expired
    assert not await standby.polls()
    clock.now += TTL - 0.1  # NATS answers the standby, not yet for a whole TTL
    assert not await standby.polls() and kv.holder is None
    kv.holder = "writer"  # the writer took its lease back
    assert not await standby.polls()
    kv.holder = None  # ... and then stopped while NATS answered: taken at once
    assert await standby.polls() and kv.holder == "me"


@standby_test
async def test_a_standby_takes_a_lease_that_lapsed_while_nats_did_not_answer_after_a_ttl(standby, clock):
    kv = standby.kv
    kv.unreachable = True
    assert not await standby.polls()
    kv.unreachable, kv.holder = False, None  # the writer is gone too: nobody takes the lease back
    assert not await standby.polls()
    clock.now += TTL / 2
    kv.unreachable = True  # NATS fails again: the standby's count starts over
    assert not await standby.polls()
    kv.unreachable = False
    clock.now += TTL / 2
    assert not await standby.polls()
    clock.now += TTL
    assert await standby.polls() and kv.holder == "me"


@standby_test
async def test_a_standby_whose_create_answer_was_lost_finds_the_lease_its_own(standby, clock):
    kv = standby.kv
    kv.answer_lost = True
    kv.holder = None
    assert await standby.polls() and kv.holder == "me"
    assert standby.task.result() >= 0
    assert standby.lease.revision == kv.revision and not standby.lease.sure()  # sure from its first renewal


def test_a_lease_taken_again_is_renewed_while_the_journals_are_fenced(clock):
    """Seen in a chaos run: the writer took its lapsed lease back when NATS elected a new leader,
    then fenced its journals, which waited 4.6 s for their own stream leaders; the renewal
    waited for the fence, the new entry lapsed after its TTL and the standby took it."""
    kv = KV(clock, holder=None)  # lapsed during a NATS leader election
    lease = lease_on(kv)
    fenced = []

    async def go():
        stream_leaders = asyncio.get_running_loop().create_future()

        async def refence():
            await stream_leaders  # the journals' streams elect their leaders in their own time
            fenced.append(True)

        lease.refence = refence
        await asyncio.wait_for(lease.renew_now(), 5)  # taken again, its fence published beside
        assert kv.holder == "me" and not fenced and not lease.sure()
        reading = asyncio.ensure_future(lease.confirm(timeout_s=7))
        for _ in range(3):  # the renewals go on meanwhile
            updates = kv.updates
            await asyncio.wait_for(lease.renew_now(), 5)
            assert kv.updates == updates + 1 and not lease.sure() and not reading.done()
        stream_leaders.set_result(None)
        await asyncio.wait_for(reading, 5)  # the read waited for the fence, not for a renewal storm
        assert fenced and lease.sure()
        assert kv.updates == updates + 1

    asyncio.run(go())


def test_a_lapse_while_the_fence_is_published_is_fenced_again(clock):
    """A second lapse, taken again while the first one's fence was being published: another
    process may have written between them, so one more fence must follow."""
    kv = KV(clock, holder=None)
    lease = lease_on(kv)
    fences = []

    async def go():
        gates = [asyncio.get_running_loop().create_future() for _ in range(2)]

        async def refence():
            await gates[len(fences)]
            fences.append(clock.now)

        lease.refence = refence
        await lease.renew_now()  # first lapse: fence 1 starts
        kv.holder = None  # lapses again before fence 1 is through
        await lease.renew_now()
        gates[0].set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(fences) == 1 and not lease.sure()  # fence 1 began before the second lapse
        gates[1].set_result(None)
        await asyncio.wait_for(lease.confirm(timeout_s=7), 5)
        assert len(fences) == 2 and lease.sure()

    asyncio.run(go())
