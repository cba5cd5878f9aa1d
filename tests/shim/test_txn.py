"""The one-walk Txn check (shim.txn) against the separate passes it replaces on
the hot path (validate.check_txn, check_txn_intervals, txn_written_keys,
quota.cost_txn, convert.txn_req), and the hand-encoded TxnResponse against
protobuf's own encoding, over random requests and results; the passes
themselves are checked against a real etcd by tests/integration/test_errors.py."""
from __future__ import annotations

import random

import pytest

from proto import kv_pb2, rpc_pb2 as pb
from shards.types import DeleteResult, PutResult, RangeResult, TxnResult
from shim import convert, quota, txn, validate, wire
from shim.errors import RequestError
from tests.shim.test_wire_range import _steps

KEYS = [b"", b"a", b"b", b"b\x00", b"c", b"/registry/pods/x"]


def _key(r: random.Random) -> bytes:
    return r.choice(KEYS[1:]) if r.random() < 0.95 else b""


def _op(r: random.Random, depth: int) -> pb.RequestOp:
    x = r.random()
    if x < 0.3:
        return pb.RequestOp(request_range=pb.RangeRequest(key=_key(r), range_end=r.choice([b"", b"c"]),
                                                          sort_order=r.choice([0, 1, 2, 5]) if r.random() < 0.1 else 0))
    if x < 0.65:
        p = pb.PutRequest(key=_key(r), value=r.choice([b"", b"v", b"w" * 100]), lease=r.choice([0, 0, 7]))
        p.ignore_value = r.random() < 0.05
        p.ignore_lease = r.random() < 0.05
        return pb.RequestOp(request_put=p)
    if x < 0.85:
        return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=_key(r), range_end=r.choice([b"", b"", b"c", b"\x00"])))
    if x < 0.9 or depth >= 2:
        return pb.RequestOp()  # no request set: etcd's "key not found"
    return pb.RequestOp(request_txn=_txn(r, depth + 1))


def _txn(r: random.Random, depth: int = 0) -> pb.TxnRequest:
    req = pb.TxnRequest()
    for _ in range(r.choice([0, 1, 1, 2, 3])):
        req.compare.append(pb.Compare(key=_key(r), target=pb.Compare.MOD, result=r.choice([0, 1, 2, 3]),
                                      mod_revision=r.randint(0, 9)))
    req.success.extend(_op(r, depth) for _ in range(r.choice([0, 1, 1, 2, 3, 5])))
    req.failure.extend(_op(r, depth) for _ in range(r.choice([0, 1, 1, 2])))
    return req


# -- protobuf's own encoding of a TxnResponse (what the server built before wire.txn_response)

def _kvs(rows: list[bytes]) -> list[kv_pb2.KeyValue]:
    return [kv_pb2.KeyValue.FromString(r) for r in rows]


def _pb_txn_response(result: TxnResult, header: pb.ResponseHeader) -> pb.TxnResponse:
    resp = pb.TxnResponse(header=header, succeeded=result.succeeded)
    for r in result.responses:
        resp.responses.append(_response_op(r))
    return resp


def _response_op(r) -> pb.ResponseOp:
    if isinstance(r, RangeResult):
        return pb.ResponseOp(
            response_range=pb.RangeResponse(
                header=pb.ResponseHeader(revision=r.revision), kvs=_kvs(r.kvs), more=r.more, count=r.count
            )
        )
    if isinstance(r, PutResult):
        put = pb.PutResponse(header=pb.ResponseHeader(revision=r.revision))
        if r.prev_kv is not None:
            put.prev_kv.ParseFromString(r.prev_kv)
        return pb.ResponseOp(response_put=put)
    if isinstance(r, DeleteResult):
        return pb.ResponseOp(
            response_delete_range=pb.DeleteRangeResponse(
                header=pb.ResponseHeader(revision=r.revision), deleted=r.deleted, prev_kvs=_kvs(r.prev_kvs)
            )
        )
    if isinstance(r, TxnResult):
        return pb.ResponseOp(response_txn=_pb_txn_response(r, pb.ResponseHeader()))
    return pb.ResponseOp()


def _separate_passes(req: pb.TxnRequest, max_ops: int):
    validate.check_txn(req, max_ops)
    validate.check_txn_intervals(req)
    return convert.txn_req(req), quota.cost_txn(req), list(validate.txn_written_keys(req))


