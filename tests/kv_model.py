"""A pure model of etcd 3.5's KV (mvcc store + v3 apply layer), for tests.

The model keeps the whole key space at every revision since it began, so it
can answer a read at any live revision, and every revision's events, so it
can replay a watch from any revision.  It imports no server code: it is what
servers are checked against.  Leases are not modelled (every lease is 0),
nor are nested txns.

    m = KVModel()                                  # revision 1, empty, nothing compacted
    m.put(PutOp(b"a", b"1"))                       # PutResult(revision=2, prev_kv=None)
    m.range(RangeOp(b"a")).kvs                     # (KV(b"a", b"1", 2, 2, 1),)
    m.txn(TxnOp((Cmp(b"a", VERSION, EQUAL, 1),), success=(DeleteOp(b"a"),)))   # revision 3
    m.range(RangeOp(b"a", revision=2)).kvs         # still (KV(b"a", b"1", 2, 2, 1),)
    m.compact(3)                                   # reads below 3 now raise Compacted

Requests and results use the field names of etcd's protobuf messages, so a
test converts them field by field.  Where etcd's behaviour is surprising, the
etcd 3.5 function that does it is named in a comment.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Union

# mvccpb.Event.EventType
PUT, DELETE = 0, 1
# RangeRequest.SortOrder / SortTarget
NONE, ASCEND, DESCEND = 0, 1, 2
KEY, VERSION_TARGET, CREATE_TARGET, MOD_TARGET, VALUE_TARGET = 0, 1, 2, 3, 4
# Compare.CompareTarget / CompareResult
VERSION, CREATE, MOD, VALUE = 0, 1, 2, 3
EQUAL, GREATER, LESS, NOT_EQUAL = 0, 1, 2, 3

_SORT_FIELD = {VERSION_TARGET: "version", CREATE_TARGET: "create_revision", MOD_TARGET: "mod_revision",
               VALUE_TARGET: "value", KEY: "key"}
_CMP_FIELD = {VERSION: "version", CREATE: "create_revision", MOD: "mod_revision", VALUE: "value"}


class ModelError(Exception):
    """An outcome etcd reports as an error; ``message`` is etcd's text."""

    message = ""


class Compacted(ModelError):
    message = "etcdserver: mvcc: required revision has been compacted"


class FutureRevision(ModelError):
    message = "etcdserver: mvcc: required revision is a future revision"


class DuplicateKey(ModelError):
    message = "etcdserver: duplicate key given in txn request"


# -- requests -----------------------------------------------------------


@dataclass(frozen=True)
class KV:
    key: bytes
    value: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0


@dataclass(frozen=True)
class Event:
    type: int  # PUT or DELETE
    kv: KV  # a DELETE's kv is the key and the deleting revision only
    prev_kv: KV | None = None


@dataclass(frozen=True)
class RangeOp:
    key: bytes
    range_end: bytes = b""
    limit: int = 0
    revision: int = 0
    sort_order: int = NONE
    sort_target: int = KEY
    keys_only: bool = False
    count_only: bool = False
    min_mod_revision: int = 0
    max_mod_revision: int = 0
    min_create_revision: int = 0
    max_create_revision: int = 0


@dataclass(frozen=True)
class PutOp:
    key: bytes
    value: bytes = b""
    prev_kv: bool = False


@dataclass(frozen=True)
class DeleteOp:
    key: bytes
    range_end: bytes = b""
    prev_kv: bool = False


@dataclass(frozen=True)
class Cmp:
    key: bytes
    target: int
    result: int
    operand: bytes | int  # bytes for VALUE, a number otherwise
    range_end: bytes = b""


Op = Union[RangeOp, PutOp, DeleteOp]


@dataclass(frozen=True)
class TxnOp:
    compare: tuple[Cmp, ...] = ()
    success: tuple[Op, ...] = ()
    failure: tuple[Op, ...] = ()


# -- results ------------------------------------------------------------


