"""The shardetcd test fixture itself: start, serve, restart on the same data
dir and port, SIGKILL and restart; acknowledged writes survive both."""

from __future__ import annotations

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc

pytestmark = pytest.mark.timeout(120)


def kv(endpoint: str):
    channel = grpc.insecure_channel(endpoint)
    return channel, rpc_pb2_grpc.KVStub(channel)


def test_fixture_serves_and_restarts(shardetcd):
    assert shardetcd.running() and shardetcd.pid > 0
    assert shardetcd.endpoint.startswith("127.0.0.1:")
    assert (shardetcd.data_dir / "meta.json").exists()
    ch, stub = kv(shardetcd.endpoint)
    with ch:
        r = stub.Put(pb.PutRequest(key=b"/registry/pods/default/a", value=b"1"), timeout=10)
        stub.Put(pb.PutRequest(key=b"\x00" * 8, value=b"bin"), timeout=10)
        assert r.header.revision == 2
        term = r.header.raft_term
    old_pid, port = shardetcd.pid, shardetcd.port

    shardetcd.restart()  # graceful: SIGTERM
    assert shardetcd.pid != old_pid and shardetcd.port == port
    ch, stub = kv(shardetcd.endpoint)
    with ch:
        got = stub.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00"), timeout=10)
        assert [(x.key, x.value) for x in got.kvs] == [(b"\x00" * 8, b"bin"), (b"/registry/pods/default/a", b"1")]
        assert got.header.revision == 3
        assert got.header.raft_term == term + 1  # like etcd: one more term per restart


def test_kill_then_restart_keeps_acknowledged_writes(shardetcd):
    ch, stub = kv(shardetcd.endpoint)
    with ch:
        for i in range(20):
            stub.Put(pb.PutRequest(key=b"/registry/leases/k%d" % i, value=b"%d" % i), timeout=10)
    assert shardetcd.kill() == -9
    assert not shardetcd.running()
    shardetcd.start()
    ch, stub = kv(shardetcd.endpoint)
    with ch:
        got = stub.Range(pb.RangeRequest(key=b"/registry/leases/", range_end=b"/registry/leases0", count_only=True), timeout=10)
        assert got.count == 20 and got.header.revision == 21


def test_stop_is_graceful_and_idempotent(shardetcd):
    assert shardetcd.stop() == 0
    assert shardetcd.stop() == 0
    assert not shardetcd.running()
