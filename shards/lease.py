"""Leases: the table of granted leases and which keys each one holds.

The table lives beside the store (leases span shards).  Grants and
revocations are journaled as ``LEASE`` records on one shard's journal (the
default shard) and saved in that shard's checkpoints; which keys a lease
holds is not journaled separately: it is the ``lease`` field of each key's
latest row, rebuilt on replay.  Keep-alives are not journaled: as etcd does
after a leader change, a restart gives every lease its full TTL again.

LEASE record payload (little-endian)::

    | off | size | field                         |
    |   0 |    1 | op: 1 grant, 2 revoke         |
    |   1 |    8 | lease id (i64)                |
    |   9 |    8 | TTL in seconds (i64; grant)   |
"""
from __future__ import annotations

import heapq
import struct
import time
from collections import deque
from dataclasses import dataclass, field

MIN_TTL_S = 2  # etcd: ceil(1.5 election timeouts) with default 100 ms ticks, 10 election ticks
MAX_TTL_S = 9_000_000_000
GRANT, REVOKE = 1, 2

_RECORD = struct.Struct("<Bqq")
_ENTRY = struct.Struct("<qq")


@dataclass(slots=True)
class Lease:
    id: int
    ttl: int  # granted TTL, seconds
    expiry: float  # monotonic deadline
    keys: set[bytes] = field(default_factory=set)
    queued: float = 0.0  # the deadline of this lease's one entry in the expiry heap
    expiring: bool = False  # expired, its revoke under way: no keep-alive renews it (etcd: not found)

    def remaining_s(self, now: float) -> float:
        return self.expiry - now


def encode_lease_table(leases) -> bytes:
    """A checkpoint's lease table: 16 bytes per lease, its id and TTL (i64 LE each)."""
    return b"".join(_ENTRY.pack(lease_id, ttl) for lease_id, ttl in leases)


def encode_lease_record(op: int, lease_id: int, ttl: int = 0) -> bytes:
    return _RECORD.pack(op, lease_id, ttl)


def decode_lease_record(payload: bytes) -> tuple[int, int, int]:
    return _RECORD.unpack(payload)


