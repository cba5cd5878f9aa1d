"""Range reads at a revision, across the shards a key range touches."""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from proto.kv_pb2 import KeyValue

from .errors import CompactedError, FutureRevisionError
from .gosort import go_sort
from .revision import entry_main
from .steps import Steps, drain
from .types import (
    SORT_ASCEND,
    SORT_DESCEND,
    SORT_NONE,
    TARGET_CREATE,
    TARGET_KEY,
    TARGET_MOD,
    TARGET_VALUE,
    TARGET_VERSION,
    RangeReq,
    RangeResult,
)

if TYPE_CHECKING:
    from .store import Store

FETCH_ROWS = 2048  # rows fetched (or decoded) between two yields of a large read
LIST_KEYS = 4096  # keys listed between two yields

_SORT_KEYS = {
    TARGET_KEY: lambda kv: kv.key,
    TARGET_VERSION: lambda kv: kv.version,
    TARGET_CREATE: lambda kv: kv.create_revision,
    TARGET_MOD: lambda kv: kv.mod_revision,
    TARGET_VALUE: lambda kv: kv.value,
}


def normalize_end(range_end: bytes) -> bytes | None:
    """etcd's range_end: empty = single key, "\\0" = unbounded (b"")."""
    if not range_end:
        return None
    return b"" if range_end == b"\x00" else range_end


def resolve_revision(store: Store, requested: int, current: int, compacted: int | None = None) -> int:
    """The revision a read at ``requested`` (0: ``current``) reads; ``compacted``: the compaction
    point it began under (a txn's), if not the store's now."""
    if requested > current:
        raise FutureRevisionError
    rev = current if requested <= 0 else requested
    if rev < (store.compact_rev if compacted is None else compacted):
        raise CompactedError
    return rev


def _tagged(scan: Iterator[tuple[bytes, int]], sid: int) -> Iterator[tuple[bytes, int, int]]:
    for key, e in scan:
        yield key, e, sid


def scan_shards(store: Store, key: bytes, end: bytes | None, rev: int) -> Iterator[tuple[bytes, int, int]]:
    """(key, entry, shard id) of keys live at ``rev`` in [key, end), in key order."""
    if end is None:
        sid = store.router.shard_for_key(key)
        return _tagged(store.states[sid].scan(key, None, rev), sid)
    sids = store.router.shards_for_range(key, end)
    if len(sids) == 1:
        return _tagged(store.states[sids[0]].scan(key, end, rev), sids[0])
    return heapq.merge(*(_tagged(store.states[s].scan(key, end, rev), s) for s in sids))


def listed(store: Store, key: bytes, end: bytes | None, rev: int, most: int = 0) -> Steps[list[tuple[bytes, int, int]]]:
    """``scan_shards`` as a list (of at most ``most`` keys, if given), ``LIST_KEYS`` keys a step."""
    return (yield from _in_steps(lambda start: scan_shards(store, start, end, rev), key, most))


def count_keys(store: Store, key: bytes, end: bytes | None, rev: int) -> Steps[int]:
    """Keys live at ``rev`` in [key, end), in steps: a shard that must scan its keys in
    range to count them scans ``LIST_KEYS`` a step."""
    if end is None:
        return store.states[store.router.shard_for_key(key)].count(key, None, rev)
    total = 0
    for sid in store.router.shards_for_range(key, end):
        state = store.states[sid]
        n = yield from state.count_steps(key, end, rev)
        if n is None:
            n = len((yield from _in_steps(lambda start: state.scan(start, end, rev), key)))
        total += n
    return total


def fetch_rows(store: Store, items: list[tuple[bytes, int, int]]) -> list[bytes]:
    if len(items) == 1:
        _, e, sid = items[0]
        return [store.states[sid].get_row(e)]
    by_shard: dict[int, list[int]] = {}
    for _, e, sid in items:
        by_shard.setdefault(sid, []).append(e)
    if len(by_shard) == 1:
        ((sid, entries),) = by_shard.items()
        return store.states[sid].get_rows(entries)
    fetched = {sid: iter(store.states[sid].get_rows(es)) for sid, es in by_shard.items()}
    return [next(fetched[sid]) for _, _, sid in items]


def range_at(store: Store, req: RangeReq, current: int) -> RangeResult:
    """etcd's Range, as seen by a read view whose current revision is ``current``."""
    if not req.range_end:
        return range_key(store, req, current)
    return drain(range_steps(store, req, current))


def range_key(store: Store, req: RangeReq, current: int) -> RangeResult:
    """``range_at`` of one key (no range_end: kube-apiserver's GET, a txn's read), at once: its
    work is bounded, so it needs no steps."""
    rev = resolve_revision(store, req.revision, current)
    state = store.states[store.router.shard_for_key(req.key)]
    e = state.entry_at(req.key, rev)
    if e is None:
        return RangeResult(current, [], False, 0)
    if req.count_only or ((req.min_mod_revision or req.max_mod_revision) and not _mod_ok(req, entry_main(e))):
        return RangeResult(current, [], False, 1)  # the count is of the keys before the filters, as etcd's
    row = state.get_row(e)
    if (req.min_create_revision or req.max_create_revision) and not _create_ok(
            req, KeyValue.FromString(row).create_revision):
        return RangeResult(current, [], False, 1)
    return RangeResult(current, [_strip_value(row) if req.keys_only else row], False, 1)


