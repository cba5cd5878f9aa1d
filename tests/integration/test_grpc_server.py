"""Transport-level conformance of shardetcd's gRPC server, for each server implementation.

Every test runs against each ``--grpc-server`` implementation: ``grpcio`` (grpc.aio's
server) and ``native`` (shardetcd's own HTTP/2 transport). The answers asserted are
the ones the grpcio server gives (it matches etcd 3.5 wherever etcd's answer can be
observed; where it does not, a comment says what etcd says instead, and where the
native server gives etcd's answer instead the test says so), so the two
implementations must answer alike: status codes, details strings, what happens to
the connection. Every test ends by checking that the server still answers a Put and
a Range on a new connection.

Some tests talk HTTP/2 over a plain socket (``RawH2``, decoding headers with ``hpack``)
to do what a grpc client will not: send a deadline the client does not enforce
itself, or vanish mid-call. One module-scoped server per implementation serves the
tests; the stop test starts its own.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import socket
import struct
import threading
import time
import urllib.parse
import urllib.request
import uuid

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg, v3lock_pb2 as lpb, v3lock_pb2_grpc as lpbg
from tests.etcd_fixture import free_port
from tests.integration.diffkit import MAX_REQUEST_BYTES
from tests.integration.h2kit import (
    CONTINUATION, DATA, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, FRAME_SIZE_ERROR, GOAWAY, HEADERS, PING, PREFACE,
    SETTINGS, SETTINGS_MAX_FRAME_SIZE, WINDOW_UPDATE, RawH2, RawStream, frame, grpc_message, hpack_literals,
)
from shim import wire
from tests.shardetcd_fixture import start_shardetcd

pytestmark = pytest.mark.timeout(120)

IMPLS = ["grpcio", "native"]

MiB = 1024 * 1024
GRPC_LIMIT = MAX_REQUEST_BYTES + 512 * 1024  # etcd's gRPC receive limit: --max-request-bytes + 512 KiB
RECEIVE_CAP = 16 * MiB  # grpcio's own receive limit in shardetcd (ServerConfig.receive_cap_bytes)
BIG_CLIENT = [("grpc.max_receive_message_length", 64 * MiB), ("grpc.max_send_message_length", 64 * MiB)]
# grpc python shares connections between channels to the same target unless told not to
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
DEADLINE_EXCEEDED = (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def server_args(impl: str) -> tuple[str, ...]:
    """The flags that pick the gRPC server implementation."""
    return ("--grpc-server", impl)


class Served:
    def __init__(self, impl: str, process, metrics_url: str) -> None:
        self.impl, self.process, self.metrics_url = impl, process, metrics_url
        self.endpoint = process.endpoint
        self.host, self.port = "127.0.0.1", process.port


def _start(base, impl: str) -> Served:
    metrics_port = free_port()
    process = start_shardetcd(base, extra_args=(*server_args(impl),
                                                "--listen-metrics-urls", f"http://127.0.0.1:{metrics_port}"))
    return Served(impl, process, f"http://127.0.0.1:{metrics_port}")


@pytest.fixture(scope="module", params=IMPLS)
def server(request, tmp_path_factory):
    served = _start(tmp_path_factory.mktemp(f"grpc-{request.param}"), request.param)
    try:
        yield served
    finally:
        served.process.stop()


# -- helpers -------------------------------------------------------------------------------------


def unique(prefix: str) -> bytes:
    return f"{prefix}/{uuid.uuid4().hex}".encode()


def status(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return exc.code(), exc.details()


def refusal(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return status(info.value)


def assert_serving(server: Served) -> None:
    """A Put and a Range on a new connection succeed (and the process still runs)."""
    assert server.process.running(), f"server exited; log:\n{server.process.log_tail()}"
    key, value = unique("serving"), uuid.uuid4().bytes
    with grpc.insecure_channel(server.endpoint, options=OWN_CONNECTION) as ch:
        kv = pbg.KVStub(ch)
        put = kv.Put(pb.PutRequest(key=key, value=value), timeout=20)
        got = kv.Range(pb.RangeRequest(key=key), timeout=20)
    assert [(k.key, k.value, k.mod_revision) for k in got.kvs] == [(key, value, put.header.revision)]


def scrape(server: Served) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


WATCHERS = ("etcd_debugging_mvcc_watcher_total", ())
WATCH_CANCELED = ("grpc_server_handled_total", (("grpc_code", "Canceled"), ("grpc_method", "Watch"),
                                                ("grpc_service", "etcdserverpb.Watch"), ("grpc_type", "bidi_stream")))


def wait_metrics(server: Served, predicate, timeout: float = 20.0) -> dict:
    """Scrape until ``predicate(metrics)`` holds; fail with the last scrape if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(server)
        if predicate(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never satisfied the condition: watchers={m.get(WATCHERS)} "
                                 f"watch canceled={m.get(WATCH_CANCELED)}")
        time.sleep(0.05)


def no_watchers_left(server: Served) -> None:
    wait_metrics(server, lambda m: m[WATCHERS] == 0)


# -- raw HTTP/2 (tests/integration/h2kit.py) ----------------------------------------------------


def raw_call(server: Served, path: str, message, headers=(), timeout: float = 10.0) -> RawStream:
    """One unary call on a new raw connection, read until its stream ends."""
    conn = RawH2(server).handshake()
    try:
        st = conn.request(1, path, [message], headers)
        conn.pump(lambda: st.ended or st.reset is not None, timeout)
        return st
    finally:
        conn.close()


# -- 1. unary round trips ------------------------------------------------------------------------