def _outcome(fn):
    try:
        return ("ok", fn())
    except RequestError as exc:
        return ("error", exc.args)


@pytest.mark.parametrize("seed", range(4))
def test_one_walk_gives_what_the_separate_passes_give(seed):
    r = random.Random(seed)
    kinds = set()
    for _ in range(3000):
        req = _txn(r)
        max_ops = r.choice([2, 3, 128])
        want = _outcome(lambda: _separate_passes(req, max_ops))
        got = _outcome(lambda: txn.check_txn(req, max_ops))
        if got[0] == "ok":
            got = ("ok", (got[1].req, got[1].cost, got[1].written))
        assert got == want, req
        kinds.add(want[0] if want[0] == "ok" else want[1])
    assert len(kinds) >= 4  # successes and several of etcd's errors were exercised


def _kv(r: random.Random) -> bytes:
    return kv_pb2.KeyValue(key=_key(r) or b"k", value=b"v" * r.randint(0, 3), create_revision=r.randint(1, 9),
                           mod_revision=r.randint(1, 300), version=r.randint(1, 3), lease=r.choice([0, 5])).SerializeToString()


def _result(r: random.Random, depth: int = 0, rows=(0, 1, 2, 3)) -> TxnResult:
    """A random result; ``rows``: how many rows a range or a delete's previous rows may hold."""
    out = []
    for _ in range(r.choice([0, 1, 2, 3])):
        x = r.random()
        rev = r.choice([0, 1, 200, 1 << 40])
        if x < 0.3:
            out.append(PutResult(rev, _kv(r) if r.random() < 0.5 else None))
        elif x < 0.6:
            out.append(RangeResult(rev, [_kv(r) for _ in range(r.choice(rows))], r.random() < 0.3, r.randint(0, 5)))
        elif x < 0.85:
            n = r.choice(rows)
            out.append(DeleteResult(rev, n + r.randint(0, 1), [_kv(r) for _ in range(n)]))
        elif x < 0.95 and depth < 2:
            out.append(_result(r, depth + 1, rows))
        else:
            out.append(None)
    return TxnResult(r.choice([0, 5, 300]), r.random() < 0.5, out)


def test_hand_encoded_txn_response_is_protobufs_encoding():
    r = random.Random(7)
    headers = wire.Headers(cluster_id=0x1234_5678_9ABC, member_id=0xFEDC_BA98, raft_term=3)
    for _ in range(2000):
        res = _result(r)
        header = pb.ResponseHeader(cluster_id=0x1234_5678_9ABC, member_id=0xFEDC_BA98, revision=res.revision, raft_term=3)
        want = _pb_txn_response(res, header).SerializeToString()
        assert wire.txn_response(headers.framed(res.revision), res) == want


def test_large_txn_response_in_parts_is_protobufs_encoding():
    """A txn answering more than PART_ROWS rows (a range over many keys, a delete with prev_kv) is
    encoded in parts, a step per operation and per PART_ROWS rows: joined, the same bytes."""
    r = random.Random(11)
    headers = wire.Headers(cluster_id=0x1234_5678_9ABC, member_id=0xFEDC_BA98, raft_term=3)
    large = 0
    for _ in range(60):
        res = _result(r, rows=(0, 2, wire.PART_ROWS, wire.PART_ROWS + 1, 2 * wire.PART_ROWS + 5))
        rows = wire.txn_rows(res)
        header = pb.ResponseHeader(cluster_id=0x1234_5678_9ABC, member_id=0xFEDC_BA98, revision=res.revision, raft_term=3)
        want = _pb_txn_response(res, header).SerializeToString()
        steps, parts = _steps(wire.txn_parts(headers.framed(res.revision), res))
        assert type(parts) is wire.Parts and parts.joined() == want and parts.size == len(want)
        assert wire.txn_response(headers.framed(res.revision), res) == want
        assert all(len(p) <= len(want) for p in parts)
        if rows > 2 * wire.PART_ROWS:  # no step with more than about two parts' rows in it
            large += 1
            assert steps >= rows // wire.PART_ROWS and len(parts) > 2, (rows, steps, len(parts))
    assert large >= 5
