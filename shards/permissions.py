"""Key permissions of one user, merged across their roles, and etcd's checks on them.

etcd puts every permission of every role a user has into two interval sets,
one for reading and one for writing, and asks two questions:

- one key (a request without range_end): does any interval hold the key?
- a range [key, range_end): do the intervals that overlap it, taken in
  order of their start, cover it without a gap from key to range_end?

Ends follow etcd's "affine" byte strings: a range_end of "\\0" means "to the
end of the keyspace" (``None`` here), and a permission without range_end
is the one key [key, key + "\\0").  A permission with an empty key, or whose
range is empty or inverted, grants nothing.

Worked example: a user whose roles grant READ on [a/, a0), on x, on [m, n)
and on [n, p)::

    read a/1                 a/1 is in [a/, a0)                     allowed
    read [a/, a1)            [a/, a0) stops short of a1              denied
    read [m, p)              [m, n) then [n, p): no gap, reaches p   allowed
    read [m, q)              reaches only p                          denied
    read [x, x\\0)           the key x                               allowed
    read from a/ (end "\\0")  nothing reaches the end of the keyspace  denied
"""
from __future__ import annotations

from collections.abc import Iterable

READ, WRITE, READWRITE = 0, 1, 2  # authpb.Permission.Type

Interval = tuple[bytes, "bytes | None"]  # [begin, end); end None: to the end of the keyspace


def _end(range_end: bytes) -> bytes | None:
    return None if range_end == b"\x00" else range_end


def _before(a: bytes | None, b: bytes | None) -> bool:
    """a < b, where None is +infinity."""
    return a is not None and (b is None or a < b)


def granted_interval(key: bytes, range_end: bytes) -> Interval | None:
    """What a permission on [key, range_end) grants, or None if it grants nothing."""
    if not key:
        return None  # affine bytes: an empty begin is +infinity
    if not range_end:
        return key, key + b"\x00"
    end = _end(range_end)
    if end is not None and end <= key:
        return None
    return key, end


class Intervals:
    """A set of granted intervals, sorted by their start."""

    __slots__ = ("ivs",)

    def __init__(self, ivs: Iterable[Interval]) -> None:
        self.ivs = sorted(ivs, key=lambda iv: iv[0])

    def holds(self, key: bytes) -> bool:
        return any(b <= key and _before(key, e) for b, e in self.ivs)

    def covers(self, key: bytes, range_end: bytes) -> bool:
        """etcd's interval-tree Contains: the overlapping intervals reach from key to range_end without a gap."""
        q_end = _end(range_end)
        reach: bytes | None = b""
        started = False
        for b, e in self.ivs:
            # etcd's overlap test for a query [key, q_end) against [b, e)
            if (key < b and not _before(b, q_end)) or not _before(key, e):
                continue
            if not started:
                if b > key:
                    return False
                started, reach = True, e
            elif _before(reach, b):
                return False
            elif _before(reach, e):
                reach = e
        return started and not _before(reach, q_end)

    def allows(self, key: bytes, range_end: bytes) -> bool:
        return self.covers(key, range_end) if range_end else self.holds(key)


class UserPermissions:
    """One user's merged read and write intervals."""

    __slots__ = ("read", "write")

    def __init__(self, perms: Iterable[tuple[int, bytes, bytes]]) -> None:
        read: list[Interval] = []
        write: list[Interval] = []
        for kind, key, range_end in perms:
            iv = granted_interval(key, range_end)
            if iv is None:
                continue
            if kind in (READ, READWRITE):
                read.append(iv)
            if kind in (WRITE, READWRITE):
                write.append(iv)
        self.read = Intervals(read)
        self.write = Intervals(write)

    def allows(self, key: bytes, range_end: bytes, write: bool) -> bool:
        return (self.write if write else self.read).allows(key, range_end)