def test_unary_round_trips(server):
    key, other = unique("unary"), unique("unary")
    with grpc.insecure_channel(server.endpoint) as ch:
        kv = pbg.KVStub(ch)
        r1 = kv.Put(pb.PutRequest(key=key, value=b"one"), timeout=10)
        r2 = kv.Put(pb.PutRequest(key=key, value=b"two", prev_kv=True), timeout=10)
        assert r2.header.revision == r1.header.revision + 1
        assert (r2.prev_kv.key, r2.prev_kv.value, r2.prev_kv.mod_revision) == (key, b"one", r1.header.revision)
        got = kv.Range(pb.RangeRequest(key=key), timeout=10)
        assert [(k.key, k.value, k.version, k.create_revision) for k in got.kvs] == [
            (key, b"two", 2, r1.header.revision)]
        assert got.count == 1 and got.header.revision == r2.header.revision

        txn = kv.Txn(pb.TxnRequest(
            compare=[pb.Compare(key=key, target=pb.Compare.VALUE, result=pb.Compare.EQUAL, value=b"two")],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=other, value=b"txn")),
                     pb.RequestOp(request_range=pb.RangeRequest(key=key))],
            failure=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key))]), timeout=10)
        assert txn.succeeded and txn.header.revision == r2.header.revision + 1
        assert [k.value for k in txn.responses[1].response_range.kvs] == [b"two"]
        failed = kv.Txn(pb.TxnRequest(
            compare=[pb.Compare(key=key, target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=1)],
            success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=other))]), timeout=10)
        assert not failed.succeeded and failed.header.revision == txn.header.revision
        assert [k.value for k in failed.responses[0].response_range.kvs] == [b"txn"]

        deleted = kv.DeleteRange(pb.DeleteRangeRequest(key=key, prev_kv=True), timeout=10)
        assert deleted.deleted == 1 and [k.value for k in deleted.prev_kvs] == [b"two"]
        assert deleted.header.revision == txn.header.revision + 1
        assert kv.Range(pb.RangeRequest(key=key), timeout=10).kvs == []
        assert kv.DeleteRange(pb.DeleteRangeRequest(key=key), timeout=10).deleted == 0
    assert_serving(server)


# -- 2. big messages -----------------------------------------------------------------------------


def test_big_put_and_big_range_are_byte_exact(server):
    """Messages far over HTTP/2's 16 KiB frames and 64 KiB initial windows, both ways."""
    rnd = random.Random(7)
    key = unique("big")
    value = rnd.randbytes(int(1.2 * MiB))  # under etcd's 1.5 MiB request limit
    prefix = unique("bigrange") + b"/"
    values = {prefix + b"%02d" % i: rnd.randbytes(MiB) for i in range(12)}
    with grpc.insecure_channel(server.endpoint, options=BIG_CLIENT) as ch:
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=key, value=value), timeout=30)
        got = kv.Range(pb.RangeRequest(key=key), timeout=30)
        assert len(got.kvs) == 1 and got.kvs[0].value == value
        for k, v in values.items():
            kv.Put(pb.PutRequest(key=k, value=v), timeout=30)
        whole = kv.Range(pb.RangeRequest(key=prefix, range_end=prefix[:-1] + b"0"), timeout=60)  # ~12 MiB
        assert whole.ByteSize() > 12 * MiB
        assert {k.key: k.value for k in whole.kvs} == values
        assert [k.key for k in whole.kvs] == sorted(values)
    assert_serving(server)


def test_requests_over_the_limits(server):
    """Over etcd's --max-request-bytes: etcd's refusal; over its gRPC limit (2 MiB): grpc-go's words;
    over grpcio's own receive cap (16 MiB): grpcio's words. The connection stays usable."""
    just_over = pb.PutRequest(key=b"k", value=b"B" * (MAX_REQUEST_BYTES + 1))
    under = pb.PutRequest(key=unique("limit"), value=b"u" * (MAX_REQUEST_BYTES - 100))
    over_grpc = pb.PutRequest(key=b"k", value=b"H" * (3 * MiB))
    over_cap = pb.PutRequest(key=b"k", value=b"C" * (17 * MiB))
    with grpc.insecure_channel(server.endpoint, options=BIG_CLIENT) as ch:
        kv = pbg.KVStub(ch)
        assert kv.Put(under, timeout=30).header.revision > 0
        assert refusal(kv.Put, just_over, timeout=30) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                           "etcdserver: request is too large")
        assert refusal(kv.Put, over_grpc, timeout=30) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"grpc: received message larger than max ({over_grpc.ByteSize()} vs. {GRPC_LIMIT})")
        # etcd says "grpc: received message larger than max (17825802 vs. 2097152)" here, and so does the
        # native server, which refuses it before holding it; the grpcio server's own cap (above etcd's so
        # that the handlers can answer in grpc-go's words) answers first, in grpc core's words
        assert refusal(kv.Put, over_cap, timeout=60) == ((
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"SERVER: Received message larger than max ({over_cap.ByteSize()} vs. {RECEIVE_CAP})")
            if server.impl == "grpcio" else (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"grpc: received message larger than max ({over_cap.ByteSize()} vs. {GRPC_LIMIT})"))
        txn = pb.TxnRequest(success=[pb.RequestOp(request_put=just_over)])
        assert refusal(kv.Txn, txn, timeout=30) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                     "etcdserver: request is too large")
        assert kv.Range(pb.RangeRequest(key=under.key), timeout=10).kvs[0].value == under.value  # same channel
    assert_serving(server)


# -- 3. many concurrent calls on one connection --------------------------------------------------


def test_300_concurrent_puts_on_one_channel(server):
    prefix = unique("concurrent") + b"/"

    async def run() -> list[int]:
        async with grpc.aio.insecure_channel(server.endpoint, options=OWN_CONNECTION) as ch:
            kv = pbg.KVStub(ch)
            replies = await asyncio.gather(*(kv.Put(pb.PutRequest(key=prefix + b"%03d" % i, value=b"%d" % i),
                                                    timeout=60) for i in range(300)))
            return [r.header.revision for r in replies]

    revisions = asyncio.run(run())
    assert len(set(revisions)) == 300  # each its own write
    with grpc.insecure_channel(server.endpoint) as ch:
        got = pbg.KVStub(ch).Range(pb.RangeRequest(key=prefix, range_end=prefix[:-1] + b"0"), timeout=10)
    assert {k.key: k.value for k in got.kvs} == {prefix + b"%03d" % i: b"%d" % i for i in range(300)}
    assert sorted(k.mod_revision for k in got.kvs) == sorted(revisions)
    assert_serving(server)


