"""etcd's backend schema: what an etcd snapshot (a bbolt file) holds, both ways.

An etcd snapshot is etcd's bbolt database file (``bbolt.py``), and what
``etcdctl snapshot save`` receives also ends with the SHA-256 of the file
(32 bytes; the file is whole pages, so its length is a multiple of 512 and
the hashed one's is 32 more).  A copy of ``member/snap/db`` has no hash.

The buckets of etcd 3.4–3.6, as written and read here::

    | bucket          | key                                  | value                                   |
    | key             | revision: main (u64 BE) "_" sub      | mvccpb.KeyValue; a tombstone's holds    |
    |                 |   (u64 BE), + "t" for a tombstone    |   the key alone                         |
    | meta            | consistent_index, term (3.5+)        | u64 BE                                  |
    |                 | scheduledCompactRev,                 | a revision key (sub 0): a Compact       |
    |                 |   finishedCompactRev                 |   asked for / one whose rows are gone   |
    |                 | confState (3.5+), storageVersion     | not written, not read                   |
    |                 |   (3.6)                              |                                         |
    | lease           | lease id (i64 BE)                    | leasepb.Lease (ID, TTL, RemainingTTL)    |
    | auth            | authEnabled                          | one byte: 1 on, 0 off                   |
    |                 | authRevision                         | u64 BE                                  |
    | authUsers       | user name                            | authpb.User (bcrypt hash, roles)         |
    | authRoles       | role name                            | authpb.Role (key permissions)            |
    | cluster         | clusterVersion                       | "3.5.0"                                 |
    | members,        | member id (hex)                      | JSON; etcdutl snapshot restore rewrites |
    |  members_removed|                                      |   them: written empty, not read         |
    | alarm           | AlarmMember                          | written empty, not read                 |

The key bucket is etcd's whole MVCC history above the compaction: every
revision of every key, tombstones included, in revision order.  etcd's
current revision after a restore is the highest main revision in it, or
the compacted revision if that is higher.  While a compaction is under way
``scheduledCompactRev`` is above ``finishedCompactRev`` and rows it will
remove may still be there; etcd finishes it on start, and so does a
shardetcd data dir made from it (the compacted revision is the scheduled one).
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from proto import auth_pb2, lease_pb2
from proto.kv_pb2 import KeyValue

from .auth import role_from_message, role_message, user_from_message, user_message
from .auth_state import AuthState
from .bbolt import Bucket, BoltError, BoltReader
from .errors import SnapshotError
from .layout import Router

HASH_BYTES = 32
CLUSTER_VERSION = b"3.5.0"

KEY, META, LEASE, AUTH, AUTH_USERS, AUTH_ROLES = b"key", b"meta", b"lease", b"auth", b"authUsers", b"authRoles"
CLUSTER, MEMBERS, MEMBERS_REMOVED, ALARM = b"cluster", b"members", b"members_removed", b"alarm"
CONSISTENT_INDEX, TERM = b"consistent_index", b"term"
SCHEDULED_COMPACT, FINISHED_COMPACT = b"scheduledCompactRev", b"finishedCompactRev"
AUTH_ENABLED, AUTH_REVISION = b"authEnabled", b"authRevision"

_U64BE = struct.Struct(">Q")
_I64BE = struct.Struct(">q")
_REV = struct.Struct(">QcQ")
REV_BYTES = _REV.size  # 17
TOMBSTONE = b"t"


def rev_key(main: int, sub: int = 0, tombstone: bool = False) -> bytes:
    return _REV.pack(main, b"_", sub) + (TOMBSTONE if tombstone else b"")


def parse_rev_key(k: bytes) -> tuple[int, int, bool]:
    """(main, sub, tombstone) of a key-bucket key; SnapshotError if it is not one."""
    if len(k) not in (REV_BYTES, REV_BYTES + 1) or k[8:9] != b"_" or (len(k) > REV_BYTES and k[-1:] != TOMBSTONE):
        raise SnapshotError(f"key bucket: {k[:40]!r} is not a revision")
    main, _, sub = _REV.unpack_from(k)
    if main >= 1 << 63 or sub >= 1 << 32:
        raise SnapshotError(f"key bucket: revision {main}/{sub} is out of range")
    return main, sub, len(k) > REV_BYTES


def to_row_key(k: bytes) -> bytes:
    """etcd's revision key → shardetcd's row key (``revision.py``: the same without the "_")."""
    return k[:8] + k[9:]


def from_row_key(rk: bytes) -> bytes:
    return rk[:8] + b"_" + rk[8:]


# -- export ------------------------------------------------------------------

@dataclass(frozen=True)
class Content:
    """Everything a snapshot holds, frozen at one committed revision.
    ``rows()`` yields (row key, serialized KeyValue) in revision order, the
    same each time it is called."""

    revision: int
    compact_rev: int  # -1: never compacted
    finished_compact_rev: int  # the highest compaction whose rows are all gone; -1: none
    term: int
    leases: list[tuple[int, int]]  # (id, TTL s)
    auth: AuthState
    rows: Callable[[], Iterator[tuple[bytes, bytes]]]


def buckets(c: Content) -> list[Bucket]:
    """The buckets of etcd 3.5's backend holding ``c``."""
    meta = [(CONSISTENT_INDEX, _U64BE.pack(c.revision)), (TERM, _U64BE.pack(c.term))]
    if c.finished_compact_rev >= 0:
        meta.append((FINISHED_COMPACT, rev_key(c.finished_compact_rev)))
    if c.compact_rev >= 0:
        meta.append((SCHEDULED_COMPACT, rev_key(c.compact_rev)))
    leases = sorted((_I64BE.pack(i), lease_pb2.Lease(ID=i, TTL=ttl).SerializeToString()) for i, ttl in c.leases)
    auth = [(AUTH_ENABLED, b"\x01" if c.auth.enabled else b"\x00"), (AUTH_REVISION, _U64BE.pack(c.auth.revision))]
    users = sorted((u.name.encode(), user_message(u).SerializeToString()) for u in c.auth.users.values())
    roles = sorted((r.name.encode(), role_message(r).SerializeToString()) for r in c.auth.roles.values())
    fixed = {KEY: lambda: ((from_row_key(rk), v) for rk, v in c.rows()),
             META: lambda: sorted(meta), LEASE: lambda: leases, AUTH: lambda: sorted(auth),
             AUTH_USERS: lambda: users, AUTH_ROLES: lambda: roles,
             CLUSTER: lambda: [(b"clusterVersion", CLUSTER_VERSION)],
             MEMBERS: lambda: [], MEMBERS_REMOVED: lambda: [], ALARM: lambda: []}
    return [Bucket(name, items) for name, items in fixed.items()]


