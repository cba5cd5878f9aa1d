"""The deployments of the durability comparison (python -m bench.durability).

A deployment is one client endpoint plus every process that persists its
writes (their PIDs give the server-side CPU and the bytes written), all on
127.0.0.1, free ports, data under the run's temp dir, stopped by PID:

  etcd                  single etcd 3.5.1, data dir on disk
  etcd-3                three etcd 3.5.1 members (static --initial-cluster, each its own data
                        dir on disk); the load is given the leader's endpoint
  shardetcd-local       shardetcd with its defaults: local journal segments, fdatasync per group commit
  shardetcd-js-r1       journals on JetStream, one NATS server, --journal-replicas 1
  shardetcd-js-r3       journals on JetStream, three clustered NATS servers, --journal-replicas 3
  shardetcd-js-r3-sync  the same with NATS's `sync_interval: always` (fsync before each ack;
                        JetStream's default fsyncs every 2 minutes)

Why the leader for etcd-3: the load generator drives one target per run, and
a 3-member etcd given all three endpoints sends two thirds of the writes
through a follower, which forwards each proposal to the leader (one more hop
and more CPU on the same 2 cores). The leader is etcd's best case, so ratios
against it are the strict ones for shardetcd.

Takeover (kill -9, then the first acknowledged write):
  etcd-3           the leader (found by Maintenance.Status) is killed under 8 writing
                   clients; probes go to the two surviving members; the killed member is
                   started again on its data dir before the next repeat
  shardetcd-js-r3  a --standby (its own data dir and client port) waits on the writer
                   lease; the writer is killed under 8 writing clients; probes go to the
                   standby; the standby is the writer of the next repeat (with a new standby)
Probes: a Put to every probed endpoint every 20 ms, each with its own 10 s
deadline, over channels that retry a refused connection after 20-50 ms; the
takeover time is kill -> the first Put acknowledged (±~50 ms).
"""
from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import _healthy as etcd_healthy, free_ports
from tests.nats_fixture import start_nats_cluster

from .servers import _DefaultShardetcd, etcd351_binary, start_real_etcd, start_shardetcd_default

LEASE_TTL_S = 3.0  # shardetcd's default --journal-lease-ttl (renewed every TTL/3), not changed here
# a refused connection is retried within 20-50 ms (gRPC's default backoff starts at 1 s)
FAST_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 20), ("grpc.min_reconnect_backoff_ms", 20),
                  ("grpc.max_reconnect_backoff_ms", 50)]


