"""A Prometheus histogram observed from the event loop's thread, and Go's way of writing bounds."""
from __future__ import annotations

import bisect
import contextlib
import time

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    """A Prometheus histogram observed from the event loop's thread only.

    prometheus_client's Histogram takes a lock for its sum and for the bucket
    it counts (~1.9 µs an observation on this machine); three of them run per
    journal batch, which is one per write for a lone client. Here an
    observation is a bisect and two additions (~0.4 µs); the cumulative
    buckets are built when scraped. The exposition is the same
    (``_bucket{le=...}``, ``_count``, ``_sum``)."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...], labelnames: tuple[str, ...] = (),
                 bound_text=floatToGoString) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.bounds = tuple(sorted(buckets))
        self.bound_text = bound_text  # how a bucket's bound is written (go_float: as etcd writes integral ones)
        self._children: dict[tuple[str, ...], _LoopHistogramChild] = {}
        if not self.labelnames:
            self._unlabelled = self.labels()
            self.observe = self._unlabelled.observe

    def labels(self, *values: str) -> _LoopHistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _LoopHistogramChild(self.bounds)
        return child

    def collect(self):
        yield self.family(self.name, self.doc)

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        """The observations so far, as a histogram family of that name."""
        family = HistogramMetricFamily(name, doc, labels=self.labelnames)
        for values, child in list(self._children.items()):
            # a consistent enough copy: observers run on the loop
            family.add_metric(list(values), cumulative(self.bounds, list(child.counts), self.bound_text), child.sum)
        return family


def exponential(start: float, count: int, factor: float = 2) -> tuple[float, ...]:
    """Go's prometheus.ExponentialBuckets(start, factor, count)."""
    return tuple(start * factor**i for i in range(count))


@contextlib.contextmanager
def timed(histogram: LoopHistogram):
    """Observe how long the block took, if it ends without an exception."""
    start = time.perf_counter()
    yield
    histogram.observe(time.perf_counter() - start)


def go_float(bound: float) -> str:
    """A bucket bound as Go's client writes it ('g', shortest): 1 and 10, not prometheus_client's 1.0
    and 10.0 (for a family etcd shows with integral bounds, whose series must be the same)."""
    text = floatToGoString(bound)
    return text[:-2] if text.endswith(".0") else text


def cumulative(bounds: tuple[float, ...], counts: list[int], bound_text=floatToGoString) -> list[tuple[str, int]]:
    """A histogram's buckets as Prometheus shows them, from counts per bucket (the last: +Inf)."""
    total, buckets = 0, []
    for le, n in zip([*(bound_text(b) for b in bounds), "+Inf"], counts):
        total += n
        buckets.append((le, total))
    return buckets


class _LoopHistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
