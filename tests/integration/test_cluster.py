"""`shardetcd cluster`: one process per partition, supervised.

Three partitions (leases, events with a small quota, everything else) on
free loopback ports; each is driven through its own URL with etcdctl and a
Python gRPC client.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port, free_ports
from tests.integration.test_etcdctl import ctl, etcdctl_bin
from tests.shardetcd_fixture import stop_by_pid
from tests.shards.test_partition import kube_apiserver_overrides

EVENTS_QUOTA_BYTES = 400_000


class Cluster:
    def __init__(self, tmp_path: Path) -> None:
        self.layout = tmp_path / "cluster.toml"
        self.choose_ports()
        self.data_dir = tmp_path / "cluster"
        self.out_path = tmp_path / "supervisor.out"
        self.argv = [sys.executable, "-m", "shim", "cluster", "--layout", str(self.layout), "--data-dir", str(self.data_dir),
                     "--state-dir", str(tmp_path / "state"), "--journal-fsync", "always"]
        self.wal_dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.child_pids: dict[str, int] = {}

    def with_wal_dir(self, wal_dir: Path) -> Cluster:
        """Local journals in ``wal_dir``/<partition> (not with --journal-url)."""
        self.argv += ["--wal-dir", str(wal_dir)]
        self.wal_dir = wal_dir
        return self

    def choose_ports(self) -> None:
        self.ports = dict(zip(("leases", "events", "main"), free_ports(3)))
        self.layout.write_text(f"""
[[partition]]
name = "leases"
resources = ["coordination.k8s.io/leases"]
port = {self.ports["leases"]}

[[partition]]
name = "events"
resources = ["events"]
port = {self.ports["events"]}
quota-backend-bytes = {EVENTS_QUOTA_BYTES}
nice = 5

[[partition]]
name = "main"
default = true
port = {self.ports["main"]}
""")

    def start(self, timeout: float = 60.0, attempts: int = 3) -> Cluster:
        """Start the supervisor and wait for its flags. The layout's ports were free when chosen; when
        another test's process binds one before its partition listens, start again on new ones."""
        for attempt in range(attempts):
            self.out = self.out_path.open("ab")
            offset = self.out.tell()
            self.proc = subprocess.Popen(self.argv, stdout=self.out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout
            while "--etcd-servers=" not in self.output()[offset:]:  # this start's, not an earlier one's
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    said = self.output()[offset:]
                    if self.proc.returncode == 2 and "cannot listen on" in said and attempt + 1 < attempts:
                        self.choose_ports()
                        break
                    raise AssertionError(f"cluster did not start:\n{self.output()}")
                time.sleep(0.1)
            else:
                break
        self.child_pids = {m[0]: int(m[1]) for m in re.findall(r"^  (\w+)\s+https?://\S+\s+pid (\d+)",
                                                              self.output()[offset:], re.M)}
        return self

    def output(self) -> str:
        return self.out_path.read_bytes().decode("latin-1")  # one character a byte: sliced by file offsets

    def endpoint(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        stop_by_pid(self.proc)
        for pid in self.child_pids.values():  # never leave a partition behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.out.close()
        return self.proc.returncode


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path).with_wal_dir(tmp_path / "wal").start()
    try:
        yield c
    finally:
        c.stop()


def kv(endpoint: str) -> pbg.KVStub:
    return pbg.KVStub(grpc.insecure_channel(endpoint))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive; the supervisor reaps its children
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_printed_flags_name_every_partition_in_kube_apiserver_format(cluster):
    flags = (cluster.data_dir / "kube-apiserver.flags").read_text().split()
    assert flags[0] == f"--etcd-servers=http://127.0.0.1:{cluster.ports['main']}"
    assert flags[1].startswith("--etcd-servers-overrides=")
    parsed = kube_apiserver_overrides(flags[1].split("=", 1)[1])
    assert parsed == {
        ("coordination.k8s.io", "leases"): [f"http://127.0.0.1:{cluster.ports['leases']}"],
        ("", "events"): [f"http://127.0.0.1:{cluster.ports['events']}"],
    }
    for f in flags:
        assert f"  {f}" in cluster.output()
    assert set(cluster.child_pids) == {"leases", "events", "main"}
    # the layout's nice applies to that partition's process only
    nice = {n: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16]) for n, pid in cluster.child_pids.items()}
    own = os.nice(0)
    assert nice == {"leases": own, "events": min(19, own + 5), "main": own}