def test_150_concurrent_watch_streams_on_one_channel(server):
    prefix = unique("watchers") + b"/"
    keys = [prefix + b"%03d" % i for i in range(150)]

    async def run() -> dict[bytes, tuple]:
        async with grpc.aio.insecure_channel(server.endpoint, options=OWN_CONNECTION) as ch:
            calls = [pbg.WatchStub(ch).Watch(timeout=60) for _ in keys]
            for call, key in zip(calls, keys):
                await call.write(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)))
            created = await asyncio.gather(*(call.read() for call in calls))
            assert all(r.created and not r.canceled for r in created)
            kv = pbg.KVStub(ch)
            await asyncio.gather(*(kv.Put(pb.PutRequest(key=key, value=key[-3:]), timeout=30) for key in keys))

            async def event(call):
                while True:
                    r = await call.read()
                    assert r is not grpc.aio.EOF, "stream ended"
                    if r.events:
                        return r

            got = await asyncio.wait_for(asyncio.gather(*(event(c) for c in calls)), 60)
            for call in calls:
                call.cancel()
            return {key: [(e.type, e.kv.key, e.kv.value) for e in r.events] for key, r in zip(keys, got)}

    events = asyncio.run(run())
    assert events == {key: [(0, key, key[-3:])] for key in keys}  # 0: PUT
    no_watchers_left(server)
    assert_serving(server)


# -- 4. deadlines --------------------------------------------------------------------------------


def test_deadline_of_a_waiting_lock(server):
    """A Lock waiting behind a holder ends at its deadline and does not keep its place in line."""
    name = unique("lock")
    with grpc.insecure_channel(server.endpoint) as ch:
        lease = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
        locks = lpbg.LockStub(ch)
        held = locks.Lock(lpb.LockRequest(name=name, lease=lease), timeout=10)
        assert held.key == name + b"/" + f"{lease:x}".encode()
        assert refusal(locks.Lock, lpb.LockRequest(name=name), timeout=0.5) == DEADLINE_EXCEEDED
        locks.Unlock(lpb.UnlockRequest(key=held.key), timeout=10)
        lease2 = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
        # the expired waiter's key (on a 60 s lease of its own) would make this wait a minute
        again = locks.Lock(lpb.LockRequest(name=name, lease=lease2), timeout=10)
        assert again.key == name + b"/" + f"{lease2:x}".encode()
        left = pbg.KVStub(ch).Range(pb.RangeRequest(key=name + b"/", range_end=name + b"0"), timeout=10)
        assert [k.key for k in left.kvs] == [again.key]
        locks.Unlock(lpb.UnlockRequest(key=again.key), timeout=10)
    assert_serving(server)


def test_deadline_enforced_by_the_server(server):
    """A grpc-timeout the client does not enforce itself: the server ends the waiting Lock at it
    (trailers-only DEADLINE_EXCEEDED), and the connection goes on serving."""
    name = unique("rawlock")
    with grpc.insecure_channel(server.endpoint) as ch:
        lease = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=60), timeout=10).ID
        held = lpbg.LockStub(ch).Lock(lpb.LockRequest(name=name, lease=lease), timeout=10)
        conn = RawH2(server).handshake()
        try:
            st = conn.request(1, "/v3lockpb.Lock/Lock", [lpb.LockRequest(name=name)], [("grpc-timeout", "300m")])
            conn.pump(lambda: st.ended, timeout=20)
            assert st.trailers_only and st.data == b""
            assert st.status() == (4, "Deadline Exceeded")
            assert dict(st.header_blocks[0])[":status"] == "200"
            key = unique("rawlock-after")
            put = conn.request(3, "/etcdserverpb.KV/Put", [pb.PutRequest(key=key, value=b"v")])
            conn.pump(lambda: put.ended, timeout=10)
            assert put.status() == (0, "")
            assert pb.PutResponse.FromString(put.messages()[0]).header.revision > held.header.revision
        finally:
            conn.close()
        deadline = time.monotonic() + 10
        while True:  # the waiter's key goes (its clean-up may finish just after the answer)
            waiting = pbg.KVStub(ch).Range(pb.RangeRequest(key=name + b"/", range_end=name + b"0"), timeout=10)
            if len(waiting.kvs) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [k.key for k in waiting.kvs] == [held.key]
        lpbg.LockStub(ch).Unlock(lpb.UnlockRequest(key=held.key), timeout=10)
    assert_serving(server)


def test_tiny_and_long_deadlines(server):
    """A deadline already over on arrival: the call gets its answer or DEADLINE_EXCEEDED, nothing
    else (the grpcio server mostly still answers a quick Range, ~97% of the time, where etcd refuses
    it every time; the grpc client itself mostly lets the answer through too). Every grpc-timeout
    unit is understood."""
    key = unique("tiny")
    with grpc.insecure_channel(server.endpoint) as ch:
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=key, value=b"v"), timeout=10)
        for _ in range(100):  # the client's own deadline: linearizable Ranges with a microsecond to go
            try:
                got = kv.Range(pb.RangeRequest(key=key), timeout=0.000001)
            except grpc.RpcError as exc:
                assert status(exc) == DEADLINE_EXCEEDED
            else:
                assert got.kvs[0].value == b"v"
    request = pb.RangeRequest(key=key)
    for timeout in ("1n", "1u"):  # over on arrival: an answer or DEADLINE_EXCEEDED, never anything else
        for _ in range(10):
            st = raw_call(server, "/etcdserverpb.KV/Range", request, [("grpc-timeout", timeout)])
            assert st.ended, vars(st)
            if st.status() == (0, ""):
                assert pb.RangeResponse.FromString(st.messages()[0]).kvs[0].value == b"v"
            else:
                assert st.status() == (4, "Deadline Exceeded") and st.data == b""
    for timeout in ("99999999u", "30000m", "30S", "1M", "1H", "99999999H"):  # (8 digits of "n" is only 0.1 s)
        st = raw_call(server, "/etcdserverpb.KV/Range", request, [("grpc-timeout", timeout)])
        assert st.status() == (0, ""), timeout
        assert pb.RangeResponse.FromString(st.messages()[0]).kvs[0].value == b"v"
    assert_serving(server)


