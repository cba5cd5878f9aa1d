"""etcdctl snapshot save → shardetcd snapshot restore → the same data and revisions."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.shardetcd_fixture import ShardetcdProcess, start_shardetcd
from tests.etcd_fixture import client_url_flags, free_port

REPO = Path(__file__).resolve().parents[2]


def everything(ch) -> tuple:
    kv, mt, lease = pbg.KVStub(ch), pbg.MaintenanceStub(ch), pbg.LeaseStub(ch)
    r = kv.Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00"))
    h = mt.HashKV(pb.HashKVRequest())
    leases = sorted(l.ID for l in lease.LeaseLeases(pb.LeaseLeasesRequest()).leases)
    return list(r.kvs), r.header.revision, h.hash, h.compact_revision, leases


def test_snapshot_save_restore_serves_the_same_data(shardetcd, tmp_path):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv, lease = pbg.KVStub(ch), pbg.LeaseStub(ch)
        lid = lease.LeaseGrant(pb.LeaseGrantRequest(TTL=600)).ID
        for i in range(200):
            kv.Put(pb.PutRequest(key=b"/registry/pods/p%d" % (i % 37), value=b"v%d" % i))
            kv.Put(pb.PutRequest(key=b"/registry/events/e%d" % i, value=b"e", lease=lid))
        kv.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/pods/p1", range_end=b"/registry/pods/p2"))
        kv.Compact(pb.CompactionRequest(revision=300, physical=True))
        before = everything(ch)
    snap = tmp_path / "snap.db"
    out = subprocess.run(["/usr/bin/etcdctl", f"--endpoints={shardetcd.endpoint}", "snapshot", "save", str(snap)],
                         capture_output=True, text=True, env={"ETCDCTL_API": "3"}, timeout=60)
    assert out.returncode == 0 and "Snapshot saved at" in out.stdout, out.stderr
    restored = tmp_path / "restored"
    r = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(restored)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"at revision {before[1]}" in r.stdout
    server = ShardetcdProcess(data_dir=restored, state_dir=tmp_path / "state2", port=free_port(),
                              log_path=tmp_path / "restored.log").start()
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            after = everything(ch)
            assert after == before
            t = pbg.LeaseStub(ch).LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lid, keys=True))
            assert len(t.keys) == 200
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"new")).header.revision == before[1] + 1
    finally:
        server.stop()
    # restoring into a data dir that is in use or not empty is refused
    again = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(restored)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "is not empty" in again.stderr


def test_a_snapshot_stream_cut_by_kill_9_needs_no_clean_up(tmp_path):
    """The snapshot is streamed from the shards' RocksDB snapshots, with no
    copy on disk (the former format was written to <data-dir>/tmp first):
    nothing is left behind by a server killed mid-stream, which restarts with
    everything, and a stream the client abandons leaves the server serving."""
    server = start_shardetcd(tmp_path)
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(200):  # 20 MB: more than gRPC lets the server send ahead of the reader
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=os.urandom(100_000)), timeout=10)
            abandoned = pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=30)
            first = next(abandoned)
            assert first.remaining_bytes + len(first.blob) > 20_000_000
            abandoned.cancel()
            kv.Put(pb.PutRequest(key=b"after", value=b"abandoned"), timeout=10)
            stream = pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=30)
            assert next(stream).remaining_bytes > 10_000_000
            before = sorted(p.relative_to(server.data_dir) for p in server.data_dir.rglob("*"))
            assert not [p for p in before if p.parts[0] == "tmp" and len(p.parts) > 1]
            server.kill()
            stream.cancel()
        server.start()
        with grpc.insecure_channel(server.endpoint) as ch:
            r = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"\0", range_end=b"\0", count_only=True))
            assert r.count == 201 and r.header.revision == 202
    finally:
        server.stop()


def _restore(snap: Path, target: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(target)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


def _start_refused(data_dir: Path, tmp_path: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(data_dir), "--state-dir",
                        str(tmp_path / "refused-state"), *client_url_flags(f"http://127.0.0.1:{free_port()}")],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    return lines[0]


def test_an_interrupted_restore_leaves_nothing_a_server_would_serve(shardetcd, tmp_path):
    """issue 18.2: a restore killed between shards leaves no data dir; a dir with
    shard data but no meta.json, or a restored dir missing a shard's checkpoint
    (the default shard: leases and auth), is refused, never served half empty."""
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv, auth = pbg.KVStub(ch), pbg.AuthStub(ch)
        lid = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=600)).ID
        for i in range(30):
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v", lease=lid))
        auth.UserAdd(pb.AuthUserAddRequest(name="root", password="pw"))
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"))
        auth.AuthEnable(pb.AuthEnableRequest())
        token = auth.Authenticate(pb.AuthenticateRequest(name="root", password="pw")).token
        md = (("token", token),)
        snap = tmp_path / "snap.db"
        snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), metadata=md)))

    target = tmp_path / "restored"
    env = {**os.environ, "SHARDETCD_FAILPOINTS": "snapshot.restore_between_shards=exit@2"}
    r = _restore(snap, target, env)
    assert r.returncode == 70 and not target.exists()  # killed after two shards: nothing in place

    partial = tmp_path / "partial"  # what a restore used to leave: some shards, no meta.json
    shutil.copytree(next(tmp_path.glob(".restored.restoring-*")) / "data" / "shards", partial / "shards")
    partial.chmod(0o700)  # as a restore makes it (one open to others is warned about first)
    assert "holds shard data but no meta.json" in _start_refused(partial, tmp_path)

    assert _restore(snap, target).returncode == 0
    default = target / "shards" / "default"
    for ckpt in default.glob("*.ckpt"):
        ckpt.rename(tmp_path / ckpt.name)
    said = _start_refused(target, tmp_path)
    assert "shard(s) default have no checkpoint" in said and "incomplete" in said
    for ckpt in tmp_path.glob("*.ckpt"):
        ckpt.rename(default / ckpt.name)

    server = ShardetcdProcess(data_dir=target, state_dir=tmp_path / "state2", port=free_port(),
                              log_path=tmp_path / "restored.log").start()
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            with pytest.raises(grpc.RpcError) as err:
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"x", value=b"unauthenticated"))
            assert err.value.details() == "etcdserver: user name is empty"
            token = pbg.AuthStub(ch).Authenticate(pb.AuthenticateRequest(name="root", password="pw")).token
            r = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"),
                                     metadata=(("token", token),))
            assert len(r.kvs) == 30 and {kv.lease for kv in r.kvs} == {lid}
    finally:
        server.stop()


def test_a_lost_checkpoint_is_refused_not_served_empty(tmp_path):
    """A shard whose journal was released up to a checkpoint that is then lost
    (deleted by hand, a bad copy) would come up without those keys; the server
    refuses it in one line instead."""
    server = start_shardetcd(tmp_path, extra_args=("--checkpoint-journal-bytes", "65536",
                                                  "--journal-segment-bytes", "16384"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            for i in range(400):
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 50), value=b"v" * 500))
    finally:
        server.stop()
    pods = server.data_dir / "shards" / "pods"
    assert min(int(p.name.split("-")[0], 16) for p in (pods / "journal").glob("*.wal")) > 0, "nothing released"
    for ckpt in pods.glob("*.ckpt"):
        ckpt.unlink()
    said = _start_refused(server.data_dir, tmp_path)
    assert "shard(s) pods was released up to a checkpoint that is missing" in said


def test_a_checkpoint_in_the_wrong_shard_dir_is_one_line(tmp_path):
    server = start_shardetcd(tmp_path, extra_args=("--checkpoint-journal-bytes", "65536"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            for i in range(200):
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v" * 500))
    finally:
        server.stop()
    shards = server.data_dir / "shards"
    for ckpt in (shards / "pods").glob("*.ckpt"):
        shutil.copy(ckpt, shards / "events" / ckpt.name)
    said = _start_refused(server.data_dir, tmp_path)
    assert "belongs to shard" in said and "not to events" in said
