"""shardetcd with its per-request stages timed exactly (run by ``python -m bench.stages``).

    SHARDETCD_STAGES_OUT=/tmp/stages.json python -m bench.stages_server --data-dir ... (shardetcd's flags)

Serves exactly as ``shardetcd`` does, on the same default loop (uvloop), with the
functions a Put, a Txn and a Range pass through wrapped in a timer of the event
loop thread's own CPU clock (``time.thread_time_ns``). Timers nest: each stage
reports its *self* time (its own CPU less that of the stages it called), so the
stages add up to the instrumented part of the loop thread's CPU, and the bench
gives the rest of that thread's CPU (grpc.aio's Cython/C work, the event loop) as
"outside". A coroutine is timed over every step it runs, not while it waits. The
garbage collector's runs are a stage of their own (``gc.callbacks``). SIGUSR2
writes ``{stage: [self ns, calls]}`` since the last SIGUSR2 to
$SHARDETCD_STAGES_OUT and starts counting again.

A sampling profiler cannot make this split on uvloop (grpc's callbacks sit
under the handler's frame there, see bench/profile.py); timers can, at a cost
of about a microsecond per stage, which the bench reports by also running the
same load uninstrumented.
"""
from __future__ import annotations

import functools
import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from time import thread_time_ns

STAGES: dict[str, list[int]] = {}  # stage -> [self ns, calls]
GC_STAGE = "gc"
_stack: list[list] = []  # [stage, started ns, ns spent in nested stages]
_LOOP_THREAD = threading.get_ident()  # the server's event loop runs in the main thread


def _enter(stage: str) -> None:
    _stack.append([stage, thread_time_ns(), 0])


def _leave() -> None:
    stage, started, nested = _stack.pop()
    spent = thread_time_ns() - started
    acc = STAGES.get(stage)
    if acc is None:
        acc = STAGES[stage] = [0, 0]
    acc[0] += spent - nested
    acc[1] += 1
    if _stack:
        _stack[-1][2] += spent


def timed(owner, name: str, stage: str) -> None:
    """Wrap the plain function ``owner.name`` (a module's or a class's)."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        _enter(stage)
        try:
            return fn(*args, **kwargs)
        finally:
            _leave()

    setattr(owner, name, functools.update_wrapper(wrapper, fn))


class _Steps:
    """Awaiting a coroutine through this times each of its steps as ``stage``; the
    time it waits is not counted. Counted as one call when it ends."""

    __slots__ = ("coro", "stage")

    def __init__(self, coro, stage: str) -> None:
        self.coro, self.stage = coro, stage

    def __await__(self):
        coro, value, exc, calls = self.coro, None, None, 0
        while True:
            _enter(self.stage)
            try:
                step = coro.throw(exc) if exc is not None else coro.send(value)
            except StopIteration as stop:
                _leave()
                STAGES[self.stage][1] += calls  # one call per request, not per step
                return stop.value
            except BaseException:
                _leave()
                STAGES[self.stage][1] += calls
                raise
            _leave()
            calls -= 1  # every step counted one; the last one stands for the call
            try:
                value, exc = (yield step), None
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine, as await does
                value, exc = None, e


def timed_async(owner, name: str, stage: str) -> None:
    fn: Callable = getattr(owner, name)

    async def wrapper(*args, **kwargs):
        return await _Steps(fn(*args, **kwargs), stage)

    # its marks too (shim.handlers.eager, batched), so the staged server serves as shipped
    setattr(owner, name, functools.update_wrapper(wrapper, fn))


def _gc(phase: str, info: dict) -> None:
    if threading.get_ident() != _LOOP_THREAD:  # a collection another thread (the journal's writer) set off
        return
    if phase == "start":
        _enter(GC_STAGE)
    elif _stack and _stack[-1][0] == GC_STAGE:
        _leave()


# (module, attribute path, stage, coroutine?) in the order a request meets them; stages
# named alike add up (one response encoder per method, say)
SPECS: tuple[tuple[str, str, str, bool], ...] = (
    ("shim.kv", "KVService.Put", "handler: Put", True),
    ("shim.kv", "KVService.Txn", "handler: Txn", True),
    ("shim.kv", "KVService.Range", "handler: Range", True),
    ("shim.kv", "KVService.put_batch", "handler: Put", True),  # the native server's batches of calls
    ("shim.kv", "KVService.txn_batch", "handler: Txn", True),
    ("shim.txn", "check_txn", "check + convert a Txn", False),
    ("shim.validate", "checked_put", "check + convert a Put", False),
    ("shim.validate", "check_size", "request size (ByteSize)", False),
    ("shim.quota", "Quota.check", "quota", False),
    ("shim.convert", "range_req", "convert a Range", False),
    ("shards.store", "Store.put", "store: write (revision, steps, bookkeeping)", True),
    ("shards.store", "Store.txn", "store: write (revision, steps, bookkeeping)", True),
    ("shards.store", "Store.put_many", "store: write (revision, steps, bookkeeping)", True),
    ("shards.store", "Store.txn_many", "store: write (revision, steps, bookkeeping)", True),
    ("shards.write", "WriteTxn.put", "store: MVCC row + key index (WriteTxn.put)", False),
    ("shards.store", "Store._append", "store: journal record + pending revision", False),
    ("shards.store", "Store.wait_committed", "store: wait for the commit (register)", False),
    ("shards.store", "Store.range_async", "store: read", True),
    ("shim.wire", "put_response", "encode the response", False),
    ("shim.wire", "txn_response", "encode the response", False),
    ("shim.wire", "range_response", "encode the response", False),
    ("journal.journal", "Journal._write_inline", "journal: lone batch written + fdatasync on the loop", False),
    ("journal.journal", "Journal._batch_written", "journal: batch acknowledged (commit, release waiters)", False),
)


def stage_names() -> list[str]:
    """Every stage, in the order a request meets them (the tables' row order)."""
    return list(dict.fromkeys([spec[2] for spec in SPECS] + [GC_STAGE]))


def install() -> None:
    import importlib

    wrapped = []
    for module, path, stage, is_coroutine in SPECS:
        owner = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        (timed_async if is_coroutine else timed)(owner, name, stage)
        wrapped.append((owner, getattr(owner, name)))
    for owner, wrapper in wrapped:  # once all are wrapped: a batched method's batch (handlers.batched), timed
        if (batch := getattr(wrapper, "batch", None)) is not None:
            wrapper.batch = getattr(owner, batch.__name__)
    gc.callbacks.append(_gc)


def _dump(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(STAGES, f)
    os.replace(path + ".tmp", path)
    STAGES.clear()


def main() -> int:
    out = os.environ["SHARDETCD_STAGES_OUT"]
    install()
    signal.signal(signal.SIGUSR2, lambda *_: _dump(out))
    from shim.cli import main as serve
    return serve(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
