"""tests/chaos.py's ``--cluster`` deployment: ``shardetcd cluster``, on JetStream or local journals.

The supervisor runs two partitions, ``main`` (everything the chaos clients, watches, leases and
locks use) and ``nodes`` (``/registry/minions/``, one client of its own), each as two processes on
one client URL (on JetStream, ``--standbys``: one serves, the other follows and takes over; on
local journals, one process) and one follower on a URL of its own (``--followers 1``: of the
JetStream journals, or of the writer's data dir). The chaos members are the endpoints: ``main``
(whichever of its processes serves) and ``main.f1``; ``nodes`` and ``nodes.f1`` are the other
partition's. The supervisor restarts what dies; the faults strike its processes, or it
(``CLUSTER_FAULTS``; on local journals ``CLUSTER_LOCAL_FAULTS``, without the standby's and NATS's):

* ``kill-writer`` / ``pause-writer``: main's serving process (its standby takes over the URL);
* ``hang-writer``: main's serving process stopped until a write through main's URL is answered,
  which must be within 30 s: on JetStream the standby takes over and serves the URL the stopped
  process still holds (the supervisor kills it); on local journals the supervisor finds its event
  loop silent past ``--liveness-timeout`` (LIVENESS_S here) and kills and restarts it;
* ``kill-member`` / ``pause-member``: main's standby process or its follower (local: its follower);
* ``kill-partition``: the nodes partition's serving process (main must not notice);
* ``kill-supervisor``: SIGKILL the supervisor: every process it started stops (their parent-death
  signal), and it is started again on the same data dir, as an init system would;
* ``cut-cluster`` / ``stall-cluster``: every process of the cluster cut off from NATS, or its
  connections to NATS a black hole, for a while, as when the machine the cluster runs on loses its
  network to NATS and gets it back (the processes reach NATS through proxies shared by them all:
  the supervisor passes one ``--journal-url`` to each). No process can write or renew its lease
  meanwhile, and none can take over; once it heals, one serves main again and no lease kept alive
  through any member is lost;
* the NATS faults of the JetStream deployment.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests import chaos_auth
from tests.etcd_fixture import free_ports
from tests.shardetcd_fixture import REPO_ROOT, stop_by_pid
from tests.tcp_proxy import TcpProxy, broken_for

CLUSTER_FAULTS = ("kill-writer", "pause-writer", "hang-writer", "kill-member", "pause-member", "kill-partition", "kill-supervisor",
                  "cut-cluster", "stall-cluster", "kill-nats", "pause-nats", "kill-nats-quorum")
CLUSTER_LOCAL_FAULTS = ("kill-writer", "pause-writer", "hang-writer", "kill-member", "pause-member", "kill-partition",
                        "kill-supervisor")
LIVENESS_S = 10.0  # the supervisor's --liveness-timeout: past the longest pause (2.5 lease TTLs)
OTHER_KEY = b"/registry/minions/chaos/lin"  # on the nodes partition
START_TIMEOUT_S = 120.0


def endpoint_status(endpoint: str) -> pb.StatusResponse | None:
    """Status through ``endpoint``, None when it does not answer (a chaos member's own)."""
    try:
        with chaos_auth.channel(endpoint) as ch:
            return pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=2)
    except grpc.RpcError:
        return None