def test_each_partition_is_its_own_etcd_and_refuses_other_resources(cluster, etcdctl_bin):
    binary = etcdctl_bin
    lease_key = "/registry/leases/kube-node-lease/node-1"
    assert ctl(binary, cluster.endpoint("leases"), "put", lease_key, "v1").stdout.strip() == "OK"
    assert ctl(binary, cluster.endpoint("events"), "put", "/registry/events/default/e1", "ev").stdout.strip() == "OK"
    assert ctl(binary, cluster.endpoint("main"), "put", "/registry/pods/default/p1", "pod").stdout.strip() == "OK"
    assert ctl(binary, cluster.endpoint("leases"), "get", lease_key, "--print-value-only").stdout.strip() == "v1"
    # separate revision sequences, like separate etcd clusters
    revs = {n: kv(cluster.endpoint(n)).Range(pb.RangeRequest(key=b"x"), timeout=5).header.revision for n in cluster.ports}
    assert revs == {"leases": 2, "events": 2, "main": 2}
    # a resource on the wrong partition is refused, through etcdctl and gRPC
    r = ctl(binary, cluster.endpoint("leases"), "put", "/registry/pods/default/p2", "x", check=False)
    assert r.returncode != 0 and "belongs to partition 'main'" in r.stderr
    with pytest.raises(grpc.RpcError) as err:
        kv(cluster.endpoint("main")).Txn(pb.TxnRequest(success=[pb.RequestOp(request_txn=pb.TxnRequest(failure=[
            pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=b"/registry/events/default/e1"))]))]), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "belongs to partition 'events', this endpoint serves partition 'main'" in err.value.details()
    # master leases go through --etcd-servers: main takes them, the leases partition does not
    assert kv(cluster.endpoint("main")).Put(pb.PutRequest(key=b"/registry/masterleases/10.0.0.1", value=b"x"), timeout=5)
    with pytest.raises(grpc.RpcError):
        kv(cluster.endpoint("leases")).Put(pb.PutRequest(key=b"/registry/masterleases/10.0.0.1", value=b"x"), timeout=5)
    # what kube-apiserver sends to every endpoint works on each partition
    for name in cluster.ports:
        c = kv(cluster.endpoint(name))
        compact = c.Txn(pb.TxnRequest(
            compare=[pb.Compare(key=b"compact_rev_key", target=pb.Compare.VERSION, result=pb.Compare.EQUAL, version=0)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=b"compact_rev_key", value=b"2"))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=b"compact_rev_key"))]), timeout=5)
        assert compact.succeeded, name
        c.Compact(pb.CompactionRequest(revision=2), timeout=5)
        assert c.Range(pb.RangeRequest(key=b"/registry/health"), timeout=5).count == 0
        lease = pbg.LeaseStub(grpc.insecure_channel(cluster.endpoint(name))).LeaseGrant(pb.LeaseGrantRequest(TTL=3660), timeout=5)
        assert lease.ID > 0 and not lease.error
    # no partition saw another's keys
    assert ctl(binary, cluster.endpoint("events"), "get", "--prefix", "/registry/", "--keys-only").stdout.split() == ["/registry/events/default/e1"]


def write_loop(endpoint: str, prefix: bytes, stop: threading.Event, acked: dict, errors: list) -> None:
    c = kv(endpoint)
    i = 0
    while not stop.is_set():
        key = prefix + b"%d" % i
        try:
            r = c.Put(pb.PutRequest(key=key, value=b"v%d" % i), timeout=5, wait_for_ready=True)
            acked[key] = r.header.revision
        except grpc.RpcError as exc:
            errors.append((time.monotonic(), exc.code()))
            time.sleep(0.05)
        i += 1