# -- 5. cancellation -----------------------------------------------------------------------------


def test_a_stream_refused_for_an_oversized_message_ends_its_handler(server):
    """A Watch stream whose next request is over the server's receive cap is refused with
    RESOURCE_EXHAUSTED, and the stream's watchers go with it (the handler does not linger)."""
    no_watchers_left(server)
    key = unique("refused")
    requests = [pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)),
                pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"x" * (17 * MiB)))]
    sent = threading.Event()

    def feed():
        yield requests[0]
        sent.wait(30)
        yield requests[1]

    with grpc.insecure_channel(server.endpoint, options=BIG_CLIENT + OWN_CONNECTION) as ch:
        call = pbg.WatchStub(ch).Watch(feed(), timeout=60)
        assert next(call).created
        wait_metrics(server, lambda m: m[WATCHERS] == 1)
        sent.set()
        with pytest.raises(grpc.RpcError) as info:
            for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    no_watchers_left(server)
    assert_serving(server)


def test_cancelled_watch_streams_are_cleaned_up(server):
    no_watchers_left(server)
    before = scrape(server)
    prefix = unique("cancel") + b"/"
    with grpc.insecure_channel(server.endpoint, options=OWN_CONNECTION) as ch:
        calls = []
        for i in range(50):
            call = pbg.WatchStub(ch).Watch(
                iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=prefix + b"%02d" % i))]), timeout=60)
            calls.append(call)
        for call in calls:
            first = next(call)
            assert first.created and not first.canceled
        wait_metrics(server, lambda m: m[WATCHERS] == 50)
        for call in calls:
            call.cancel()
        after = wait_metrics(server, lambda m: m[WATCHERS] == 0 and m[WATCH_CANCELED] >= before[WATCH_CANCELED] + 50)
        assert after[WATCH_CANCELED] == before[WATCH_CANCELED] + 50
        for call in calls:
            assert call.code() == grpc.StatusCode.CANCELLED
        # a new watch on the same channel works
        key = prefix + b"new"
        requests = iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key))])
        call = pbg.WatchStub(ch).Watch(requests, timeout=30)
        assert next(call).created
        pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=b"x"), timeout=10)
        assert [(e.kv.key, e.kv.value) for e in next(call).events] == [(key, b"x")]
        call.cancel()
    no_watchers_left(server)
    assert_serving(server)


# -- 6. malformed request bytes ------------------------------------------------------------------


def test_malformed_request_bytes(server):
    with grpc.insecure_channel(server.endpoint) as ch:
        unary = ch.unary_unary("/etcdserverpb.KV/Range", request_serializer=None, response_deserializer=None)
        # etcd's words, its generated code's error (shim/gogo.py)
        assert refusal(unary, b"\xff\xff\xff", timeout=10) == (
            grpc.StatusCode.INTERNAL, "grpc: error unmarshalling request: unexpected EOF")
        # an empty message is a valid (empty) request
        assert refusal(unary, b"", timeout=10) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided")
        # a client stream's bad message ends the call too, in grpc-go's words for a stream's message
        stream = ch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=None, response_deserializer=None)
        call = stream(iter([b"\xff\xff\xff"]), timeout=10)
        assert refusal(list, call) == (
            grpc.StatusCode.INTERNAL, "grpc: failed to unmarshal the received message unexpected EOF")
        server_stream = ch.unary_stream("/etcdserverpb.Maintenance/Snapshot", request_serializer=None,
                                        response_deserializer=None)
        assert refusal(list, server_stream(b"\xff\xff\xff", timeout=10)) == (
            grpc.StatusCode.INTERNAL, "grpc: failed to unmarshal the received message unexpected EOF")
    assert_serving(server)


def test_writes_sent_together_are_answered_each_on_its_own(server):
    """Puts and Txns whose requests arrive in one read (the native server answers them as one
    batch: shim.handlers.batched) each get their own answer, as they do one by one on grpc.aio's
    server: their own revision, their own refusal, and their own count in etcd's metrics."""
    lease_missing = 0x7EEDBEEF
    keys = [unique("together") for _ in range(4)]
    compare = pb.Compare(key=keys[0], target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=99)
    calls = [  # (path, request bytes, expected (grpc-status, grpc-message) or None for OK)
        ("Put", pb.PutRequest(key=keys[0], value=b"1"), None),
        ("Put", pb.PutRequest(key=b"", value=b"x"), (3, "etcdserver: key is not provided")),
        ("Txn", pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=keys[1], value=b"2"))]), None),
        ("Put", pb.PutRequest(key=keys[2], value=b"3", lease=lease_missing), (5, "etcdserver: requested lease not found")),
        ("Put", b"\xff\xff\xff", (13, "grpc: error unmarshalling request: unexpected EOF")),
        ("Txn", pb.TxnRequest(compare=[compare], failure=[pb.RequestOp(request_range=pb.RangeRequest(key=keys[0]))]),
         None),
        ("Put", pb.PutRequest(key=keys[3], value=b"4", prev_kv=True), None),
    ]

    def counts() -> dict:  # etcd's grpc_server_handled_total of KV's methods: {(method, code): calls}
        return {(dict(labels)["grpc_method"], dict(labels)["grpc_code"]): value
                for (name, labels), value in scrape(server).items()
                if name == "grpc_server_handled_total" and dict(labels).get("grpc_service") == "etcdserverpb.KV"}

    before = counts()
    conn = RawH2(server).handshake()
    try:
        wire, streams = b"", []
        for i, (method, request, _) in enumerate(calls):
            sid = 2 * i + 1
            conn.streams[sid] = st = RawStream()
            streams.append(st)
            body = request if isinstance(request, bytes) else request.SerializeToString()
            wire += frame(HEADERS, END_HEADERS, sid, hpack_literals([
                (":method", "POST"), (":scheme", "http"), (":path", f"/etcdserverpb.KV/{method}"), (":authority", "x"),
                ("content-type", "application/grpc"), ("te", "trailers")])) + frame(DATA, END_STREAM, sid,
                                                                                   grpc_message(body))
        conn.send(wire)  # one write: the server reads every request in one go
        conn.pump(lambda: all(st.ended for st in streams))
    finally:
        conn.close()
    revisions = {}
    for (method, request, expected), st in zip(calls, streams):
        code, message = st.status()
        assert (code, message) == (expected or (0, "")), (method, request)
        if expected is None:
            (answer,) = st.messages()
            reply = (pb.PutResponse if method == "Put" else pb.TxnResponse).FromString(answer)
            revisions[method, request.SerializeToString()] = reply.header.revision
    writes = sorted(revisions.values())
    assert len(set(writes)) == 3 and writes[1] == writes[0] + 1  # the failed compare only read: no revision
    with grpc.insecure_channel(server.endpoint) as ch:
        kv = pbg.KVStub(ch)
        got = {key: kv.Range(pb.RangeRequest(key=key), timeout=10).kvs for key in keys}
    assert got[keys[2]] == [] and [kv.mod_revision for kv in got[keys[0]]] == [
        revisions["Put", calls[0][1].SerializeToString()]]
    after = counts()
    delta = {k: after[k] - before.get(k, 0) for k in after if k[0] != "Range" and after[k] != before.get(k, 0)}
    # grpc-go refuses the undecodable request before its metrics see the call
    assert delta == {("Put", "OK"): 2, ("Put", "InvalidArgument"): 1, ("Put", "NotFound"): 1, ("Txn", "OK"): 2}
    assert_serving(server)