# -- import ------------------------------------------------------------------

SKIP = 0xFF  # a row not to import (a tombstone whose put a compaction already removed)


@dataclass
class Imported:
    """A checked etcd snapshot: its tables, and its key rows routed to shards."""

    db: BoltReader
    revision: int
    compact_rev: int
    leases: list[tuple[int, int]]
    auth: AuthState
    route: bytearray  # shard id of each key-bucket row, in order; SKIP for none
    keys_live: int
    lease_routes: dict[int, set[int]]  # lease id -> the routes of the live keys attached to it (none: absent)

    @property
    def rows_kept(self) -> int:
        """How many rows ``routed_rows`` yields."""
        return len(self.route) - self.route.count(SKIP)

    def routed_rows(self) -> Iterator[tuple[int, bytes, bytes]]:
        """(route, row key, serialized KeyValue) of every row kept, in revision order: one pass over
        the key bucket, whatever the number of shards or partitions the rows go to."""
        route = self.route
        for i, (k, v) in enumerate(_bucket_items(self.db, KEY)):
            if (r := route[i]) != SKIP:
                yield r, to_row_key(k), v


def _bucket_items(db: BoltReader, name: bytes) -> Iterator[tuple[bytes, bytes]]:
    b = db.bucket(name)
    return iter(()) if b is None else b.items()


def import_db(db: BoltReader, router: Router) -> Imported:
    """Read and check every bucket shardetcd takes from an etcd database;
    SnapshotError (or BoltError) for anything that is not what etcd writes."""
    names = set()
    for name, bucket in db.buckets():  # every page of every bucket, those not imported too
        names.add(name)
        if name not in (KEY, META, LEASE, AUTH, AUTH_USERS, AUTH_ROLES):
            for _ in bucket.items():
                pass
    if router.default >= SKIP:
        raise SnapshotError(f"a layout of {router.default + 1} shards: a restore routes to at most {SKIP} shards")
    if KEY not in names or META not in names:
        raise SnapshotError(f"not an etcd database: it has no 'key' and 'meta' buckets (it has {sorted(names)})")
    compact_rev = _compact_rev(db)
    route, last_main, live = _route_rows(db, router, compact_rev)
    leases = _leases(db)
    auth = _auth(db)
    revision = max(1, last_main, compact_rev)
    lease_routes: dict[int, set[int]] = {}
    for key, lease in live.items():
        if lease:
            lease_routes.setdefault(lease, set()).add(router.shard_for_key(key))
    return Imported(db, revision, compact_rev, leases, auth, route, len(live), lease_routes)


