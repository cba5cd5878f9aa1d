"""--wal-dir: the local journal on a dir (a disk) of its own, as etcd's WAL.

Every write is made durable in the journal, so the journal is what an operator puts on a
dedicated disk. What must hold: writes acknowledged before a kill are there after it, the
journal is where --wal-dir says and nowhere else, and a start that would not find the real
journal (another dir given, none given, the disk not mounted, a dir another data dir uses) is
refused instead of serving from an empty one.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import client_url_flags, free_port
from tests.shardetcd_fixture import ShardetcdProcess, start_shardetcd

REPO = Path(__file__).resolve().parents[2]
PODS = b"/registry/pods/ns/p%d"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def refused(data: Path, tmp_path: Path, *args: str) -> str:
    """The one line a refused start ends with (exit 2)."""
    r = run("--data-dir", str(data), "--state-dir", str(tmp_path / "other-state"),
            *client_url_flags(f"http://127.0.0.1:{free_port()}"), *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and lines and lines[-1].startswith("shardetcd: "), r.stderr[-1500:]
    return lines[-1]


def put_pods(server, start: int, count: int) -> None:
    with grpc.insecure_channel(server.endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(start, start + count):
            kv.Put(pb.PutRequest(key=PODS % i, value=b"v" * 300), timeout=10)


def pods(server) -> list[bytes]:
    with grpc.insecure_channel(server.endpoint) as ch:
        got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"), timeout=10)
    return [kv.key for kv in got.kvs]


def expected(count: int) -> list[bytes]:
    return sorted(PODS % i for i in range(count))


def test_the_journal_lives_in_the_wal_dir_and_survives_a_kill(tmp_path):
    wal = tmp_path / "wal-disk" / "wal"
    small = ("--journal-segment-bytes", "8192", "--checkpoint-journal-bytes", "20000")
    server = start_shardetcd(tmp_path, extra_args=("--wal-dir", str(wal), *small))
    data = server.data_dir
    try:
        put_pods(server, 0, 200)
    finally:
        server.kill()  # SIGKILL: nothing flushed on the way out
    link = data / "shards" / "pods" / "journal"
    assert link.is_symlink() and os.readlink(link) == str(wal / "pods")
    assert list((wal / "pods").glob("*.wal")), "the segments are in the wal dir"
    assert wal.stat().st_mode & 0o777 == 0o700, "private, as etcd makes its wal dir"
    assert list((data / "shards" / "pods").glob("checkpoint-*.ckpt")), "checkpoints stay in the data dir"
    assert not list(wal.rglob("checkpoint-*")), "and never land in the wal dir"
    in_data = [p for p in data.rglob("*.wal") if not any(d.is_symlink() for d in p.parents)]
    assert not in_data, in_data
    verified = run("journal", "verify", "--data-dir", str(data))
    assert verified.returncode == 0 and "pods: 0" in verified.stdout and "corrupt" not in verified.stdout, verified.stdout
    server.extra_args = (f"-wal-dir={wal}", *small)  # the same dir in Go's flag syntax, as an etcd manifest has it
    server.start()
    try:
        assert pods(server) == expected(200), "every acknowledged write, after a kill"
        put_pods(server, 200, 10)
        assert pods(server) == expected(210)
    finally:
        server.stop()


def test_a_start_that_would_not_find_the_journal_is_refused(tmp_path):
    wal = tmp_path / "wal"
    server = start_shardetcd(tmp_path, extra_args=("--wal-dir", str(wal)))
    data = server.data_dir.absolute()
    other = tmp_path / "other-data"
    try:
        put_pods(server, 0, 20)
        assert refused(other, tmp_path, "--wal-dir", str(wal)) == \
            f"shardetcd: wal dir {wal} is in use by another shardetcd process"
    finally:
        server.stop()
    assert refused(data, tmp_path) == \
        f"shardetcd: data dir {data} keeps its journal in {wal} (its --wal-dir), but this start has no --wal-dir: " \
        f"give --wal-dir {wal}"
    assert refused(data, tmp_path, "--wal-dir", str(tmp_path / "elsewhere")).endswith(f"give --wal-dir {wal}")
    assert not (tmp_path / "elsewhere").exists()
    assert refused(other, tmp_path, "--wal-dir", str(wal)) == \
        f"shardetcd: wal dir {wal} holds the journal of another data dir ({data}): give an empty --wal-dir"
    (wal / "pods").rename(tmp_path / "unmounted")  # the disk is not there: never an empty journal instead
    line = refused(data, tmp_path, "--wal-dir", str(wal))
    assert f"links to {wal / 'pods'}, which is missing: is the wal dir's disk mounted?" in line, line
    assert not (wal / "pods").exists()
    verify = run("journal", "verify", "--data-dir", str(data))
    assert verify.returncode == 1, verify.stdout
    assert f"pods: journal: missing; {data}/shards/pods/journal links to {wal / 'pods'}" in verify.stdout, verify.stdout
    (tmp_path / "unmounted").rename(wal / "pods")
    server.start()
    try:
        assert pods(server) == expected(20)
    finally:
        server.stop()


def test_only_a_data_dir_without_a_journal_takes_up_a_wal_dir(tmp_path):
    server = start_shardetcd(tmp_path)  # its journal in the data dir
    put_pods(server, 0, 5)
    data = server.data_dir.absolute()
    snap = tmp_path / "snap.db"
    with grpc.insecure_channel(server.endpoint) as ch:
        snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=30)))
    server.stop()
    line = refused(data, tmp_path, "--wal-dir", str(tmp_path / "w"))
    assert f"data dir {data} keeps its journal in itself" in line and "snapshot restore" in line, line
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "0000000000000000-0000000000000002.wal").write_bytes(b"x")
    assert refused(tmp_path / "fresh", tmp_path, "--wal-dir", str(busy)) == \
        f"shardetcd: wal dir {busy} is not empty (0000000000000000-0000000000000002.wal) and is not this data " \
        "dir's: give an empty --wal-dir"
    assert refused(tmp_path / "fresh", tmp_path, "--wal-dir", str(tmp_path / "w"), "--journal-url",
                   "nats://127.0.0.1:1") == \
        "shardetcd: --wal-dir places a local journal written by this process: not with --journal-url (the journal " \
        "is in JetStream)"
    # the way over that the refusal names: a restored data dir has checkpoints and no journal yet
    restored = tmp_path / "restored"
    r = run("snapshot", "restore", str(snap), "--data-dir", str(restored))
    assert r.returncode == 0, r.stderr
    moved = ShardetcdProcess(data_dir=restored, state_dir=tmp_path / "moved-state", port=free_port(),
                             log_path=tmp_path / "moved.log", extra_args=("--wal-dir", str(tmp_path / "w"))).start()
    try:
        assert pods(moved) == expected(5)
        put_pods(moved, 5, 1)
    finally:
        moved.stop()
    assert list((tmp_path / "w" / "pods").glob("*.wal")) and (restored / "shards" / "pods" / "journal").is_symlink()


def test_snapshot_restore_takes_etcdutls_command_line_and_its_wal_dir(tmp_path):
    """`shardetcd snapshot restore` with etcdutl's restore command line (--name, --initial-cluster,
    --initial-cluster-token, --initial-advertise-peer-urls, --wal-dir, --skip-hash-check), refused and
    taken as etcdutl 3.5.1 refuses and takes it: the journals then go to the --wal-dir, which the
    server must be started with."""
    from tests.integration.snapkit import ETCDUTL35
    server = start_shardetcd(tmp_path)
    put_pods(server, 0, 7)
    snap = tmp_path / "snap.db"
    with grpc.insecure_channel(server.endpoint) as ch:
        snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=30)))
    server.stop()
    damaged_hash = tmp_path / "damaged-hash.db"
    damaged_hash.write_bytes(snap.read_bytes()[:-1] + bytes([snap.read_bytes()[-1] ^ 1]))
    member = ("--name", "m1", "--initial-cluster", "m1=http://127.0.0.1:2380", "--initial-cluster-token", "tok",
              "--initial-advertise-peer-urls", "http://127.0.0.1:2380")
    existing = tmp_path / "existing-wal"
    existing.mkdir()

    def both(snapshot: Path, *args: str) -> list[tuple[bool, str]]:
        """Each tool's (taken, message) for one command line; its own dirs under tmp_path."""
        got = []
        for tool in ("etcdutl", "shardetcd"):
            argv = [a.replace("TOOL", tool) for a in args]
            cmd = [ETCDUTL35] if tool == "etcdutl" else [sys.executable, "-m", "shim"]
            r = subprocess.run([*cmd, "snapshot", "restore", str(snapshot), *argv], cwd=REPO, capture_output=True,
                               text=True, timeout=60)
            got.append((r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]))
        return got

    name_missing = both(snap, "--data-dir", str(tmp_path / "TOOL-a"), "--name", "m2",
                        "--initial-cluster", "m1=http://127.0.0.1:2380")
    assert [taken for taken, _ in name_missing] == [False, False]
    assert name_missing[0][1] == 'Error: couldn\'t find local name "m2" in the initial cluster configuration'
    assert name_missing[1][1] == 'shardetcd: couldn\'t find local name "m2" in the initial cluster configuration'
    wal_exists = both(snap, "--data-dir", str(tmp_path / "TOOL-b"), "--wal-dir", str(existing))
    assert [taken for taken, _ in wal_exists] == [False, False], wal_exists
    assert wal_exists[0][1] == f'Error: wal-dir "{existing}" exists'
    assert wal_exists[1][1] == f"shardetcd: wal dir {existing} exists: restore needs a new one"
    assert not (tmp_path / "shardetcd-b").exists() and list(existing.iterdir()) == []
    bad_hash = both(damaged_hash, "--data-dir", str(tmp_path / "TOOL-c"))
    assert [taken for taken, _ in bad_hash] == [False, False], bad_hash
    assert [taken for taken, _ in both(damaged_hash, "--data-dir", str(tmp_path / "TOOL-d"), "--skip-hash-check")] \
        == [True, True]
    killed = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir",
                             str(tmp_path / "shardetcd-e"), "--wal-dir", str(tmp_path / "shardetcd-wal")], cwd=REPO,
                            env={**os.environ, "SHARDETCD_FAILPOINTS": "snapshot.restore_between_shards=exit@2"},
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 70 and not (tmp_path / "shardetcd-e").exists()
    assert not (tmp_path / "shardetcd-wal").exists(), "a restore cut short leaves no wal dir to refuse the next one"
    taken = both(snap, "--data-dir", str(tmp_path / "TOOL-e"), "--wal-dir", str(tmp_path / "TOOL-wal"), *member)
    assert [t for t, _ in taken] == [True, True], taken
    assert list((tmp_path / "etcdutl-wal").glob("*.wal")), "etcdutl's WAL went to its --wal-dir"

    data, wal = tmp_path / "shardetcd-e", tmp_path / "shardetcd-wal"
    assert refused(data, tmp_path) == (f"shardetcd: data dir {data} keeps its journal in {wal} (its --wal-dir), "
                                       f"but this start has no --wal-dir: give --wal-dir {wal}")
    restored = ShardetcdProcess(data_dir=data, state_dir=tmp_path / "restored-state", port=free_port(),
                                log_path=tmp_path / "restored.log", extra_args=("--wal-dir", str(wal))).start()
    try:
        assert pods(restored) == expected(7)
        put_pods(restored, 7, 1)
        assert pods(restored) == expected(8)
    finally:
        restored.stop()
    assert list((wal / "pods").glob("*.wal")) and (data / "shards" / "pods" / "journal").is_symlink()
    assert refused(tmp_path / "other-data", tmp_path, "--wal-dir", str(wal)) == \
        f"shardetcd: wal dir {wal} holds the journal of another data dir ({data}): give an empty --wal-dir"
    assert not list(tmp_path.glob(".shardetcd-d.restoring-*"))
