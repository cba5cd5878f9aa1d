"""The lease table's expiry queue, on a fake clock."""
from __future__ import annotations

from shards.lease import LeaseTable


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def table() -> tuple[LeaseTable, Clock]:
    clock = Clock()
    return LeaseTable(member_id=1, clock=clock), clock


def test_keepalives_do_not_grow_the_expiry_queue():
    leases, clock = table()
    for i in range(1, 101):
        leases.grant(i, 60)
    for _ in range(1000):  # 100k keep-alives over ~17 minutes of fake time
        clock.t += 1
        for i in range(1, 101):
            leases.renew(i)
        assert leases.expired(1000) == []
    assert len(leases._expiry_heap) == 100  # one entry per lease, not one per keep-alive


def test_a_renewed_lease_expires_ttl_after_its_last_keepalive():
    leases, clock = table()
    leases.grant(7, 10)
    leases.grant(8, 10)
    clock.t += 8
    leases.renew(7)
    clock.t += 2.5  # 8 is due, 7 was renewed 2.5 s ago
    assert leases.expired(10) == [8]
    clock.t += 7.0
    assert leases.expired(10) == []
    clock.t += 0.6  # 10.1 s after the keep-alive
    assert leases.expired(10) == [7]


def test_revoked_and_regranted_ids_expire_once_at_the_new_deadline():
    leases, clock = table()
    leases.grant(5, 10)
    leases.remove(5)
    clock.t += 5
    leases.grant(5, 10)  # same id, new deadline 5 s later than the old entry's
    clock.t += 6  # the old entry is due: dropped, not an expiry
    assert leases.expired(10) == []
    clock.t += 4.5
    assert leases.expired(10) == [5]
    assert leases.expired(10) == []


def test_expiry_is_bounded_per_call_and_earliest_first():
    leases, clock = table()
    for i in range(1, 1001):
        leases.grant(i, 10 + i % 7)
    clock.t += 100
    first = leases.expired(300)
    assert len(first) == 300
    deadlines = [leases.leases[i].expiry for i in first]
    assert deadlines == sorted(deadlines)
    rest = leases.expired(10_000)
    assert len(rest) == 700 and not set(first) & set(rest)