# -- 7. unknown methods and services -------------------------------------------------------------


@pytest.mark.parametrize("path, details", [
    ("/etcdserverpb.KV/Nope", "unknown method Nope for service etcdserverpb.KV"),
    ("/etcdserverpb.Watch/Watchh", "unknown method Watchh for service etcdserverpb.Watch"),
    ("/v3lockpb.Lock/Nope", "unknown method Nope for service v3lockpb.Lock"),
    ("/foo.Bar/Baz", "unknown service foo.Bar"),
    ("/etcdserverpb.KVX/Range", "unknown service etcdserverpb.KVX"),
], ids=["kv_method", "watch_method", "lock_method", "service", "near_service"])
def test_unknown_method_or_service(server, path, details):
    want = (grpc.StatusCode.UNIMPLEMENTED, details)
    with grpc.insecure_channel(server.endpoint) as ch:
        unary = ch.unary_unary(path, request_serializer=None, response_deserializer=None)
        assert refusal(unary, b"", timeout=10) == want
        assert refusal(unary, pb.RangeRequest(key=b"k").SerializeToString(), timeout=10) == want
        bidi = ch.stream_stream(path, request_serializer=None, response_deserializer=None)
        assert refusal(list, bidi(iter([b"", b"x"]), timeout=10)) == want
        server_stream = ch.unary_stream(path, request_serializer=None, response_deserializer=None)
        assert refusal(list, server_stream(b"", timeout=10)) == want
    assert_serving(server)


# -- 8. compression ------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate], ids=["gzip", "deflate"])
def test_compressed_requests(server, compression):
    key, value = unique("gzip"), b"compressible " * 20000
    if compression == grpc.Compression.Deflate and server.impl == "native":
        # etcd's server decompresses gzip only; so does the native server (grpc.aio's takes deflate too)
        with grpc.insecure_channel(server.endpoint, compression=compression, options=OWN_CONNECTION) as ch:
            assert refusal(pbg.KVStub(ch).Put, pb.PutRequest(key=key, value=value), timeout=10) == (
                grpc.StatusCode.UNIMPLEMENTED, 'grpc: Decompressor is not installed for grpc-encoding "deflate"')
        assert_serving(server)
        return
    with grpc.insecure_channel(server.endpoint, compression=compression, options=OWN_CONNECTION) as ch:
        kv = pbg.KVStub(ch)
        put = kv.Put(pb.PutRequest(key=key, value=value), timeout=10)
        got = kv.Range(pb.RangeRequest(key=key), timeout=10)
        assert [(k.value, k.mod_revision) for k in got.kvs] == [(value, put.header.revision)]
        # compressed, a request over etcd's limit is still over it
        too_big = pb.PutRequest(key=key, value=b"z" * (MAX_REQUEST_BYTES + 1))
        assert refusal(kv.Put, too_big, timeout=10) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                         "etcdserver: request is too large")
    with grpc.insecure_channel(server.endpoint, options=OWN_CONNECTION) as ch:  # calls compressed one by one
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=key, value=value[:1000]), timeout=10, compression=compression)
        assert kv.Range(pb.RangeRequest(key=key), timeout=10, compression=compression).kvs[0].value == value[:1000]
    assert_serving(server)


@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip], ids=["plain", "gzip"])
def test_a_stream_carries_many_windows_of_requests(server, compression):
    """One Watch stream sends 12 MiB of requests (48 creates with 256 KiB random keys, three times
    the server's 4 MiB stream window): a client that keeps to the windows it is given is never
    refused (the native server resets a stream that overruns its window, as etcd's does), also
    when its messages are compressed and their wire size is not their size."""
    rng = random.Random(5)
    keys = [rng.randbytes(256 * 1024) for _ in range(48)]

    def requests():
        for key in keys:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key))

    with grpc.insecure_channel(server.endpoint, compression=compression, options=OWN_CONNECTION) as ch:
        created = 0
        stream = pbg.WatchStub(ch).Watch(requests(), timeout=60)
        for response in stream:
            created += response.created
            if created == len(keys):
                stream.cancel()
                break
    assert created == len(keys)
    no_watchers_left(server)
    assert_serving(server)


