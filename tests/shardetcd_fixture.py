"""Run shardetcd (``python -m shim``) as a subprocess on a free loopback port.

    server = start_shardetcd(tmp_path)
    try:
        channel = grpc.insecure_channel(server.endpoint)
        ...
        server.restart()      # same data dir, same port
    finally:
        server.stop()

The process's stdout and stderr go to ``<tmp_path>/<name>.log`` (appended to
across restarts). Readiness means a Range over gRPC was answered, not just that
the port accepts connections.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from proto import rpc_pb2, rpc_pb2_grpc
from tests.etcd_fixture import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent


class ShardetcdStartError(RuntimeError):
    pass


_STARTED: list[ShardetcdProcess] = []  # every one this Python process started (kill_left_running)


def stop_by_pid(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM, up to ``grace`` seconds for a clean stop, then SIGKILL; always reaped."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


def kill_left_running() -> list[str]:
    """SIGKILL every shardetcd this Python process started that still runs, e.g. the ones a fixture
    had started before one of its later starts failed; what they were. tests/conftest.py calls
    it when a session ends."""
    left = [p for p in _STARTED if p.running()]
    for p in left:
        p.kill()
    _STARTED.clear()
    return [repr(p) for p in left]


class ShardetcdProcess:
    """A shardetcd server process; ``stop()`` is safe to call repeatedly."""

    def __init__(
        self,
        *,
        data_dir: Path,
        state_dir: Path,
        port: int,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        timeout: float = 30.0,
        source: Path | None = None,
    ) -> None:
        self.source = source  # the source tree it runs from (python -m bench.ab); None: this checkout
        self.data_dir = Path(data_dir)
        self.state_dir = Path(state_dir)
        self.port = port
        self.log_path = Path(log_path)
        self.extra_args = tuple(extra_args)
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    # -- identity --------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """gRPC target, "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "shim",
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.client_url,
            "--advertise-client-urls",
            self.client_url,
            "--log-level",
            "warn",
            # keep the RocksDB state under the test's tmp dir rather than /dev/shm
            "--state-dir",
            str(self.state_dir),
            *self.extra_args,
        ]

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- lifecycle -------------------------------------------------------

    def start(self, wait: bool = True) -> ShardetcdProcess:
        """Start the process; unless ``wait`` is False, until it serves (a --standby does not, yet)."""
        if self.running():
            raise RuntimeError(f"shardetcd pid {self.pid} is already running")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        env["PYTHONUNBUFFERED"] = "1"
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"=== start: {' '.join(self.args())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.source or REPO_ROOT,
            )
        if self not in _STARTED:
            _STARTED.append(self)
        if not wait:
            return self
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Until a process started with wait=False serves."""
        if timeout is not None:
            self.timeout = timeout
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise ShardetcdStartError(
                    f"shardetcd exited with code {self.returncode}; log tail:\n{self.log_tail()}"
                )
            if self.answers_range():
                return
            time.sleep(0.05)
        raise ShardetcdStartError(f"shardetcd not serving within {self.timeout}s; log tail:\n{self.log_tail()}")

    def answers_range(self, timeout: float = 1.0) -> bool:
        with grpc.insecure_channel(self.endpoint) as channel:
            try:
                rpc_pb2_grpc.KVStub(channel).Range(
                    rpc_pb2.RangeRequest(key=b"\0", count_only=True), timeout=timeout
                )
                return True
            except grpc.RpcError as e:
                # a server with auth enabled answers, but refuses a request without a token
                return e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == "etcdserver: user name is empty"

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait()

    def kill(self) -> int | None:
        """SIGKILL by PID and reap."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.proc.wait()

    def restart(self) -> ShardetcdProcess:
        """Stop (gracefully) if running, then start again on the same data dir and port."""
        self.stop()
        return self.start()

    def __enter__(self) -> ShardetcdProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"<ShardetcdProcess pid={pid} endpoint={self.endpoint} data_dir={self.data_dir}>"


def start_shardetcd(
    tmp_path: Path,
    *,
    name: str = "shardetcd",
    extra_args: tuple[str, ...] = (),
    timeout: float = 30.0,
    attempts: int = 3,
) -> ShardetcdProcess:
    """Start shardetcd with its data under ``tmp_path/<name>`` on a free port.

    A start that fails (e.g. the picked port was taken meanwhile) is retried
    on a new port, up to `attempts` times.
    """
    base = Path(tmp_path) / name
    last: Exception | None = None
    for _ in range(attempts):
        server = ShardetcdProcess(
            data_dir=base / "data",
            state_dir=base / "state",
            port=free_port(),
            log_path=base / "shardetcd.log",
            extra_args=extra_args,
            timeout=timeout,
        )
        try:
            return server.start()
        except ShardetcdStartError as exc:
            last = exc
            if "cannot listen" not in str(exc):
                break
    assert last is not None
    raise last


@contextlib.contextmanager
def shardetcd_member(tmp_path: Path, kind: str, extra_args: tuple[str, ...] = (), called_args: tuple[str, ...] = ()):
    """A fresh shardetcd to call: the server itself (``kind`` "writer") or, "local-follower", a
    follower of it on this machine (``--follow --follow-data-dir``), which hands writes to it and
    serves reads from its journal. ``extra_args`` go to both, ``called_args`` (its own ports) to
    the one called. Yields the process to call; stops both by PID afterwards."""
    writer = start_shardetcd(tmp_path, extra_args=(*extra_args, *(called_args if kind == "writer" else ())))
    try:
        if kind == "writer":
            yield writer
            return
        assert kind == "local-follower", kind
        follower = start_shardetcd(tmp_path, name="follower", extra_args=(
            *extra_args, *called_args, "--follow", "--follow-data-dir", str(writer.data_dir)))
        try:
            yield follower
        finally:
            follower.stop()
    finally:
        writer.stop()


@contextlib.contextmanager
def etcd_and_shardetcd(tmp_path: Path, etcd_args: tuple[str, ...] = (), shardetcd_args: tuple[str, ...] = ()):
    """A real etcd and a shardetcd started with the given flags; yields the two processes
    (EtcdProcess, ShardetcdProcess) and stops both by PID afterwards."""
    from tests.etcd_fixture import start_etcd

    etcd = start_etcd(Path(tmp_path) / "etcd", extra_args=etcd_args)
    try:
        shard = start_shardetcd(tmp_path, extra_args=shardetcd_args)
        try:
            yield etcd, shard
        finally:
            shard.stop()
    finally:
        etcd.stop()


@contextlib.contextmanager
def etcd_beside_shardetcd(tmp_path: Path, etcd_args: tuple[str, ...] = (), shardetcd_args: tuple[str, ...] = ()):
    """The same, yielding {"etcd": endpoint, "shardetcd": endpoint}."""
    with etcd_and_shardetcd(tmp_path, etcd_args, shardetcd_args) as (etcd, shard):
        yield {"etcd": etcd.endpoint, "shardetcd": shard.endpoint}