def _compact_rev(db: BoltReader) -> int:
    """The compacted revision: the scheduled compaction (etcd finishes it on start)."""
    found = dict(_bucket_items(db, META))
    revs = []
    for name in (FINISHED_COMPACT, SCHEDULED_COMPACT):
        value = found.get(name)
        if value is None:
            continue
        if len(value) != REV_BYTES:
            raise SnapshotError(f"meta bucket: {name.decode()} is {value!r}, not a revision")
        revs.append(parse_rev_key(value)[0])
    return max(revs, default=-1)


def _route_rows(db: BoltReader, router: Router, compact_rev: int) -> tuple[bytearray, int, dict[bytes, int]]:
    """Check every row of the key bucket and pick its shard; also the live keys at the end, with
    their leases.  Rows arrive in revision order; a tombstone must end a key's life, except one at
    or below the compaction whose put the compaction removed already (skipped)."""
    route = bytearray()
    live: dict[bytes, int] = {}
    last = 0
    for k, v in _bucket_items(db, KEY):
        main, _sub, tomb = parse_rev_key(k)
        try:
            kv = KeyValue.FromString(v)
        except DecodeError:
            raise SnapshotError(f"key bucket: the row at revision {main} is not a KeyValue") from None
        if not kv.key:
            raise SnapshotError(f"key bucket: the row at revision {main} has no key")
        last = main
        if tomb:
            if kv.key not in live:
                if main > compact_rev:
                    raise SnapshotError(f"key bucket: tombstone of {kv.key[:80]!r} at revision {main} "
                                        "for a key that does not exist")
                route.append(SKIP)
                continue
            del live[kv.key]
        else:
            if kv.mod_revision != main:
                raise SnapshotError(f"key bucket: the row at revision {main} says mod_revision {kv.mod_revision}")
            live[kv.key] = kv.lease
        route.append(router.shard_for_key(kv.key))
    return route, last, live


def _leases(db: BoltReader) -> list[tuple[int, int]]:
    out = []
    for k, v in _bucket_items(db, LEASE):
        try:
            lease = lease_pb2.Lease.FromString(v)
        except DecodeError:
            lease = None
        if lease is None or len(k) != 8 or _I64BE.unpack(k)[0] != lease.ID:
            raise SnapshotError(f"lease bucket: entry {k!r} is not a lease")
        out.append((lease.ID, lease.TTL))
    return out


def _auth(db: BoltReader) -> AuthState:
    s = AuthState()
    flags = dict(_bucket_items(db, AUTH))
    s.enabled = flags.get(AUTH_ENABLED) == b"\x01"
    if AUTH_REVISION in flags:
        if len(flags[AUTH_REVISION]) != 8:
            raise SnapshotError(f"auth bucket: authRevision is {flags[AUTH_REVISION]!r}, not a u64")
        s.revision = _U64BE.unpack(flags[AUTH_REVISION])[0]
    try:
        for k, v in _bucket_items(db, AUTH_USERS):
            u = user_from_message(auth_pb2.User.FromString(v))
            if u.name.encode() != k:
                raise SnapshotError(f"authUsers bucket: the user under {k[:80]!r} is named {u.name[:80]!r}")
            s.users[u.name] = u
        for k, v in _bucket_items(db, AUTH_ROLES):
            r = role_from_message(auth_pb2.Role.FromString(v))
            if r.name.encode() != k:
                raise SnapshotError(f"authRoles bucket: the role under {k[:80]!r} is named {r.name[:80]!r}")
            s.roles[r.name] = r
    except (DecodeError, UnicodeDecodeError):
        raise SnapshotError("auth buckets: a user or role is damaged") from None
    return s


__all__ = ["BoltError", "Content", "Imported", "buckets", "import_db", "parse_rev_key", "rev_key"]
