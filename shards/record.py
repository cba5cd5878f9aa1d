"""Journal payloads written by shards (the frame around them is journal/'s).

WRITE (type 1) — one shard's part of one main revision; the revision is the
frame's revision tag::

    | off | size | field                                   |
    |   0 |    2 | P: number of shards taking part (u16 LE) |
    |   2 |   2P | their shard ids (u16 LE each)            |
    | 2+2P|    4 | C: number of changes (u32 LE)             |
    then C changes:
    |   0 |    1 | kind: 0 put, 1 delete (tombstone)        |
    |   1 |    4 | sub revision (u32 LE)                    |
    |   5 |    4 | K: key length (u32 LE)                   |
    |   9 |    4 | V: row length (u32 LE)                   |
    |  13 |    K | key                                     |
    | 13+K|    V | row: serialized mvccpb.KeyValue          |

COMPACT (type 2) — ``Compact(rev)`` was requested; payload: rev (u64 LE).
The frame's revision tag is the latest revision when it was written.

LEASE (type 3) — a lease grant or revocation (``lease.py`` has the payload);
the tag is the latest revision when it was written.

AUTH (type 4) — one change of the auth store (``auth.py`` has the payload);
the tag is the latest revision when it was written.

TOKEN (type 5) — a simple auth token the writer assigned (``tokens.py`` has
the payload), so followers know it as etcd members learn a token through
Raft; the tag is the latest revision when it was written.  Followers apply
it in journal order with AUTH records (a later password change ends it);
recovery of a writer skips it (tokens live in memory: a restart ends them).

LEASE, AUTH and TOKEN records live in the default shard's journal.

The default shard's checkpoints carry the lease table and the auth table
in their meta, after the shard's own fields::

    | off | size | field                                             |
    |   0 |    8 | magic b"SEXTRA\x01\xff"                            |
    |   8 |    4 | L: lease table length (u32 LE)                    |
    |  12 |    L | lease table (lease.py)                            |
    | 12+L|  ... | auth table (auth.py)                              |

Checkpoints written before auth existed hold only the lease table (16-byte
entries of positive lease ids); the magic, read as a lease id, is negative,
so the two never look alike.

A revision is recovered only if every shard named in its WRITE records has
its part (in its journal, or in a checkpoint at or above the revision).
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

WRITE = 1
COMPACT = 2
LEASE = 3  # payload: see lease.py
AUTH = 4  # payload: see auth.py
TOKEN = 5  # payload: see tokens.py
# A write too large for one record (a DeleteRange or a lease revoke of tens of thousands of keys:
# a JetStream message holds a few MiB) goes in several, all tagged with its revision and epoch,
# one after the other on its shard's journal: WRITE_PARTs (payload: u32 count, then changes as in
# a WRITE), then a WRITE_LAST (a WRITE's payload with the last changes). Read together they are
# the WRITE. The last is not a WRITE so that a version from before them, which skips both types,
# finds the revision missing (its start refuses: acknowledged records gone; its follower stops
# there) rather than applying the last part alone.
WRITE_PART = 6
WRITE_LAST = 7

PUT, DELETE = 0, 1

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_CHANGE = struct.Struct("<BIII")


@dataclass(unsafe_hash=True, slots=True)  # immutable by convention: a frozen dataclass's __init__ costs ~1.4 µs more
class Change:
    kind: int
    sub: int
    key: bytes
    row: bytes


def varint(n: int) -> bytes:
    """A protobuf varint (a negative int64 as its two's complement, ten bytes)."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tombstone_row(key: bytes) -> bytes:
    """etcd's tombstone row: an mvccpb.KeyValue of the key alone, as protobuf encodes it
    (field 1; a deletion of thousands of keys writes one each: 0.7 µs here against 1.6)."""
    return b"\n" + varint(len(key)) + key if key else b""


def deleted_kv(key: bytes, rev: int) -> bytes:
    """A delete event's kv: an mvccpb.KeyValue of the key and its mod_revision (fields 1 and 3),
    as protobuf encodes it."""
    head = b"\n" + varint(len(key)) + key if key else b""
    return head + b"\x18" + varint(rev) if rev else head


_ONE_CHANGE = struct.Struct("<HHIBIII")  # a write of one change on one shard: its whole head at once


def encode_write(participants: tuple[int, ...], changes: list[Change],
                 ahead: tuple[int, list[bytes]] | None = None) -> bytes:
    """A WRITE payload. ``ahead``: (n, parts) when the first n changes are encoded already
    (``encode_changes``, in parts), as a write of thousands of changes does between its steps."""
    if ahead is None and len(changes) == 1 and len(participants) == 1:  # most writes: 0.7 µs against 1.7
        c = changes[0]
        return b"".join((_ONE_CHANGE.pack(1, participants[0], 1, c.kind, c.sub, len(c.key), len(c.row)), c.key, c.row))
    out = [_U16.pack(len(participants)), *map(_U16.pack, participants), _U32.pack(len(changes))]
    done = 0
    if ahead is not None:
        done, parts = ahead
        out += parts
    _append_changes(out, changes[done:] if done else changes)
    return b"".join(out)


def encode_changes(changes: list[Change]) -> bytes:
    """``changes`` as they follow a WRITE payload's head."""
    out: list[bytes] = []
    _append_changes(out, changes)
    return b"".join(out)


def _append_changes(out: list[bytes], changes: list[Change]) -> None:
    for c in changes:
        out.append(_CHANGE.pack(c.kind, c.sub, len(c.key), len(c.row)))
        out.append(c.key)
        out.append(c.row)


def decode_write(payload: bytes) -> tuple[tuple[int, ...], list[Change]]:
    (n,) = _U16.unpack_from(payload, 0)
    participants = tuple(_U16.unpack_from(payload, 2 + 2 * i)[0] for i in range(n))
    pos = 2 + 2 * n
    (count,) = _U32.unpack_from(payload, pos)
    changes, pos = _decode_changes(payload, pos + 4, count)
    if pos != len(payload):
        raise ValueError(f"write record has {len(payload) - pos} trailing bytes")
    return participants, changes


def write_changes_in_steps(payload: bytes, step: int) -> Iterator[list[Change]]:
    """A WRITE payload's changes, ``step`` at a time (a follower applies a write of many
    changes between turns of the event loop, decoding as it goes)."""
    count, pos = write_changes_at(payload)
    while count:
        n = min(step, count)
        changes, pos = _decode_changes(payload, pos, n)
        count -= n
        yield changes
    if pos != len(payload):
        raise ValueError(f"write record has {len(payload) - pos} trailing bytes")


def _decode_changes(payload: bytes, pos: int, count: int) -> tuple[list[Change], int]:
    """``count`` changes from ``pos`` on; the offset after them."""
    changes = []
    for _ in range(count):
        kind, sub, klen, vlen = _CHANGE.unpack_from(payload, pos)
        pos += _CHANGE.size
        key = payload[pos : pos + klen]
        pos += klen
        changes.append(Change(kind, sub, key, payload[pos : pos + vlen]))
        pos += vlen
    return changes, pos


def split_write(payload: bytes, limit: int) -> list[tuple[int, bytes]]:
    """A WRITE payload larger than ``limit`` as records of at most ``limit`` bytes (each holding at
    least one change): (WRITE_PART, changes)... then (WRITE_LAST, the head and the last changes)."""
    count, pos = write_changes_at(payload)
    head = payload[: pos - 4]
    room = limit - len(head) - 4  # for each record's changes (the last one carries the head)
    out: list[tuple[int, bytes]] = []
    start, n = pos, 0
    while pos < len(payload):
        _, _, klen, vlen = _CHANGE.unpack_from(payload, pos)
        size = _CHANGE.size + klen + vlen
        if n and (pos - start) + size > room:
            out.append((WRITE_PART, _U32.pack(n) + payload[start:pos]))
            start, n = pos, 0
        pos += size
        n += 1
    out.append((WRITE_LAST if out else WRITE, head + _U32.pack(n) + payload[start:]))  # (one change: as it is)
    return out


def join_write(parts: list[bytes], last: bytes) -> bytes:
    """The WRITE payload that ``split_write`` made ``parts`` (WRITE_PART payloads) and ``last`` of."""
    count, pos = write_changes_at(last)
    count += sum(_U32.unpack_from(p)[0] for p in parts)
    return b"".join((last[: pos - 4], _U32.pack(count), *(memoryview(p)[4:] for p in parts), memoryview(last)[pos:]))


class WriteParts:
    """A journal's WRITE_PART records joined to the WRITE_LAST after them, as its records are
    read in order. Parts of a write whose WRITE never came (its writer stopped between them) are
    dropped with the next write's parts, or stay out of every revision."""

    __slots__ = ("_key", "_parts")

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None  # (revision, epoch) of the parts held
        self._parts: list[bytes] = []

    @property
    def held(self) -> bool:
        """Parts are held, waiting for their last."""
        return self._key is not None

    def part(self, rev: int, epoch: int, payload: bytes) -> None:
        if self._key != (rev, epoch):
            self._key, self._parts = (rev, epoch), []
        self._parts.append(payload)

    def whole(self, rtype: int, rev: int, epoch: int, payload: bytes) -> bytes | None:
        """The WRITE payload of revision ``rev``: a WRITE's, or a WRITE_LAST's with its parts;
        None for a WRITE_LAST whose parts were not read before it (not a whole write)."""
        if self._key is None:
            return payload if rtype == WRITE else None
        key, parts = self._key, self._parts
        self._key, self._parts = None, []
        if rtype == WRITE:
            return payload
        return join_write(parts, payload) if key == (rev, epoch) else None


def write_participants(payload: bytes) -> tuple[int, ...]:
    """The shard ids a WRITE payload names (its changes are not read: see ``write_changes_at``)."""
    (n,) = _U16.unpack_from(payload, 0)
    return struct.unpack_from(f"<{n}H", payload, 2)


def write_changes_at(payload: bytes) -> tuple[int, int]:
    """(number of changes, offset of the first) of a WRITE payload, for a caller that
    reads the changes itself (``CHANGE`` headers, key, row), as recovery's bulk load does."""
    pos = 2 + 2 * _U16.unpack_from(payload, 0)[0]
    return _U32.unpack_from(payload, pos)[0], pos + 4


CHANGE = _CHANGE  # a change's header: kind, sub revision, key length, row length


def encode_compact(rev: int) -> bytes:
    return _U64.pack(rev)


def decode_compact(payload: bytes) -> int:
    return _U64.unpack(payload)[0]


_EXTRA_MAGIC = b"SEXTRA\x01\xff"


def encode_extra_meta(lease_table: bytes, auth_table: bytes) -> bytes:
    return _EXTRA_MAGIC + _U32.pack(len(lease_table)) + lease_table + auth_table


def decode_extra_meta(extra: bytes) -> tuple[bytes, bytes]:
    """(lease table, auth table) of a checkpoint's extra meta, old format included."""
    if not extra.startswith(_EXTRA_MAGIC):
        return extra, b""
    pos = len(_EXTRA_MAGIC)
    (n,) = _U32.unpack_from(extra, pos)
    pos += _U32.size
    return extra[pos : pos + n], extra[pos + n :]
