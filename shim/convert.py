"""protobuf requests → store requests (responses are built as bytes in wire)."""
from __future__ import annotations

from proto import rpc_pb2 as pb
from shards.types import (
    CMP_CREATE,
    CMP_LEASE,
    CMP_MOD,
    CMP_VALUE,
    CMP_VERSION,
    Compare,
    DeleteReq,
    PutReq,
    RangeReq,
    TxnReq,
)

_UNION_FIELD = {
    CMP_VERSION: "version",
    CMP_CREATE: "create_revision",
    CMP_MOD: "mod_revision",
    CMP_VALUE: "value",
    CMP_LEASE: "lease",
}


def range_req(r: pb.RangeRequest) -> RangeReq:
    return RangeReq(
        r.key,
        r.range_end,
        r.limit,
        r.revision,
        r.sort_order,
        r.sort_target,
        r.keys_only,
        r.count_only,
        r.min_mod_revision,
        r.max_mod_revision,
        r.min_create_revision,
        r.max_create_revision,
    )


def put_req(r: pb.PutRequest) -> PutReq:
    return PutReq(r.key, r.value, r.lease, r.prev_kv, r.ignore_value, r.ignore_lease)


def delete_req(r: pb.DeleteRangeRequest) -> DeleteReq:
    return DeleteReq(r.key, r.range_end, r.prev_kv)


def compare(c: pb.Compare) -> Compare:
    which = c.WhichOneof("target_union")
    value, number = b"", 0
    if which is not None and which == _UNION_FIELD.get(c.target):
        if which == "value":
            value = c.value
        else:
            number = getattr(c, which)
    return Compare(c.target, c.result, c.key, c.range_end, value, number)


def txn_req(r: pb.TxnRequest) -> TxnReq:
    return TxnReq(
        tuple(compare(c) for c in r.compare),
        tuple(_op(o) for o in r.success),
        tuple(_op(o) for o in r.failure),
    )


def _op(o: pb.RequestOp):
    which = o.WhichOneof("request")
    if which == "request_range":
        return range_req(o.request_range)
    if which == "request_put":
        return put_req(o.request_put)
    if which == "request_delete_range":
        return delete_req(o.request_delete_range)
    if which == "request_txn":
        return txn_req(o.request_txn)
    return None
