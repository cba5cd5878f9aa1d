"""Request bytes etcd cannot decode, refused in etcd's words.

etcd decodes requests with code gogo/protobuf generated; grpc-go passes its error on as INTERNAL
"grpc: error unmarshalling request: <error>" (a unary call) or "grpc: failed to unmarshal the
received message <error>" (a stream's message). shim/gogo.py walks the bytes as that code does.
Valid requests of eight message types (nested messages, oneofs, a packed enum list, strings,
another package's message) are damaged at random: a bit flipped, cut short, bytes inserted or
replaced, a field appended, a tag's wire type changed, or replaced by random bytes. Each is sent
to a real etcd; the walk must give etcd's error exactly, or none where etcd took the bytes. Where
Python's protobuf refuses the bytes too, shardetcd's answer must be etcd's.
"""
from __future__ import annotations

import random

import grpc
import pytest

from proto import auth_pb2, rpc_pb2 as pb, v3election_pb2 as epb
from shim.gogo import camel_case, unmarshal_error
from tests.conftest import require_etcd_binary
from tests.shardetcd_fixture import etcd_and_shardetcd

pytestmark = pytest.mark.timeout(300)

UNARY = "grpc: error unmarshalling request: "
STREAM = "grpc: failed to unmarshal the received message "

REQUESTS = {
    "/etcdserverpb.KV/Range": pb.RangeRequest(
        key=b"fz/a", range_end=b"fz/b", limit=5, serializable=True, keys_only=True, min_mod_revision=1,
        max_create_revision=1000),
    "/etcdserverpb.KV/Put": pb.PutRequest(key=b"fz/p", value=b"v" * 20, prev_kv=True),
    "/etcdserverpb.KV/Txn": pb.TxnRequest(
        compare=[pb.Compare(key=b"fz/c", target=pb.Compare.VERSION, result=pb.Compare.GREATER, version=3)],
        success=[pb.RequestOp(request_put=pb.PutRequest(key=b"fz/t", value=b"x")),
                 pb.RequestOp(request_range=pb.RangeRequest(key=b"fz/t"))],
        failure=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"fz/zz"))]),
    "/etcdserverpb.Lease/LeaseTimeToLive": pb.LeaseTimeToLiveRequest(ID=12345, keys=True),
    "/etcdserverpb.Auth/UserGet": pb.AuthUserGetRequest(name="someone"),
    "/etcdserverpb.Auth/RoleGrantPermission": pb.AuthRoleGrantPermissionRequest(
        name="norole", perm=auth_pb2.Permission(permType=2, key=b"a", range_end=b"b")),
    "/v3electionpb.Election/Leader": epb.LeaderRequest(name=b"noelection"),
    "/etcdserverpb.Watch/Watch": pb.WatchRequest(create_request=pb.WatchCreateRequest(
        key=b"fz/w", range_end=b"fz/x", filters=[0, 1], prev_kv=True, watch_id=7, fragment=True)),
}