def range_steps(store: Store, req: RangeReq, current: int, compacted: int | None = None) -> Steps[RangeResult]:
    """``range_at`` in steps: the keys are listed ``LIST_KEYS`` at a time, their rows
    fetched ``FETCH_ROWS`` at a time, and decoded (a sort, a create-revision filter,
    keys_only) as many at a time (rows at or below ``current`` never change; the store
    holds compaction back while a sliced read is in flight). ``compacted``: as for
    ``resolve_revision``."""
    rev = resolve_revision(store, req.revision, current, compacted)
    end = normalize_end(req.range_end)
    if req.count_only:
        return RangeResult(current, [], False, (yield from count_keys(store, req.key, end, rev)))
    filtered = bool(req.min_mod_revision or req.max_mod_revision or req.min_create_revision or req.max_create_revision)
    fetch_all = req.limit <= 0 or req.sort_order != SORT_NONE or filtered
    if fetch_all:
        items = yield from listed(store, req.key, end, rev)
        count = len(items)
    else:
        items = yield from listed(store, req.key, end, rev, req.limit + 1)
        count = len(items) if len(items) <= req.limit else (yield from count_keys(store, req.key, end, rev))
    if filtered:
        items = [i for i in items if _mod_ok(req, entry_main(i[1]))]
    rows: list[bytes] = []
    for i in range(0, len(items), FETCH_ROWS):
        if i:
            yield
        rows += fetch_rows(store, items[i : i + FETCH_ROWS])
    if req.min_create_revision or req.max_create_revision:
        rows = yield from _each_part(rows, lambda part: [
            r for r in part if _create_ok(req, KeyValue.FromString(r).create_revision)])
    rows = yield from _sorted(req, rows)
    more = False
    if 0 < req.limit < len(rows):
        rows = rows[: req.limit]
        more = True
    if req.keys_only:
        rows = yield from _each_part(rows, lambda part: [_strip_value(r) for r in part])
    return RangeResult(current, rows, more, count)


def _in_steps(scan: Callable[[bytes], Iterator[tuple]], key: bytes, most: int = 0) -> Steps[list]:
    """What ``scan(start)`` yields from ``key`` on, items led by their key, as a list (of at most
    ``most`` items, if given), ``LIST_KEYS`` keys a step: each step scans again from just after
    the last key listed, so keys written meanwhile do not disturb it (none of them is live at the
    revision the scan reads)."""
    items: list[tuple] = []
    while True:
        want = LIST_KEYS if not most else min(LIST_KEYS, most - len(items))
        part = list(islice(scan(key), want))
        items += part
        if len(part) < want or len(items) == most:
            return items
        key = part[-1][0] + b"\x00"  # the least key after it
        yield


def _each_part(rows: list, fn: Callable[[list], list]) -> Steps[list]:
    """``fn`` applied to ``rows`` ``FETCH_ROWS`` at a time, a step each."""
    done: list = []
    for i in range(0, len(rows), FETCH_ROWS):
        if i:
            yield
        done += fn(rows[i : i + FETCH_ROWS])
    return done


def _mod_ok(req: RangeReq, mod: int) -> bool:
    if req.max_mod_revision and mod > req.max_mod_revision:
        return False
    return not (req.min_mod_revision and mod < req.min_mod_revision)


def _create_ok(req: RangeReq, create: int) -> bool:
    if req.max_create_revision and create > req.max_create_revision:
        return False
    return not (req.min_create_revision and create < req.min_create_revision)


def _sorted(req: RangeReq, rows: list[bytes]) -> Steps[list[bytes]]:
    order = req.sort_order
    if req.sort_target != TARGET_KEY and order == SORT_NONE:
        order = SORT_ASCEND
    if order == SORT_NONE or (order == SORT_ASCEND and req.sort_target == TARGET_KEY):
        return rows
    keyf = _SORT_KEYS.get(req.sort_target, _SORT_KEYS[TARGET_KEY])
    decoded = yield from _each_part(rows, lambda part: [(keyf(KeyValue.FromString(r)), r) for r in part])
    descend = order == SORT_DESCEND
    if len({k for k, _ in decoded}) == len(decoded):  # no ties: any sort gives etcd's order
        decoded.sort(key=lambda t: t[0], reverse=descend)
    else:  # ties: the order etcd's unstable sort.Sort (sort.Reverse for DESCEND) leaves them in
        go_sort(decoded, (lambda x, y: y[0] < x[0]) if descend else (lambda x, y: x[0] < y[0]))
    return [r for _, r in decoded]


def _strip_value(row: bytes) -> bytes:
    kv = KeyValue.FromString(row)
    kv.value = b""
    return kv.SerializeToString()
