"""Bad inputs: shardetcd must reject each one exactly as etcd 3.5.1 does — the
same gRPC status code and the same details string — and keep serving.

One etcd and one shardetcd serve the whole module; every case first runs the
same setup writes on both, so their revisions stay in step.
"""

from __future__ import annotations

import grpc
import pytest

from proto import kv_pb2, rpc_pb2 as pb
from tests.conftest import require_etcd_binary
from tests.etcd_fixture import start_etcd
from tests.integration.diffkit import (
    INVALID_SORT,
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    Client,
    describe,
    normalise,
    same,
)
from tests.shardetcd_fixture import start_shardetcd

pytestmark = pytest.mark.timeout(120)

EMPTY_KEY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")
KEY_NOT_FOUND = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key not found")
VALUE_PROVIDED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: value is provided")
LEASE_PROVIDED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: lease is provided")
TOO_MANY_OPS = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations in txn request")
DUPLICATE_KEY = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request")
TOO_LARGE = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large")
COMPACTED = (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted")
FUTURE_REV = (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")
LEASE_NOT_FOUND = (grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require_etcd_binary()
    base = tmp_path_factory.mktemp("errors")
    etcd = start_etcd(base)
    try:
        shard = start_shardetcd(base)
        try:
            ref, sut = Client(etcd.endpoint), Client(shard.endpoint)
            yield etcd, shard, ref, sut
            ref.close()
            sut.close()
        finally:
            shard.stop()
    finally:
        etcd.stop()


def op(req) -> pb.RequestOp:
    field = {
        pb.RangeRequest: "request_range",
        pb.PutRequest: "request_put",
        pb.DeleteRangeRequest: "request_delete_range",
        pb.TxnRequest: "request_txn",
    }[type(req)]
    return pb.RequestOp(**{field: req})


def rng(key=b"k", **kw):
    return pb.RangeRequest(key=key, **kw)


def put(key=b"k", value=b"v", **kw):
    return pb.PutRequest(key=key, value=value, **kw)


def dele(key=b"k", **kw):
    return pb.DeleteRangeRequest(key=key, **kw)


def cmp(key=b"k", **kw):
    kw.setdefault("target", pb.Compare.VERSION)
    return pb.Compare(key=key, **kw)


BIG = b"B" * (MAX_REQUEST_BYTES + 64 * 1024)  # over etcd's 1.5 MiB, under gRPC's 2 MiB
HUGE = put(value=b"H" * (3 * 1024 * 1024))  # over gRPC's 2 MiB (--max-request-bytes + 512 KiB): grpc-go's refusal
TOO_LARGE_FOR_GRPC = (grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"grpc: received message larger than max ({HUGE.ByteSize()} vs. {MAX_REQUEST_BYTES + 512 * 1024})")

# name -> (bad request, expected (code, details)); a callable builds the request
# from the current revision `rev` and the compaction point `crev`.
CASES = {
    # empty key
    "range_empty_key": (pb.RangeRequest(), EMPTY_KEY),
    "range_empty_key_with_end": (pb.RangeRequest(range_end=b"\x00"), EMPTY_KEY),
    "put_empty_key": (put(key=b""), EMPTY_KEY),
    "delete_empty_key": (pb.DeleteRangeRequest(range_end=b"z"), EMPTY_KEY),
    "txn_compare_empty_key": (pb.TxnRequest(compare=[cmp(key=b"")]), EMPTY_KEY),
    "txn_success_empty_key": (pb.TxnRequest(success=[op(rng(key=b""))]), EMPTY_KEY),
    "txn_failure_empty_key": (pb.TxnRequest(failure=[op(dele(key=b""))]), EMPTY_KEY),
    "txn_nested_empty_key": (pb.TxnRequest(success=[op(pb.TxnRequest(failure=[op(put(key=b""))]))]), EMPTY_KEY),
    # too many ops (etcd's default --max-txn-ops is 128)
    "txn_too_many_compares": (pb.TxnRequest(compare=[cmp() for _ in range(MAX_TXN_OPS + 1)]), TOO_MANY_OPS),
    "txn_too_many_success": (pb.TxnRequest(success=[op(rng()) for _ in range(MAX_TXN_OPS + 1)]), TOO_MANY_OPS),
    "txn_too_many_failure": (pb.TxnRequest(failure=[op(rng()) for _ in range(MAX_TXN_OPS + 1)]), TOO_MANY_OPS),
    "txn_too_many_nested": (pb.TxnRequest(success=[op(pb.TxnRequest(success=[op(rng()) for _ in range(MAX_TXN_OPS + 1)]))]), TOO_MANY_OPS),
    "txn_too_many_beats_empty_key": (pb.TxnRequest(compare=[cmp(key=b"")], success=[op(rng()) for _ in range(MAX_TXN_OPS + 1)]), TOO_MANY_OPS),
    # duplicate keys in a txn
    "txn_duplicate_put": (pb.TxnRequest(success=[op(put(b"d")), op(put(b"d"))]), DUPLICATE_KEY),
    "txn_put_then_delete_same_key": (pb.TxnRequest(failure=[op(put(b"d")), op(dele(b"d"))]), DUPLICATE_KEY),
    "txn_put_inside_delete_range": (pb.TxnRequest(success=[op(dele(b"/registry/", range_end=b"/registry0")), op(put(b"/registry/pods/x"))]), DUPLICATE_KEY),
    "txn_nested_duplicate": (pb.TxnRequest(success=[op(put(b"d")), op(pb.TxnRequest(success=[op(put(b"d"))]))]), DUPLICATE_KEY),
    # ignore_value / ignore_lease misuse
    "put_ignore_value_with_value": (put(ignore_value=True), VALUE_PROVIDED),
    "put_ignore_lease_with_lease": (put(lease=7, ignore_lease=True), LEASE_PROVIDED),
    "txn_ignore_value_with_value": (pb.TxnRequest(success=[op(put(ignore_value=True))]), VALUE_PROVIDED),
    "put_ignore_value_missing_key": (put(key=b"/registry/configmaps/nope", value=b"", ignore_value=True), KEY_NOT_FOUND),
    "put_ignore_lease_missing_key": (put(key=b"/registry/pods/nope", ignore_lease=True), KEY_NOT_FOUND),
    "txn_ignore_value_missing_key": (pb.TxnRequest(success=[op(put(key=b"nope", value=b"", ignore_value=True))]), KEY_NOT_FOUND),
    "txn_empty_request_op": (pb.TxnRequest(success=[pb.RequestOp()]), KEY_NOT_FOUND),
    # leases that do not exist
    "put_no_such_lease": (put(lease=12345), LEASE_NOT_FOUND),
    "put_negative_lease": (put(lease=-1), LEASE_NOT_FOUND),
    "txn_no_such_lease": (pb.TxnRequest(success=[op(put(b"/registry/leases/l", lease=99))]), LEASE_NOT_FOUND),
    # revisions in the future / compacted
    "range_future_rev": (lambda rev, crev: rng(revision=rev + 1), FUTURE_REV),
    "range_far_future_rev": (lambda rev, crev: rng(range_end=b"\x00", revision=rev + 1000), FUTURE_REV),
    "txn_range_future_rev": (lambda rev, crev: pb.TxnRequest(success=[op(rng(revision=rev + 5))]), FUTURE_REV),
    "range_compacted_rev": (lambda rev, crev: rng(revision=crev - 1), COMPACTED),
    "txn_range_compacted_rev": (lambda rev, crev: pb.TxnRequest(failure=[op(rng(revision=1))], compare=[cmp(result=pb.Compare.LESS, version=0)]), COMPACTED),
    "compact_compacted_rev": (lambda rev, crev: pb.CompactionRequest(revision=crev), COMPACTED),
    "compact_future_rev": (lambda rev, crev: pb.CompactionRequest(revision=rev + 1), FUTURE_REV),
    # requests over --max-request-bytes (1.5 MiB)
    "put_too_large": (put(value=BIG), TOO_LARGE),
    "txn_too_large": (pb.TxnRequest(success=[op(put(value=BIG))]), TOO_LARGE),
    "put_over_grpc_limit": (HUGE, TOO_LARGE_FOR_GRPC),
}


def _setup(ref: Client, sut: Client) -> tuple[int, int]:
    """Same writes on both: key b"k" exists, history is compacted at rev-1. Returns (rev, crev)."""
    out = []
    for c in (ref, sut):
        c.call(put(b"k", b"v0"))
        r = c.call(put(b"k", b"v1"))
        rev = r.response.header.revision
        comp = c.call(pb.CompactionRequest(revision=rev - 1))
        assert comp.error is None or comp.error == COMPACTED, comp
        out.append(rev)
    assert out[0] == out[1], f"servers out of step: etcd rev {out[0]}, shardetcd rev {out[1]}"
    return out[0], out[0] - 1


def _serving(client: Client) -> None:
    r = client.call(put(b"/registry/pods/still", b"alive"))
    assert r.error is None, f"no longer serving writes: {r}"
    g = client.call(rng(b"/registry/pods/still"))
    assert g.error is None and g.response.kvs[0].value == b"alive", f"no longer serving reads: {g}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_matches_etcd(servers, name):
    etcd, shard, ref, sut = servers
    rev, crev = _setup(ref, sut)
    build, expected = CASES[name]
    req = build(rev, crev) if callable(build) else build
    want, got = normalise(req, ref.call(req)), normalise(req, sut.call(req))
    assert want.error == expected, f"test expectation is stale — etcd said {want}"
    assert same(want, got), f"request: {describe(req)[:2000]}\netcd:      {want}\nshardetcd: {got}"
    _serving(sut)
    _serving(ref)
    # a rejected request changes nothing: both stay on the same revision
    a = ref.call(rng(b"k")).response.header.revision
    b = sut.call(rng(b"k")).response.header.revision
    assert a == b


@pytest.mark.parametrize(
    "req",
    [
        rng(range_end=b"\x00", sort_order=3),
        rng(range_end=b"\x00", sort_order=-1),
        rng(range_end=b"\x00", sort_target=5, sort_order=pb.RangeRequest.ASCEND),
        rng(range_end=b"\x00", sort_target=100),
        pb.TxnRequest(success=[op(rng(sort_target=7))]),
        pb.TxnRequest(failure=[op(pb.TxnRequest(success=[op(rng(sort_order=9))]))]),
    ],
    ids=["order3", "order-1", "target5", "target100", "txn_target7", "nested_txn_order9"],
)
def test_sort_options_out_of_range(servers, req):
    """Not asked of etcd 3.5.1: an unknown sort *target* makes it dereference a
    nil sorter and crash (etcd issue #13554), and an unknown sort *order* is
    ignored. etcd's fix (checkRangeRequest, 3.6) rejects both with
    INVALID_ARGUMENT "etcdserver: invalid sort option"; shardetcd is held to that."""
    etcd, shard, ref, sut = servers
    got = sut.call(req)
    assert got.error == INVALID_SORT, f"request: {describe(req)}\nshardetcd: {got}"
    _serving(sut)


def test_compare_targets_and_results_out_of_range_match_etcd(servers):
    """Every compare target and result, known or not, on a present key and an
    absent range, with each kind of compared value: etcd's outcome for each."""
    etcd, shard, ref, sut = servers
    for client in (ref, sut):  # revision 2 is not this key's on both: compared are outcomes, not headers
        client.call(put(b"cmp-k", b"v"))
    diffs = []
    for target in range(-1, 8):
        for result in (-1, 0, 1, 2, 3, 4, 9):
            for extra in ({}, {"version": 1}, {"value": b"v"}, {"create_revision": 2}, {"mod_revision": 2}, {"lease": 0}):
                for where in ({"key": b"cmp-k"}, {"key": b"cmp-none", "range_end": b"cmp-nonf"}):
                    req = pb.TxnRequest(compare=[pb.Compare(target=target, result=result, **where, **extra)])
                    want, got = (o.error or o.response.succeeded for o in (ref.call(req), sut.call(req)))
                    if want != got:
                        diffs.append(f"{describe(req)}\n  etcd: {want}\n  shardetcd: {got}")
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs[:10])
    _serving(sut)


# -- malformed protobuf -------------------------------------------------------------

KV_METHODS = ["Range", "Put", "DeleteRange", "Txn", "Compact"]

MALFORMED = {
    "truncated_varint": b"\x08",  # field 1 varint with no bytes
    "truncated_length": b"\x0a\x05ab",  # field 1 says 5 bytes, has 2
    "bad_wire_type": b"\x0f\x01",  # wire type 7 does not exist
    "zero_tag": b"\x00\x01",  # field number 0 is illegal
    "overlong_varint": b"\x08" + b"\xff" * 11,
    "end_group_unmatched": b"\x0c",  # END_GROUP with no START_GROUP
}


def _raw_call(endpoint: str, method: str, body: bytes):
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/etcdserverpb.KV/{method}")  # no serializers: raw bytes both ways
        try:
            return call(body, timeout=10), None
        except grpc.RpcError as exc:
            return None, (exc.code(), exc.details())


@pytest.mark.parametrize("method", KV_METHODS)
@pytest.mark.parametrize("payload", sorted(MALFORMED))
def test_malformed_protobuf(servers, method, payload):
    etcd, shard, ref, sut = servers
    body = MALFORMED[payload]
    resp, err = _raw_call(shard.endpoint, method, body)
    assert err is not None, f"shardetcd accepted malformed {method} bytes {body!r}: {resp!r}"
    # etcd (Go gRPC) answers INTERNAL "grpc: error unmarshalling request: <its generated code's error>"
    _, etcd_err = _raw_call(etcd.endpoint, method, body)
    assert etcd_err is not None
    assert err == etcd_err
    assert shard.running()
    _serving(sut)


def test_valid_raw_bytes_still_work(servers):
    """The raw-bytes path itself works (the malformed tests do not fail for another reason)."""
    etcd, shard, ref, sut = servers
    for endpoint in (etcd.endpoint, shard.endpoint):
        resp, err = _raw_call(endpoint, "Range", pb.RangeRequest(key=b"k").SerializeToString())
        assert err is None
        parsed = pb.RangeResponse.FromString(resp)
        assert parsed.kvs and isinstance(parsed.kvs[0], kv_pb2.KeyValue)


@pytest.mark.parametrize("method", ["/etcdserverpb.KV/Nope", "/etcdserverpb.Nope/Range", "/v3electionpb.Election/Nope",
                                    "/grpc.health.v1.Health/Nope", "/grpc.reflection.v1alpha.ServerReflection/Info"])
def test_unknown_methods_and_services_answer_as_grpc_go(servers, method):
    """UNIMPLEMENTED in grpc-go's words ("unknown method M for service S", "unknown service S"),
    for unary and streaming calls; the health service keeps answering."""
    _, _, ref, sut = servers
    answers = []
    for client in (ref, sut):
        got = []
        for call in (client.channel.unary_unary(method), client.channel.stream_stream(method)):
            try:
                reply = call(b"") if call.__class__.__name__.startswith("_Unary") else list(call(iter([b""])))
                got.append(("ok", reply))
            except grpc.RpcError as exc:
                got.append((exc.code(), exc.details()))
        health = client.channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
        answers.append((got, health))
    assert answers[0] == answers[1]
    assert answers[0][0][0][0] == grpc.StatusCode.UNIMPLEMENTED
