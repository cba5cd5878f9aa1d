"""An etcd snapshot restored into a JetStream journal (three real NATS servers).

A replicated deployment keeps its state in JetStream, not in a data dir: the restore puts each
shard's checkpoint in its stream's bucket and records the journal in the new data dir, so the
writer (and a follower, which loads the same checkpoints) serves the snapshot's keys at its
revision and writes on from there. A prefix whose streams already hold a journal is refused;
a restore cut short leaves nothing a second try would refuse; a data dir restored for the local
journal and started on JetStream is refused with the way over.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc

from journal.jetstream import retrying
from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
from tests.integration.test_lost_journal import refused_start
from tests.nats_fixture import shardetcd_on
from tests.shardetcd_fixture import ShardetcdProcess, start_shardetcd

REPO = Path(__file__).resolve().parents[2]
KEYS = [b"/registry/pods/ns/p%d" % i for i in range(30)] + [b"/registry/leases/kube-node-lease/n%d" % i for i in range(5)] \
    + [b"/registry/configmaps/ns/c%d" % i for i in range(5)]


def restore(snap: Path, data: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(data),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def everything(endpoint: str) -> tuple[int, list[tuple[bytes, bytes, int, int]]]:
    with grpc.insecure_channel(endpoint) as ch:
        r = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00"), timeout=10)
    return r.header.revision, [(kv.key, kv.value, kv.mod_revision, kv.lease) for kv in r.kvs]


def snapshot_of_keys(tmp_path: Path) -> tuple[Path, int, tuple[int, list]]:
    """A snapshot of a shardetcd holding KEYS (every seventh on a lease, one deleted): its path,
    the lease and what the source served."""
    source = start_shardetcd(tmp_path, name="source")
    try:
        with grpc.insecure_channel(source.endpoint) as ch:
            kv = pbg.KVStub(ch)
            lease = pbg.LeaseStub(ch).LeaseGrant(pb.LeaseGrantRequest(TTL=600), timeout=10).ID
            for i, key in enumerate(KEYS):
                kv.Put(pb.PutRequest(key=key, value=b"v%d" % i, lease=lease if i % 7 == 0 else 0), timeout=10)
            kv.DeleteRange(pb.DeleteRangeRequest(key=KEYS[1]), timeout=10)
            snap = tmp_path / "snap.db"
            snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(),
                                                                                        timeout=30)))
        return snap, lease, everything(source.endpoint)
    finally:
        source.stop()


def test_a_snapshot_restores_into_jetstream_and_a_used_prefix_is_refused(nats, tmp_path):
    snap, lease, want = snapshot_of_keys(tmp_path)

    js = ("--journal-url", nats.urls, "--journal-prefix", "restored")
    from tests.integration.test_jetstream_faults import nats_call

    async def stale_release_key(js) -> None:  # as a deployment on the prefix whose streams were deleted leaves it
        # (the cluster just started: its first stream may take a loaded machine more than a request's 10 s)
        bucket = await retrying("bucket", lambda: js.create_key_value(bucket="restored-meta", history=1), deadline_s=60)
        await retrying("put", lambda: bucket.put("released.restored_pods", b"1000"), deadline_s=60)

    nats_call(nats.urls, stale_release_key)
    r = restore(snap, tmp_path / "w" / "data", *js)
    assert r.returncode == 0 and "journals in JetStream, prefix restored" in r.stdout, r.stderr
    assert r.stdout.rstrip().endswith(f"start it with: shardetcd --data-dir {tmp_path / 'w' / 'data'} --journal-url "
                                      f"{nats.urls} --journal-prefix restored"), r.stdout
    assert not list((tmp_path / "w" / "data").rglob("*.ckpt")), "the checkpoints are in JetStream only"
    from shards.layout import load_layout

    async def recorded_layout(js) -> str:
        bucket = await retrying("bucket", lambda: js.key_value("restored-meta"), deadline_s=60)
        return (await retrying("get", lambda: bucket.get("layout.default"), deadline_s=60)).value.decode()

    # what a process with another --shard-layout is refused on (test_jetstream.py)
    assert nats_call(nats.urls, recorded_layout) == load_layout(None).describe()
    writer = shardetcd_on(nats, tmp_path / "w", "--journal-prefix", "restored").start()
    follower = shardetcd_on(nats, tmp_path / "f", "--journal-prefix", "restored", "--follow").start()
    try:
        assert everything(writer.endpoint) == want
        with grpc.insecure_channel(writer.endpoint) as ch:
            rev = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/after", value=b"x"), timeout=10).header.revision
            assert rev == want[0] + 1
            ttl = pbg.LeaseStub(ch).LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease, keys=True), timeout=10)
            assert ttl.TTL > 0 and sorted(ttl.keys) == sorted(KEYS[i] for i in range(0, len(KEYS), 7))
        deadline_rev = rev
        deadline = time.monotonic() + 60  # the follower catches up through the journal (a loaded machine's deadline)
        while True:
            got_rev, got = everything(follower.endpoint)
            if got_rev >= deadline_rev or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got_rev == rev and [k for k in got if k[0] != b"/registry/pods/ns/after"] == want[1]
    finally:
        follower.stop()
        writer.stop()
    # the revisions up to the snapshot's are in the checkpoints alone: none of them is taken for lost
    verified = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", *js], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    assert verified.returncode == 0 and verified.stdout.strip().splitlines()[-1].endswith(": all sound"), \
        verified.stdout + verified.stderr

    # the restore recorded that each stream keeps from its first message (over the stale key): a hand
    # purge of the restored journal is refused at the next start, before any release of its own
    async def purge(js) -> int:
        await js.purge_stream("restored_pods")
        return (await js.stream_info("restored_pods")).state.first_seq

    first = nats_call(nats.urls, purge)
    refused = refused_start(shardetcd_on(nats, tmp_path / "w", "--journal-prefix", "restored"))
    assert refused.startswith(f"shardetcd: journal stream restored_pods starts at message {first}, but its writer "
                              "released only the messages before 1 (key released.restored_pods)"), refused

    again = restore(snap, tmp_path / "again", *js)
    assert again.returncode == 2 and "JetStream stream restored_" in again.stderr and "already holds a journal" in \
        again.stderr and not (tmp_path / "again").exists(), again.stderr

    # cut short after the first shard's checkpoint went up: nothing in place, a second try goes through
    cut = ("--journal-url", nats.urls, "--journal-prefix", "cut")
    env = {**os.environ, "SHARDETCD_FAILPOINTS": "snapshot.restore_between_uploads=exit@1"}
    assert restore(snap, tmp_path / "c" / "data", *cut, env=env).returncode == 70
    assert not (tmp_path / "c" / "data").exists()
    assert restore(snap, tmp_path / "c" / "data", *cut).returncode == 0
    server = shardetcd_on(nats, tmp_path / "c", "--journal-prefix", "cut").start()
    try:
        assert everything(server.endpoint) == want
    finally:
        server.stop()

    # restored for the local journal, started on JetStream: refused, saying how
    assert restore(snap, tmp_path / "l" / "data").returncode == 0
    local = ShardetcdProcess(data_dir=tmp_path / "l" / "data", state_dir=tmp_path / "l" / "state", port=free_port(),
                             log_path=tmp_path / "l.log", extra_args=("--journal-url", nats.urls, "--journal-prefix",
                                                                      "other"))
    r = subprocess.run(local.args(), cwd=REPO, capture_output=True, text=True, timeout=60)  # killed if it serves
    assert r.returncode == 2 and "keeps its journal in local, not nats:other" in r.stderr and \
        "snapshot restore FILE --data-dir NEW --journal-url URLS" in r.stderr, r.stderr[-2000:]
    assert restore(snap, tmp_path / "x", "--journal-url", nats.urls, "--wal-dir", str(tmp_path / "wal")).returncode == 2


def lease_holder(urls: str, prefix: str, key: str = "writer") -> str | None:
    """Who holds the writer lease ``key`` of ``prefix`` (None: nobody, no bucket yet, or NATS did
    not answer in time: a bucket just made may still be electing its leader; callers poll)."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import BucketNotFoundError, KeyNotFoundError

    from tests.integration.test_jetstream_faults import nats_call

    async def read(js) -> str | None:
        try:
            entry = await (await js.key_value(f"{prefix}-writer")).get(key)
            return entry.value.decode() if entry.value else None
        except (BucketNotFoundError, KeyNotFoundError, NatsTimeout):
            return None

    return nats_call(urls, read)


