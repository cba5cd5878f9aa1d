"""A real full state dir: the RocksDB state sits on a small tmpfs the test
mounts (CI runs as root) and the writes fill it.

Before: the put whose RocksDB write failed stayed half-applied in the
in-memory index, a list returned one key twice, the shard never took writes
again and /health said true.  Required and checked here: every answer given
while the server ran was consistent (no duplicate key in a list, count equal
to what a full list returns), the server exits non-zero with one line saying
why, and a restart with space serves every acknowledged write.
"""
from __future__ import annotations

import os
import threading

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
from tests.shardetcd_fixture import ShardetcdProcess
from tests.tmpfs import mounted_tmpfs

PODS = b"/registry/pods/default/"
VALUE = os.urandom(60_000)  # incompressible: RocksDB's first 64 MiB memtable flush fills the tmpfs
STOPPED = (grpc.StatusCode.UNAVAILABLE, "etcdserver: server stopped")


@pytest.fixture
def small_tmpfs(tmp_path):
    with mounted_tmpfs(tmp_path / "state-fs", "24m") as mnt:
        yield mnt


class Writer(threading.Thread):
    def __init__(self, endpoint: str, n: int) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.n = endpoint, n
        self.acked: list[tuple[bytes, int]] = []
        self.errors: list[tuple] = []

    def run(self) -> None:
        with grpc.insecure_channel(self.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(5_000):
                key = PODS + b"w%d-%05d" % (self.n, i % 700)  # rewrites too: history rows
                try:
                    self.acked.append((key, kv.Put(pb.PutRequest(key=key, value=VALUE), timeout=20).header.revision))
                except grpc.RpcError as exc:
                    self.errors.append((exc.code(), exc.details()))
                    return


class Lister(threading.Thread):
    """Lists the pods (keys only) and counts them, over and over, checking each answer."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.bad: list[str] = []
        self.lists = 0
        self.errors: list[tuple] = []

    def run(self) -> None:
        with grpc.insecure_channel(self.endpoint) as ch:
            kv = pbg.KVStub(ch)
            while True:
                try:
                    r = kv.Range(pb.RangeRequest(key=PODS, range_end=PODS[:-1] + b"0", keys_only=True), timeout=20)
                    c = kv.Range(pb.RangeRequest(key=PODS, range_end=PODS[:-1] + b"0", count_only=True,
                                                 revision=r.header.revision), timeout=20)
                except grpc.RpcError as exc:
                    self.errors.append((exc.code(), exc.details()))
                    return
                keys = [kv_.key for kv_ in r.kvs]
                if len(set(keys)) != len(keys) or r.count != len(keys) or c.count != len(keys):
                    self.bad.append(f"rev={r.header.revision} keys={len(keys)} unique={len(set(keys))} "
                                    f"count={r.count} count_only={c.count}")
                self.lists += 1


def test_full_state_dir_is_fail_stop_and_loses_nothing(small_tmpfs, tmp_path):
    server = ShardetcdProcess(data_dir=tmp_path / "data", state_dir=small_tmpfs / "state", port=free_port(),
                              log_path=tmp_path / "server.log").start()
    try:
        writers = [Writer(server.endpoint, n) for n in range(4)]
        lister = Lister(server.endpoint)
        for t in (*writers, lister):
            t.start()
        for t in (*writers, lister):
            t.join(240)
        server.proc.wait(30)
        log = server.log_tail(400)
        assert server.returncode == 1, log
        assert lister.bad == [], lister.bad[:5]
        assert lister.lists > 0
        # every client saw either a good answer or etcd's "server stopped" (or the server go away)
        for e in (*lister.errors, *(e for w in writers for e in w.errors)):
            assert e == STOPPED or e[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e
        stopped = [line for line in log.splitlines() if line.startswith("shardetcd: stopped after a state failure")]
        assert len(stopped) == 1 and "No space left on device" in stopped[0], log
        acked = [a for w in writers for a in w.acked]
        assert len(acked) > 100

        server.state_dir = tmp_path / "state"  # a restart with space
        server.start()
        latest: dict[bytes, int] = {}
        for key, rev in acked:
            latest[key] = max(rev, latest.get(key, 0))
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            r = kv.Range(pb.RangeRequest(key=PODS, range_end=PODS[:-1] + b"0", keys_only=True))
            got = {x.key: x.mod_revision for x in r.kvs}
            for key, rev in latest.items():
                assert got.get(key, 0) >= rev, key  # acknowledged, or overwritten by a later (unacked) put
            assert r.count == len(got) == len(r.kvs)
            for key in list(latest)[:20]:  # the keys take writes again
                kv.Put(pb.PutRequest(key=key, value=b"again"), timeout=10)
    finally:
        server.stop()
