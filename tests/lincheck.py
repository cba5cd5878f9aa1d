"""A linearizability checker (Wing & Gong's search with Lowe's memoization,
as in porcupine) for a key-value register model.

An operation is (call time, return time, input, output).  An operation whose
outcome is unknown (the server died while it was in flight) returns at +inf
with output None: it may take effect at any point after its call, or never.
Linearizability is compositional, so histories are checked one key at a time.

A failing history is saved with ``save`` (JSON, one object per operation) and
checked again with ``python -m tests.lincheck FILE...``.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

UNKNOWN = None


@dataclass(frozen=True)
class Op:
    client: int
    call: float
    ret: float  # math.inf when the outcome is unknown
    kind: str  # "get", "put", "delete", "cas"
    arg: Any = None  # put: value; cas: (expected or None, new)
    out: Any = UNKNOWN  # get: value or None (absent); cas: bool; put/delete: True


def step(state, op: Op):
    """(ok, next state) of the register model; an unknown output matches anything."""
    if op.kind == "get":
        return (op.out is UNKNOWN or op.out == state), state
    if op.kind == "put":
        return True, op.arg
    if op.kind == "delete":
        return True, None
    expected, new = op.arg
    hit = state == expected
    if op.out is not UNKNOWN and op.out != hit:
        return False, state
    return True, (new if hit else state)


class _Entry:
    __slots__ = ("op_id", "is_call", "time", "match", "prev", "next")

    def __init__(self, op_id: int, is_call: bool, time: float) -> None:
        self.op_id, self.is_call, self.time = op_id, is_call, time
        self.match = self.prev = self.next = None


def _build(ops: list[Op]) -> _Entry:
    events = []
    for i, op in enumerate(ops):
        call, ret = _Entry(i, True, op.call), _Entry(i, False, op.ret)
        call.match = ret
        events += [call, ret]
    # at equal times returns go first: an op that returned at t precedes one called at t
    events.sort(key=lambda e: (e.time, e.is_call))
    head = _Entry(-1, False, -math.inf)
    prev = head
    for e in events:
        prev.next, e.prev = e, prev
        prev = e
    return head


def _lift(e: _Entry) -> None:
    e.prev.next = e.next
    if e.next:
        e.next.prev = e.prev
    m = e.match
    m.prev.next = m.next
    if m.next:
        m.next.prev = m.prev


def _unlift(e: _Entry) -> None:
    m = e.match
    m.prev.next = m
    if m.next:
        m.next.prev = m
    e.prev.next = e
    if e.next:
        e.next.prev = e


def linearizable(ops: list[Op], init=None) -> bool:
    head = _build(ops)
    state, linearized = init, 0
    cache: set[tuple[int, Any]] = set()
    calls: list[tuple[_Entry, Any]] = []
    entry = head.next
    while head.next is not None:
        if entry is None:  # only unknown returns remain, all at +inf: they may never have happened
            return True
        if entry.is_call:
            ok, nxt = step(state, ops[entry.op_id])
            bits = linearized | (1 << entry.op_id)
            if ok and (bits, nxt) not in cache:
                cache.add((bits, nxt))
                calls.append((entry, state))
                state, linearized = nxt, bits
                _lift(entry)
                entry = head.next
                continue
            entry = entry.next
        elif math.isinf(entry.time):
            return True  # every remaining op is pending forever: drop them
        else:
            if not calls:
                return False
            entry, state = calls.pop()
            linearized &= ~(1 << entry.op_id)
            _unlift(entry)
            entry = entry.next
    return True


def save(ops: list[Op], path: Path) -> None:
    """Write a history as JSON (an unknown return time as null)."""
    rows = [asdict(op) | {"ret": None if math.isinf(op.ret) else op.ret} for op in ops]
    path.write_text(json.dumps(rows, indent=0))


def load(path: Path) -> list[Op]:
    ops = []
    for row in json.loads(Path(path).read_text()):
        arg = tuple(row["arg"]) if row["kind"] == "cas" else row["arg"]
        ops.append(Op(row["client"], row["call"], math.inf if row["ret"] is None else row["ret"],
                      row["kind"], arg, row["out"]))
    return ops


def main(argv: list[str]) -> int:
    """Replay saved histories: exit 1 if any is not linearizable."""
    bad = 0
    for name in argv:
        ops = load(Path(name))
        ok = linearizable(ops)
        bad += not ok
        print(f"{name}: {len(ops)} operations, {'linearizable' if ok else 'NOT linearizable'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
