"""--auto-compaction-mode periodic --auto-compaction-retention 2s, against etcd 3.5.1
and shardetcd side by side: while a writer puts every 50 ms, each server compacts
on its own, never newer than the retention window, and a read below the
compacted revision gets etcd's error."""
from __future__ import annotations

import bisect
import threading
import time

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.shardetcd_fixture import etcd_beside_shardetcd

FLAGS = ("--auto-compaction-mode", "periodic", "--auto-compaction-retention", "2s")


@pytest.fixture
def servers(tmp_path):
    with etcd_beside_shardetcd(tmp_path, FLAGS, FLAGS) as endpoints:
        yield endpoints


def compacted_revision(kv, key: bytes, top: int) -> int:
    """The lowest revision a read at that revision still answers (etcd allows reading at the compacted one)."""
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            kv.Range(pb.RangeRequest(key=key, revision=mid), timeout=10)
            hi = mid
        except grpc.RpcError as exc:
            assert (exc.code(), exc.details()) == (grpc.StatusCode.OUT_OF_RANGE,
                                                   "etcdserver: mvcc: required revision has been compacted")
            lo = mid + 1
    return lo


def write_for(endpoint: str, seconds: float, out: dict) -> None:
    times, revs = [], []
    with grpc.insecure_channel(endpoint) as ch:
        kv = pbg.KVStub(ch)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r = kv.Put(pb.PutRequest(key=b"/auto/k", value=b"v"), timeout=10)
            times.append(time.monotonic())
            revs.append(r.header.revision)
            time.sleep(0.05)
        out.update(times=times, revs=revs, compacted=compacted_revision(kv, b"/auto/k", revs[-1]), end=time.monotonic())


def test_periodic_auto_compaction_as_etcd(servers):
    results = {name: {} for name in servers}
    threads = [threading.Thread(target=write_for, args=(ep, 7.0, results[name])) for name, ep in servers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, r in results.items():
        times, revs, c = r["times"], r["revs"], r["compacted"]

        def rev_at(t: float) -> int:  # the last revision written at or before t
            i = bisect.bisect_right(times, t)
            return revs[i - 1] if i else 1

        # something recent was compacted (the compactor runs every 2 s), nothing inside the 2 s window was
        assert c >= rev_at(r["end"] - 5.0), (name, c)
        assert c <= rev_at(r["end"] - 1.8), (name, c)