def test_sigkill_of_one_partition_restarts_it_losing_nothing_while_the_others_keep_serving(cluster):
    stop = threading.Event()
    acked = {n: {} for n in cluster.ports}
    errors = {n: [] for n in cluster.ports}
    prefixes = {"leases": b"/registry/leases/ns/", "events": b"/registry/events/ns/", "main": b"/registry/pods/ns/"}
    threads = [threading.Thread(target=write_loop, args=(cluster.endpoint(n), prefixes[n], stop, acked[n], errors[n])) for n in cluster.ports]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        victim = cluster.child_pids["events"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "serving again partition=events" not in cluster.output():
            assert time.monotonic() < deadline, cluster.output()
            time.sleep(0.1)
        before = len(acked["events"])
        while len(acked["events"]) < before + 20:
            assert time.monotonic() < deadline, "the restarted partition takes no writes"
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    out = cluster.output()
    assert "partition died partition=events" in out and "killed by SIGKILL" in out
    new_pid = int(re.search(r"restarted partition=events pid=(\d+)", out)[1])
    cluster.child_pids["events_restarted"] = new_pid
    assert not alive(victim) and alive(new_pid)
    # the others never stopped serving
    assert errors["leases"] == [] and errors["main"] == []
    assert alive(cluster.child_pids["leases"]) and alive(cluster.child_pids["main"])
    # nothing acknowledged is lost, with the revision it was acknowledged at
    for name, written in acked.items():
        got = kv(cluster.endpoint(name)).Range(pb.RangeRequest(key=prefixes[name], range_end=prefixes[name][:-1] + b"0"), timeout=10)
        have = {x.key: x.mod_revision for x in got.kvs}
        missing = {k: r for k, r in written.items() if have.get(k) != r}
        assert not missing, f"{name}: {len(missing)} acknowledged writes lost or changed, e.g. {list(missing.items())[:3]}"
        # each partition's journal is in the cluster's --wal-dir, under the partition's name
        assert list((cluster.wal_dir / name / name).glob("*.wal")), name
        assert (cluster.data_dir / name / "shards" / name / "journal").is_symlink()
    # SIGTERM to the supervisor stops every partition
    pids = [cluster.child_pids[n] for n in ("leases", "main")] + [new_pid]
    assert cluster.stop() == 0
    assert not any(alive(p) for p in pids)


def test_a_partition_process_that_hangs_is_killed_and_restarted_but_not_for_the_supervisors_own_pause(tmp_path):
    """On local journals nothing else can end a hung partition process (it holds the data dir):
    one whose event loop falls silent for --liveness-timeout is killed and restarted, and its
    partition serves again; while the supervisor itself was stopped, the beats wait in their pipes
    for it."""
    c = Cluster(tmp_path)
    c.argv += ["--liveness-timeout", "3"]
    c.start()
    try:
        put = lambda: kv(c.endpoint("events")).Put(pb.PutRequest(key=b"/registry/events/ns/e", value=b"x"), timeout=10)  # noqa: E731
        put()
        os.kill(c.proc.pid, signal.SIGSTOP)  # the supervisor stopped longer than the timeout: no kill
        time.sleep(5)
        os.kill(c.proc.pid, signal.SIGCONT)
        time.sleep(1.5)
        assert "not answering" not in c.output() and all(alive(p) for p in c.child_pids.values())
        hung = c.child_pids["events"]
        os.kill(hung, signal.SIGSTOP)  # hung: its loop beats no more
        deadline = time.monotonic() + 30
        while "serving again partition=events" not in c.output():
            assert time.monotonic() < deadline, c.output()
            time.sleep(0.1)
        out = c.output()
        assert re.search(rf"partition not answering, killing it partition=events pid={hung} silent_s=3\.\d", out), out
        assert "partition died partition=events" in out and "killed by SIGKILL" in out
        c.child_pids["events_restarted"] = int(re.search(r"restarted partition=events pid=(\d+)", out)[1])
        assert not alive(hung)
        put()
        assert "not answering, killing it partition=leases" not in out and alive(c.child_pids["leases"])
    finally:
        c.stop()


def test_a_full_events_partition_does_not_stop_lease_writes(cluster):
    events, leases, main = kv(cluster.endpoint("events")), kv(cluster.endpoint("leases")), kv(cluster.endpoint("main"))
    value = b"e" * 8000
    with pytest.raises(grpc.RpcError) as err:
        for i in range(10_000):
            events.Put(pb.PutRequest(key=b"/registry/events/ns/e%d" % i, value=value), timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == "etcdserver: mvcc: database space exceeded"
    assert 10 < i < EVENTS_QUOTA_BYTES // len(value) + 1
    maintenance = {n: pbg.MaintenanceStub(grpc.insecure_channel(cluster.endpoint(n))) for n in cluster.ports}
    alarms = {n: list(m.Alarm(pb.AlarmRequest(action=pb.AlarmRequest.GET), timeout=5).alarms) for n, m in maintenance.items()}
    assert [a.alarm for a in alarms["events"]] == [pb.NOSPACE]
    assert alarms["leases"] == [] and alarms["main"] == []
    # node leases and everything else keep writing
    for i in range(50):
        leases.Put(pb.PutRequest(key=b"/registry/leases/kube-node-lease/n%d" % (i % 5), value=value), timeout=5)
        main.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % (i % 5), value=value), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        events.Put(pb.PutRequest(key=b"/registry/events/ns/small", value=b"x"), timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert maintenance["leases"].Status(pb.StatusRequest(), timeout=5).errors == []


@pytest.mark.parametrize("rotation", [False, True], ids=["log", "rotated-log"])
def test_a_partition_that_cannot_start_stops_the_cluster_with_a_reason(tmp_path, rotation):
    """The reason is the partition's last word; with --enable-log-rotation it printed that to
    DIR/<name>.out, its log lines being in its own DIR/<name>.log."""
    for attempt in range(3):  # another test may take one of the other partitions' free ports first
        (tmp_path / str(attempt)).mkdir()
        c = Cluster(tmp_path / str(attempt))
        if rotation:
            c.argv.append("--enable-log-rotation")
        blocker = __import__("socket").socket()
        blocker.bind(("127.0.0.1", c.ports["events"]))
        blocker.listen()
        try:
            proc = subprocess.run(c.argv, capture_output=True, text=True, timeout=90)
        finally:
            blocker.close()
        assert proc.returncode == 2
        last = proc.stderr.strip().splitlines()[-1]
        assert re.match(r"shardetcd cluster: partition \S+ exited with code 2: shardetcd: cannot listen on", last), last
        if " partition events " in last:
            break
    assert last.startswith("shardetcd cluster: partition events exited with code 2: shardetcd: cannot listen on"), proc.stderr
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftovers == [], "the partitions that did start were left running"
    if rotation:
        assert "cannot listen on" in (c.data_dir / "events.out").read_text()
        assert "cannot listen on" not in (c.data_dir / "events.log").read_text()
        assert "level=INFO" in (c.data_dir / "events.log").read_text()


def test_with_log_rotation_each_partition_rotates_its_own_log(tmp_path):
    """`--enable-log-rotation --log-rotation-config-json '{"maxsize": 1}'`: a partition whose log
    is already at 1 MiB renames it to a backup at its first line, with its content, and logs on
    into a new DIR/<name>.log; the others' logs are their own and not rotated; what a partition
    prints (that it serves) goes to DIR/<name>.out; the cluster serves. --log-outputs with
    rotation is refused: the partitions would share one file."""
    c = Cluster(tmp_path)
    c.argv += ["--enable-log-rotation", '--log-rotation-config-json={"maxsize": 1}']
    c.data_dir.mkdir(parents=True)
    full = b"old line\n" * (1024 * 1024 // 9) + b"x" * (1024 * 1024 % 9)
    (c.data_dir / "events.log").write_bytes(full)
    c.start()
    try:
        backups = [p for p in c.data_dir.iterdir() if re.fullmatch(r"\w+-\d{4}-\d\d-\d\dT.*\.log", p.name)]
        assert [p.name.split("-")[0] for p in backups] == ["events"], backups
        assert backups[0].read_bytes() == full
        for name in ("leases", "events", "main"):
            log, out = (c.data_dir / name).with_suffix(".log").read_text(), (c.data_dir / name).with_suffix(".out").read_text()
            assert "old line" not in log and "level=INFO" in log and "shardetcd serving" not in log, name
            assert "shardetcd serving the etcd v3 API" in out and "level=INFO" not in out, name
            put = kv(c.endpoint(name)).Put(pb.PutRequest(key=b"compact_rev_key", value=b"1"), timeout=10)
            assert put.header.revision == 2, name
    finally:
        c.stop()
    refused = subprocess.run([*c.argv, "--log-outputs", str(tmp_path / "all.log")], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "no --log-outputs" in refused.stderr, refused.stderr


def test_a_follower_whose_port_is_taken_while_it_starts_moves_to_a_free_one(tmp_path):
    """The supervisor chooses followers' ports; another process may bind one between that choice
    and the follower's listen (this failed a CI run). The follower then starts on the next free
    port, and the flags name the port it serves on."""
    import socket

    from shards.partition import load_cluster_layout
    from shim.cluster import Supervisor

    layout = tmp_path / "cluster.toml"
    layout.write_text(f'[[partition]]\nname = "main"\ndefault = true\nport = {free_port()}\n')
    sup = Supervisor(load_cluster_layout(layout), layout, tmp_path / "data", "127.0.0.1", 2379,
                     ["--journal-fsync", "always"], tmp_path / "state", followers=1)
    follower = next(c for c in sup.children if c.follower)
    taken = int(follower.url.rsplit(":", 1)[1])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        try:
            assert sup.start_all() is None
            port = int(follower.url.rsplit(":", 1)[1])
            assert port != taken and follower.proc.poll() is None
            assert any(f"http://127.0.0.1:{port}" in f for f in sup.flags), sup.flags
            assert all(f"127.0.0.1:{taken}" not in f for f in sup.flags), sup.flags
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10).header.revision >= 1
        finally:
            sup.stop_all()


def test_followers_keep_their_ports_when_the_cluster_starts_again(tmp_path):
    """A cluster started again (say, by its init system) gives its followers the ports they had,
    so that the kube-apiserver flags it printed stay true. A follower that had clients when it
    stopped and closed their connections first leaves its port in TIME_WAIT (made here by hand,
    the way such a close leaves it), which a plain bind refuses but a server (binding with
    SO_REUSEADDR) does not mind: the supervisor's check of a port now binds as a server does (it
    moved such a follower to the next port, for as long as TIME_WAIT lasts)."""
    import socket

    from shards.partition import load_cluster_layout
    from shim.cluster import Supervisor

    layout = tmp_path / "cluster.toml"
    layout.write_text(f'[[partition]]\nname = "main"\ndefault = true\nport = {free_port()}\n')

    def supervisor() -> Supervisor:
        return Supervisor(load_cluster_layout(layout), layout, tmp_path / "data", "127.0.0.1", 2379,
                          ["--journal-fsync", "always"], tmp_path / "state", followers=1)

    first = supervisor()
    try:
        assert first.start_all() is None
        url = next(c for c in first.children if c.follower).url
    finally:
        first.stop_all()
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            served, _ = listener.accept()
            served.close()  # the serving side closes first: its end of the connection goes to TIME_WAIT
            assert client.recv(1) == b""
    with socket.socket() as plain:  # what the test is about: the port is in TIME_WAIT
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    again = supervisor()
    try:
        assert again.start_all() is None
        assert next(c for c in again.children if c.follower).url == url
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10).header.revision >= 1
    finally:
        again.stop_all()


def test_partitions_and_followers_advertise_the_advertise_host(tmp_path):
    """--advertise-host: the host every process advertises (MemberList), the kube-apiserver flags
    name and a follower forwards writes to, while all listen on --host."""
    from shards.partition import load_cluster_layout
    from shim.cluster import Supervisor

    layout = tmp_path / "cluster.toml"
    port = free_port()
    layout.write_text(f'[[partition]]\nname = "main"\ndefault = true\nport = {port}\n')
    sup = Supervisor(load_cluster_layout(layout), layout, tmp_path / "data", "127.0.0.1", 2379,
                     ["--journal-fsync", "always"], tmp_path / "state", followers=1, advertise_host="localhost")
    follower = next(c for c in sup.children if c.follower)
    try:
        assert sup.start_all() is None
        follower_port = int(follower.url.rsplit(":", 1)[1])
        assert sup.flags == [f"--etcd-servers=http://localhost:{port},http://localhost:{follower_port}"]
        for p in (port, follower_port):
            with grpc.insecure_channel(f"127.0.0.1:{p}") as ch:
                members = pbg.ClusterStub(ch).MemberList(pb.MemberListRequest(), timeout=10).members
                assert sorted(u for m in members for u in m.clientURLs) == [
                    f"http://localhost:{port}", f"http://localhost:{follower_port}"]
        with grpc.insecure_channel(f"127.0.0.1:{follower_port}") as ch:  # forwarded to the writer
            put = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/ns/a", value=b"v"), timeout=10)
        got = kv(f"127.0.0.1:{port}").Range(pb.RangeRequest(key=b"/registry/pods/ns/a"), timeout=10)
        assert [(x.value, x.mod_revision) for x in got.kvs] == [(b"v", put.header.revision)]
    finally:
        sup.stop_all()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_listening_on_every_address_needs_an_advertise_host(tmp_path, host):
    c = Cluster(tmp_path)
    r = subprocess.run([*c.argv, "--host", host], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
        f"--host {host} listens on every address: give --advertise-host, the name or address kube-apiserver "
        "and followers reach the partitions at"), r.stderr
    assert not c.data_dir.exists(), "refused before anything starts"


def test_with_tls_flags_every_partition_and_follower_serves_https(tmp_path):
    """--cert-file among the flags passed on: each partition and follower listens on https:// (it
    served plaintext on http:// URLs before), the kube-apiserver flags name https:// URLs, and a
    write through a follower reaches its writer over TLS with the follower's client certificate."""
    from shards.partition import load_cluster_layout
    from shim.cluster import Supervisor
    from tests.integration.test_tls import tls_channel
    from tests.tls_certs import make_pki, member_tls_flags

    pki = make_pki(tmp_path / "pki")
    layout = tmp_path / "cluster.toml"
    port = free_port()
    layout.write_text(f'[[partition]]\nname = "main"\ndefault = true\nport = {port}\n')
    tls = list(member_tls_flags(pki))
    sup = Supervisor(load_cluster_layout(layout), layout, tmp_path / "data", "127.0.0.1", 2379,
                     ["--journal-fsync", "always", *tls], tmp_path / "state", followers=1)
    try:
        assert sup.start_all() is None
        follower = next(c for c in sup.children if c.follower)
        assert sup.flags == [f"--etcd-servers=https://127.0.0.1:{port},{follower.url}"], sup.flags
        assert follower.url.startswith("https://127.0.0.1:")
        with tls_channel(follower.url.split("://")[1], pki["ca"], pki["client"], pki["client-key"]) as ch:
            put = pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/a", value=b"v"), timeout=20)
        with tls_channel(f"127.0.0.1:{port}", pki["ca"], pki["client"], pki["client-key"]) as ch:
            got = pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10)
        assert [(kv.value, kv.mod_revision) for kv in got.kvs] == [(b"v", put.header.revision)]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch, pytest.raises(grpc.RpcError):
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=5)
    finally:
        sup.stop_all()


