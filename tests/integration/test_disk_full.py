"""A real full filesystem: the journal's write fails with ENOSPC.

shardetcd must stop acknowledging (clients get an error, not a hang), exit
non-zero, and after space is given back restart with every acknowledged
write.  The data dir sits on a tmpfs the test mounts (CI runs as root)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.shardetcd_fixture import ShardetcdProcess
from tests.tmpfs import mounted_tmpfs
from tests.etcd_fixture import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_fs(tmp_path):
    with mounted_tmpfs(tmp_path / "fs", "4m") as mnt:
        yield mnt


def test_disk_full_stops_acknowledging_and_loses_nothing(small_fs, tmp_path):
    server = ShardetcdProcess(data_dir=small_fs / "data", state_dir=tmp_path / "state", port=free_port(),
                              log_path=tmp_path / "server.log").start()
    acked: list[tuple[bytes, int]] = []
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                for i in range(10_000):
                    key = b"/registry/events/e%d" % i
                    acked.append((key, kv.Put(pb.PutRequest(key=key, value=b"x" * 4000), timeout=10).header.revision))
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: server stopped")
        assert 100 < len(acked) < 10_000
        server.proc.wait(15)
        assert server.returncode == 1, server.log_tail()
        assert "No space left on device" in server.log_tail(200)
        # a restart on the still-full disk is refused in one line (issue 18.12)
        with open(small_fs / "filler", "wb") as f:  # whatever room the journal left
            with pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
        r = subprocess.run([sys.executable, "-m", "shim", *server.args()[3:]], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert lines[0].startswith("shardetcd: no space left on the disk of") and str(small_fs / "data") in lines[0]
        (small_fs / "filler").unlink()
        subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
        server.start()
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for key, rev in acked:
                kvs = kv.Range(pb.RangeRequest(key=key)).kvs
                assert len(kvs) == 1 and kvs[0].mod_revision == rev, key
            kv.Put(pb.PutRequest(key=b"after", value=b"ok"), timeout=10)
    finally:
        server.stop()