def io_bytes(pid: int) -> tuple[int, int]:
    """(write_bytes, cancelled_write_bytes) of a process, all its threads: bytes it caused
    to be written to a block device (page-granular, counted when a page is dirtied;
    writes to tmpfs are not counted)."""
    with open(f"/proc/{pid}/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return int(d["write_bytes"]), int(d["cancelled_write_bytes"])


@dataclass
class Deployment:
    name: str
    endpoint: str
    version: str
    pids: Callable[[], dict[str, int]]  # role -> pid, every process that persists (read at each sample)
    stop: Callable[[], None]
    takeover: Callable[[int, float, Callable[[str], None]], list[dict]] | None = None  # (repeats, write s, log)
    describe: str = ""
    meta: dict = field(default_factory=dict)


# ---------------------------------------------------------------- etcd


def etcd_version() -> str:
    out = subprocess.run([etcd351_binary(), "--version"], capture_output=True, text=True).stdout
    return "etcd " + (out.split("\n")[0].split(":")[-1].strip() or "?")


def start_etcd_single(tmp: Path) -> Deployment:
    srv = start_real_etcd(tmp / "etcd")
    return Deployment("etcd", srv.endpoint, srv.version, lambda: {"etcd": srv.process.pid}, srv.stop,
                      describe="single etcd 3.5.1, data dir on disk")


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    dir: Path
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        with open(self.dir / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 by PID and reap."""
        if self.running():
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.dir / "etcd.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class EtcdCluster:
    """`size` etcd members on loopback, bootstrapped statically (--initial-cluster)."""

    def __init__(self, tmp: Path, size: int = 3) -> None:
        ports = free_ports(2 * size)
        token = f"bench-{ports[0]}"
        self.members = [EtcdMember(f"m{i}", ports[2 * i], ports[2 * i + 1], tmp / f"m{i}") for i in range(size)]
        initial = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)
        for m in self.members:
            m.dir.mkdir(parents=True, exist_ok=True)
            client, peer = f"http://{m.endpoint}", f"http://127.0.0.1:{m.peer_port}"
            m.args = [etcd351_binary(), f"--name={m.name}", f"--data-dir={m.dir / 'data'}",
                      f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                      f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                      f"--initial-cluster={initial}", "--initial-cluster-state=new",
                      f"--initial-cluster-token={token}", "--logger=zap", "--log-outputs=stderr"]

    def start(self, timeout: float = 60.0) -> EtcdCluster:
        for m in self.members:  # all before waiting: a member is healthy only once a leader is elected
            m.start()
        self.wait_healthy(timeout)
        return self

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for m in self.members:
            while not etcd_healthy(f"http://{m.endpoint}"):
                if not m.running():
                    raise RuntimeError(f"etcd member {m.name} exited:\n{m.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd member {m.name} not healthy within {timeout:.0f} s:\n{m.log_tail()}")
                time.sleep(0.05)

    def leader(self) -> int:
        """Index of the current leader, from Maintenance.Status of the running members."""
        for _ in range(100):
            ids = {}
            lead = None
            for i, m in enumerate(self.members):
                if not m.running():
                    continue
                with grpc.insecure_channel(m.endpoint) as ch:
                    try:
                        st = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=5)
                    except grpc.RpcError:
                        continue
                ids[st.header.member_id] = i
                lead = st.leader or lead
            if lead in ids:
                return ids[lead]
            time.sleep(0.1)
        raise RuntimeError("no etcd leader found")

    def pids(self) -> dict[str, int]:
        return {f"etcd {m.name}": m.proc.pid for m in self.members if m.running()}

    def stop(self) -> None:
        for m in self.members:
            m.kill()


def start_etcd_cluster(tmp: Path, size: int = 3) -> Deployment:
    last: Exception | None = None
    for attempt in range(2):  # a picked port may be taken before etcd binds it
        cluster = EtcdCluster(tmp / f"etcd-{size}-{attempt}", size)
        try:
            cluster.start()
            break
        except (RuntimeError, TimeoutError) as exc:
            cluster.stop()
            last = exc
    else:
        raise last  # type: ignore[misc]
    state = {"endpoint": cluster.members[cluster.leader()].endpoint}

    def takeover(repeats: int, write_s: float, log: Callable[[str], None]) -> list[dict]:
        out = []
        for k in range(repeats):
            li = cluster.leader()
            leader = cluster.members[li]
            writers = Writers(leader.endpoint)
            time.sleep(write_s)
            survivors = [m.endpoint for m in cluster.members if m is not leader]
            took = kill_and_probe(leader.kill, survivors)
            acked = writers.join()
            out.append({"took_s": took, "killed": f"leader {leader.name} (pid {leader.proc.pid})",
                        "acked_before_kill": acked})
            log(f"takeover etcd-3 {k + 1}/{repeats}: leader {leader.name} killed under 8 writers ({acked} puts acked), "
                f"first put acked by a survivor after {took:.2f} s")
            leader.start()  # again on its data dir; it rejoins as a follower
            cluster.wait_healthy()
        return out

    return Deployment("etcd-3", state["endpoint"], f"{etcd_version()} × {size}", cluster.pids, cluster.stop, takeover,
                      describe=f"{size} etcd 3.5.1 members on loopback, each its own data dir on disk; "
                               "load on the leader's endpoint",
                      meta={"members": [m.endpoint for m in cluster.members], "leader_at_start": state["endpoint"]})


# ---------------------------------------------------------------- shardetcd


def start_shardetcd_local(tmp: Path) -> Deployment:
    srv = start_shardetcd_default(tmp / "local")
    return Deployment("shardetcd-local", srv.endpoint, srv.version, lambda: {"shardetcd": srv.process.pid}, srv.stop,
                      describe="shardetcd defaults: local journal on disk, fdatasync per group commit")


def start_shardetcd_js(tmp: Path, replicas: int, sync: bool = False) -> Deployment:
    name = f"shardetcd-js-r{replicas}" + ("-sync" if sync else "")
    base = tmp / name
    nats = start_nats_cluster(base / "nats", size=replicas, sync_interval="always" if sync else None)
    js_args = ("--journal-url", nats.urls, "--journal-replicas", str(replicas))
    try:
        srv = start_shardetcd_default(base / "n0", js_args, f"journal on JetStream R{replicas}")
    except BaseException:
        nats.stop()
        raise
    # the writer serving now, and every process started since (standbys), for stop and clean-up
    state = {"writer": srv.process, "all": [srv.process]}

    def pids() -> dict[str, int]:
        out = {"shardetcd": state["writer"].pid}
        out.update({f"nats {s.name}": s.pid for s in nats.servers if s.running()})
        return out

    def stop() -> None:
        try:
            for p in state["all"]:
                p.stop(grace=15)
                shutil.rmtree(p.default_state_dir(), ignore_errors=True)  # RocksDB state on /dev/shm
        finally:
            nats.stop()

    def takeover(repeats: int, write_s: float, log: Callable[[str], None]) -> list[dict]:
        out = []
        for k in range(repeats):
            writer = state["writer"]
            d = base / f"n{k + 1}"
            standby = _DefaultShardetcd(data_dir=d / "data", state_dir=d / "unused", port=free_ports(1)[0],
                                        log_path=d / "shardetcd.log", extra_args=(*js_args, "--standby"), timeout=120)
            standby.metrics_port = free_ports(1)[0]
            state["all"].append(standby)
            standby.start(wait=False)
            deadline = time.monotonic() + 120
            while "standing by, following" not in standby.log_tail(200):
                if not standby.running() or time.monotonic() > deadline:
                    raise RuntimeError(f"standby did not start:\n{standby.log_tail()}")
                time.sleep(0.05)
            writers = Writers(writer.endpoint)
            time.sleep(write_s)
            killed_at: list[float] = []

            def kill() -> None:
                writer.kill()
                killed_at.append(time.time())  # wall clock, as the standby's log lines

            took = kill_and_probe(kill, [standby.endpoint])
            acked = writers.join()
            shutil.rmtree(writer.default_state_dir(), ignore_errors=True)
            state["writer"] = standby
            split = standby_phases(standby.log_tail(400), killed_at[0])
            # a standby holding the lease before the kill means the writer had lost it: not a takeover from a kill
            valid = split.get("lease_s", 1.0) > 0
            out.append({"took_s": took, "valid": valid, "killed": f"writer (pid {writer.pid})", "acked_before_kill": acked,
                        **split})
            log(f"takeover {name} {k + 1}/{repeats}: writer killed under 8 writers ({acked} puts acked), "
                f"first put acked by the standby after {took:.2f} s (lease taken at {split.get('lease_s', 0):.2f} s, "
                f"recovered at {split.get('recovered_s', 0):.2f} s, {split.get('records_replayed', '?')} records replayed)"
                + ("" if valid else "; NOT COUNTED: the standby held the lease before the kill (the writer had lost it)"))
            if k + 1 < repeats:
                # The new writer renews its lease only once it has recovered (shim/server.py start()): after a
                # recovery longer than 2/3 of the TTL the lease has lapsed and the writer takes it again at its first
                # renewal, TTL/3 after it serves. A standby started before that takes the lapsed lease from the
                # serving writer, and the next repeat would not start from a steady writer.
                time.sleep(LEASE_TTL_S + 1.0)
        return out

    nats_desc = "one NATS server" if replicas == 1 else f"{replicas} clustered NATS servers"
    sync_desc = "NATS sync_interval: always (fsync before ack)" if sync else "NATS default sync_interval (fsync every 2 min)"
    return Deployment(name, srv.endpoint, f"shardetcd, journal on JetStream R{replicas} (nats-server {nats_version()})",
                      pids, stop, takeover if replicas > 1 and not sync else None,
                      describe=f"shardetcd, journals on JetStream, {nats_desc}, --journal-replicas {replicas}; {sync_desc}",
                      meta={"nats": nats.urls})


def _log_time(line: str) -> float:
    """Wall-clock time of a shardetcd log line ("2026-01-01 12:00:00,123 level=...", local time)."""
    return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def standby_phases(log_text: str, killed_wall: float) -> dict:
    """What a takeover was made of, from the standby's log: seconds from the kill until it
    held the writer lease (the dead writer's lease lapsing) and until it was ready to write
    (a standby that follows the journals only fences them and applies what came meanwhile;
    one that recovers replays checkpoint + streams), and the journal records it read then."""
    out: dict = {}
    lines = log_text.splitlines()
    start = next((i for i, x in enumerate(lines) if "msg=taking over as the writer" in x), None)
    if start is None:
        return out
    acquired = next((x for x in lines[:start + 1] if "msg=writer lease acquired" in x), lines[start])
    out["lease_s"] = _log_time(acquired) - killed_wall
    records = 0
    for x in lines[start:]:
        m = re.search(r"msg=journal stream read .* records=(\d+)", x)
        if m:
            records += int(m[1])
        if "msg=recovered " in x or "msg=took over as the writer" in x:  # the latter: from the state it followed
            out["recovered_s"] = _log_time(x) - killed_wall
            break
    out["records_replayed"] = records
    return out


def nats_version() -> str:
    from tests.nats_fixture import nats_binary

    out = subprocess.run([nats_binary(), "--version"], capture_output=True, text=True).stdout.strip()
    return out.split()[-1].lstrip("v") if out else "?"


DEPLOYMENTS: dict[str, Callable[[Path], Deployment]] = {
    "etcd": start_etcd_single,
    "etcd-3": start_etcd_cluster,
    "shardetcd-local": start_shardetcd_local,
    "shardetcd-js-r1": lambda tmp: start_shardetcd_js(tmp, 1),
    "shardetcd-js-r3": lambda tmp: start_shardetcd_js(tmp, 3),
    "shardetcd-js-r3-sync": lambda tmp: start_shardetcd_js(tmp, 3, sync=True),
}


# ---------------------------------------------------------------- takeover


class Writers:
    """`n` clients putting distinct keys to `endpoint` in a loop until it stops answering
    (the load a takeover happens under); counts acknowledged puts."""

    def __init__(self, endpoint: str, n: int = 8) -> None:
        self.endpoint = endpoint
        self.acked = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(w,), daemon=True) for w in range(n)]
        for t in self.threads:
            t.start()

    def run(self, w: int) -> None:
        value = b"v" * 256
        with grpc.insecure_channel(self.endpoint) as ch:
            put = pbg.KVStub(ch).Put
            i = 0
            while not self.stop.is_set():
                i += 1
                try:
                    put(pb.PutRequest(key=b"/bench/takeover/w%d/%d" % (w, i), value=value), timeout=10)
                except grpc.RpcError:
                    return
                with self.lock:
                    self.acked += 1

    def join(self) -> int:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        return self.acked


def kill_and_probe(kill: Callable[[], None], endpoints: list[str], every: float = 0.02, limit: float = 120.0) -> float:
    """kill(), then a Put to every endpoint every `every` s until one is acknowledged;
    seconds from the kill to that acknowledgement."""
    chans = [grpc.insecure_channel(e, options=FAST_RECONNECT) for e in endpoints]
    puts = [pbg.KVStub(c).Put for c in chans]
    acked: list[float] = []
    lock = threading.Lock()

    def done(f) -> None:
        t = time.monotonic()
        if not f.cancelled() and f.exception() is None:
            with lock:
                acked.append(t)

    futures = []
    try:
        kill()
        t_kill = time.monotonic()
        i = 0
        while not acked:
            if time.monotonic() - t_kill > limit:
                raise RuntimeError(f"no write acknowledged by {endpoints} within {limit:.0f} s of the kill")
            for put in puts:
                i += 1
                f = put.future(pb.PutRequest(key=b"/bench/takeover/probe/%d" % i, value=b"p"), timeout=10)
                f.add_done_callback(done)
                futures.append(f)
            time.sleep(every)
        with lock:
            return min(acked) - t_kill
    finally:
        for f in futures:
            f.cancel()
        for c in chans:
            c.close()
