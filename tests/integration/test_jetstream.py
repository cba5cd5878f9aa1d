"""shardetcd with its journals on a real three-server NATS JetStream cluster
(--journal-url): acknowledged writes survive the loss of the machine (a new
data dir, a new state dir), checkpoints come from the object store, a
standby takes over from a killed writer, a second writer is refused, and
writes wait out a lost NATS quorum."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from journal.jetstream import list_streams, retrying
from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from shards.layout import DEFAULT_LAYOUT_TOML, load_layout
from tests.etcd_fixture import client_url_flags, free_port
from tests.nats_fixture import shardetcd_on as server_on, wait_standing_by

REPO = Path(__file__).resolve().parents[2]




def everything(ch, serializable: bool = False) -> tuple:
    r = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"\x00", range_end=b"\x00", serializable=serializable), timeout=10)
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in r.kvs], \
        r.header.revision


TIMED_OUT = (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")


class Writers:
    """32 clients writing puts and cross-shard txns until the server stops answering
    (with ``through_timeouts``: a write answered etcd's "request timed out" is counted
    and the client goes on); what each had acknowledged, by key: (value, revision)."""

    def __init__(self, endpoint: str, n: int = 32, through_timeouts: bool = False) -> None:
        self.endpoint = endpoint
        self.through_timeouts = through_timeouts
        self.timeouts = 0
        self.errors: list[tuple] = []  # any other error a client stopped on: (code, details)
        self.acks = 0  # writes acknowledged so far
        self.acked: dict[bytes, tuple[bytes, int]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(w,)) for w in range(n)]
        for t in self.threads:
            t.start()

    def run(self, w: int) -> None:
        with grpc.insecure_channel(self.endpoint) as ch:
            kv = pbg.KVStub(ch)
            i = 0
            while not self.stop.is_set():
                i += 1
                value = b"w%d-%d-%s" % (w, i, self.endpoint.encode()) + b"x" * 200
                try:
                    if i % 3:
                        key = b"/registry/pods/ns/w%d-%d" % (w, i % 50)
                        rev = kv.Put(pb.PutRequest(key=key, value=value), timeout=10).header.revision
                        done = [(key, value, rev)]
                    else:  # one revision across the pods and leases shards
                        keys = (b"/registry/pods/ns/t%d" % w, b"/registry/leases/ns/t%d" % w)
                        ops = [pb.RequestOp(request_put=pb.PutRequest(key=k, value=value)) for k in keys]
                        rev = kv.Txn(pb.TxnRequest(success=ops), timeout=10).header.revision
                        done = [(k, value, rev) for k in keys]
                except grpc.RpcError as exc:
                    with self.lock:
                        if self.through_timeouts and (exc.code(), exc.details()) == TIMED_OUT:
                            self.timeouts += 1
                            continue
                        self.errors.append((exc.code(), exc.details()))
                    return
                with self.lock:
                    self.acks += 1
                    for key, v, r in done:
                        if self.acked.get(key, (b"", 0))[1] < r:
                            self.acked[key] = (v, r)

    def join(self) -> dict[bytes, tuple[bytes, int]]:
        self.stop.set()
        for t in self.threads:
            t.join()
        return self.acked


def check_everything_acknowledged(ch, acked: dict[bytes, tuple[bytes, int]]) -> int:
    """Every acknowledged write is there with its revision (or overwritten later);
    no cross-shard txn half applied; returns the revision served."""
    rows, rev = everything(ch)
    got = {k: (v, mod) for k, v, _, mod, _, _ in rows}
    for key, (value, r) in acked.items():
        assert got.get(key, (None, 0))[1] >= r, f"acknowledged write lost: {key!r} at {r}"
        if got[key][1] == r:
            assert got[key][0] == value
    for w in range(32):  # the two halves of each txn carry the same revision and value
        a, b = got.get(b"/registry/pods/ns/t%d" % w), got.get(b"/registry/leases/ns/t%d" % w)
        assert (a is None) == (b is None) and (a is None or a == b)
    assert max(r for _, r in acked.values()) <= rev
    return rev


def test_acknowledged_writes_survive_losing_the_machine(nats, tmp_path):
    """32 writers against a server whose journal is JetStream R3 with small
    checkpoints; kill -9; a server on a fresh data dir and state dir (another
    machine) serves every acknowledged write with its revision, no txn half
    applied, and the revisions go on without a gap."""
    first = server_on(nats, tmp_path / "m1", "--checkpoint-journal-bytes", "65536").start()
    writers = Writers(first.endpoint)
    time.sleep(4)
    first.kill()
    acked = writers.join()
    assert len(acked) > 100
    second = server_on(nats, tmp_path / "m2", "--standby").start(wait=False)  # nothing of m1's disk
    try:
        second.wait_ready(timeout=30)  # once m1's lease lapses
        with grpc.insecure_channel(second.endpoint) as ch:
            rev = check_everything_acknowledged(ch, acked)
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"after", value=b"v"), timeout=10).header.revision == rev + 1
    finally:
        second.stop()


def test_a_standby_takes_over_from_a_killed_writer(nats, tmp_path):
    """A writer and a --standby (which does not serve); kill -9 the writer under
    32 writers; the standby takes the lease, fences the journals and serves the
    same revision sequence with every acknowledged write. Three cycles, each
    with a new standby; the takeover time is printed (goal: under 5 s)."""
    writer = server_on(nats, tmp_path / "n0", "--checkpoint-journal-bytes", "262144").start()
    servers = [writer]
    try:
        for cycle in range(1, 4):
            standby = server_on(nats, tmp_path / f"n{cycle}", "--standby").start(wait=False)
            servers.append(standby)
            time.sleep(1.0)
            assert standby.running() and not standby.answers_range(timeout=0.5), "a standby must not serve"
            writers = Writers(writer.endpoint)
            time.sleep(2.5)
            writer.kill()
            killed = time.monotonic()
            acked = writers.join()
            # once seen failing in CI (cycle 3, no server log kept): say why, should it again
            assert acked, (f"cycle {cycle}: no write acknowledged in 2.5 s before the kill; the clients' errors: "
                           f"{writers.errors[:3]}; the writer's log:\n{writer.log_tail(30)}")
            standby.wait_ready(timeout=30)
            with grpc.insecure_channel(standby.endpoint) as ch:
                kv = pbg.KVStub(ch)
                rev = kv.Put(pb.PutRequest(key=b"first-after-takeover", value=b"%d" % cycle), timeout=30).header.revision
                took = time.monotonic() - killed
                print(f"cycle {cycle}: takeover in {took:.2f} s (kill -9 to the first acknowledged write)")
                assert check_everything_acknowledged(ch, acked) == rev
                assert rev > max(r for _, r in acked.values())
            writer = standby
    finally:
        for s in servers:
            s.kill()


def scrape(port: int, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def followed_revision(port: int) -> int:
    _, body = scrape(port, "/metrics")
    line = next(l for l in body.decode().splitlines() if l.startswith("etcd_debugging_mvcc_current_revision "))
    return int(float(line.split()[1]))


def test_a_standby_keeps_its_state_current_and_says_it_is_a_standby(nats, tmp_path):
    """While it stands by, the standby applies what the writer commits (its
    /metrics revision reaches the writer's), answers /health and /readyz
    "standby" (503) and /livez ok, and does not serve; after the kill it takes
    over from that state without reading the journals again."""
    writer = server_on(nats, tmp_path / "w").start()
    metrics_port = free_port()
    standby = server_on(nats, tmp_path / "s", "--standby", "--listen-metrics-urls",
                        f"http://127.0.0.1:{metrics_port}").start(wait=False)
    try:
        wait_standing_by(standby)
        assert scrape(metrics_port, "/health") == (503, b'{"health":"false","reason":"standby"}\n')
        assert scrape(metrics_port, "/readyz")[0] == 503 and scrape(metrics_port, "/livez") == (200, b"ok")
        assert b"shardetcd_standby 1.0" in scrape(metrics_port, "/metrics")[1]
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(200):  # puts, and txns over two shards
                ops = [pb.RequestOp(request_put=pb.PutRequest(key=k, value=b"%d" % i))
                       for k in (b"/registry/pods/ns/p%d" % i, b"/registry/leases/ns/l%d" % i)]
                header = kv.Txn(pb.TxnRequest(success=ops), timeout=10).header
        rev = header.revision
        deadline = time.monotonic() + 30
        while followed_revision(metrics_port) != rev:
            assert time.monotonic() < deadline, followed_revision(metrics_port)
            time.sleep(0.1)
        assert not standby.answers_range(timeout=0.5)
        reads_before = standby.log_tail(500).count("journal stream read")
        writer.kill()
        standby.wait_ready(timeout=30)
        log = standby.log_tail(500)
        assert f"took over as the writer rev={rev}" in log
        assert log.count("journal stream read") == reads_before  # took over from the state it kept
        with grpc.insecure_channel(standby.endpoint) as ch:
            rows, served = everything(ch)
            assert served == rev and len(rows) == 400
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"after", value=b"v"), timeout=10).header.revision == rev + 1
            status = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=10)
        assert status.leader == status.header.member_id and status.raftTerm > header.raft_term
        # one cluster (its id kept in NATS), another member, a later term
        assert status.header.cluster_id == header.cluster_id and status.header.member_id != header.member_id
        assert scrape(metrics_port, "/health") == (200, b'{"health":"true","reason":""}')
        metrics = scrape(metrics_port, "/metrics")[1].decode()
        assert "shardetcd_standby 0.0" in metrics
        # the JetStream journal's publishes under the local journal's names: latency and batch sizes
        counts = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                  if line.startswith(("etcd_disk_wal_fsync_duration_seconds_count",
                                      'shardetcd_shard_journal_batch_bytes_count{shard="default"}'))}
        assert counts["etcd_disk_wal_fsync_duration_seconds_count"] >= 1
        assert counts['shardetcd_shard_journal_batch_bytes_count{shard="default"}'] >= 1  # the put after takeover
    finally:
        writer.kill()
        standby.kill()


def test_a_second_writer_is_refused_while_the_first_holds_the_lease(nats, tmp_path):
    first = server_on(nats, tmp_path / "a").start()
    try:
        with grpc.insecure_channel(first.endpoint) as ch:
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"k", value=b"first"), timeout=10).header.revision == 2
        second = server_on(nats, tmp_path / "b")
        r = subprocess.run(second.args(), cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "holds the writer lease" in lines[0], r.stderr
        with grpc.insecure_channel(first.endpoint) as ch:
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"k", value=b"still"), timeout=10).header.revision == 3
    finally:
        first.stop()


def test_journals_written_with_one_shard_layout_refuse_a_process_with_another(nats, tmp_path):
    """A data dir remembers its layout, but a JetStream deployment's processes start on new data
    dirs (another machine, a standby). One given another --shard-layout looked for keys in streams
    that do not hold them: here the same shards, pods given to the nodes shard, so every pod was
    looked for in the nodes stream and answered as absent. The first process records the layout
    in the meta bucket; one with another is refused in one line."""
    moved = tmp_path / "pods-in-nodes.toml"
    moved.write_text(DEFAULT_LAYOUT_TOML.replace('resources = ["pods"]', 'resources = ["replicasets"]')
                     .replace('resources = ["minions"]', 'resources = ["minions", "pods"]'))
    first = server_on(nats, tmp_path / "a", "--checkpoint-journal-bytes", "2000").start()
    try:
        with grpc.insecure_channel(first.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p", value=b"pod"), timeout=10)
            for i in range(40):  # the default shard checkpoints past the pod's revision
                kv.Put(pb.PutRequest(key=b"/registry/configmaps/ns/c%d" % i, value=b"v" * 200), timeout=10)
    finally:
        first.stop()
    for flags in ((), ("--standby",)):
        other = server_on(nats, tmp_path / f"b{len(flags)}", "--shard-layout", str(moved), *flags)
        r = subprocess.run(other.args(), cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and lines[-1] == (
            f"shardetcd: the journals of default (shardetcd) were written with the shard layout "
            f"{load_layout(None).describe()} (shard, resources), not {load_layout(moved).describe()}: moving keys "
            "between shards is not supported. Start with the layout they were written with (--shard-layout), or "
            "take a snapshot and restore it into the new layout under a new --journal-prefix"), r.stderr[-3000:]
    again = server_on(nats, tmp_path / "c").start()  # the layout they were written with, on a new data dir
    try:
        with grpc.insecure_channel(again.endpoint) as ch:
            assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10).kvs[0].value == b"pod"
    finally:
        again.stop()


def test_a_journal_stream_that_would_drop_records_is_refused(nats, tmp_path):
    """A journal keeps every message until its writer releases it after a checkpoint. A stream
    edited since (`nats stream edit --max-age`), or made beforehand by someone else with memory
    storage, drops acknowledged records in silence: as its limits bite, or on a NATS restart. A
    process refuses such a stream in one line, naming the setting; with the limit removed it
    serves everything it had. A writer whose stream is edited so while it writes stops writing."""
    from nats.js.api import StorageType, StreamConfig

    from tests.integration.test_jetstream_faults import nats_call

    first = server_on(nats, tmp_path / "a").start()
    try:
        with grpc.insecure_channel(first.endpoint) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/p", value=b"pod"), timeout=10)
    finally:
        first.stop()

    async def set_max_age(js, seconds: float) -> None:
        info = await js.stream_info("shardetcd_pods")
        info.config.max_age = seconds
        await js.update_stream(info.config)

    def refused(server) -> str:
        r = subprocess.run(server.args(), cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        return lines[-1]

    nats_call(nats.urls, lambda js: set_max_age(js, 3600))
    assert refused(server_on(nats, tmp_path / "a")) == (
        "shardetcd: JetStream stream shardetcd_pods would drop acknowledged records: max_age 3600 s. A journal keeps "
        "every message until its writer releases it after a checkpoint: remove the limits (`nats stream edit "
        "shardetcd_pods`), or, for memory storage or another retention, restore a snapshot under a new --journal-prefix")
    verify = subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--journal-url", nats.urls], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 1 and [line for line in verify.stdout.splitlines() if "would drop" in line] == [
        "pods: stream shardetcd_pods: would drop records, 3 messages (seq 1..3), 1 records, 1 fences, 1 cuts, revs 2..2; "
        "it would drop acknowledged records: max_age 3600 s"], verify.stdout
    nats_call(nats.urls, lambda js: set_max_age(js, 0))
    again = server_on(nats, tmp_path / "a").start()
    try:
        with grpc.insecure_channel(again.endpoint) as ch:
            assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10).kvs[0].value == b"pod"
        nats_call(nats.urls, lambda js: set_max_age(js, 3600))  # edited while a writer writes it: it stops writing
        deadline = time.monotonic() + 60
        while again.running():
            assert time.monotonic() < deadline, again.log_tail(30)
            time.sleep(0.2)
        assert again.returncode == 1
        assert "journal stream edited to drop records, stopping writes stream=shardetcd_pods error=JetStream stream " \
               "shardetcd_pods would drop acknowledged records: max_age 3600 s." in again.log_tail(50)
    finally:
        again.stop()
    nats_call(nats.urls, lambda js: set_max_age(js, 0))

    async def made_in_memory(js) -> None:
        await retrying("add stream", lambda: js.add_stream(StreamConfig(
            name="mem_events", subjects=["journal.mem_events"], num_replicas=3, storage=StorageType.MEMORY)),
            deadline_s=60)

    nats_call(nats.urls, made_in_memory)
    assert refused(server_on(nats, tmp_path / "m", "--journal-prefix", "mem", "--standby")).startswith(
        "shardetcd: JetStream stream mem_events would drop acknowledged records: memory storage (a NATS restart "
        "empties it). ")


def test_journals_on_nats_servers_that_require_tls_and_client_certificates(tmp_path):
    """Production NATS clusters run TLS, with a private CA, often verifying client certificates.
    The server, `journal verify` and the cluster supervisor reach them with the NATS servers' CA
    and a client certificate; without them a start is one line at once, saying which is missing."""
    from tests.nats_fixture import start_nats_cluster
    from tests.tls_certs import journal_tls_flags, make_pki, nats_server_tls_flags

    pki = make_pki(tmp_path / "pki")
    nats = start_nats_cluster(tmp_path / "nats", size=1, extra=nats_server_tls_flags(pki))
    tls = journal_tls_flags(pki)
    try:
        for flags, said in (((), "SSLCertVerificationError"),  # none: the system's CAs do not know theirs
                            (tls[:2], "ClientCertificateRequired")):  # the CA without a client certificate
            r = subprocess.run(server_on(nats, tmp_path / "x", "--journal-replicas", "1", *flags).args(), cwd=REPO,
                               capture_output=True, text=True, timeout=60)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and lines[-1].startswith(f"shardetcd: NATS at {nats.urls} refused this process: "
                                                              f"{said}("), r.stderr[-3000:]
            assert "--journal-trusted-ca-file" in lines[-1] if not flags else "--journal-cert-file" in lines[-1]
        server = server_on(nats, tmp_path / "a", "--journal-replicas", "1", *tls).start()
        try:
            with grpc.insecure_channel(server.endpoint) as ch:
                assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/p", value=b"v"),
                                          timeout=10).header.revision == 2
        finally:
            server.stop()
        verify = [sys.executable, "-m", "shim", "journal", "verify", "--journal-url", nats.urls]
        checked = subprocess.run([*verify, *tls], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0 and "pods: stream shardetcd_pods: ok, " in checked.stdout, \
            (checked.stdout, checked.stderr)
        plain = subprocess.run(verify, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert plain.returncode == 2 and plain.stderr.startswith(
            f"shardetcd: NATS at {nats.urls} refused this process: SSLCertVerificationError("), plain.stderr
        no_cert = subprocess.run([*verify, *tls[:2]], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert no_cert.returncode == 2 and no_cert.stderr.startswith(
            f"shardetcd: NATS at {nats.urls} refused this process: ClientCertificateRequired("), no_cert.stderr
        again = server_on(nats, tmp_path / "b", "--journal-replicas", "1", *tls).start()  # a new machine
        try:
            with grpc.insecure_channel(again.endpoint) as ch:
                assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10).kvs[0].value == b"v"
        finally:
            again.stop()

        from tests.integration.test_cluster import Cluster

        (tmp_path / "c").mkdir()
        cluster = Cluster(tmp_path / "c")  # the supervisor asks NATS about the layout first, then each partition
        cluster.argv += ["--journal-url", nats.urls, "--journal-prefix", "c", "--journal-replicas", "1", *tls]
        cluster.start()
        try:
            with grpc.insecure_channel(cluster.endpoint("events")) as ch:
                assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/events/ns/e", value=b"v"),
                                          timeout=10).header.revision == 2
        finally:
            cluster.stop()
    finally:
        nats.stop()


def test_a_renewed_nats_client_certificate_is_presented_at_the_next_reconnect(tmp_path):
    """The NATS connection's client certificate is renewed on disk while the writer runs, and the
    one loaded at start expires; then the NATS server restarts. The writer reconnects with the
    renewed certificate and goes on (with the expired one, every reconnect's handshake was refused
    and the writer could journal nothing until restarted)."""
    import datetime
    import shutil

    from tests.nats_fixture import start_nats_cluster
    from tests.tls_certs import client_cert, make_pki, nats_server_tls_flags

    pki = make_pki(tmp_path / "pki")
    nats = start_nats_cluster(tmp_path / "nats", size=1, extra=nats_server_tls_flags(pki))
    cert, key = tmp_path / "live" / "client.pem", tmp_path / "live" / "client-key.pem"
    cert.parent.mkdir()
    first = client_cert(pki, cert, key, valid_for=datetime.timedelta(seconds=15))
    server = server_on(nats, tmp_path / "a", "--journal-replicas", "1", "--journal-trusted-ca-file", str(pki["ca"]),
                       "--journal-cert-file", str(cert), "--journal-key-file", str(key))
    try:
        server.start()
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p", value=b"1"), timeout=10)
            client_cert(pki, tmp_path / "next.pem", tmp_path / "next-key.pem")  # renewed as a tool does it:
            shutil.move(tmp_path / "next-key.pem", key)  # whole files moved into place
            shutil.move(tmp_path / "next.pem", cert)
            while datetime.datetime.now(datetime.timezone.utc) <= first.not_valid_after_utc + datetime.timedelta(seconds=1):
                time.sleep(0.5)
            nats.kill(0)
            nats.start(0)
            deadline = time.monotonic() + 60
            while True:
                try:
                    put = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p", value=b"2"), timeout=10)
                    break
                except grpc.RpcError as exc:
                    assert time.monotonic() < deadline, f"no write after the reconnect: {exc}\n{server.log_tail()}"
                    time.sleep(0.5)
            assert kv.Range(pb.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10).kvs[0].mod_revision == \
                put.header.revision
    finally:
        server.stop()
        nats.stop()


def test_an_unreachable_journal_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(tmp_path / "d"), "--state-dir",
                        str(tmp_path / "s"), *client_url_flags(f"http://127.0.0.1:{free_port()}"),
                        "--journal-url", f"nats://127.0.0.1:{free_port()}"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("shardetcd: cannot reach NATS at"), r.stderr


def test_writes_time_out_without_a_quorum_and_resume_with_it(nats, tmp_path):
    """Two of three NATS servers killed: a write is answered etcd's "request
    timed out" (never acknowledged); serializable reads keep being served, a
    linearizable one is answered "request timed out" too (the writer lease cannot
    be confirmed without a quorum, as an etcd member without one cannot confirm its
    leadership); the servers come back, the write lands once, and writes go on."""
    server = server_on(nats, tmp_path / "a").start()
    try:
        with grpc.insecure_channel(server.endpoint) as ch:
            kv = pbg.KVStub(ch)
            assert kv.Put(pb.PutRequest(key=b"k", value=b"v1"), timeout=10).header.revision == 2
            nats.kill(1)
            nats.wait_ready([0, 2], timeout=60)
            nats.wait_stream_leaders([0, 2])  # the two left re-elect the streams' leaders (NATS's own time)
            assert kv.Put(pb.PutRequest(key=b"k", value=b"one down"), timeout=10).header.revision == 3
            nats.kill(2)
            with pytest.raises(grpc.RpcError) as err:
                kv.Put(pb.PutRequest(key=b"k", value=b"no quorum"), timeout=30)
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
            r = kv.Range(pb.RangeRequest(key=b"k", serializable=True), timeout=10)
            assert [kv_.value for kv_ in r.kvs] == [b"one down"] and r.header.revision == 3
            with pytest.raises(grpc.RpcError) as err:
                kv.Range(pb.RangeRequest(key=b"k"), timeout=30)
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out")
            nats.start(1)
            nats.start(2)
            assert kv.Put(pb.PutRequest(key=b"k", value=b"back"), timeout=60).header.revision == 5
            history = [kv.Range(pb.RangeRequest(key=b"k", revision=rev), timeout=10).kvs[0].value for rev in (3, 4, 5)]
            assert history == [b"one down", b"no quorum", b"back"]
        assert "journal publish not acknowledged, retrying" in server.log_tail(200)
    finally:
        server.stop()


def test_cluster_partitions_each_hold_their_own_lease_and_survive_a_kill(nats, tmp_path):
    """`shardetcd cluster --journal-url`: every partition is a writer of its own
    streams under its own lease; a SIGKILLed partition is restarted by the
    supervisor, waits for its lease to lapse and serves again, losing nothing."""
    import os
    import signal

    from tests.integration.test_cluster import Cluster

    cluster = Cluster(tmp_path)
    cluster.argv += ["--journal-url", nats.urls]
    cluster.start()
    try:
        prefixes = {"leases": b"/registry/leases/ns/", "events": b"/registry/events/ns/", "main": b"/registry/pods/ns/"}
        acked = {}
        for name, prefix in prefixes.items():
            with grpc.insecure_channel(cluster.endpoint(name)) as ch:
                for i in range(20):
                    acked[prefix + b"k%d" % i] = pbg.KVStub(ch).Put(
                        pb.PutRequest(key=prefix + b"k%d" % i, value=name.encode()), timeout=10).header.revision
        os.kill(cluster.child_pids["main"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "serving again partition=main" not in cluster.output():
            assert time.monotonic() < deadline, cluster.output()
            time.sleep(0.1)
        for name, prefix in prefixes.items():
            with grpc.insecure_channel(cluster.endpoint(name)) as ch:
                got = pbg.KVStub(ch).Range(pb.RangeRequest(key=prefix, range_end=prefix[:-1] + b"0"), timeout=10)
                assert {kv.key: kv.mod_revision for kv in got.kvs} == {k: r for k, r in acked.items() if k.startswith(prefix)}
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/after", value=b"v"), timeout=10).header.revision == 22
    finally:
        cluster.stop()


def test_a_layout_that_drops_a_jetstream_partition_holding_data_is_refused(nats, tmp_path):
    """A partition's journal on JetStream is in NATS, not in its data dir, so the supervisor's
    look at the data dirs cannot see a dropped partition's data: it asks JetStream. A layout that
    drops a partition whose stream holds a record is refused, naming the stream; one that drops a
    partition that never took a write (its stream holds only the writer's fence and cut marker)
    starts."""
    from tests.etcd_fixture import free_port
    from tests.integration.test_cluster import Cluster
    from tests.integration.test_jetstream_faults import nats_call

    cluster = Cluster(tmp_path)
    cluster.argv += ["--journal-url", nats.urls]
    original = cluster.layout.read_text()
    extra = free_port()
    with_cms = original + f'\n[[partition]]\nname = "cms"\nresources = ["configmaps"]\nport = {extra}\n'
    cluster.layout.write_text(with_cms)
    cluster.ports["cms"] = extra
    cluster.start()
    try:
        with grpc.insecure_channel(cluster.endpoint("events")) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/events/ns/e1", value=b"v"), timeout=10)
    finally:
        cluster.stop()

    def start_with(layout: str) -> subprocess.CompletedProcess:
        cluster.layout.write_text(layout)
        return subprocess.run(cluster.argv, capture_output=True, text=True, timeout=120)

    dropped = start_with(with_cms.replace('name = "events"\nresources = ["events"]',
                                          'name = "leases2"\nresources = ["coordination.k8s.io/leases2"]'))
    assert dropped.returncode == 2 and dropped.stderr.strip().splitlines()[-1].startswith(
        "shardetcd cluster: JetStream stream shardetcd_events holds the data of partition events, which the cluster "
        "layout no longer has"), dropped.stderr[-3000:]
    async def messages(js) -> int:
        return (await js.stream_info("shardetcd_cms")).state.messages

    assert nats_call(nats.urls, messages) >= 2  # cms's writer fenced its stream and marked its cut
    cluster.layout.write_text(original)  # cms dropped: it never took a write
    cluster.start()
    try:
        with grpc.insecure_channel(cluster.endpoint("events")) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/events/ns/e1"), timeout=10)
            assert [kv.value for kv in got.kvs] == [b"v"]
    finally:
        cluster.stop()


def test_cluster_standbys_take_over_their_partition_on_the_same_url(nats, tmp_path):
    """`shardetcd cluster --journal-url ... --standbys`: two processes per
    partition, one serving, one following; SIGKILL the one serving a
    partition: one of its processes takes over and serves the same URL with
    every acknowledged write and the next revision, and the killed one comes
    back as a standby (it may also win the lease race itself, after following)."""
    import os
    import re
    import signal

    from tests.integration.test_cluster import Cluster

    cluster = Cluster(tmp_path)
    cluster.argv += ["--journal-url", nats.urls, "--standbys"]
    cluster.start()
    # which of a partition's two processes (DIR/<name>, DIR/<name>.2) took the lease first is a race
    standbys = {m[0]: (m[0] + m[1], int(m[2])) for m in re.findall(r"^  (\w+)(\.2)?\s+standby for \S+\s+pid (\d+)",
                                                                   cluster.output(), re.M)}
    standby_pids = {name: pid for name, (_, pid) in standbys.items()}
    try:
        assert set(standby_pids) == {"leases", "events", "main"}
        acked = {}
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            for i in range(50):
                key = b"/registry/pods/ns/k%d" % i
                acked[key] = pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=b"v"), timeout=10).header.revision
        standby_label = standbys["main"][0]
        writer_label = "main.2" if standby_label == "main" else "main"
        log_before = (cluster.data_dir / f"{writer_label}.log").stat().st_size
        os.kill(cluster.child_pids["main"], signal.SIGKILL)
        killed = time.monotonic()
        deadline = killed + 30
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            kv = pbg.KVStub(ch)
            while True:
                try:
                    rev = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/after", value=b"v"), timeout=2).header.revision
                    break
                except grpc.RpcError:
                    assert time.monotonic() < deadline, cluster.output()
                    time.sleep(0.1)
            took = time.monotonic() - killed
            got = kv.Range(pb.RangeRequest(key=b"/registry/pods/ns/", range_end=b"/registry/pods/ns0"), timeout=10)
        print(f"partition takeover in {took:.2f} s")
        assert rev == max(acked.values()) + 1
        assert {kv_.key: kv_.mod_revision for kv_ in got.kvs if kv_.key in acked} == acked
        # the killed process is restarted as a standby; it or the standby that was following took over
        def logs() -> tuple[str, str]:
            return ((cluster.data_dir / f"{standby_label}.log").read_text(),
                    (cluster.data_dir / f"{writer_label}.log").read_text()[log_before:])

        while "standing by, following" not in logs()[1]:
            assert time.monotonic() < deadline, cluster.output()
            time.sleep(0.1)
        assert sum("took over as the writer" in log for log in logs()) == 1, logs()
    finally:
        cluster.stop()
        for pid in standby_pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_stopped_partition_writer_is_replaced_on_its_url_while_it_holds_it(nats, tmp_path):
    """`shardetcd cluster --standbys`: the process serving a partition stops (SIGSTOP: as one hung
    where it would not notice it was deposed) and keeps holding the partition's URL. Its standby
    takes the writer lease over, finds the URL held, says so, and the supervisor kills the stopped
    process (deposed: the lease and the journals are the standby's), so that the standby serves the
    URL with every acknowledged write while the old one would still be stopped. Before, the standby
    exited on the held URL and the partition served nobody until the stopped process went on."""
    import os
    import signal

    from tests.chaos_cluster import _alive, served_again
    from tests.integration.test_cluster import Cluster

    cluster = Cluster(tmp_path)
    cluster.argv += ["--journal-url", nats.urls, "--standbys"]
    cluster.start()
    pids = dict(cluster.child_pids)
    try:
        acked = {}
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            for i in range(20):
                key = b"/registry/pods/ns/k%d" % i
                acked[key] = pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=b"v"), timeout=10).header.revision
        stopped = cluster.child_pids["main"]
        os.kill(stopped, signal.SIGSTOP)
        try:
            served_again(cluster.endpoint("main"), 30.0)
            killed = not _alive(stopped)
        finally:
            if _alive(stopped):
                os.kill(stopped, signal.SIGCONT)
        assert killed, cluster.output()[-3000:]
        assert "killing the process it took over from partition=main" in cluster.output(), cluster.output()[-3000:]
        with grpc.insecure_channel(cluster.endpoint("main")) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/", range_end=b"/registry/pods/ns0"),
                                       timeout=10)
        assert {kv.key: kv.mod_revision for kv in got.kvs} == acked
    finally:
        cluster.stop()
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def test_more_replicas_than_a_lone_nats_server_has_is_refused_in_one_line(tmp_path):
    """A single NATS server (not clustered) refuses a stream of 3 replicas, the default: the start
    says so in one line, naming --journal-replicas 1 (it was a traceback); with it, it serves."""
    from tests.nats_fixture import start_nats_cluster

    lone = start_nats_cluster(tmp_path / "nats", size=1)
    try:
        server = server_on(lone, tmp_path / "s")
        r = subprocess.run(server.args(), capture_output=True, text=True, timeout=60,
                           cwd=Path(__file__).resolve().parents[2])  # killed by run() if it serves
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and lines[-1].startswith("shardetcd: JetStream refused to create the ") and \
            "replicas > 1 not supported in non-clustered mode" in lines[-1] and \
            "give --journal-replicas 1" in lines[-1] and "Traceback" not in r.stderr, r.stderr[-3000:]
        default_args = server.extra_args
        server.extra_args = (*server.extra_args, "--journal-replicas", "1")
        server.start()
        try:
            with grpc.insecure_channel(server.endpoint) as ch:
                assert pbg.KVStub(ch).Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10).header.revision == 2
        finally:
            server.stop()
        # its streams are there now, of 1 replica: a start asking 3 again is refused, not served at 1
        server.extra_args = default_args
        r = subprocess.run(server.args(), capture_output=True, text=True, timeout=60,
                           cwd=Path(__file__).resolve().parents[2])
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and lines[-1].startswith("shardetcd: JetStream did not change stream ") and \
            "from 1 to 3 replicas (replicas > 1 not supported in non-clustered mode)" in lines[-1], r.stderr[-3000:]
    finally:
        lone.stop()


def test_a_writer_stores_its_journals_with_the_replicas_it_is_given(nats, tmp_path):
    """Streams and buckets keep the replica count they were made with. A deployment first
    started with --journal-replicas 1 and restarted with 3 (its NATS cluster grown) acknowledged
    writes stored on one server, whatever the flag said, and a lost machine lost them. The
    writer now gives what it writes — its shards' streams, their checkpoint buckets, the meta
    and lease buckets — the replicas it is given, and says so; the keys are all still there."""
    from tests.integration.test_jetstream_faults import nats_call

    async def replicas(js) -> dict[str, int]:
        return {i.config.name: i.config.num_replicas for i in await list_streams(js)}

    first = server_on(nats, tmp_path / "a", "--journal-replicas", "1", "--checkpoint-journal-bytes", "2000").start()
    try:
        with grpc.insecure_channel(first.endpoint) as ch:
            for i in range(30):  # past a checkpoint: the buckets are made too
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/k%d" % i, value=b"v"), timeout=10)
    finally:
        first.stop()
    made = nats_call(nats.urls, replicas)
    ours = sorted(name for name in made if "shardetcd" in name)
    assert {made[name] for name in ours} == {1} and any(n.startswith("OBJ_") for n in ours) and \
        "KV_shardetcd-meta" in ours and "KV_shardetcd-writer" in ours, made
    again = server_on(nats, tmp_path / "a").start()  # the default, 3
    try:
        with grpc.insecure_channel(again.endpoint) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0",
                                                       count_only=True), timeout=10)
            assert got.count == 30
        now = nats_call(nats.urls, replicas)
        written = [name for name in ours if not name.startswith("KV_shardetcd-members")]
        assert {name: now[name] for name in written} == {name: 3 for name in written}, now
        assert "jetstream replicas changed to --journal-replicas stream=shardetcd_pods from=1 to=3" in \
            again.log_tail(200)
    finally:
        again.stop()


def test_a_stream_edited_to_fewer_replicas_while_written_gets_them_back(nats, tmp_path):
    """`nats stream edit --replicas 1` on a journal's stream while its writer writes: what the
    writer acknowledges from then on is stored on one server only. Its periodic stream check
    gives the stream its --journal-replicas back within seconds, says so, and writes go on."""
    from tests.integration.test_jetstream_faults import nats_call

    async def set_replicas(js, n: int) -> None:
        info = await js.stream_info("shardetcd_pods")
        info.config.num_replicas = n
        await js.update_stream(info.config)

    async def replicas(js) -> int:
        return (await js.stream_info("shardetcd_pods")).config.num_replicas

    writer = server_on(nats, tmp_path / "w").start()  # the default, 3
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            kv.Put(pb.PutRequest(key=b"/registry/pods/a", value=b"v"), timeout=10)
            nats_call(nats.urls, lambda js: set_replicas(js, 1))
            assert nats_call(nats.urls, replicas) == 1
            deadline = time.monotonic() + 30
            while nats_call(nats.urls, replicas) != 3:
                assert time.monotonic() < deadline, writer.log_tail(50)
                time.sleep(0.5)
            log = writer.log_tail(100)
            assert "journal stream has fewer replicas than --journal-replicas streams=shardetcd_pods" in log and \
                "jetstream replicas changed to --journal-replicas stream=shardetcd_pods from=1 to=3" in log, log
            rev = kv.Put(pb.PutRequest(key=b"/registry/pods/b", value=b"v"), timeout=10).header.revision
            assert kv.Range(pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"),
                            timeout=10).header.revision == rev
    finally:
        writer.stop()


def test_a_writer_moves_its_streams_leadership_to_the_nats_server_it_is_connected_to(nats, tmp_path):
    """Every publish goes to its stream's leader: a writer connected to another NATS server pays a
    route there and back per batch. A writer's start hands each stream's leadership to the server it
    is connected to (here a replica of every R3 stream) before it serves, and its stream check does
    again when one is moved away, while a client goes on writing: no write fails, every acknowledged
    one is read back."""
    import json

    from journal.jetstream import STREAM_CHECK_S
    from tests.integration.test_jetstream_faults import nats_call
    from tests.nats_fixture import connected_to

    streams = [f"shardetcd_{name}" for name in load_layout(None).names]

    def leaders_become(want, which=streams, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while (got := [nats.stream_leader(s) for s in which]) != [want] * len(which):
            assert time.monotonic() < deadline, (want, got, writer.log_tail(30))
            time.sleep(0.5)

    writer = server_on(nats, tmp_path / "w", "--log-level", "info").start()
    acked: dict[bytes, bytes] = {}
    failed: list = []
    stop = threading.Event()

    def write() -> None:
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv, i = pbg.KVStub(ch), 0
            while not stop.is_set():
                key, value = b"/registry/pods/ns/p%d" % (i % 50), b"v%d" % i
                try:
                    kv.Put(pb.PutRequest(key=key, value=value), timeout=10)
                    acked[key] = value
                except grpc.RpcError as exc:
                    failed.append(exc)
                i += 1

    writing = threading.Thread(target=write)
    try:
        (mine,) = connected_to(nats)
        here = nats.servers[mine].name
        # already when it serves (as the server it is connected to sees it)
        assert [nats.stream_leader(s, asking=mine) for s in streams] == [here] * len(streams), writer.log_tail(30)
        writing.start()
        time.sleep(STREAM_CHECK_S + 1)  # a check has seen them here since it moved them: a new move is not held back
        away = next(s.name for s in nats.servers if s.name != here)

        async def move_away(js) -> dict:
            answer = await js._nc.request("$JS.API.STREAM.LEADER.STEPDOWN.shardetcd_pods",
                                          json.dumps({"placement": {"preferred": away}}).encode(), timeout=10)
            return json.loads(answer.data)

        def moves_back() -> int:
            return writer.log_path.read_text().count(
                f"journal stream leader moved to this writer's NATS server stream=shardetcd_pods from={away} to={here}")

        before = moves_back()
        assert nats_call(nats.urls, move_away).get("success"), "NATS did not move the leader away"
        time.sleep(1)
        leaders_become(here, ["shardetcd_pods"])
        assert moves_back() == before + 1, writer.log_tail(30)
        stop.set()
        writing.join(30)
        assert not failed and len(acked) == 50, (failed[:3], len(acked))
        with grpc.insecure_channel(writer.endpoint) as ch:
            got = {kv.key: kv.value for kv in pbg.KVStub(ch).Range(
                pb.RangeRequest(key=b"/registry/pods/", range_end=b"/registry/pods0"), timeout=10).kvs}
        assert got == acked
    finally:
        stop.set()
        writing.join(30) if writing.is_alive() else None
        writer.stop()


def test_a_takeover_serves_before_it_moves_the_streams_leaders(nats, tmp_path):
    """A writer's start moves its streams' leaders to its NATS server before it serves (an election
    each); a takeover does not: its first acknowledgement is not to wait on elections while clients
    retry, so the new writer's stream check moves them once it serves. Writer and standby each on
    a NATS server of its own."""
    from types import SimpleNamespace

    streams = [f"shardetcd_{name}" for name in load_layout(None).names]
    on = [SimpleNamespace(urls=s.url) for s in nats.servers]
    writer = server_on(on[0], tmp_path / "w").start()
    standby = server_on(on[1], tmp_path / "s", "--standby", "--log-level", "info").start(wait=False)
    try:
        assert [nats.stream_leader(s) for s in streams] == ["n0"] * len(streams), writer.log_tail(30)
        wait_standing_by(standby)
        writer.kill()
        standby.wait_ready(timeout=30)
        with grpc.insecure_channel(standby.endpoint) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/a", value=b"v"), timeout=30)
        deadline = time.monotonic() + 30  # the stream check, every STREAM_CHECK_S, moves them
        while (got := [nats.stream_leader(s, asking=1) for s in streams]) != ["n1"] * len(streams):
            assert time.monotonic() < deadline, (got, standby.log_tail(30))
            time.sleep(0.5)
        log = standby.log_path.read_text()
        took_over = log.index("took over as the writer")
        moved = {m.group(1): m.start() for m in re.finditer(r"journal stream leader moved to this writer's NATS "
                                                            r"server stream=(shardetcd_\w+) from=n0 to=n1", log)}
        assert sorted(moved) == sorted(streams) and min(moved.values()) > took_over, log[-3000:]
    finally:
        standby.kill()
        writer.kill()


def test_a_standby_that_takes_over_gives_the_journals_its_replicas(nats, tmp_path):
    """With --standby, processes start by standing by and write only once they take over: the
    replicas they are given are applied then (after the journals are fenced, so a takeover is not
    held up by it), as a plain writer's are at start: to the journals and to the meta, writer lease
    and members buckets (those stayed at the old writer's count)."""
    from tests.integration.test_jetstream_faults import nats_call

    buckets = ("KV_shardetcd-meta", "KV_shardetcd-writer", "KV_shardetcd-members")

    async def shard_streams(js) -> dict[str, int]:
        return {i.config.name: i.config.num_replicas for i in await list_streams(js)
                if i.config.name.startswith("shardetcd_") or i.config.name in buckets}

    writer = server_on(nats, tmp_path / "a", "--journal-replicas", "1").start()
    standby = server_on(nats, tmp_path / "b", "--standby").start(wait=False)  # the default, 3
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/k", value=b"v"), timeout=10)
        wait_standing_by(standby)
        before = nats_call(nats.urls, shard_streams)
        assert set(before.values()) == {1} and set(buckets) <= set(before), before
        writer.kill()
        standby.wait_ready(timeout=30)
        with grpc.insecure_channel(standby.endpoint) as ch:
            assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/k"), timeout=30).kvs[0].value == b"v"
        deadline = time.monotonic() + 30
        # a stream being changed can be left out of JetStream's list for a moment
        while (now := nats_call(nats.urls, shard_streams)) != dict.fromkeys(before, 3):
            assert time.monotonic() < deadline, now
            time.sleep(0.2)
        assert "jetstream replicas changed to --journal-replicas stream=shardetcd_pods from=1 to=3" in \
            standby.log_tail(300)
    finally:
        standby.kill()
        writer.kill()


def test_a_follower_started_first_makes_the_lease_bucket_with_its_ttl(nats, tmp_path):
    """Whichever process opens the writer lease bucket first makes it, with that process's lease
    TTL, which every later one then uses. A follower made it with the default 3 s whatever its
    --journal-lease-ttl, so a deployment configured with another TTL ran on 3 s."""
    from tests.integration.test_jetstream_faults import nats_call

    async def bucket_ttl(js) -> float | None:
        from nats.js.errors import BucketNotFoundError

        try:
            return (await (await js.key_value("shardetcd-writer")).status()).ttl
        except BucketNotFoundError:
            return None

    follower = server_on(nats, tmp_path / "f", "--journal-lease-ttl", "7", "--follow").start(wait=False)
    try:
        deadline = time.monotonic() + 30
        while (ttl := nats_call(nats.urls, bucket_ttl)) is None:
            assert follower.running() and time.monotonic() < deadline, follower.log_tail(20)
            time.sleep(0.2)
        assert ttl == 7.0
    finally:
        follower.kill()


def takes_over_with_the_pods(writer, standby, rev: int, count: int) -> None:
    """``writer`` killed, ``standby`` serves: ``count`` keys under /registry/pods/ns/ at ``rev``."""
    writer.kill()
    standby.wait_ready(timeout=30)
    with grpc.insecure_channel(standby.endpoint) as ch:
        got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/", range_end=b"/registry/pods/ns0"),
                                   timeout=30)
    assert got.header.revision == rev and len(got.kvs) == count


def started_paused(standby, point: str, seconds: float) -> None:
    """Start ``standby`` (not waiting for it to serve) with failpoint ``point`` armed to pause it
    ``seconds``, and wait until it pauses there."""
    import os

    os.environ["SHARDETCD_FAILPOINTS"] = f"{point}=pause:{seconds}"
    try:
        standby.start(wait=False)
    finally:
        del os.environ["SHARDETCD_FAILPOINTS"]
    deadline = time.monotonic() + 30
    while f"failpoint pausing name={point}" not in standby.log_tail(100_000):
        assert standby.running() and time.monotonic() < deadline, standby.log_tail(20)
        time.sleep(0.05)


def test_a_standby_whose_journal_is_released_in_the_middle_of_its_read_loads_the_newer_checkpoint(nats, tmp_path):
    """A starting standby reads each journal as one stream of messages, from the first its info
    named; a writer that checkpoints as it writes may release (purge) messages that read has not
    reached yet (here: before it begins; a read that stalls for READ_STALL_S begins again from the
    same message). The read passes them over, and was taken as whole: the revisions they held,
    above the checkpoint it had fetched (none: the journal had not been released before), were in
    nothing it read, and it refused to start ("acknowledged journal records are gone", seen in CI
    with 32 writers on a loaded machine). A purge in the middle of a read is a release past its
    checkpoint too: it fetches the newer checkpoint, reads again, and stands by with everything."""
    writer = server_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "262144").start()
    standby = server_on(nats, tmp_path / "s", "--standby", "--log-level", "info")
    log = lambda: standby.log_tail(100_000)  # noqa: E731 - the whole log
    point = "recovery.follow_journal_listed"
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            kv = pbg.KVStub(ch)
            for i in range(100):  # 100 KB: no checkpoint yet, the pods journal never released
                kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v" * 1000), timeout=10)
            started_paused(standby, point, 5)
            for i in range(600):  # within the pause: checkpoints, each releasing the pods journal up to it
                rev = kv.Put(pb.PutRequest(key=b"/registry/pods/ns/q%d" % (i % 50), value=b"v" * 1000),
                             timeout=10).header.revision
        wait_standing_by(standby, timeout=60)
        again = [l for l in log().splitlines() if "fetching the newer one" in l]
        assert again and "shardetcd_pods: released past the checkpoint fetched" in again[0], again
        assert "rebuilds its state" not in log()  # (it stood by without the revisions, then found the gap)
        takes_over_with_the_pods(writer, standby, rev, 150)
    finally:
        standby.kill()
        writer.kill()


@pytest.mark.parametrize("point, reloads", [("recovery.follow_after_checkpoints", True),
                                            ("recovery.follow_journal_read", False),
                                            ("recovery.follow_loading_checkpoints", False)])
def test_a_standby_whose_checkpoint_is_released_while_it_starts_loads_the_newer_one(nats, tmp_path, point, reloads):
    """A standby fetches the newest checkpoints, then reads the journals after them. A writer that
    checkpoints as it writes may release those journals in between; the standby then found the
    stream purged past its checkpoint and exited with a traceback (seen in CI). It now fetches the
    newer checkpoint (of the overtaken shard) and stands by, as a follower already did. While it loads the checkpoints'
    rows (long for a large state) the journals are already read: released meanwhile, nothing is
    missed and nothing fetched again. The journals are read at once: while one read waits (here
    the leases journal's, first in the layout), the pods journal's is done, not waiting its turn."""
    from tests.integration.followkit import write_past_checkpoints

    writer = server_on(nats, tmp_path / "w", "--checkpoint-journal-bytes", "65536").start()
    standby = server_on(nats, tmp_path / "s", "--standby", "--log-level", "info")  # (each journal read: a line)
    log = lambda: standby.log_tail(100_000)  # noqa: E731 - the whole log
    try:
        with grpc.insecure_channel(writer.endpoint) as ch:
            pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/early", value=b"v" * 1000), timeout=10)
        started_paused(standby, point, 6)
        if point == "recovery.follow_journal_read":  # one read done and waiting: the pods journal's done too
            deadline = time.monotonic() + 4
            while "journal stream read stream=shardetcd_pods " not in log():
                assert time.monotonic() < deadline, "the pods journal was not read while another read waited"
                time.sleep(0.05)
        rev = write_past_checkpoints(writer.endpoint)  # within the pause: journals released past its checkpoint
        wait_standing_by(standby)
        again = [l for l in log().splitlines() if "fetching the newer one" in l]
        assert bool(again) == reloads, again
        if reloads:  # which checkpoint was overtaken, by what
            assert re.search(r"attempt=1 error=journal nats:shardetcd_\w+: released past the checkpoint fetched "
                             r"\(rev \d+\) to a newer one meanwhile; its first record read is rev \d+$", again[0]), again
        takes_over_with_the_pods(writer, standby, rev, 42)
    finally:
        standby.kill()
        writer.kill()


def test_a_writer_resumed_after_its_journals_were_taken_over_leaves_the_followers_with_the_new_one(nats, tmp_path):
    """A writer frozen between its recovery and saying where it serves (the meta bucket's writer
    record, which followers send their writes to) while a standby takes its lapsed lease and its
    journals over, then resumed: it must not write its record over the standby's, which is said
    once, at takeover. It did, and then failed (its lease and journals were another's): every
    follower's writes went to a process that was gone, until the new writer restarted. It stops,
    saying why, and a follower's writes reach the new writer."""
    import os
    import signal

    old = server_on(nats, tmp_path / "old")
    started_paused(old, "server.before_announce", 20)
    standby = server_on(nats, tmp_path / "new", "--standby").start(wait=False)
    follower = None
    try:
        wait_standing_by(standby)
        os.kill(old.pid, signal.SIGSTOP)  # its lease lapses
        try:
            standby.wait_ready(timeout=30)
        finally:
            os.kill(old.pid, signal.SIGCONT)  # its pause is over by now: it goes on to say where it serves
        deadline = time.monotonic() + 30
        while old.running():
            assert time.monotonic() < deadline, old.log_tail(20)
            time.sleep(0.1)
        assert "another shardetcd took these journals over after this one" in old.log_tail(20), old.log_tail(20)
        follower = server_on(nats, tmp_path / "f", "--follow").start()
        with grpc.insecure_channel(follower.endpoint) as ch:
            put = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/p", value=b"v"), timeout=10)
        with grpc.insecure_channel(standby.endpoint) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/ns/p"), timeout=10)
        assert [(kv.value, kv.mod_revision) for kv in got.kvs] == [(b"v", put.header.revision)]
    finally:
        for process in (follower, standby, old):
            if process is not None:
                process.kill()