def test_a_server_started_while_a_restore_uploads_does_not_write(nats, tmp_path):
    """A restore into JetStream holds the writer lease from before it checks (again) that the
    streams hold nothing until it has recorded the restored revision: a server started on the
    prefix meanwhile is refused, naming the lease's holder, instead of writing journals the
    restore then fills with checkpoints; the restore completes, and its data dir serves the
    snapshot."""
    snap, _, want = snapshot_of_keys(tmp_path)
    # the window: 20 s after the first upload, ample for a server to start and, the lease's TTL being 1 s,
    # give up on it within 2 s (a loaded machine once took longer than a 10 s window, and that server served)
    env = {**os.environ, "SHARDETCD_FAILPOINTS": "snapshot.restore_between_uploads=pause:20"}
    data = tmp_path / "r" / "data"
    proc = subprocess.Popen([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(data),
                             "--journal-url", nats.urls, "--journal-prefix", "held", "--journal-lease-ttl", "1"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (holder := lease_holder(nats.urls, "held")) is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        early = shardetcd_on(nats, tmp_path / "early", "--journal-prefix", "held")
        r = subprocess.run(early.args(), cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and f"another shardetcd ({holder}) holds the writer lease writer of held" in r.stderr, \
            r.stderr[-2000:]
        assert proc.poll() is None, "refused only once the restore was over: the window was missed"
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    writer = ShardetcdProcess(data_dir=data, state_dir=tmp_path / "r" / "state", port=free_port(),
                              log_path=tmp_path / "r.log", extra_args=("--journal-url", nats.urls, "--journal-prefix",
                                                                       "held")).start()
    try:
        assert everything(writer.endpoint) == want
    finally:
        writer.stop()


def test_a_snapshot_restores_into_the_partitions_jetstream_streams(nats, tmp_path):
    """--cluster-layout with --journal-url: each partition's checkpoint goes to its own stream's
    bucket (<prefix>_<partition>); a partition process started on them serves its keys."""
    source = start_shardetcd(tmp_path, name="source")
    try:
        with grpc.insecure_channel(source.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for key in KEYS:
                kv.Put(pb.PutRequest(key=key, value=b"v"), timeout=10)
            snap = tmp_path / "snap.db"
            snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(),
                                                                                        timeout=30)))
        want_rev, want = everything(source.endpoint)
    finally:
        source.stop()
    layout = tmp_path / "cluster.toml"
    layout.write_text('[[partition]]\nname = "leases"\nresources = ["coordination.k8s.io/leases"]\n\n'
                      '[[partition]]\nname = "main"\ndefault = true\n')
    r = restore(snap, tmp_path / "cluster", "--cluster-layout", str(layout), "--journal-url", nats.urls,
                "--journal-prefix", "parts")
    assert r.returncode == 0, r.stderr
    for name, mine in (("leases", lambda k: k.startswith(b"/registry/leases/")),
                       ("main", lambda k: not k.startswith(b"/registry/leases/"))):
        part = ShardetcdProcess(data_dir=tmp_path / "cluster" / name, state_dir=tmp_path / f"{name}-state",
                                port=free_port(), log_path=tmp_path / f"{name}.log",
                                extra_args=("--journal-url", nats.urls, "--journal-prefix", "parts", "--cluster-layout",
                                            str(layout), "--partition", name)).start()
        try:
            assert everything(part.endpoint) == (want_rev, [k for k in want if mine(k[0])]), name
        finally:
            part.stop()


def test_a_restore_into_jetstream_tells_how_each_checkpoints_upload_goes(nats, tmp_path, monkeypatch):
    """Uploading the checkpoints is a restore's last long step: its progress lines say how much of
    each shard's checkpoint is stored (here a line per 128 KiB chunk, and a line at every chance)."""
    import re

    import journal.jetstream
    from journal.jetstream import JetStreamConfig
    from shards import snapshot
    from shards.layout import Router, load_layout

    source = start_shardetcd(tmp_path, name="source")
    try:
        with grpc.insecure_channel(source.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(3):  # ~300 KB in the pods shard: three chunks
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/big%d" % i, value=os.urandom(100_000)), timeout=10)
            kv.Put(pb.PutRequest(key=b"/registry/configmaps/ns/c", value=b"v"), timeout=10)
            snap = tmp_path / "snap.db"
            snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(),
                                                                                        timeout=30)))
    finally:
        source.stop()
    monkeypatch.setattr(snapshot, "PROGRESS_S", 0.0)
    monkeypatch.setattr(journal.jetstream, "STORE_CHUNKS", 1)
    lines: list[str] = []
    layout = load_layout(None)
    snapshot.restore_snapshot(snap, tmp_path / "data", layout, progress=lines.append,
                              jetstream=JetStreamConfig(urls=tuple(nats.urls.split(",")), prefix="told"))
    stored: dict[str, list[tuple[float, float]]] = {}
    for line in lines:
        if m := re.fullmatch(r"stored ([\d.]+) of ([\d.]+) MB of shard (\w+)'s checkpoint in JetStream \(prefix told\)",
                             line):
            stored.setdefault(m[3], []).append((float(m[1]), float(m[2])))
    assert sorted(stored) == sorted(s.name for s in layout.shards), lines
    assert all(told[-1][0] == told[-1][1] for told in stored.values()), stored  # each to its end
    pods = stored[layout.shards[Router(layout).shard_for_key(b"/registry/pods/ns/big0")].name]
    assert len(pods) == 3 and pods[0][0] <= pods[1][0] <= pods[2][0] == pods[2][1] >= 0.3 > pods[0][0], pods
