"""Request checks etcd makes in its gRPC layer, before a request reaches the store.

Same checks, same order, same errors as etcd 3.5's v3rpc, including
its txn interval rules: a key may be written once per txn (either branch of
a nested txn may write the same key, as only one runs), and a put may not
fall inside a delete range of the same txn.
"""
from __future__ import annotations

from proto import rpc_pb2 as pb
from shards.types import PutReq

from .errors import (
    DUPLICATE_KEY,
    EMPTY_KEY,
    INVALID_SORT,
    KEY_NOT_FOUND,
    LEASE_PROVIDED,
    REQUEST_TOO_LARGE,
    TOO_MANY_OPS,
    VALUE_PROVIDED,
    RequestError,
    wrong_partition,
)

_RAFT_ENVELOPE_BYTES = 16  # etcd measures the request inside its raft envelope


def check_size(req, max_request_bytes: int) -> None:
    if req.ByteSize() + _RAFT_ENVELOPE_BYTES > max_request_bytes:
        raise RequestError(REQUEST_TOO_LARGE)


def check_range(r: pb.RangeRequest) -> None:
    if not r.key:
        raise RequestError(EMPTY_KEY)
    if not 0 <= r.sort_order <= 2 or not 0 <= r.sort_target <= 4:
        raise RequestError(INVALID_SORT)


def check_put(r: pb.PutRequest) -> None:
    if not r.key:
        raise RequestError(EMPTY_KEY)
    if r.ignore_value and r.value:
        raise RequestError(VALUE_PROVIDED)
    if r.ignore_lease and r.lease:
        raise RequestError(LEASE_PROVIDED)


def checked_put(r: pb.PutRequest) -> PutReq:
    """``check_put``, and the store's request for the Put, each field read from the message once
    (every Put's and every Txn put's path; a read of a field makes a Python object each time)."""
    key, value, lease = r.key, r.value, r.lease
    ignore_value, ignore_lease = r.ignore_value, r.ignore_lease
    if not key or ignore_value and value or ignore_lease and lease:
        check_put(r)
    return PutReq(key, value, lease, r.prev_kv, ignore_value, ignore_lease)


def check_delete(r: pb.DeleteRangeRequest) -> None:
    if not r.key:
        raise RequestError(EMPTY_KEY)


def check_txn(r: pb.TxnRequest, max_txn_ops: int) -> None:
    """etcd's budget: the most of compares, success and failure ops counts
    against ``max_txn_ops``; a nested txn gets what its parent left over."""
    ops = max(len(r.compare), len(r.success), len(r.failure))
    if ops > max_txn_ops:
        raise RequestError(TOO_MANY_OPS)
    for c in r.compare:
        if not c.key:
            raise RequestError(EMPTY_KEY)
    for op in (*r.success, *r.failure):
        _check_op(op, max_txn_ops - ops)


def _check_op(op: pb.RequestOp, max_txn_ops: int) -> None:
    which = op.WhichOneof("request")
    if which == "request_range":
        check_range(op.request_range)
    elif which == "request_put":
        check_put(op.request_put)
    elif which == "request_delete_range":
        check_delete(op.request_delete_range)
    elif which == "request_txn":
        check_txn(op.request_txn, max_txn_ops)
    else:
        raise RequestError(KEY_NOT_FOUND)


def check_partition(guard, keys) -> None:
    """With a partition guard (``shardetcd cluster``): refuse writes to other partitions' resources."""
    for key in keys:
        owner = guard.owner(key)
        if owner is not None:
            raise RequestError(wrong_partition(key, owner, guard.layout.partitions[guard.mine].name))


def txn_written_keys(r: pb.TxnRequest):
    """Every key a txn may put or (start to) delete, in both branches, nested txns included."""
    for op in (*r.success, *r.failure):
        which = op.WhichOneof("request")
        if which == "request_put":
            yield op.request_put.key
        elif which == "request_delete_range":
            yield op.request_delete_range.key
        elif which == "request_txn":
            yield from txn_written_keys(op.request_txn)


def check_txn_intervals(r: pb.TxnRequest) -> None:
    _intervals(r.success)
    _intervals(r.failure)


def hits(dels: list[tuple[bytes, bytes]], key: bytes) -> bool:
    """Does the point [key, key+"\\0") meet any [begin, end) in dels?"""
    point_end = key + b"\x00"
    return any(begin < point_end and key < end for begin, end in dels)


def _intervals(ops) -> tuple[set[bytes], list[tuple[bytes, bytes]]]:
    dels: list[tuple[bytes, bytes]] = []
    for op in ops:
        if op.WhichOneof("request") == "request_delete_range":
            d = op.request_delete_range
            dels.append((d.key, d.range_end) if d.range_end else (d.key, d.key + b"\x00"))
    puts: set[bytes] = set()
    for op in ops:
        if op.WhichOneof("request") != "request_txn":
            continue
        puts_then, dels_then = _intervals(op.request_txn.success)
        puts_else, dels_else = _intervals(op.request_txn.failure)
        for k in puts_then:
            if k in puts or hits(dels, k):
                raise RequestError(DUPLICATE_KEY)
            puts.add(k)
        for k in puts_else:
            if (k in puts and k not in puts_then) or hits(dels, k):
                raise RequestError(DUPLICATE_KEY)
            puts.add(k)
        dels.extend(dels_then)
        dels.extend(dels_else)
    for op in ops:
        if op.WhichOneof("request") != "request_put":
            continue
        k = op.request_put.key
        if k in puts or hits(dels, k):
            raise RequestError(DUPLICATE_KEY)
        puts.add(k)
    return puts, dels