# -- 9. metadata ---------------------------------------------------------------------------------


def test_custom_metadata_and_ignored_token(server):
    key = unique("metadata")
    # (well under grpc's 8 KiB metadata soft limit, past which grpcio refuses calls at random)
    metadata = [("x-custom", "plain"), ("x-trace-bin", bytes(range(256))), ("x-empty", ""),
                ("x-long", "v" * 1000), *[("x-many", f"value-{i}") for i in range(50)]]
    with grpc.insecure_channel(server.endpoint) as ch:
        kv = pbg.KVStub(ch)
        put = kv.Put(pb.PutRequest(key=key, value=b"m"), metadata=metadata, timeout=10)
        assert kv.Range(pb.RangeRequest(key=key), metadata=metadata, timeout=10).kvs[0].value == b"m"
        # auth is off: a token, even a bogus one, is ignored (etcd 3.5.1 refuses it:
        # UNAUTHENTICATED "etcdserver: invalid auth token")
        for token in ("garbage", "user.42"):
            got = kv.Range(pb.RangeRequest(key=key), metadata=[("token", token)], timeout=10)
            assert got.kvs[0].mod_revision == put.header.revision
        call = pbg.WatchStub(ch).Watch(iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key))]),
                                       metadata=[("token", "garbage"), *metadata], timeout=10)
        assert next(call).created
        call.cancel()
    no_watchers_left(server)
    assert_serving(server)


# -- 10. garbage on the wire ---------------------------------------------------------------------


GARBAGE = {
    "http1_get": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "random_after_preface": PREFACE + random.Random(11).randbytes(4096),
    "random_after_settings": PREFACE + frame(SETTINGS, 0, 0) + random.Random(12).randbytes(4096),
    "oversized_frame": PREFACE + frame(SETTINGS, 0, 0) + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01",
    "wrong_preface": b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + frame(SETTINGS, 0, 0),
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_closes_the_connection(server, name):
    """Not HTTP/2, or not valid HTTP/2: the server closes the connection (the grpcio server sends its
    SETTINGS, then closes; no GOAWAY). etcd, whose port also serves HTTP/1.1, answers the GET with a
    404 and keeps that connection open; so does the native server (its HTTP endpoint does)."""
    conn = RawH2(server)
    try:
        conn.send(GARBAGE[name])
        if name == "http1_get" and server.impl == "native":
            for _ in range(2):  # the connection stays open for the next request
                answer = b""
                while b"404 page not found" not in answer:
                    data = conn._recv(10)
                    assert data, f"no HTTP answer, the connection ended or stayed silent: {answer!r}"
                    answer += data
                assert answer.startswith(b"HTTP/1.1 404 Not Found\r\n"), answer
                conn.send(GARBAGE[name])
        else:
            conn.until_closed(timeout=10)
    finally:
        conn.close()
    assert_serving(server)


def test_an_endless_header_block_is_not_held(server):
    """A HEADERS frame whose block never ends (4 MiB of CONTINUATION frames): the server does not
    serve that call or keep collecting the block; it resets the stream (grpcio, after a
    RESOURCE_EXHAUSTED status) or closes the connection (native: GOAWAY past 1 MiB), and
    serves everyone else meanwhile."""
    conn = RawH2(server).handshake()
    try:
        conn.pump(lambda: conn.settings_seen)  # nothing but CONTINUATION may follow the HEADERS below
        block = hpack_literals([(":method", "POST"), (":scheme", "http"), (":path", "/etcdserverpb.KV/Range"),
                                (":authority", "x"), ("content-type", "application/grpc")])
        conn.send(frame(HEADERS, 0, 1, block))
        filler = frame(CONTINUATION, 0, 1, b"\x00\x01a\x01b" * 3000)  # literal headers a: b, 15 KB a frame
        with contextlib.suppress(OSError):  # the server may close while we still send
            for _ in range(4 * MiB // len(filler)):
                conn.send(filler)
        with contextlib.suppress(AssertionError):
            conn.pump(lambda: 1 in conn.streams and (conn.streams[1].reset is not None or conn.streams[1].ended),
                      timeout=10)
        answered = conn.streams.get(1)
        assert conn.closed or (answered is not None and answered.reset is not None), vars(answered or RawStream())
        assert conn.goaway is None or conn.goaway[1] != 1  # not for a PROTOCOL_ERROR of the test's own
        # no answer to the flooded call, or a refusal (grpcio: trailers-only RESOURCE_EXHAUSTED and a reset)
        assert answered is None or not answered.header_blocks or answered.status()[0] != 0
    finally:
        conn.close()
    assert_serving(server)


def test_a_frame_over_the_max_frame_size_ends_the_connection(server):
    """A whole DATA frame longer than the SETTINGS_MAX_FRAME_SIZE the server announced (16 KiB
    unless it said otherwise; grpcio's server announces 4 MiB): a connection error
    FRAME_SIZE_ERROR (RFC 9113 4.2), not a frame taken. grpcio's server closes while its 4 MiB
    frame is still being sent, and the reset that follows loses its GOAWAY; the native server's
    GOAWAY is read."""
    conn = RawH2(server).handshake()
    try:
        conn.pump(lambda: conn.settings_seen)
        limit = conn.settings.get(SETTINGS_MAX_FRAME_SIZE, 16384)
        conn.request(1, "/etcdserverpb.KV/Put", end_stream=False)
        body = pb.PutRequest(key=unique("frame"), value=b"x" * limit).SerializeToString()
        with contextlib.suppress(OSError):  # the server may close while we still send
            conn.send(frame(DATA, END_STREAM, 1, grpc_message(body)))
        with contextlib.suppress(AssertionError):  # the connection closes after the GOAWAY
            conn.pump(lambda: conn.goaway is not None)
        if conn.goaway is None:
            conn.until_closed(timeout=10)
    finally:
        conn.close()
    if server.impl == "native" or conn.goaway is not None:
        assert conn.goaway is not None and conn.goaway[1] == FRAME_SIZE_ERROR, conn.goaway
    answered = conn.streams[1]  # not served (grpcio tells the call UNAVAILABLE first)
    assert not answered.header_blocks or answered.status()[0] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert_serving(server)


def test_client_trailers_end_a_unary_request(server):
    """A client ending its request with trailers (HEADERS with END_STREAM) instead of an empty DATA
    frame: grpc.aio's server takes the call as complete and answers it; etcd's grpc-go server (and
    the native one, tests/integration/test_http2_differential.py) resets the stream with
    PROTOCOL_ERROR, as a second header block that is not a gRPC request."""
    key = unique("trailers")
    conn = RawH2(server).handshake()
    try:
        st = conn.request(1, "/etcdserverpb.KV/Put", [pb.PutRequest(key=key, value=b"t")], end_stream=False)
        conn.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack_literals([("x-trailer", "1")])))
        conn.pump(lambda: st.ended or st.reset is not None)
    finally:
        conn.close()
    if server.impl == "native":
        assert st.reset == 1 and not st.header_blocks
        assert_serving(server)
        return
    assert st.status() == (0, "") and pb.PutResponse.FromString(st.messages()[0]).header.revision > 0
    with grpc.insecure_channel(server.endpoint) as ch:
        assert pbg.KVStub(ch).Range(pb.RangeRequest(key=key), timeout=10).kvs[0].value == b"t"


