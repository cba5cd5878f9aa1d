"""protobuf requests → store requests, store results → protobuf responses."""
from __future__ import annotations

from proto import kv_pb2, rpc_pb2 as pb
from shards.types import (
    CMP_CREATE,
    CMP_LEASE,
    CMP_MOD,
    CMP_VALUE,
    CMP_VERSION,
    Compare,
    DeleteReq,
    DeleteResult,
    PutReq,
    PutResult,
    RangeReq,
    RangeResult,
    TxnReq,
    TxnResult,
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


def _kvs(rows: list[bytes]) -> list[kv_pb2.KeyValue]:
    return [kv_pb2.KeyValue.FromString(r) for r in rows]


def txn_response(result: TxnResult, header: pb.ResponseHeader) -> pb.TxnResponse:
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
        return pb.ResponseOp(response_txn=txn_response(r, pb.ResponseHeader()))
    return pb.ResponseOp()
