"""One main revision's worth of writes: Put, DeleteRange and Txn semantics.

A ``WriteTxn`` applies changes to shard state the moment it makes them (as
pending rows, invisible to reads at the committed revision), numbering them
with sub revisions, and collects each shard's part for the journal.  All
checks that can fail run before the first change, so a txn never stops half
applied.  Nothing here awaits: the event loop is the serializer.

Work that grows with the data (a compare, a delete or a read over a range)
is written as steps (``steps.py``) that yield every ``STEP_KEYS`` keys: the
store drives them and, once a request has held the loop for a slice of time,
holds every other write back and lets the loop serve reads, keep-alives and
watches before going on (``Store._run``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from proto.kv_pb2 import KeyValue

from .errors import CompactedError, FutureRevisionError, KeyNotFoundError, LeaseNotFoundError, NotTheWriterError
from .read import listed, normalize_end, range_key, range_steps, scan_shards
from .revision import entry_main
from .steps import Steps, drain
from .record import DELETE, PUT, Change, encode_changes, tombstone_row
from .types import (
    CMP_CREATE,
    CMP_LEASE,
    CMP_MOD,
    CMP_VALUE,
    CMP_VERSION,
    RESULT_EQUAL,
    RESULT_GREATER,
    RESULT_LESS,
    RESULT_NOT_EQUAL,
    Compare,
    DeleteReq,
    DeleteResult,
    PutReq,
    PutResult,
    RangeReq,
    TxnReq,
    TxnResult,
)

if TYPE_CHECKING:
    from .state import ShardState
    from .store import Store

_EMPTY_KV = KeyValue()
STEP_KEYS = 256  # keys a compare or delete handles between two yields


class WriteTxn:
    """Changes made at main revision ``rev`` (= the store's latest + 1)."""

    __slots__ = ("store", "rev", "sub", "parts", "ops", "_compared", "ahead", "compacted")

    def __init__(self, store: Store) -> None:
        if store.follower is not None:
            raise NotTheWriterError  # before anything is written to a follower's state
        self.store = store
        self.rev = store.rev + 1
        self.sub = 0
        # the compaction point it began under: a compaction requested while a txn in steps has
        # yielded (a read-only one runs beside writes) does not refuse its reads, held back for them
        self.compacted = store.compact_rev
        self.parts: dict[int, list[Change]] = {}
        self.ahead: dict[int, tuple[int, list[bytes]]] | None = None  # see encode_ahead
        self.ops = 0  # operations of etcd's current metrics transaction (counts.py)
        # the row a compare on one key read, parsed: (key, entry, row, KeyValue); a put of that key then
        # takes it instead of reading and parsing it again (kube-apiserver's every update)
        self._compared: tuple[bytes, int, bytes, KeyValue] | None = None

    @property
    def changed(self) -> bool:
        return self.sub > 0

    def read_rev(self) -> int:
        """Revision a read inside this txn sees (etcd: begin rev, +1 once written)."""
        return self.rev if self.sub else self.rev - 1

    # -- put ------------------------------------------------------------

    def check_put(self, req: PutReq) -> None:
        """A Put's checks, in etcd's order: the lease, then the key that ignore_value or
        ignore_lease needs (etcd's apply reads it: a range, counted even if it is missing)."""
        if req.lease and not self.store.lease_exists(req.lease):
            raise LeaseNotFoundError
        if (req.ignore_value or req.ignore_lease) and self._missing(req.key):
            self.store.counts.ranges += 1
            raise KeyNotFoundError

    def _check_put_in_txn(self, req: PutReq) -> None:
        """A Txn's put on its chosen path (etcd's checkRequestPut): the key first, read in
        the txn's read phase, then the lease."""
        if req.ignore_value or req.ignore_lease:
            self.store.counts.ranges += 1
            self.ops += 1
            if self._missing(req.key):
                raise KeyNotFoundError
        if req.lease and not self.store.lease_exists(req.lease):
            raise LeaseNotFoundError

    def _missing(self, key: bytes) -> bool:
        return self.store.states[self.store.router.shard_for_key(key)].latest_entry(key) is None

    def encode_ahead(self) -> None:
        """Encode the changes recorded so far for the journal record, per shard (a write in
        slices does it at each pause: encoded when it was journaled, 100,000 changes held the
        event loop 45–73 ms at once); ``Store._append`` adds the rest."""
        ahead = self.ahead
        if ahead is None:
            ahead = self.ahead = {}
        for sid, changes in self.parts.items():
            done, parts = ahead.get(sid, (0, []))
            if len(changes) > done:
                parts.append(encode_changes(changes[done:]))
                ahead[sid] = (len(changes), parts)

    def end_metrics_txn(self) -> None:
        """etcd counts a metrics transaction of more than one operation as a txn."""
        if self.ops > 1:
            self.store.counts.txns += 1
        self.ops = 0

    def put(self, req: PutReq) -> PutResult:
        key = req.key
        sid = self.store.router.shard_for_key(key)
        state = self.store.states[sid]
        e = state.latest_entry(key)
        value, lease = req.value, req.lease
        prev_row = None
        if e is None:
            create, version = self.rev, 1
        else:
            compared = self._compared
            if compared is not None and compared[1] == e and compared[0] == key:  # the same row
                prev_row, old = compared[2], compared[3]
            else:
                prev_row = state.get_row(e)
                old = KeyValue.FromString(prev_row)
            create, version = old.create_revision, old.version + 1
            if req.ignore_value:
                value = old.value
            if req.ignore_lease:
                lease = old.lease
        counts = self.store.counts
        if req.prev_kv or req.ignore_value or req.ignore_lease:  # etcd reads the previous value first
            counts.ranges += 1
            self.ops += 2
        else:
            self.ops += 1
        counts.puts += 1
        counts.put_bytes += len(key) + len(value)
        row = KeyValue(
            key=key, create_revision=create, mod_revision=self.rev, version=version, value=value, lease=lease
        ).SerializeToString()
        state.put(key, self.rev, self.sub, row)
        self.store.leases.attach(key, lease)
        self._record(sid, Change(PUT, self.sub, key, row))
        return PutResult(self.rev, prev_row if req.prev_kv else None)

    # -- delete ---------------------------------------------------------

    def delete(self, req: DeleteReq) -> DeleteResult:
        return drain(self.delete_steps(req))

    def delete_steps(self, req: DeleteReq) -> Steps[DeleteResult]:
        rev = self.rev
        counts = self.store.counts
        counts.deletes += 1
        if req.prev_kv:
            counts.ranges += 1
            self.ops += 2
        else:
            self.ops += 1
        # listed in steps too (at once, 50,000 keys held the loop ~40 ms): no other write runs
        # between two of them (the write gate closes at this write's first pause)
        items = yield from listed(self.store, req.key, normalize_end(req.range_end), self.read_rev())
        prev = []
        for i, (key, e, sid) in enumerate(items, 1):
            state = self.store.states[sid]
            if req.prev_kv:
                prev.append(state.get_row(e))
            self._tombstone(sid, state, key)
            if not i % STEP_KEYS:
                yield
        return DeleteResult(rev if self.sub else rev - 1, len(items), prev)

    def delete_key(self, key: bytes) -> int:
        """``delete`` of one key, without prev_kv and without a range scan (a revoked lease's
        keys, thousands at a time); counted as such a delete is. The number deleted, 0 or 1."""
        self.store.counts.deletes += 1
        self.ops += 1
        sid = self.store.router.shard_for_key(key)
        state = self.store.states[sid]
        if state.entry_at(key, self.read_rev()) is None:
            return 0
        self._tombstone(sid, state, key)
        return 1

    def _tombstone(self, sid: int, state: ShardState, key: bytes) -> None:
        """Delete ``key``, live in shard ``sid``'s ``state``: its tombstone, lease and change."""
        row = tombstone_row(key)  # etcd's tombstone row: the key alone
        state.delete(key, self.rev, self.sub, row)
        self.store.leases.detach(key)
        self._record(sid, Change(DELETE, self.sub, key, row))

    def _record(self, sid: int, change: Change) -> None:
        part = self.parts.get(sid)
        if part is None:
            self.parts[sid] = [change]
        else:
            part.append(change)
        self.sub += 1

    # -- txn ------------------------------------------------------------

    def txn(self, req: TxnReq) -> TxnResult:
        return drain(self.txn_steps(req))

    def txn_steps(self, req: TxnReq) -> Steps[TxnResult]:
        """Evaluate compares, check the chosen path, then apply it. A Txn that can write
        applies in a metrics transaction of its own, as etcd's does (counts.py)."""
        path = yield from self._path(req)
        writes = is_write(req)
        self._check(req, path, writes)
        if writes:
            self.end_metrics_txn()
        result = yield from self._apply(req, iter(path))
        result.revision = self.rev if self.sub else self.rev - 1
        return result

    def txn_now(self, req: TxnReq, writes: bool) -> TxnResult:
        """``txn_steps`` at once, for a txn that cannot take long (``single_key_writes``, which
        gives ``writes``): the same checks, counts and result without the steps' generators."""
        store = self.store
        ok = True
        for c in req.compare:
            store.counts.ranges += 1  # etcd reads each compare's key
            self.ops += 1
            if not self._compare_key(c):
                ok = False
                break
        ops = req.success if ok else req.failure
        if writes:
            for op in ops:
                if type(op) is PutReq:
                    self._check_put_in_txn(op)
        for op in ops:
            if type(op) is RangeReq and op.revision:
                self._check_range_op(op)
        if writes:
            self.end_metrics_txn()
        responses = []
        for op in ops:
            kind = type(op)
            if kind is PutReq:
                responses.append(self.put(op))
            elif kind is RangeReq:
                store.counts.ranges += 1
                self.ops += 1
                responses.append(range_key(store, op, self.read_rev()))
            elif kind is DeleteReq:
                responses.append(drain(self.delete_steps(op)))
            else:
                responses.append(None)
        return TxnResult(self.rev if self.sub else self.rev - 1, ok, responses)

    def _path(self, req: TxnReq) -> Steps[list[bool]]:
        ok = True
        for c in req.compare:
            if not (yield from self._compare(c)):
                ok = False
                break
        path = [ok]
        for op in req.success if ok else req.failure:
            if isinstance(op, TxnReq):
                path.extend((yield from self._path(op)))
        return path

    def _check(self, req: TxnReq, path: list[bool], writes: bool) -> None:
        """etcd's checkRequests: puts on the chosen path first (write txns only), then ranges."""
        if writes:
            self._walk(req, iter(path), self._check_put_op)
        self._walk(req, iter(path), self._check_range_op)

    def _walk(self, req: TxnReq, path, check) -> None:
        for op in req.success if next(path) else req.failure:
            if isinstance(op, TxnReq):
                self._walk(op, path, check)
            else:
                check(op)

    def _check_put_op(self, op) -> None:
        if isinstance(op, PutReq):
            self._check_put_in_txn(op)

    def _check_range_op(self, op) -> None:
        if isinstance(op, RangeReq) and op.revision:
            if op.revision > self.rev - 1:
                raise FutureRevisionError
            if op.revision < self.compacted:
                raise CompactedError

    def _apply(self, req: TxnReq, path) -> Steps[TxnResult]:
        ok = next(path)
        responses = []
        for op in req.success if ok else req.failure:
            if isinstance(op, RangeReq):
                self.store.counts.ranges += 1
                self.ops += 1
                responses.append((yield from range_steps(self.store, op, self.read_rev(), self.compacted)))
            elif isinstance(op, PutReq):
                responses.append(self.put(op))
            elif isinstance(op, DeleteReq):
                responses.append((yield from self.delete_steps(op)))
            elif isinstance(op, TxnReq):
                nested = yield from self._apply(op, path)
                nested.revision = 0
                responses.append(nested)
            else:
                responses.append(None)
        return TxnResult(0, ok, responses)

    def _compare_key(self, c: Compare, rev: int = 0) -> bool:
        """A compare on one key (kube-apiserver's every txn); before the txn changes anything. At
        the latest revision, or at ``rev`` (a txn in steps: writes may have come between them, for
        one that only reads)."""
        store = self.store
        state = store.states[store.router.shard_for_key(c.key)]
        e = state.entry_at(c.key, rev) if rev else state.latest_entry(c.key)
        if e is None:
            return c.target != CMP_VALUE and _compare_kv(c, _EMPTY_KV)
        row = state.get_row(e)
        kv = KeyValue.FromString(row)
        self._compared = (c.key, e, row, kv)
        return _compare_kv(c, kv)

    def _compare(self, c: Compare) -> Steps[bool]:
        store = self.store
        store.counts.ranges += 1  # etcd reads each compare's key or range
        self.ops += 1
        if not c.range_end:
            return self._compare_key(c, self.rev - 1)
        items = scan_shards(store, c.key, normalize_end(c.range_end), self.rev - 1)
        states = store.states
        n = 0
        for n, (_, e, sid) in enumerate(items, 1):
            if c.target == CMP_MOD:  # the mod revision is the entry's own revision
                holds = _holds(c, entry_main(e), c.number)
            else:
                holds = _compare_kv(c, KeyValue.FromString(states[sid].get_row(e)))
            if not holds:
                return False
            if not n % STEP_KEYS:
                yield
        if not n:
            return c.target != CMP_VALUE and _compare_kv(c, _EMPTY_KV)
        return True


def _compare_kv(c: Compare, kv: KeyValue) -> bool:
    t = c.target
    if t == CMP_VALUE:
        return _holds(c, kv.value, c.value)
    if t == CMP_MOD:
        return _holds(c, kv.mod_revision, c.number)
    if t == CMP_VERSION:
        return _holds(c, kv.version, c.number)
    if t == CMP_CREATE:
        return _holds(c, kv.create_revision, c.number)
    if t == CMP_LEASE:
        return _holds(c, kv.lease, c.number)
    return _holds(c, 0, 0)


def _holds(c: Compare, a, b) -> bool:
    r = c.result
    if r == RESULT_EQUAL:
        return a == b
    if r == RESULT_NOT_EQUAL:
        return a != b
    if r == RESULT_GREATER:
        return a > b
    if r == RESULT_LESS:
        return a < b
    return True


def single_key_writes(req: TxnReq) -> bool | None:
    """For a txn without nested txns whose every compare, range and delete names one key (its work
    bounded by its number of operations: ``WriteTxn.txn_now``), whether it writes (``is_write``);
    None for any other txn."""
    for c in req.compare:
        if c.range_end:
            return None
    writes = False
    for op in (*req.success, *req.failure):
        kind = type(op)
        if kind is PutReq:
            writes = True
        elif kind is RangeReq:
            if op.range_end:
                return None
        elif kind is DeleteReq:
            if op.range_end:
                return None
            writes = True
        elif kind is TxnReq:
            return None
        else:
            writes = True
    return writes


def is_write(req: TxnReq) -> bool:
    """etcd's !isTxnReadonly: anything but a Range on either branch -- a nested txn too, even one
    that only reads (etcd 3.5 applies such a txn as a write: its metrics count it so)."""
    return not all(isinstance(op, RangeReq) for op in (*req.success, *req.failure))