# -- 11. clients that vanish mid-call ------------------------------------------------------------


def test_a_range_of_many_rows_arrives_whole_in_protobufs_encoding(server):
    """An answer of several wire.PART_ROWS rows (sent in parts by the native server) is one message,
    byte for byte protobuf's encoding of what the rows read; so is the JSON gateway's."""
    prefix = unique("manyrows") + b"/"
    rows = 2 * wire.PART_ROWS + 300
    rnd = random.Random(5)
    values = {prefix + b"%05d" % i: rnd.randbytes(rnd.randrange(1, 600)) for i in range(rows)}
    end = prefix[:-1] + b"0"
    with grpc.insecure_channel(server.endpoint, options=BIG_CLIENT) as ch:
        kv = pbg.KVStub(ch)
        items = list(values.items())
        for i in range(0, rows, 100):  # etcd's --max-txn-ops is 128
            kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=v))
                                          for k, v in items[i:i + 100]]), timeout=30)
        limit = rows - 100
    request = pb.RangeRequest(key=prefix, range_end=end, limit=limit)
    # a small stream window and frames: the answer's parts go out cut across frame boundaries
    raw = RawH2(server)
    try:
        raw.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 70_001)))
        st = raw.request(1, "/etcdserverpb.KV/Range", [request])
        raw.pump(lambda: st.ended, timeout=60)
        assert st.status() == (0, "") and len(st.messages()) == 1
        message = st.messages()[0]
    finally:
        raw.close()
    got = pb.RangeResponse.FromString(message)
    assert got.SerializeToString() == message  # protobuf's own encoding, field by field in order
    assert [(k.key, k.value) for k in got.kvs] == items[:limit]
    assert got.more and got.count == rows
    body = json.dumps({"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode(),
                       "limit": str(limit)}).encode()
    req = urllib.request.Request(server.metrics_url + "/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        answer = json.loads(r.read())
    assert answer["more"] is True and answer["count"] == str(rows)
    assert [(base64.b64decode(k["key"]), base64.b64decode(k.get("value", ""))) for k in answer["kvs"]] == items[:limit]
    assert_serving(server)


def test_flow_control_windows_are_respected(server):
    """The server sends no more than the client's windows allow, stream and connection, and
    resumes exactly as far as each WINDOW_UPDATE lets it; the answer arrives whole."""
    key, value = unique("flow"), random.Random(7).randbytes(100_000)
    with grpc.insecure_channel(server.endpoint) as ch:
        pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=value), timeout=10)

    def quiet(raw: RawH2) -> None:  # read whatever else comes for a while: nothing may
        with contextlib.suppress(AssertionError):
            raw.pump(lambda: False, timeout=0.7)

    # a stream window of 100 bytes
    raw = RawH2(server)
    raw.auto_credit = False
    try:
        raw.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 100)))
        st = raw.request(1, "/etcdserverpb.KV/Range", [pb.RangeRequest(key=key)])
        raw.pump(lambda: len(st.data) >= 100)
        quiet(raw)
        assert len(st.data) == 100 and not st.ended
        raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1_000)))
        raw.pump(lambda: len(st.data) >= 1_100)
        quiet(raw)
        assert len(st.data) == 1_100 and not st.ended
        raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
        raw.pump(lambda: st.ended)
        assert st.status() == (0, "") and len(st.messages()) == 1
        assert pb.RangeResponse.FromString(st.messages()[0]).kvs[0].value == value
        assert raw.largest_data <= 16_384  # the peer's (default) largest frame
    finally:
        raw.close()
    # the connection's window (65,535 bytes, never raised by this client)
    raw = RawH2(server)
    raw.auto_credit = False
    try:
        raw.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)))
        st = raw.request(1, "/etcdserverpb.KV/Range", [pb.RangeRequest(key=key)])
        raw.pump(lambda: len(st.data) >= 65_535)
        quiet(raw)
        assert len(st.data) == 65_535 and not st.ended
        raw.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
        raw.pump(lambda: st.ended)
        assert st.status() == (0, "") and pb.RangeResponse.FromString(st.messages()[0]).kvs[0].value == value
    finally:
        raw.close()
    assert_serving(server)


