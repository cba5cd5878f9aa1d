"""etcd's HashKV: a CRC-32C over the MVCC rows up to a revision.

Rows are hashed in revision order with etcd's own revision-key encoding
(8-byte main, "_", 8-byte sub, "t" for a tombstone) after the bucket name
"key", skipping history that compaction drops, so the same history gives
the same hash as etcd and the same hash across restarts.
"""
from __future__ import annotations

import bisect
import struct
from typing import TYPE_CHECKING

import crc32c

from .errors import CompactedError, FutureRevisionError
from .revision import entry_bound
from .state import entries_of
from .steps import Steps, drain

if TYPE_CHECKING:
    from .store import Store


def etcd_revision_key(e: int) -> bytes:
    key = struct.pack(">Q", e >> 33) + b"_" + struct.pack(">Q", (e >> 1) & 0xFFFFFFFF)
    return key + b"t" if e & 1 else key


HASH_ROWS = 1024  # rows hashed between two chances for the event loop to run others
HASH_KEYS = 4096  # keys' entries listed between two such chances


def hash_kv(store: Store, rev: int) -> tuple[int, int]:
    """(hash, compact revision) of the state at ``rev`` (0: current), at once."""
    return drain(hash_kv_steps(store, rev))


def hash_kv_steps(store: Store, rev: int) -> Steps[tuple[int, int]]:
    """``hash_kv`` in steps: the rows are listed ``HASH_KEYS`` keys at a time, sorted
    at once, then read and hashed ``HASH_ROWS`` at a time (the caller holds compaction
    at the compact revision back meanwhile: every row listed must stay).

    As etcd: rows above the compact revision count if their revision is <=
    rev; rows at or below it count only if they are the version of their key
    visible at ``rev`` ("keep") — unless no key is visible at all, in which
    case they all count.  The compact revision is -1 before any compaction.
    """
    compact = store.compact_rev
    if 0 < rev <= compact:
        raise CompactedError
    if rev > store.committed:
        raise FutureRevisionError
    if rev == 0:
        rev = store.committed
    upper = entry_bound(rev)
    lower = entry_bound(compact) if compact > 0 else 0
    recent: list[tuple[int, int]] = []  # (entry, shard id) above the compact revision
    old: list[tuple[int, int, bool]] = []  # (entry, shard id, kept) at or below it
    any_kept = False
    for sid, state in enumerate(store.states):
        # the keys' entries as they are now, walked in steps: writes meanwhile only append
        # entries above ``rev`` (to a list, in place) and compaction is held back
        held = list(state.index.values())
        for i, revs in enumerate(map(entries_of, held)):
            if i and not i % HASH_KEYS:
                yield
            hi = bisect.bisect_left(revs, upper)
            lo = bisect.bisect_left(revs, lower)
            visible = revs[hi - 1] if hi and not revs[hi - 1] & 1 else None
            any_kept |= visible is not None
            recent.extend((e, sid) for e in revs[lo:hi])
            old.extend((e, sid, e == visible) for e in revs[:lo])
    rows = recent + [(e, sid) for e, sid, kept in old if kept or not any_kept]
    rows.sort()
    h = crc32c.crc32c(b"key")
    states = store.states
    for i, (e, sid) in enumerate(rows):
        if i and not i % HASH_ROWS:
            yield
        h = crc32c.crc32c(etcd_revision_key(e), h)
        h = crc32c.crc32c(states[sid].get_row(e), h)
    return h, compact