class LeaseTable:
    def __init__(self, member_id: int, clock=time.monotonic) -> None:
        self.clock = clock
        self.leases: dict[int, Lease] = {}
        self.key_lease: dict[bytes, int] = {}  # key -> lease id, for keys put with a lease
        self._expiry_heap: list[tuple[float, int]] = []
        # (tag rev, op, lease id, TTL) of grants and revokes not yet known
        # committed, oldest first: a checkpoint at revision R must hold the
        # table as of R, not the table of now (see ``encode_table``)
        self._recent: deque[tuple[int, int, int, int]] = deque()
        # etcd's id generator: member id (16 bits) | unix ms (40 bits) | counter (8 bits)
        ms = int(time.time() * 1000) & ((1 << 40) - 1)
        self._next = ((member_id & 0xFFFF) << 48) | (ms << 8)

    def adopt(self, other: LeaseTable) -> None:
        """Take ``other``'s contents (a follower's state rebuilt from a checkpoint)."""
        self.__dict__.update(other.__dict__)

    def __contains__(self, lease_id: int) -> bool:
        return lease_id in self.leases

    def new_id(self) -> int:
        while True:
            self._next = (self._next + 1) & ((1 << 64) - 1)
            candidate = self._next & ((1 << 63) - 1)
            if candidate and candidate not in self.leases:
                return candidate

    # -- grant / renew / revoke ------------------------------------------

    def grant(self, lease_id: int, ttl: int, tag: int | None = None) -> Lease:
        """Add a lease; ``tag`` is the revision its GRANT record is tagged with
        (None while replaying what is already durable)."""
        ttl = max(ttl, MIN_TTL_S)
        lease = Lease(lease_id, ttl, self.clock() + ttl)
        self.leases[lease_id] = lease
        self._queue(lease)
        if tag is not None:
            self._recent.append((tag, GRANT, lease_id, ttl))
        return lease

    def _queue(self, lease: Lease) -> None:
        lease.queued = lease.expiry
        heapq.heappush(self._expiry_heap, (lease.expiry, lease.id))

    def renew(self, lease_id: int) -> int:
        """Reset the lease's deadline; its TTL, or 0 when it does not exist."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.expiring:
            return 0
        lease.expiry = self.clock() + lease.ttl  # its heap entry moves when it comes due
        return lease.ttl

    def remove(self, lease_id: int, tag: int | None = None) -> Lease | None:
        """Forget a lease; ``tag`` is the revision its REVOKE record is tagged with."""
        lease = self.leases.pop(lease_id, None)
        if lease is not None and tag is not None:
            self._recent.append((tag, REVOKE, lease_id, lease.ttl))
        return lease

    def settle(self, committed: int) -> None:
        """Grants and revokes tagged at or below ``committed`` are in every later checkpoint's table."""
        recent = self._recent
        while recent and recent[0][0] <= committed:
            recent.popleft()

    def expired(self, limit: int) -> list[int]:
        """Up to ``limit`` leases past their deadline, earliest first.

        Each lease has one heap entry, at the deadline it had when queued; a
        keep-alive only moves ``lease.expiry``.  An entry that comes due for a
        renewed lease is queued again at the new deadline (one heap operation
        per TTL period, not per keep-alive); an entry of a revoked lease, or
        of an earlier grant of the same id, is dropped.
        """
        now = self.clock()
        heap = self._expiry_heap
        out: list[int] = []
        while heap and heap[0][0] <= now and len(out) < limit:
            deadline, lease_id = heapq.heappop(heap)
            lease = self.leases.get(lease_id)
            if lease is None or lease.queued != deadline:
                continue
            if lease.expiry <= now:
                out.append(lease_id)
            else:
                self._queue(lease)
        return out

    def refresh_all(self) -> None:
        """After a restart: every lease gets its full TTL from now."""
        now = self.clock()
        for lease in self.leases.values():
            lease.expiry = lease.queued = now + lease.ttl
        self._expiry_heap = [(lease.expiry, lease.id) for lease in self.leases.values()]
        heapq.heapify(self._expiry_heap)

    def extend_all(self, seconds: float) -> None:
        """Move every deadline ``seconds`` later (time the server could not
        process keep-alives does not count against a lease)."""
        for lease in self.leases.values():
            lease.expiry += seconds

    # -- attachments ------------------------------------------------------

    def attach(self, key: bytes, lease_id: int) -> None:
        """``key`` now carries ``lease_id`` (0: none)."""
        old = self.key_lease.get(key, 0)
        if old == lease_id:
            return
        if old:
            self._drop(key, old)
        if lease_id:
            self.key_lease[key] = lease_id
            lease = self.leases.get(lease_id)
            if lease is not None:
                lease.keys.add(key)
        else:
            self.key_lease.pop(key, None)

    def detach(self, key: bytes) -> None:
        old = self.key_lease.pop(key, 0)
        if old:
            self._drop(key, old)

    def _drop(self, key: bytes, lease_id: int) -> None:
        lease = self.leases.get(lease_id)
        if lease is not None:
            lease.keys.discard(key)

    def rebuild_keys(self) -> int:
        """After replay: fill each lease's key set; returns keys whose lease is gone."""
        orphans = 0
        for key, lease_id in self.key_lease.items():
            lease = self.leases.get(lease_id)
            if lease is None:
                orphans += 1
            else:
                lease.keys.add(key)
        return orphans

    # -- checkpoints ------------------------------------------------------

    def table_at(self, at_rev: int) -> dict[int, int]:
        """{lease id: TTL} as of revision ``at_rev``: grants and revokes tagged
        above it are undone, newest first.  A checkpoint at R written while a
        revoke tagged R+1 is still on its way must keep the lease: if a crash
        cuts R+1, the keys it deleted come back, and so must their lease."""
        table = {l.id: l.ttl for l in self.leases.values()}
        for tag, op, lease_id, ttl in reversed(self._recent):
            if tag <= at_rev:
                break
            if op == GRANT:
                table.pop(lease_id, None)
            else:
                table[lease_id] = ttl
        return table

    def encode_table(self, at_rev: int) -> bytes:
        """The table as of revision ``at_rev`` (``table_at``), for a checkpoint."""
        return encode_lease_table(self.table_at(at_rev).items())

    def load_table(self, blob: bytes) -> None:
        for lease_id, ttl in _ENTRY.iter_unpack(blob):
            self.grant(lease_id, ttl)
