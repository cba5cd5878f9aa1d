"""shardetcd journal verify / repair on a real data dir, torn and corrupt."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import client_url_flags
from tests.shardetcd_fixture import start_shardetcd

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "journal", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def pods_segment(data_dir: Path) -> Path:
    return sorted((data_dir / "shards" / "pods" / "journal").glob("*.wal"))[-1]


def test_verify_and_repair(shardetcd):
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(20):
            kv.Put(pb.PutRequest(key=b"/registry/pods/p%d" % i, value=b"v" * 50))
    shardetcd.stop()
    data = shardetcd.data_dir
    ok = cli("verify", "--data-dir", str(data))
    assert ok.returncode == 0 and "pods: " in ok.stdout and "ok, 20 records, revs 2..21" in ok.stdout, ok.stdout
    assert "acknowledged: writes up to revision 21 (the writer's watermark), every one in the journals" in ok.stdout
    # the tears below stand for a crash mid-write, whose records were never acknowledged: without the
    # watermark, which says they were (and so calls them lost: test_lost_journal.py)
    (data / "watermark").unlink()
    seg = pods_segment(data)
    size = seg.stat().st_size
    with open(seg, "r+b") as f:  # tear the last record
        f.truncate(size - 7)
    torn = cli("verify", "--data-dir", str(data))
    assert torn.returncode == 0 and "torn tail" in torn.stdout
    assert seg.stat().st_size == size - 7, "verify must not change anything"
    fixed = cli("repair", "--data-dir", str(data))
    assert fixed.returncode == 0 and "ok, 19 records, revs 2..20" in fixed.stdout, fixed.stdout
    assert list(seg.parent.glob("*.broken-*")), "repair keeps a copy of what it cut"
    data_bytes = bytearray(seg.read_bytes())  # flip a bit in the first record
    data_bytes[30] ^= 0x10
    seg.write_bytes(bytes(data_bytes))
    bad = cli("verify", "--data-dir", str(data))
    assert bad.returncode == 1 and "corrupt" in bad.stdout and "offset 0" in bad.stdout, bad.stdout
    refused = cli("repair", "--data-dir", str(data))
    assert refused.returncode == 1 and "cannot repair" in refused.stdout
    start = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(data), "--state-dir", str(data.parent / "s2"),
                            *client_url_flags("http://127.0.0.1:1")], cwd=REPO, capture_output=True, text=True, timeout=60)
    last = start.stderr.strip().splitlines()[-1]
    assert start.returncode == 2 and last.startswith("shardetcd: journal corrupt, refusing to start:"), start.stderr[-800:]
    assert seg.name in last and "offset 0" in last


def test_every_subcommand_answers_odd_dirs_in_one_line(shardetcd, tmp_path):
    """Restored data dirs (shards without a journal yet), empty, missing and
    non-directory paths: a result or one line, never a traceback (issue 18.11)."""
    snap = tmp_path / "snap.db"
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/a", value=b"v"), timeout=10)
        snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=30)))
    restored = tmp_path / "restored"
    r = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(restored)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for command in ("verify", "repair"):
        r = cli(command, "--data-dir", str(restored))
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "pods: no journal yet" in r.stdout and "checkpoint" in r.stdout
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    odd = {
        "empty": "holds no shard journals",
        "missing": "does not exist or is not a directory",
        "a-file": "does not exist or is not a directory",
    }
    for name, said in odd.items():
        for command in ("verify", "repair"):
            r = cli(command, "--data-dir", str(tmp_path / name))
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("shardetcd: ") and said in lines[0]
    for target in ("a-file", "restored"):  # a file, a data dir that is not empty
        r = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir",
                            str(tmp_path / target)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_verify_reports_what_start_up_refuses(tmp_path):
    """A missing middle segment and a released prefix whose checkpoint is gone: verify
    calls both damage (exit 1) in the words start-up refuses them with."""
    server = start_shardetcd(tmp_path, extra_args=("--journal-segment-bytes", "4096"))
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(60):
                kv.Put(pb.PutRequest(key=b"/registry/pods/p%d" % i, value=b"v" * 200), timeout=10)
    finally:
        server.stop()
    data = server.data_dir
    segments = sorted((data / "shards" / "pods" / "journal").glob("*.wal"))
    assert len(segments) >= 3, segments
    assert cli("verify", "--data-dir", str(data)).returncode == 0
    segments[1].unlink()
    gap = cli("verify", "--data-dir", str(data))
    assert gap.returncode == 1, gap.stdout
    line = next(x for x in gap.stdout.splitlines() if x.startswith(f"pods: {segments[2].name}: "))
    assert line.startswith(f"pods: {segments[2].name}: corrupt") and "segment sequence gap: expected seq 1, found 2" in line
    refused = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(data), "--state-dir", str(tmp_path / "s2"),
                              *client_url_flags("http://127.0.0.1:1")], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "segment sequence gap: expected seq 1, found 2" in refused.stderr, refused.stderr[-800:]
    segments[0].unlink()  # now the journal starts at seq 2 with no checkpoint: records were "released" and lost
    lost = cli("verify", "--data-dir", str(data))
    assert lost.returncode == 1 and "pods: journal: corrupt" in lost.stdout and "no sound checkpoint" in lost.stdout, lost.stdout
    refused = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(data), "--state-dir", str(tmp_path / "s3"),
                              *client_url_flags("http://127.0.0.1:1")], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "checkpoint that is missing" in refused.stderr, refused.stderr[-800:]


def test_verify_finds_a_restored_state_whole_in_its_checkpoints(shardetcd, tmp_path):
    """A data dir restored from a snapshot holds the revisions up to the snapshot's in every shard's
    checkpoint and in no journal: verify, after writes on top, finds every acknowledged one kept."""
    from tests.etcd_fixture import free_port
    from tests.shardetcd_fixture import ShardetcdProcess

    snap = tmp_path / "snap.db"
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(20):
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v"), timeout=10)
            kv.Put(pb.PutRequest(key=b"k%d" % i, value=b"v"), timeout=10)
        snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=30)))
    restored = tmp_path / "restored"
    r = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(restored)],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    server = ShardetcdProcess(data_dir=restored, state_dir=tmp_path / "state", port=free_port(),
                              log_path=tmp_path / "restored.log").start()
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            last = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/after", value=b"x"),
                                      timeout=10).header.revision
    finally:
        server.kill()  # (no clean stop: the watermark says what was acknowledged)
    assert last == 42
    r = cli("verify", "--data-dir", str(restored))
    assert r.returncode == 0, r.stdout
    assert f"acknowledged: writes up to revision {last} (the writer's watermark), every one in the journals" in \
        r.stdout.splitlines(), r.stdout
