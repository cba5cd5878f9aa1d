"""Property-based fuzzing over gRPC: any field values, any order; the server
answers each request with a result or one of etcd's errors, never crashes or
hangs, and keeps serving. Malformed bytes on every method of every service
get an error status."""
from __future__ import annotations

import grpc
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

# every status an etcd server gives for a bad or unlucky request
ETCD_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
}

keys = st.one_of(st.just(b""), st.just(b"\x00"), st.binary(max_size=12),
                 st.sampled_from([b"/registry/pods/a", b"/registry/leases/b", b"/registry/events/c", b"k"]))
ints = st.one_of(st.integers(min_value=-3, max_value=40), st.integers(min_value=-(2**63), max_value=2**63 - 1))
small = st.integers(min_value=-2, max_value=6)

range_reqs = st.builds(pb.RangeRequest, key=keys, range_end=keys, limit=ints, revision=ints, sort_order=small,
                       sort_target=small, serializable=st.booleans(), keys_only=st.booleans(),
                       count_only=st.booleans(), min_mod_revision=ints, max_mod_revision=ints,
                       min_create_revision=ints, max_create_revision=ints)
put_reqs = st.builds(pb.PutRequest, key=keys, value=st.binary(max_size=16), lease=ints, prev_kv=st.booleans(),
                     ignore_value=st.booleans(), ignore_lease=st.booleans())
delete_reqs = st.builds(pb.DeleteRangeRequest, key=keys, range_end=keys, prev_kv=st.booleans())
compares = st.builds(pb.Compare, result=small, target=small, key=keys, range_end=keys, version=ints)


def ops(depth: int):
    leaf = st.one_of(st.builds(pb.RequestOp, request_range=range_reqs), st.builds(pb.RequestOp, request_put=put_reqs),
                     st.builds(pb.RequestOp, request_delete_range=delete_reqs), st.just(pb.RequestOp()))
    if depth == 0:
        return leaf
    return st.one_of(leaf, st.builds(pb.RequestOp, request_txn=txns(depth - 1)))


def txns(depth: int = 2):
    return st.builds(pb.TxnRequest, compare=st.lists(compares, max_size=3), success=st.lists(ops(depth), max_size=3),
                     failure=st.lists(ops(depth), max_size=3))


requests = st.one_of(
    st.tuples(st.just("Range"), range_reqs), st.tuples(st.just("Put"), put_reqs),
    st.tuples(st.just("DeleteRange"), delete_reqs), st.tuples(st.just("Txn"), txns()),
    st.tuples(st.just("Compact"), st.builds(pb.CompactionRequest, revision=ints, physical=st.booleans())),
    st.tuples(st.just("LeaseGrant"), st.builds(pb.LeaseGrantRequest, TTL=ints, ID=ints)),
    st.tuples(st.just("LeaseRevoke"), st.builds(pb.LeaseRevokeRequest, ID=ints)),
    st.tuples(st.just("LeaseTimeToLive"), st.builds(pb.LeaseTimeToLiveRequest, ID=ints, keys=st.booleans())),
    st.tuples(st.just("Watch"), st.builds(pb.WatchCreateRequest, key=keys, range_end=keys, start_revision=ints,
                                           watch_id=ints, prev_kv=st.booleans(), fragment=st.booleans(),
                                           filters=st.lists(small, max_size=2))),
)


def call(ch, method: str, req):
    if method == "Watch":
        stream = pbg.WatchStub(ch).Watch(iter([pb.WatchRequest(create_request=req),
                                               pb.WatchRequest(progress_request=pb.WatchProgressRequest())]), timeout=5)
        first = next(stream)
        assert first.created
        stream.cancel()
        return
    stub = pbg.LeaseStub(ch) if method.startswith("Lease") else pbg.KVStub(ch)
    getattr(stub, method)(req, timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.shardetcd_fixture import start_shardetcd

    s = start_shardetcd(tmp_path_factory.mktemp("fuzz"))
    yield s
    s.stop()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(requests, min_size=1, max_size=8))
def test_any_requests_get_a_result_or_an_etcd_error(server, batch):
    with grpc.insecure_channel(server.endpoint) as ch:
        for method, req in batch:
            try:
                call(ch, method, req)
            except grpc.RpcError as exc:
                assert exc.code() in ETCD_CODES and exc.details().startswith("etcdserver: "), (method, req, exc)
        assert server.running()
        pbg.KVStub(ch).Range(pb.RangeRequest(key=b"health"), timeout=5)


def test_malformed_bytes_on_every_method(server):
    bad = b"\x0a\xff\xff\xff\xff\x0f"  # a length far beyond the message
    with grpc.insecure_channel(server.endpoint) as ch:
        for service in pb.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                path = f"/{service.full_name}/{m.name}"
                if m.client_streaming:
                    rpc = ch.stream_stream(path) if m.server_streaming else ch.stream_unary(path)
                    invoke = lambda: list(rpc(iter([bad]), timeout=5)) if m.server_streaming else rpc(iter([bad]), timeout=5)
                else:
                    rpc = ch.unary_stream(path) if m.server_streaming else ch.unary_unary(path)
                    invoke = lambda: list(rpc(bad, timeout=5)) if m.server_streaming else rpc(bad, timeout=5)
                with pytest.raises(grpc.RpcError) as err:
                    invoke()
                assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED), path
        pbg.KVStub(ch).Put(pb.PutRequest(key=b"still", value=b"serving"), timeout=5)
