"""A Txn request checked, converted to the store's form and costed in one walk.

Kubernetes writes everything through Txn (a compare on the key's revision,
a put, a range on failure), so this is the write path kube-apiserver takes.
The separate passes (validate.check_txn, check_txn_intervals, txn_written_keys,
quota.cost_txn, convert.txn_req) each walk the request's ops again; a flat
txn (no nested txn, by far the common shape) is done here in one walk, with
etcd's error order kept: the op budget, empty keys and unknown ops as the walk
meets them, the duplicate-key rules only once both branches passed those.
A nested txn takes the separate passes.
"""
from __future__ import annotations

from dataclasses import dataclass

from proto import rpc_pb2 as pb
from shards.types import TxnReq

from . import convert, quota, validate
from .errors import DUPLICATE_KEY, EMPTY_KEY, KEY_NOT_FOUND, TOO_MANY_OPS, RequestError


@dataclass(slots=True)
class CheckedTxn:
    req: TxnReq
    cost: int  # quota cost: the larger branch's top-level puts
    written: list[bytes]  # every key put or (start of a range) deleted, both branches


class _Nested(Exception):
    """The txn holds a nested txn: take the general path."""


def check_txn(r: pb.TxnRequest, max_txn_ops: int) -> CheckedTxn:
    """etcd's gRPC-layer checks of a Txn (RequestError on the first failing one)
    and the request in the store's form."""
    try:
        return _flat(r, max_txn_ops)
    except _Nested:
        pass
    validate.check_txn(r, max_txn_ops)
    validate.check_txn_intervals(r)
    return CheckedTxn(convert.txn_req(r), quota.cost_txn(r), list(validate.txn_written_keys(r)))


def _flat(r: pb.TxnRequest, max_txn_ops: int) -> CheckedTxn:
    compare, success, failure = r.compare, r.success, r.failure  # each access makes a new view
    if max(len(compare), len(success), len(failure)) > max_txn_ops:
        raise RequestError(TOO_MANY_OPS)
    compares = []
    for c in compare:
        if not c.key:
            raise RequestError(EMPTY_KEY)
        compares.append(convert.compare(c))
    written: list[bytes] = []
    success, success_puts, success_dels, success_cost = _branch(success, written)
    failure, failure_puts, failure_dels, failure_cost = _branch(failure, written)
    if len(success_puts) > 1 or success_dels:
        _no_duplicates(success_puts, success_dels)
    if len(failure_puts) > 1 or failure_dels:
        _no_duplicates(failure_puts, failure_dels)
    return CheckedTxn(TxnReq(tuple(compares), success, failure), max(success_cost, failure_cost), written)


_NO_OPS = ((), (), (), 0)


def _branch(ops, written: list[bytes]):
    """(store ops, put keys in order, delete intervals, quota cost) of one branch."""
    if not ops:
        return _NO_OPS
    out = []
    puts: list[bytes] = []
    dels: list[tuple[bytes, bytes]] = []
    cost = 0
    for op in ops:
        which = op.WhichOneof("request")
        if which == "request_put":
            put = validate.checked_put(op.request_put)
            out.append(put)
            puts.append(put.key)
            written.append(put.key)
            cost += quota.cost_put(put)
        elif which == "request_range":
            q = op.request_range
            validate.check_range(q)
            out.append(convert.range_req(q))
        elif which == "request_delete_range":
            d = op.request_delete_range
            validate.check_delete(d)
            out.append(convert.delete_req(d))
            dels.append((d.key, d.range_end or d.key + b"\x00"))
            written.append(d.key)
        elif which == "request_txn":
            raise _Nested
        else:
            raise RequestError(KEY_NOT_FOUND)
    return tuple(out), puts, dels, cost


def _no_duplicates(puts: list[bytes], dels: list[tuple[bytes, bytes]]) -> None:
    """etcd's checkIntervals for a branch without nested txns: a key put twice,
    or put inside a range the same branch deletes."""
    if len(puts) > 1 and len(set(puts)) < len(puts):
        raise RequestError(DUPLICATE_KEY)
    if dels:
        for k in puts:
            if validate.hits(dels, k):
                raise RequestError(DUPLICATE_KEY)
