"""The loop's lock-free histogram exposes exactly what prometheus_client's Histogram does."""
from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from shim.metrics import BATCH_BYTES_BUCKETS, FSYNC_BUCKETS_S, LoopHistogram


def _exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize("buckets,labelnames", [(FSYNC_BUCKETS_S, ()), (BATCH_BYTES_BUCKETS, ("shard",))])
def test_same_exposition_as_prometheus_client(buckets, labelnames):
    rng = random.Random(7)
    ours_reg, theirs_reg = CollectorRegistry(), CollectorRegistry()
    ours = LoopHistogram("h_seconds", "doc", buckets, labelnames)
    ours_reg.register(ours)
    theirs = Histogram("h_seconds", "doc", labelnames, buckets=buckets, registry=theirs_reg)
    top = buckets[-1] * 2
    values = [rng.choice(buckets) for _ in range(50)] + [rng.uniform(0, top) for _ in range(500)] + [0.0, top * 10]
    for i, v in enumerate(values):
        names = (f"s{i % 3}",) if labelnames else ()
        (ours.labels(*names) if names else ours).observe(v)
        (theirs.labels(*names) if names else theirs).observe(v)
    got, want = _exposition(ours_reg), _exposition(theirs_reg)
    assert any("_bucket" in line and 'le="+Inf"' in line for line in got)
    assert got == want


def test_wrong_label_count_is_refused():
    h = LoopHistogram("h", "doc", (1.0,), ("shard",))
    with pytest.raises(ValueError):
        h.labels()