def damaged(r: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = r.randrange(7)
    if kind == 0 and b:
        b[r.randrange(len(b))] ^= 1 << r.randrange(8)
    elif kind == 1 and b:
        b = b[:r.randrange(len(b))]
    elif kind == 2:
        i = r.randrange(len(b) + 1)
        b[i:i] = r.randbytes(r.randint(1, 3))
    elif kind == 3 and b:
        b[r.randrange(len(b))] = r.randrange(256)
    elif kind == 4:
        b += bytes([(r.randrange(1, 31) << 3) | r.randrange(8)]) + r.randbytes(r.randint(0, 4))
    elif kind == 5:
        return r.randbytes(r.randint(1, 12))
    elif b:
        b[0] = (b[0] & 0xF8) | r.randrange(8)
    return bytes(b)


def parsed(cls, data: bytes):
    try:
        return cls.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError, or a recursion limit
        return None


def ranges(message):
    if isinstance(message, pb.RangeRequest):
        yield message
    elif isinstance(message, pb.TxnRequest):
        for op in (*message.success, *message.failure):
            if op.HasField("request_range"):
                yield op.request_range
            elif op.HasField("request_txn"):
                yield from ranges(op.request_txn)


def unsafe_for_etcd(path: str, cls, data: bytes) -> bool:
    """etcd 3.5.1 panics (the whole member) on a Range whose sort order or target is unknown;
    such bytes, and Range or Txn bytes whose fields cannot be read here, are not sent to it."""
    message = parsed(cls, data)
    if message is None:
        return path.endswith(("/Range", "/Txn")) and unmarshal_error(cls.DESCRIPTOR, data) is None
    return any(r.sort_order not in (0, 1, 2) or r.sort_target not in range(5) for r in ranges(message))


def answer(channel: grpc.Channel, path: str, data: bytes) -> tuple | None:
    """(code, details) of the call's refusal; None if it was served."""
    try:
        if path.endswith("/Watch"):
            call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)(
                iter([data]), timeout=10)
            next(call)
            call.cancel()
        else:
            channel.unary_unary(path, request_serializer=None, response_deserializer=None)(data, timeout=10)
        return None
    except grpc.RpcError as exc:
        return exc.code(), exc.details()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require_etcd_binary()
    with etcd_and_shardetcd(tmp_path_factory.mktemp("unmarshal")) as both:
        yield both


def test_damaged_requests_refused_in_etcds_words(servers):
    etcd, shard = servers
    r = random.Random(2026)
    compared = refused = through_shardetcd = 0
    with grpc.insecure_channel(etcd.endpoint) as theirs, grpc.insecure_channel(shard.endpoint) as ours:
        for path, request in REQUESTS.items():
            cls, prefix = type(request), STREAM if path.endswith("/Watch") else UNARY
            for _ in range(40):
                data = damaged(r, request.SerializeToString())
                if r.random() < 0.3:
                    data = damaged(r, data)
                if unsafe_for_etcd(path, cls, data):
                    continue
                want = answer(theirs, path, data)
                error = want[1][len(prefix):] if want and want[0] == grpc.StatusCode.INTERNAL and \
                    want[1].startswith(prefix) else None
                assert unmarshal_error(cls.DESCRIPTOR, data) == error, (path, data.hex(), want)
                compared += 1
                refused += error is not None
                if error is not None and parsed(cls, data) is None:  # shardetcd refuses them too
                    assert answer(ours, path, data) == want, (path, data.hex())
                    through_shardetcd += 1
    assert compared > 250 and refused > 150 and through_shardetcd > 100, (compared, refused, through_shardetcd)


def snapshot_refusal(endpoint: str, data: bytes) -> tuple:
    with grpc.insecure_channel(endpoint) as ch:
        with pytest.raises(grpc.RpcError) as info:
            list(ch.unary_stream("/etcdserverpb.Maintenance/Snapshot", request_serializer=None,
                                 response_deserializer=None)(data, timeout=10))
    return info.value.code(), info.value.details()


def test_a_snapshot_request_is_a_streams_message(servers):
    """Snapshot streams its answer, so grpc-go reads its one request as a stream's message."""
    etcd, shard = servers
    for data in (b"\xff\xff\xff", b"\x08"):
        want = snapshot_refusal(etcd.endpoint, data)
        assert want[1].startswith(STREAM) and snapshot_refusal(shard.endpoint, data) == want


@pytest.mark.parametrize("name, go", [("key", "Key"), ("range_end", "RangeEnd"), ("ID", "ID"), ("TTL", "TTL"),
                                      ("peerURLs", "PeerURLs"), ("permType", "PermType"),
                                      ("min_mod_revision", "MinModRevision"), ("request_delete_range",
                                                                               "RequestDeleteRange"),
                                      ("_x", "XX"), ("a_1b", "A_1B")])
def test_field_names_as_gogo_writes_them(name, go):
    assert camel_case(name) == go