def test_a_snapshot_restores_into_the_partitions_with_their_wal_dirs(tmp_path):
    """`snapshot restore --cluster-layout L --wal-dir W`: every partition's data dir, each with its
    resources' keys, the keys every partition keeps and their leases (a lease with no key on the
    default partition), at the snapshot's revision; the cluster started with --wal-dir W journals
    into W/<partition>; a second restore is refused."""
    from tests.shardetcd_fixture import start_shardetcd

    source = start_shardetcd(tmp_path, name="source")
    try:
        with grpc.insecure_channel(source.endpoint) as ch:
            kvs = pbg.KVStub(ch)
            grant = pbg.LeaseStub(ch).LeaseGrant
            lease, keyless, pods, everyones_lease, gone = (grant(pb.LeaseGrantRequest(TTL=600), timeout=10).ID
                                                           for _ in range(5))
            leased = {b"/registry/events/ns/e1": lease, b"/registry/events/ns/e2": pods,
                      b"/registry/pods/ns/p1": pods, b"/registry/health": everyones_lease}
            for key in (b"/registry/leases/kube-node-lease/n1", b"/registry/events/ns/e1", b"/registry/pods/ns/p1",
                        b"compact_rev_key", b"/registry/health", b"/registry/events/ns/e2", b"/registry/pods/ns/p2"):
                kvs.Put(pb.PutRequest(key=key, value=b"v", lease=leased.get(key, 0)), timeout=10)
            kvs.Put(pb.PutRequest(key=b"/registry/leases/kube-node-lease/n1", value=b"v", lease=gone), timeout=10)
            kvs.Put(pb.PutRequest(key=b"/registry/leases/kube-node-lease/n1", value=b"v2"), timeout=10)
            kvs.DeleteRange(pb.DeleteRangeRequest(key=b"/registry/events/ns/e2"), timeout=10)
            snap = tmp_path / "snap.db"
            snap.write_bytes(b"".join(r.blob for r in pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(),
                                                                                        timeout=30)))
            revision = kvs.Range(pb.RangeRequest(key=b"x"), timeout=10).header.revision
    finally:
        source.stop()
    cluster = Cluster(tmp_path)
    wal = tmp_path / "wal"
    args = [sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir", str(cluster.data_dir),
            "--cluster-layout", str(cluster.layout), "--wal-dir", str(wal)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "partitions leases, events, main" in r.stdout, r.stderr
    assert r.stdout.rstrip().endswith(f"; start it with: shardetcd cluster --layout {cluster.layout} --data-dir "
                                      f"{cluster.data_dir} --wal-dir {wal}"), r.stdout
    again = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "is not empty" in again.stderr, again.stderr
    cluster.with_wal_dir(wal).start()
    try:
        ttl = pbg.LeaseStub(grpc.insecure_channel(cluster.endpoint("events"))).LeaseTimeToLive(
            pb.LeaseTimeToLiveRequest(ID=lease, keys=True), timeout=10)
        assert ttl.TTL > 0 and list(ttl.keys) == [b"/registry/events/ns/e1"]
        # a partition keeps the leases of its keys and of the keys every partition keeps; the
        # default one also those of no key (`gone` lost its key to a later put, e2's was deleted)
        kept = {"leases": {everyones_lease}, "events": {lease, everyones_lease},
                "main": {pods, everyones_lease, keyless, gone}}
        for name, want in kept.items():
            got = pbg.LeaseStub(grpc.insecure_channel(cluster.endpoint(name))).LeaseLeases(
                pb.LeaseLeasesRequest(), timeout=10)
            assert {x.ID for x in got.leases} == want, name
        everyones = [b"/registry/health", b"compact_rev_key"]
        for name, own in (("leases", [b"/registry/leases/kube-node-lease/n1"]), ("events", [b"/registry/events/ns/e1"]),
                          ("main", [b"/registry/pods/ns/p1", b"/registry/pods/ns/p2"])):
            got = kv(cluster.endpoint(name)).Range(pb.RangeRequest(key=b"\0", range_end=b"\0"), timeout=10)
            assert got.header.revision == revision and [x.key for x in got.kvs] == sorted([*own, *everyones]), name
            put = kv(cluster.endpoint(name)).Put(pb.PutRequest(key=own[0], value=b"after"), timeout=10)
            assert put.header.revision == revision + 1
            assert list((wal / name / name).glob("*.wal")), f"{name} journals into its wal dir"
    finally:
        cluster.stop()


def test_a_layout_that_moves_a_resource_away_from_its_keys_is_refused(tmp_path):
    """Each partition is an etcd of its own: a layout edited to give a resource that has keys to
    another partition would have that partition serve the resource empty (kube-apiserver would see
    every pod gone). The partition holding the keys refuses to start, naming the partition the
    layout gives them to; a layout that drops a partition whose data dir is there is refused by the
    supervisor. A change that moves no key (a new partition for a resource nothing stored yet)
    starts."""
    c = Cluster(tmp_path)
    original = c.layout.read_text()
    c.start()
    try:
        kv(c.endpoint("main")).Put(pb.PutRequest(key=b"/registry/pods/ns/p1", value=b"v"), timeout=10)
        kv(c.endpoint("events")).Put(pb.PutRequest(key=b"/registry/events/ns/e1", value=b"v"), timeout=10)
    finally:
        c.stop()

    def start_with(layout: str) -> subprocess.CompletedProcess:
        c.layout.write_text(layout)
        return subprocess.run(c.argv, capture_output=True, text=True, timeout=120)

    extra = free_port()
    moved = start_with(original + f'\n[[partition]]\nname = "pods"\nresources = ["pods"]\nport = {extra}\n')
    last = moved.stderr.strip().splitlines()[-1]
    assert moved.returncode == 2 and last.startswith(
        "shardetcd cluster: partition main exited with code 2: shardetcd: partition main holds "
        "keys the cluster layout gives to partition pods (e.g. /registry/pods/ns/p1)"), moved.stderr[-3000:]
    dropped = start_with(original.replace('name = "events"\nresources = ["events"]', 'name = "leases2"\nresources = '
                                          '["coordination.k8s.io/leases2"]'))
    assert dropped.returncode == 2 and f"{c.data_dir / 'events'} holds the data of partition events, which the " \
        "cluster layout no longer has" in dropped.stderr, dropped.stderr[-3000:]
    c.layout.write_text(original + f'\n[[partition]]\nname = "cms"\nresources = ["configmaps"]\nport = {extra}\n')
    c.ports["cms"] = extra
    c.start()
    try:
        got = kv(c.endpoint("main")).Range(pb.RangeRequest(key=b"/registry/pods/ns/p1"), timeout=10)
        assert [x.value for x in got.kvs] == [b"v"]
        assert kv(c.endpoint("cms")).Put(pb.PutRequest(key=b"/registry/configmaps/ns/c", value=b"v"),
                                        timeout=10).header.revision == 2
    finally:
        c.stop()
