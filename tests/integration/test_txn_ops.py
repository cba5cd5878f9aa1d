"""--max-txn-ops across nested txns, against etcd 3.5.1 (issue 18.9): a
nested txn's budget is what its parent left over, so a deep or wide nesting
etcd refuses is refused here too, before any work is done."""
from __future__ import annotations

import grpc
import pytest

from proto import rpc_pb2 as pb
from proto import rpc_pb2_grpc as pbg
from tests.etcd_fixture import start_etcd
from tests.shardetcd_fixture import start_shardetcd


def put(key: bytes) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key, value=b"v"))


def nest(*ops: pb.RequestOp, compares: int = 0) -> pb.RequestOp:
    return pb.RequestOp(request_txn=txn(*ops, compares=compares))


def txn(*ops: pb.RequestOp, compares: int = 0) -> pb.TxnRequest:
    cmp = pb.Compare(key=b"c", target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=0)
    return pb.TxnRequest(compare=[cmp] * compares, success=list(ops))


def deep(levels: int) -> pb.TxnRequest:
    op = put(b"leaf")
    for _ in range(levels):
        op = pb.RequestOp(request_txn=pb.TxnRequest(success=[op]))
    return op.request_txn


# with --max-txn-ops 4
SHAPES = {
    "flat at the limit": txn(put(b"a"), put(b"b"), put(b"c1"), put(b"d")),
    "2 ops, nested 3": txn(put(b"a"), nest(put(b"b"), put(b"c1"), put(b"d"))),
    "2 ops, nested 2": txn(put(b"a"), nest(put(b"b"), put(b"c1"))),
    "1 op, nested 3": txn(nest(put(b"b"), put(b"c1"), put(b"d"))),
    "1 op, nested 4": txn(nest(put(b"b"), put(b"c1"), put(b"d"), put(b"e"))),
    "4 compares, nested 1": txn(nest(put(b"b")), compares=4),
    "3 compares, nested 1": txn(nest(put(b"b")), compares=3),
    "two nested of 2": txn(nest(put(b"a"), put(b"b")), nest(put(b"c1"), put(b"d"))),
    "nested in nested": txn(put(b"x"), nest(put(b"y"), nest(put(b"b"), put(b"z")))),
    "nested compares": txn(put(b"x"), nest(put(b"y"), compares=3)),
    "3 deep": deep(3),
    "4 deep": deep(4),
    "20 deep": deep(20),
}


def answers(endpoint: str) -> dict[str, str]:
    out = {}
    with grpc.insecure_channel(endpoint) as ch:
        kv = pbg.KVStub(ch)
        for name, req in SHAPES.items():
            try:
                kv.Txn(req, timeout=10)
                out[name] = "ok"
            except grpc.RpcError as err:
                out[name] = f"{err.code().name}: {err.details()}"
        kv.Range(pb.RangeRequest(key=b"a"), timeout=10)  # still serving
    return out


@pytest.fixture(scope="module")
def etcd_answers(tmp_path_factory):
    etcd = start_etcd(tmp_path_factory.mktemp("etcd"), extra_args=("--max-txn-ops", "4"))
    try:
        return answers(etcd.endpoint)
    finally:
        etcd.stop()


def test_nested_txn_op_budget_matches_etcd(tmp_path, etcd_answers):
    server = start_shardetcd(tmp_path, extra_args=("--max-txn-ops", "4"))
    try:
        got = answers(server.endpoint)
    finally:
        server.stop()
    assert "too many operations" in etcd_answers["2 ops, nested 3"]  # the reference refuses something
    assert got == etcd_answers
