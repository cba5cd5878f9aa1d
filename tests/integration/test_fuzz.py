"""Property-based fuzzing over gRPC: any field values, any order; the server
answers each request with a result or one of etcd's errors, never crashes or
hangs, and keeps serving.

Every unary method of every service gets requests built from its own message
descriptor (so a field added to proto/ is fuzzed too): keys and values up to
1.5 MiB, revisions, limits, enums out of range, nested txns.  Watch streams
get create / cancel / progress requests in any order; keep-alive streams any
lease ids.  Malformed bytes on every method of every service get an error
status."""
from __future__ import annotations

import grpc
import hypothesis.strategies as st
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor as F
from hypothesis import HealthCheck, given, settings

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg

# every status an etcd server gives for a bad or unlucky request
# etcd passes a few auth errors to gRPC unconverted: their text starts "auth: ", not "etcdserver: "
ETCD_AUTH_TEXTS = {
    "auth: authentication failed, password was given for no password user",
    "auth: user name is empty", "auth: user not found", "auth: permission denied", "auth: invalid auth token",
}
ETCD_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNKNOWN,  # "etcdserver: unknown method" (a Downgrade action etcd does not know)
}
MAX_REQUEST_BYTES = 1536 * 1024  # the default --max-request-bytes
HUGE = b"k" * MAX_REQUEST_BYTES

keys = st.one_of(st.just(b""), st.just(b"\x00"), st.binary(max_size=12), st.just(HUGE),
                 st.sampled_from([b"/registry/pods/a", b"/registry/leases/b", b"/registry/events/c", b"k"]))
ints = st.one_of(st.integers(min_value=-3, max_value=40), st.integers(min_value=-(2**63), max_value=2**63 - 1))
small = st.integers(min_value=-2, max_value=6)
names = st.one_of(st.sampled_from(["", "root", "alice", "admin"]), st.text(max_size=8))

SCALARS = {
    F.TYPE_BYTES: keys, F.TYPE_STRING: names, F.TYPE_BOOL: st.booleans(), F.TYPE_ENUM: small,
    F.TYPE_INT64: ints, F.TYPE_SINT64: ints, F.TYPE_SFIXED64: ints,
    F.TYPE_UINT64: st.integers(0, 2**64 - 1), F.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    F.TYPE_INT32: st.integers(-(2**31), 2**31 - 1), F.TYPE_UINT32: st.integers(0, 2**32 - 1),
}


def message(desc, depth: int = 3):
    """Any value of the message type ``desc``: each field absent or drawn."""
    fields = {}
    for f in desc.fields:
        if f.type == F.TYPE_MESSAGE:
            if depth == 0:
                continue
            value = st.deferred(lambda f=f: message(f.message_type, depth - 1))
        else:
            value = SCALARS[f.type]
        fields[f.name] = st.lists(value, max_size=3) if f.is_repeated else value
    cls = message_factory.GetMessageClass(desc)
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


def _unary_methods():
    for service in pb.DESCRIPTOR.services_by_name.values():
        for m in service.methods:
            if not (m.client_streaming or m.server_streaming):
                yield service.name, m


def _safe(service: str, method: str, req):
    """Keep the shared server writable: an activated alarm would turn every
    later write into the same NOSPACE error (tested in test_maintenance)."""
    if method == "Alarm" and req.action == pb.AlarmRequest.ACTIVATE:
        req.action = pb.AlarmRequest.GET
    if method == "AuthEnable":  # auth on would refuse every later request (tested in test_auth)
        return service, "AuthStatus", pb.AuthStatusRequest()
    return service, method, req


def unary(services: set[str], exclude: bool = False):
    return st.one_of(*[message(m.input_type).map(lambda r, s=s, m=m: _safe(s, m.name, r))
                       for s, m in _unary_methods() if (s in services) != exclude])

watch_actions = st.lists(st.one_of(
    st.builds(pb.WatchRequest, create_request=message(pb.WatchCreateRequest.DESCRIPTOR)),
    st.builds(pb.WatchRequest, cancel_request=st.builds(pb.WatchCancelRequest, watch_id=st.one_of(small, ints))),
    st.builds(pb.WatchRequest, progress_request=st.just(pb.WatchProgressRequest())),
    st.just(pb.WatchRequest()),
), max_size=8)
keepalives = st.lists(st.builds(pb.LeaseKeepAliveRequest, ID=ints), min_size=1, max_size=4)

requests = st.one_of(  # KV twice as often as each of the others
    unary({"KV"}), unary({"KV"}), unary({"KV"}, exclude=True),
    st.tuples(st.just("Watch"), st.just("Watch"), watch_actions),
    st.tuples(st.just("Lease"), st.just("LeaseKeepAlive"), keepalives),
)


def call_unary(ch, service: str, method: str, req) -> None:
    stub = getattr(pbg, f"{service}Stub")(ch)
    getattr(stub, method)(req, timeout=30)


def call_watch(ch, actions: list) -> None:
    """Every create gets exactly one created answer, in order, and the stream stays up."""
    end = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"fuzz-end"))
    stream = pbg.WatchStub(ch).Watch(iter([*actions, end]), timeout=30)
    want = sum(a.HasField("create_request") for a in actions) + 1
    created = 0
    for r in stream:
        created += r.created
        if created == want:
            break
    stream.cancel()
    assert created == want


def call_keepalive(ch, reqs: list) -> None:
    got = list(pbg.LeaseStub(ch).LeaseKeepAlive(iter(reqs), timeout=30))
    assert [r.ID for r in got] == [r.ID for r in reqs]


def call(ch, service: str, method: str, req) -> None:
    if method == "Watch":
        call_watch(ch, req)
    elif method == "LeaseKeepAlive":
        call_keepalive(ch, req)
    else:
        call_unary(ch, service, method, req)


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
        for service, method, req in batch:
            try:
                call(ch, service, method, req)
            except grpc.RpcError as exc:
                what = (method, str(req)[:300], exc.code(), exc.details())
                assert exc.code() in ETCD_CODES, what
                # over max-request-bytes + 512 KiB gRPC itself refuses the message, as with etcd
                oversize = exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in exc.details()
                assert oversize or exc.details().startswith("etcdserver: ") or exc.details() in ETCD_AUTH_TEXTS, what
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