def _alive(pid: int) -> bool:
    """Running, and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


class ClusterRun:
    """One ``shardetcd cluster`` supervisor, started again on the same data dir when it is killed."""

    def __init__(self, nats, out: Path, server_args: tuple[str, ...]) -> None:
        """On ``nats``'s JetStream with standbys; with ``nats`` None, on local journals."""
        self.dir = out / "cluster"
        self.standbys = nats is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(("main", "nodes"), free_ports(2)))
        # every process reaches NATS through these (cut-cluster, stall-cluster)
        self.proxies = [TcpProxy(server.client_port).start() for server in nats.servers] if nats else []
        journal = ",".join(f"nats://127.0.0.1:{p.port}" for p in self.proxies)
        layout = out / "cluster.toml"
        layout.write_text(f'[[partition]]\nname = "nodes"\nresources = ["nodes"]\nport = {self.ports["nodes"]}\n\n'
                          f'[[partition]]\nname = "main"\ndefault = true\nport = {self.ports["main"]}\n')
        self.argv = [sys.executable, "-m", "shim", "cluster", "--layout", str(layout), "--data-dir", str(self.dir / "data"),
                     "--state-dir", str(self.dir / "state"), "--followers", "1", "--liveness-timeout", str(LIVENESS_S),
                     *(("--journal-url", journal, "--standbys") if nats else ()), *server_args]
        self.out_path = self.dir / "supervisor.out"
        self.proc: subprocess.Popen | None = None
        self.urls: dict[str, str] = {}
        self.seen: set[int] = set()  # every process of the cluster seen, stopped by PID at the end

    def output(self, since: int = 0) -> str:
        return self.out_path.read_bytes()[since:].decode("utf-8", "replace")

    def start(self) -> None:
        """The supervisor, until every partition and follower serves; the followers' URLs it printed."""
        offset = self.out_path.stat().st_size if self.out_path.exists() else 0
        with self.out_path.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=REPO_ROOT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "--etcd-servers=" not in (said := self.output(offset)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the cluster did not start: {said[-3000:]}")
            time.sleep(0.2)
        followers = dict(re.findall(r"^  (\S+)\s+follower at https?://(\S+)\s+pid \d+", said, re.M))
        assert not self.urls or followers == {k: v for k, v in self.urls.items() if k in followers}, \
            f"a follower moved: {followers} (was {self.urls})"
        self.urls = {name: f"127.0.0.1:{port}" for name, port in self.ports.items()} | followers
        self.pids()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> dict[str, int]:
        """The supervisor's processes now, by name (``main``, ``main.2``, ``main.f1``, ...)."""
        out = {}
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return out
        for pid in map(int, children):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--name" in argv and _alive(pid):
                out[argv[argv.index(b"--name") + 1].decode()] = pid
                self.seen.add(pid)
        return out

    def serving(self, partition: str, timeout: float = 60.0) -> str:
        """The name of the process serving ``partition`` now (the one its Status names the leader)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with chaos_auth.channel(self.urls[partition]) as ch:
                    leader = pbg.MaintenanceStub(ch).Status(pb.StatusRequest(), timeout=2).leader
                    members = pbg.ClusterStub(ch).MemberList(pb.MemberListRequest(), timeout=2).members
                named = [m.name for m in members if m.ID == leader]
                if named and named[0] in self.pids():
                    return named[0]
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"no process serves {partition}: {self.output()[-2000:]}"
            time.sleep(0.3)

    def kill_supervisor(self, rng: random.Random, log) -> None:
        """SIGKILL the supervisor; every process it started must stop by itself; then it is started again."""
        started = self.pids()
        log(f"  SIGKILL the supervisor (pid {self.proc.pid}; its processes {started})")
        self.proc.kill()
        self.proc.wait()
        deadline = time.monotonic() + 30
        while left := [name for name, pid in started.items() if _alive(pid)]:
            assert time.monotonic() < deadline, f"processes outlived their supervisor by 30 s: {left}"
            time.sleep(0.1)
        time.sleep(rng.uniform(0.5, 3.0))
        self.start()  # its followers on the ports they had (start asserts it), as kube-apiserver's flags name them
        log(f"  the supervisor is back (pid {self.proc.pid}): {self.pids()}")

    def stop(self) -> None:
        """The supervisor by SIGTERM (it stops its processes), then every process it ever had, by PID."""
        if self.proc is not None:
            stop_by_pid(self.proc)
        for pid in self.seen:
            try:  # still one of this cluster's (not a PID used again since)
                ours = str(self.dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if ours and _alive(pid):
                _resume(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.proxies:
            p.close()


class ClusterMember:
    """A chaos member of the cluster: one client URL, served by the processes ``names`` in turn
    (the partition's two processes, or one follower). It is also its own ``proc``, as
    tests/chaos.py asks a member's process: running while the supervisor runs (which restarts
    its processes), its log the tail of their logs; only the cluster as a whole is stopped
    (``ClusterRun.stop``)."""

    proxies: list = []

    def __init__(self, run: ClusterRun, name: str, names: tuple[str, ...]) -> None:
        self.run, self.name, self.names = run, name, names

    @property
    def proc(self) -> ClusterMember:
        return self

    @property
    def endpoint(self) -> str:
        return self.run.urls[self.name]

    @property
    def pid(self) -> int | None:
        pids = self.run.pids()
        return pids.get(self.run.serving(self.name) if len(self.names) > 1 else self.name)

    @property
    def metrics_port(self) -> int:
        return int(self.endpoint.rpartition(":")[2])

    @property
    def returncode(self) -> int | None:
        return self.run.proc.returncode

    def running(self) -> bool:
        return self.run.running()

    def revive(self) -> None:
        if not self.run.running():
            self.run.start()

    def log_tail(self, lines: int = 40) -> str:
        tails = []
        for name in self.names:
            try:
                text = (self.run.dir / "data" / f"{name}.log").read_text(errors="replace")
            except OSError:
                continue
            tails.append(f"[{name}] " + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails)

    def status(self) -> pb.StatusResponse | None:
        return endpoint_status(self.endpoint)

    def _metrics(self) -> str:
        return chaos_auth.get(self.endpoint, "/metrics").decode()

    def follower_metrics(self) -> str:
        try:
            text = self._metrics()
        except OSError as exc:
            return f"{self.name}: no metrics ({exc})"
        return f"{self.name}: " + "; ".join(line for line in text.splitlines() if line.startswith("shardetcd_follower_"))

    def checkpoints_stored(self) -> int | None:
        try:
            text = self._metrics()
        except OSError:
            return None
        return int(sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                       if line.startswith("shardetcd_shard_checkpoints_total")))


def members(run: ClusterRun, partition: str) -> list[ClusterMember]:
    return [ClusterMember(run, partition, (partition, f"{partition}.2") if run.standbys else (partition,)),
            ClusterMember(run, f"{partition}.f1", (f"{partition}.f1",))]


def _resume(pid: int) -> None:
    """SIGCONT, unless the supervisor killed (and reaped) it meanwhile: a writer stopped past its
    lease is deposed, and killed once its standby took over and found the URL held."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def served_again(endpoint: str, timeout: float) -> float:
    """Seconds until a put through ``endpoint`` is answered (AssertionError past ``timeout``): each
    try on a new connection, as one to a process that hangs would hang too."""
    started = time.monotonic()
    while True:
        try:
            with chaos_auth.channel(endpoint) as ch:
                pbg.KVStub(ch).Put(pb.PutRequest(key=b"/registry/pods/chaos/hang", value=b"x"), timeout=2)
            return time.monotonic() - started
        except grpc.RpcError as exc:
            assert time.monotonic() < started + timeout, f"{endpoint} served no write in {timeout} s while its " \
                f"writer was stopped: {exc.code().name}: {exc.details()}"
            time.sleep(0.2)


def inject(fault: str, run: ClusterRun, rng: random.Random, log, lease_ttl_s: float) -> str | None:
    """A fault of CLUSTER_FAULTS but the NATS ones, until it healed; the chaos member it struck."""
    if fault == "kill-supervisor":
        run.kill_supervisor(rng, log)
        return None  # every member, and none longer than a restart: every lease must be kept
    if fault in ("cut-cluster", "stall-cluster"):
        how, held = fault.partition("-")[0], rng.uniform(0.5, 3.0) * lease_ttl_s
        log(f"  every process of the cluster {'cut off from' if how == 'cut' else 'stalled on'} NATS for {held:.1f} s")
        broken_for(run.proxies, how, held)
        time.sleep(lease_ttl_s)
        return None  # every member alike: no lease may be lost
    if fault == "kill-partition":
        name = run.serving("nodes")
        log(f"  SIGKILL {name} (pid {run.pids()[name]}), the nodes partition's serving process")
        os.kill(run.pids()[name], signal.SIGKILL)
        time.sleep(rng.uniform(0.5, 2 * lease_ttl_s))
        return None
    writer = run.serving("main")
    if fault.endswith("-writer"):
        victim, struck = writer, "main"
    else:
        victim = rng.choice([{"main": "main.2", "main.2": "main"}[writer], "main.f1"] if run.standbys else ["main.f1"])
        struck = "main.f1" if victim == "main.f1" else None  # a standby serves no client
    pid = run.pids()[victim]
    if fault == "hang-writer":
        log(f"  SIGSTOP {victim} (pid {pid}) until a write through main's URL is answered")
        os.kill(pid, signal.SIGSTOP)
        try:
            took = served_again(run.urls["main"], 30.0)
        finally:
            _resume(pid)
        log(f"  main served a write {took:.1f} s after its writer stopped; {victim} "
            f"{'was killed' if not _alive(pid) else 'still runs'}")
        return struck
    if fault.startswith("kill"):
        log(f"  SIGKILL {victim} (pid {pid})")
        os.kill(pid, signal.SIGKILL)
        time.sleep(rng.uniform(0.5, 2 * lease_ttl_s))
    else:
        held = rng.uniform(0.5, 2.5) * lease_ttl_s
        log(f"  SIGSTOP {victim} (pid {pid}) for {held:.1f} s")
        os.kill(pid, signal.SIGSTOP)
        time.sleep(held)
        _resume(pid)
        time.sleep(lease_ttl_s)
    return struck