def test_pings_as_a_flow_controlled_answer_arrives_are_forgiven(server):
    """grpc-go's clients ping as data arrives (its window estimation), far more often than
    etcd's 5 s minimum: data the server sent since the last ping forgives it, also data that
    waited for a WINDOW_UPDATE. Seen: `etcdctl snapshot save` got GOAWAY ENHANCE_YOUR_CALM
    "too_many_pings" a few ms into the download, 1 in ~40, because only data sent without
    waiting counted."""
    key, value = unique("bdp"), random.Random(8).randbytes(50_000)
    with grpc.insecure_channel(server.endpoint) as ch:
        pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=value), timeout=10)
    raw = RawH2(server)
    raw.auto_credit = False
    try:
        raw.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1_000)))  # a stream window of 1,000 bytes
        st = raw.request(1, "/etcdserverpb.KV/Range", [pb.RangeRequest(key=key)])
        raw.pump(lambda: len(st.data) >= 1_000)
        for i in range(8):  # well within 5 s: each one would be a strike without the data before it
            have = len(st.data)
            raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1_000)))
            raw.pump(lambda: len(st.data) >= have + 1_000)
            raw.send(frame(PING, 0, 0, b"%08d" % i))
        raw.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20)) + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
        raw.pump(lambda: st.ended)
        assert raw.goaway is None
        assert st.status() == (0, "") and pb.RangeResponse.FromString(st.messages()[0]).kvs[0].value == value
    finally:
        raw.close()
    assert_serving(server)


def test_clients_vanishing_mid_call(server):
    no_watchers_left(server)
    key = unique("vanish")
    create = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key))
    # headers only, then gone
    conn = RawH2(server).handshake()
    conn.request(1, "/etcdserverpb.Watch/Watch", end_stream=False)
    conn.close()
    # a request cut off half-way through its message, then gone (reset)
    conn = RawH2(server).handshake()
    conn.request(1, "/etcdserverpb.KV/Put", end_stream=False)
    conn.send(frame(DATA, 0, 1, grpc_message(pb.PutRequest(key=key, value=b"x" * 1000).SerializeToString())[:300]))
    conn.close(reset=True)
    # watchers made, then the connection gone: FIN for some, RST for the others
    conns = []
    for i in range(20):
        conn = RawH2(server).handshake()
        st = conn.request(1, "/etcdserverpb.Watch/Watch", [create], end_stream=False)
        conn.pump(lambda: len(st.messages()) == 1, timeout=10)
        assert pb.WatchResponse.FromString(st.messages()[0]).created
        conns.append(conn)
    wait_metrics(server, lambda m: m[WATCHERS] == 20)
    for i, conn in enumerate(conns):
        conn.close(reset=bool(i % 2))
    no_watchers_left(server)
    with grpc.insecure_channel(server.endpoint) as ch:  # the cut-off Put never happened
        assert pbg.KVStub(ch).Range(pb.RangeRequest(key=key), timeout=10).kvs == []
    assert_serving(server)


# -- 12. stopping with a stream open -------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_stop_with_a_watch_open(tmp_path, impl):
    """The grpcio server ends open Watch streams cleanly (status OK, no message) as it stops, and
    exits 0. (etcd 3.5.1 on SIGTERM drops the connection instead: UNAVAILABLE "Stream removed".)"""
    served = _start(tmp_path, impl)
    try:
        with grpc.insecure_channel(served.endpoint) as ch:
            call = pbg.WatchStub(ch).Watch(iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"w"))]),
                                           timeout=60)
            assert next(call).created
            assert served.process.stop() == 0
            rest = list(call)  # ends without raising
            assert rest == []
            assert (call.code(), call.details()) == (grpc.StatusCode.OK, "")
            with pytest.raises(grpc.RpcError) as info:
                pbg.KVStub(ch).Range(pb.RangeRequest(key=b"w"), timeout=5)
            assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        served.process.stop()


# -- 13. client keepalive pings ------------------------------------------------------------------


class SniffingProxy:
    """Forwards 127.0.0.1:port to the server, counting connections and noting the GOAWAY frames
    the server sends (last stream id, error code, debug data)."""

    def __init__(self, server: Served) -> None:
        self.target = (server.host, server.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.goaways: list[tuple[int, int, bytes]] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        buf = b""
        while True:
            try:
                data = src.recv(1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return
            if not from_server:
                continue
            buf += data
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = int.from_bytes(buf[:3], "big")
                if buf[3] == GOAWAY:
                    p = buf[9:9 + n]
                    with self._lock:
                        self.goaways.append((int.from_bytes(p[:4], "big") & 0x7FFFFFFF,
                                             int.from_bytes(p[4:8], "big"), p[8:]))
                buf = buf[9 + n:]

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()


PINGING = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_permit_without_calls", 1),
           ("grpc.http2.max_pings_without_data", 0), *OWN_CONNECTION]


def test_keepalive_pings_between_calls(server):
    """Pings every second, calls every half second: under etcd's 5 s minimum ping interval, but a
    server that sends data in between does not count them against the client (grpc-go and grpcio
    alike): no GOAWAY, one connection throughout."""
    proxy = SniffingProxy(server)
    key = unique("keepalive")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}", options=PINGING) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=key, value=b"k"), timeout=10)
            end = time.monotonic() + 4
            calls = 0
            while time.monotonic() < end:
                assert kv.Range(pb.RangeRequest(key=key), timeout=10).kvs[0].value == b"k"
                calls += 1
                time.sleep(0.5)
        assert calls >= 7
        assert proxy.goaways == [] and proxy.connections == 1
    finally:
        proxy.close()
    assert_serving(server)


def test_keepalive_pings_while_idle_get_too_many_pings(server):
    """Pings every second on an idle connection: after the strikes grpc allows, the server says
    GOAWAY ENHANCE_YOUR_CALM "too_many_pings" (as etcd does) and closes; the channel reconnects."""
    proxy = SniffingProxy(server)
    key = unique("idle-pings")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}", options=PINGING) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=key, value=b"i"), timeout=10)  # stream 1
            deadline = time.monotonic() + 30
            while not proxy.goaways and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proxy.goaways == [(1, ENHANCE_YOUR_CALM, b"too_many_pings")]
            assert kv.Range(pb.RangeRequest(key=key), timeout=10).kvs[0].value == b"i"
            assert proxy.connections == 2
    finally:
        proxy.close()
    assert_serving(server)
