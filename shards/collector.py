"""The cyclic garbage collector's policy while a store is open: what survives a full
collection is frozen, and a recovery runs with the collector paused.

CPython's collector runs a *full* collection (one that walks every object it tracks,
with the event loop stopped meanwhile) whenever the objects that survived into its
oldest generation since the last one exceed a quarter of those that survived the
last one. A store holds a few very large containers (the key index, the sorted key
lists, the change log) whose every element such a collection visits: at 1M keys one
took 0.4–0.7 s, every request and watch on the server waiting (bench/README.md,
"Garbage collection pauses").

So while a store is open, whatever a full collection leaves alive is frozen
(``gc.freeze``: out of the collector's sight), and the server runs one full
collection as soon as its store is open (``freeze_now``), while those containers
are small or, after a large recovery, already frozen: later full collections walk
only what became long-lived since, the large containers are not walked again, and
the quarter rule, which counts the survivors of the last full collection, keeps full
collections as rare as they were. Frozen objects are still freed by reference
counting when dropped; what the collector can no longer reclaim is a reference cycle
that was alive at a freeze and became garbage later. The store's containers are not
such cycles, and request-scoped ones break their cycles as they end (a 4-minute churn
of connections, watch and keep-alive streams, errors and deadlines left the frozen
count flat). When the last store of the process closes, everything is thawed.
"""
from __future__ import annotations

import bisect
import gc
from contextlib import contextmanager
from time import perf_counter

FREEZE_AFTER = 100_000  # objects a recovery made (net) that are worth a freeze
PAUSE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_stores = 0  # stores open in this process (tests open several)


class Pauses:
    """How long each collection took, per generation, while a store was open (what
    /metrics shows as shardetcd_gc_pause_seconds): counts per PAUSE_BUCKETS_S bucket
    (the last one: above them all) and the sum."""

    counts = [[0] * (len(PAUSE_BUCKETS_S) + 1) for _ in range(3)]
    sums = [0.0, 0.0, 0.0]
    started = 0.0


def _on_collection(phase: str, info: dict) -> None:
    """Each collection timed; the survivors of a full one frozen."""
    if phase == "start":
        Pauses.started = perf_counter()
        return
    took = perf_counter() - Pauses.started
    generation = info["generation"]
    Pauses.counts[generation][bisect.bisect_left(PAUSE_BUCKETS_S, took)] += 1
    Pauses.sums[generation] += took
    if generation == 2:
        gc.freeze()


def store_opened() -> None:
    global _stores
    if not _stores:
        gc.callbacks.append(_on_collection)
    _stores += 1


def store_closed() -> None:
    """A store closed; after the last one the collector may walk everything again."""
    global _stores
    _stores -= 1
    if not _stores:
        gc.callbacks.remove(_on_collection)
        gc.unfreeze()


def freeze_now() -> None:
    """A full collection now, and what survives it frozen (a server's store has just opened)."""
    gc.collect()
    gc.freeze()


@contextmanager
def paused():
    """Recovery allocates objects that all live on (the index's tuples and lists, the
    lease table's entries): the collector, left on, walks them again and again as they
    pile up (at 1M keys: ~1 s of CPU).  It is paused meanwhile.  At the end of a large
    recovery, everything alive is frozen rather than walked once more by a full
    collection (~0.4 s at 1M keys).  A small recovery leaves the few objects it made to
    the running collector; a failed one freezes nothing."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    except BaseException:
        gc.enable()
        raise
    gc.enable()
    if gc.get_count()[0] > FREEZE_AFTER:  # objects made (net) since the collector last ran
        gc.freeze()
