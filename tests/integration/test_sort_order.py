"""Sorted ranges with ties come back in etcd 3.5.1's order.

etcd sorts a Range by value, version, create or mod revision with Go's unstable
sort.Sort over the keys in key order (shards/gosort.py): keys whose targets tie come
back in an order that is neither key order nor its reverse, and depends on how many
keys there are (insertion sort, a Shell pass, quicksort with median-of-three or
ninther pivots). Random key sets of every size class, with few distinct values,
versions and (through multi-key txns) shared revisions, are sorted on both servers.
"""
from __future__ import annotations

import random

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

TARGETS = (pb.RangeRequest.VERSION, pb.RangeRequest.CREATE, pb.RangeRequest.MOD, pb.RangeRequest.VALUE)
ORDERS = (pb.RangeRequest.NONE, pb.RangeRequest.ASCEND, pb.RangeRequest.DESCEND)


def _fill(kv, r: random.Random, n: int) -> None:
    kv.DeleteRange(pb.DeleteRangeRequest(key=b"k", range_end=b"l"))
    keys = [b"k%04d" % i for i in r.sample(range(10 * n), n)]
    r.shuffle(keys)
    i = 0
    while i < len(keys):
        batch = keys[i:i + r.choice((1, 1, 2, 3))]  # some keys share a create/mod revision
        kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=r.choice((b"a", b"b", b"c"))))
                                      for k in batch]))
        i += len(batch)
    for k in r.sample(keys, n // 3):  # and some have later versions
        kv.Put(pb.PutRequest(key=k, value=r.choice((b"a", b"b"))))


@pytest.mark.parametrize("seed", [1, 2])
def test_sorted_ranges_order_ties_as_etcd(real_etcd, shardetcd, seed):
    r = random.Random(seed)
    sizes = [1, 2, 5, 7, 9, 12, 13, 17, 25, 40, 41, 57, 90, 160]
    with grpc.insecure_channel(real_etcd.endpoint) as ech, grpc.insecure_channel(shardetcd.endpoint) as sch:
        stubs = (pbg.KVStub(ech), pbg.KVStub(sch))
        for n in sizes:
            state = r.getstate()
            for kv in stubs:  # the same writes on both
                r.setstate(state)
                _fill(kv, r, n)
            for target in TARGETS:
                for order in ORDERS:
                    req = pb.RangeRequest(key=b"k", range_end=b"l", sort_target=target, sort_order=order,
                                          limit=r.choice((0, 0, max(1, n // 2))))
                    theirs, ours = (kv.Range(req) for kv in stubs)
                    assert ([kv.key for kv in ours.kvs], ours.more, ours.count) == \
                        ([kv.key for kv in theirs.kvs], theirs.more, theirs.count), (seed, n, req)