@dataclass(frozen=True)
class RangeResult:
    revision: int  # header revision
    kvs: tuple[KV, ...]
    more: bool
    count: int
    # every key that passed the filters, sorted, before the limit and before
    # keys_only: what a test needs to accept etcd's unspecified order of ties
    pool: tuple[KV, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class PutResult:
    revision: int
    prev_kv: KV | None


@dataclass(frozen=True)
class DeleteResult:
    revision: int
    deleted: int
    prev_kvs: tuple[KV, ...]  # empty unless prev_kv was asked for


@dataclass(frozen=True)
class TxnResult:
    revision: int
    succeeded: bool
    responses: tuple[RangeResult | PutResult | DeleteResult, ...]


def kept_by_compaction(events: Iterable) -> list:
    """Of the events of the compacted revision itself, what etcd's compaction keeps: each key's
    last event there, and only if it is a put (keyIndex.compact keeps a key's newest revision at
    or below the compaction, and not even that if it is a tombstone), so a key a txn put and then
    deleted leaves nothing. ``events``: this model's or etcd's (kv_pb2.Event), both with ``.type``
    (PUT 0) and ``.kv.key``."""
    events = list(events)
    last = {ev.kv.key: ev for ev in events}
    return [ev for ev in events if ev.type == PUT and last[ev.kv.key] is ev]


# -- key ranges ---------------------------------------------------------


def in_range(key: bytes, lo: bytes, end: bytes) -> bool:
    """etcd's [lo, end): end b"" = the key lo alone, end b"\\0" = every key >= lo."""
    if end == b"":
        return key == lo
    if end == b"\x00":
        return key >= lo
    return lo <= key < end


def check_intervals(ops: Iterable[Op]) -> None:
    """etcd's checkIntervals (flat txns): a key is put at most once per branch
    and never inside a delete range of the same branch.

    The ranges are taken literally, as etcd's interval tree does: a delete
    with range_end b"\\0" is the interval [key, "\\0"), which holds no key, so
    "delete everything, then put k" is a valid txn."""
    ops = list(ops)
    dels = [(o.key, o.range_end or o.key + b"\x00") for o in ops if isinstance(o, DeleteOp)]
    puts: set[bytes] = set()
    for o in ops:
        if not isinstance(o, PutOp):
            continue
        point_end = o.key + b"\x00"
        if o.key in puts or any(lo < point_end and o.key < end for lo, end in dels):
            raise DuplicateKey
        puts.add(o.key)


def compare(state: Mapping[bytes, KV], c: Cmp) -> bool:
    """etcd's applyCompare: every key in the range must satisfy it; an empty
    range compares a zero KeyValue, except VALUE, which always fails."""
    if c.range_end:
        kvs = [kv for k, kv in state.items() if in_range(k, c.key, c.range_end)]
    else:
        kvs = [state[c.key]] if c.key in state else []
    if not kvs:
        return c.target != VALUE and _compare_kv(KV(c.key), c)
    return all(_compare_kv(kv, c) for kv in kvs)


def _compare_kv(kv: KV, c: Cmp) -> bool:
    a, b = getattr(kv, _CMP_FIELD[c.target]), c.operand
    return {EQUAL: a == b, NOT_EQUAL: a != b, GREATER: a > b, LESS: a < b}[c.result]


def sort_field(target: int) -> str:
    return _SORT_FIELD[target]


def select(state: Mapping[bytes, KV], op: RangeOp, header_revision: int) -> RangeResult:
    """etcd's Range over one revision's key space (apply.go Range): count all
    keys in range, then filter, sort, limit, strip values.

    Only a requested sort order or a revision filter makes etcd read every
    key before it sorts and limits; otherwise it reads limit + 1 keys in key
    order, so a sort target without a sort order (which etcd then sorts
    ascending) sorts just those."""
    kvs = sorted((kv for k, kv in state.items() if in_range(k, op.key, op.range_end)), key=lambda kv: kv.key)
    count = len(kvs)
    if op.count_only:
        return RangeResult(header_revision, (), False, count)
    filtered = op.min_mod_revision or op.max_mod_revision or op.min_create_revision or op.max_create_revision
    if op.limit > 0 and op.sort_order == NONE and not filtered:
        kvs = kvs[: op.limit + 1]
    kvs = [kv for kv in kvs if _filters_pass(op, kv)]
    order = op.sort_order
    if op.sort_target != KEY and order == NONE:
        order = ASCEND
    if order != NONE:
        # etcd's order among equal sort targets is unspecified (Go's unstable
        # sort.Sort); this one is stable, and tests compare ties as sets
        target = _SORT_FIELD[op.sort_target]
        kvs.sort(key=lambda kv: getattr(kv, target), reverse=order == DESCEND)
    pool = tuple(kvs)
    more = 0 < op.limit < len(kvs)
    if more:
        kvs = kvs[: op.limit]
    if op.keys_only:
        kvs = [replace(kv, value=b"") for kv in kvs]
    return RangeResult(header_revision, tuple(kvs), more, count, pool)


def _filters_pass(op: RangeOp, kv: KV) -> bool:
    if op.max_mod_revision and kv.mod_revision > op.max_mod_revision:
        return False
    if op.min_mod_revision and kv.mod_revision < op.min_mod_revision:
        return False
    if op.max_create_revision and kv.create_revision > op.max_create_revision:
        return False
    return not (op.min_create_revision and kv.create_revision < op.min_create_revision)


# -- the store ----------------------------------------------------------


class Write:
    """The changes of one main revision, in order (etcd's storeTxnWrite):
    reads inside it see its own earlier changes."""

    def __init__(self, model: KVModel) -> None:
        self.model = model
        self.rev = model.rev + 1
        self.state = dict(model.state())
        self.events: list[Event] = []

    @property
    def read_rev(self) -> int:
        """etcd: the begin revision, +1 once the txn has changed something."""
        return self.rev if self.events else self.rev - 1

    def put(self, op: PutOp) -> PutResult:
        prev = self.state.get(op.key)
        kv = KV(op.key, op.value, prev.create_revision if prev else self.rev, self.rev, prev.version + 1 if prev else 1)
        self.state[op.key] = kv
        self.events.append(Event(PUT, kv))
        return PutResult(self.rev, prev if op.prev_kv else None)

    def delete(self, op: DeleteOp) -> DeleteResult:
        gone = sorted((kv for k, kv in self.state.items() if in_range(k, op.key, op.range_end)), key=lambda kv: kv.key)
        for kv in gone:
            del self.state[kv.key]
            self.events.append(Event(DELETE, KV(kv.key, mod_revision=self.rev)))
        return DeleteResult(self.read_rev, len(gone), tuple(gone) if op.prev_kv else ())

    def range(self, op: RangeOp) -> RangeResult:
        # a revision was checked by the caller (see KVModel.txn); <= 0 reads this txn's view
        state = self.state if op.revision <= 0 else self.model.state(op.revision)
        return select(state, op, self.read_rev)

    def apply(self, op: Op) -> RangeResult | PutResult | DeleteResult:
        if isinstance(op, PutOp):
            return self.put(op)
        if isinstance(op, DeleteOp):
            return self.delete(op)
        return self.range(op)


class KVModel:
    """etcd's KV from revision ``rev`` on: every revision's key space and events.

    ``compacted`` is etcd's compactMainRev (-1: never compacted); reads below
    it raise Compacted.  A model that begins at ``rev`` > 1 knows nothing
    before it: start it with ``compacted=rev`` (compact the server there)."""

    def __init__(self, rev: int = 1, state: Mapping[bytes, KV] | None = None, compacted: int = -1) -> None:
        self.rev = rev
        self.first = rev
        self.compacted = compacted
        self._states: dict[int, dict[bytes, KV]] = {rev: dict(state or {})}  # never mutated once stored
        self._events: dict[int, tuple[Event, ...]] = {}

    # -- reads -----------------------------------------------------------

    def state(self, rev: int = 0) -> Mapping[bytes, KV]:
        """The key space at ``rev`` (0: the latest)."""
        rev = rev or self.rev
        if not self.first <= rev <= self.rev:
            raise LookupError(f"the model knows revisions {self.first}..{self.rev}, not {rev}")
        return self._states[rev]  # every revision after the first changed something

    def resolve(self, rev: int) -> int:
        """etcd's rangeKeys: the revision a top-level read at ``rev`` sees."""
        if rev > self.rev:
            raise FutureRevision
        at = self.rev if rev <= 0 else rev
        if at < self.compacted:
            raise Compacted
        return at

    def range(self, op: RangeOp) -> RangeResult:
        """A top-level Range: its header always carries the latest revision."""
        return select(self.state(self.resolve(op.revision)), op, self.rev)

    @property
    def watchable_from(self) -> int:
        """The lowest start revision whose events the model knows."""
        return min(self._events, default=self.rev + 1)

    def events(self, start: int, key: bytes = b"\x00", range_end: bytes = b"\x00",
               prev_kv: bool = False) -> list[Event]:
        """The events a watch from ``start`` replays, in (revision, sub) order.

        A watch from the compacted revision itself sees, of that revision,
        only what compaction kept there (``kept_by_compaction``); the watch
        replays what is left in the backend.  (Before a compaction that was
        not asked to be physical has run, they are still there: a test
        should not look then.)

        prev_kv is what etcd's watch stream adds (v3rpc watch.go sendLoop):
        the key at mod_revision - 1, read through the store, so it is absent
        for creations (create == mod revision) and for events at the
        compacted revision (the read below it fails)."""
        if start < self.watchable_from:
            raise LookupError(f"the model knows events from revision {self.watchable_from}, not {start}")
        out = []
        for rev in range(start, self.rev + 1):
            events = self._events.get(rev, ())
            if rev == self.compacted:
                events = kept_by_compaction(events)
            for ev in events:
                if not in_range(ev.kv.key, key, range_end):
                    continue
                prev = None
                creation = ev.type == PUT and ev.kv.create_revision == ev.kv.mod_revision
                if prev_kv and not creation and rev - 1 >= self.compacted:
                    prev = self.state(rev - 1).get(ev.kv.key)
                out.append(Event(ev.type, ev.kv, prev))
        return out

    # -- writes ----------------------------------------------------------

    def commit(self, w: Write) -> None:
        """A write that changed nothing takes no revision (etcd)."""
        if w.events:
            self.rev = w.rev
            self._states[w.rev] = w.state
            self._events[w.rev] = tuple(w.events)

    def put(self, op: PutOp) -> PutResult:
        w = Write(self)
        result = w.put(op)
        self.commit(w)
        return result

    def delete(self, op: DeleteOp) -> DeleteResult:
        w = Write(self)
        result = w.delete(op)
        self.commit(w)
        return result

    def txn(self, op: TxnOp) -> TxnResult:
        """etcd's Txn: interval checks, then compares against the state before
        the txn, then range-revision checks on the chosen branch, then apply."""
        check_intervals(op.success)
        check_intervals(op.failure)
        succeeded = all(compare(self.state(), c) for c in op.compare)
        branch = op.success if succeeded else op.failure
        for o in branch:  # etcd's checkRequestRange: only an explicit (non-zero) revision
            if isinstance(o, RangeOp) and o.revision:
                if o.revision > self.rev:
                    raise FutureRevision
                if o.revision < self.compacted:  # a negative revision can land here
                    raise Compacted
        w = Write(self)
        responses = tuple(w.apply(o) for o in branch)
        self.commit(w)
        return TxnResult(w.read_rev, succeeded, responses)

    def compact(self, rev: int) -> None:
        """etcd's updateCompactRev; history below ``rev`` is forgotten."""
        if rev <= self.compacted:
            raise Compacted
        if rev > self.rev:
            raise FutureRevision
        self.compacted = rev
        if rev > self.first:
            keep = self.state(rev)
            self._states = {r: s for r, s in self._states.items() if r > rev}
            self._states[rev] = dict(keep)
            self.first = rev
        self._events = {r: e for r, e in self._events.items() if r >= rev}
