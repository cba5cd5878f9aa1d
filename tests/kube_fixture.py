"""Run a real kube-apiserver against given etcd endpoints, for acceptance tests.

    api = start_kube_apiserver(tmp_path, ["http://127.0.0.1:2379"])
    try:
        status, ns = api.client.request("POST", "/api/v1/namespaces", {"metadata": {"name": "t"}})
        with api.client.watch("/api/v1/namespaces/t/configmaps", resource_version="123") as w:
            w.next_event(timeout=30)
        assert bad_log_lines(api.log_path) == []
    finally:
        api.stop()

The binary is the xz-compressed kube-apiserver that ships beside the repository
(``<repo root>/../shared/bin/kube-apiserver.xz``; CI clones the repository with
``shared/`` next to it), or the file $SHARDETCD_TEST_KUBE_APISERVER names (an
``.xz`` file or an executable). A compressed binary is unpacked once into
``~/.cache/shardetcd-test/`` (``$XDG_CACHE_HOME`` if set), keyed by the SHA-256 of
the compressed file. A missing binary is an error for the caller to report (tests
fail, never skip: CI must run them).

The API server listens on 127.0.0.1 on a free port, with a self-signed serving
certificate, a service-account key pair and a static bearer token made in the
test's tmp dir; its log goes to ``<dir>/kube-apiserver.log``; it is stopped by PID.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import lzma
import os
import queue
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.etcd_fixture import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
KUBE_APISERVER_ENV = "SHARDETCD_TEST_KUBE_APISERVER"
DEFAULT_KUBE_APISERVER_XZ = REPO_ROOT.parent / "shared" / "bin" / "kube-apiserver.xz"

# Lines in kube-apiserver's log that mean its etcd endpoint answered differently
# from etcd (the first three are the ones /work/shared/KUBERNETES.md names; the
# others are format strings found in the v1.36.2 binary's storage layer):
BAD_LOG_PATTERNS: dict[str, str] = {
    # Maintenance.Status gave a version below 3.5.13 (or could not be parsed):
    # consistent reads from cache and consistent watch-list are turned off.
    "RequestWatchProgress feature is not supported": "Status version < 3.5.13 or unparsable",
    "Failed to check if RequestWatchProgress is supported": "Status kept failing at start",
    # a DELETE watch event arrived without prev_kv although the watch asked for it
    "etcd event received with PrevKv=nil": "watch DELETE event without prev_kv",
    # the watch cache waited 3 s for a revision the endpoint had already reported
    "Too large resource version": "watch/progress did not reach a revision a read reported",
    # a read or watch at a revision the endpoint had itself reported answered "future revision"
    "required revision is a future revision": "endpoint refused a revision it had reported",
    # the periodic (~5 min) check that the watch cache equals a list at the same revision
    "Cache consistency check failed": "watch cache differs from a list at the same revision",
    # an etcd watch ended with an error (e.g. compacted), or the cacher had to relist
    "watch chan error": "a watch response carried an error",
    "unexpected ListAndWatch error": "the watch cache had to reinitialise",
    # a watch event's value could not be decoded
    "failed to prepare current and previous objects": "undecodable watch event",
}


class KubeApiserverMissing(FileNotFoundError):
    pass


class KubeApiserverStartError(RuntimeError):
    pass


# -- the binary ---------------------------------------------------------------


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardetcd-test"


def kube_apiserver_binary(cache_root: Path | None = None) -> Path:
    """The kube-apiserver executable, unpacked into the cache on first use.

    Raises KubeApiserverMissing (with what was looked for) if there is none."""
    source = os.environ.get(KUBE_APISERVER_ENV)
    path = Path(source) if source else DEFAULT_KUBE_APISERVER_XZ
    if not path.is_file():
        raise KubeApiserverMissing(
            f"no kube-apiserver: {path} does not exist; it ships as shared/bin/kube-apiserver.xz "
            f"beside the repository checkout, or set ${KUBE_APISERVER_ENV} to a kube-apiserver "
            f"binary or its .xz"
        )
    if path.suffix != ".xz":
        if not os.access(path, os.X_OK):
            raise KubeApiserverMissing(f"${KUBE_APISERVER_ENV}={path} is not executable")
        return path
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    target_dir = (cache_root or _cache_root()) / f"kube-apiserver-{digest.hexdigest()[:24]}"
    target = target_dir / "kube-apiserver"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    partial = target_dir / f".kube-apiserver.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        with lzma.open(path, "rb") as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.chmod(0o755)
        os.replace(partial, target)  # atomic: a concurrent unpacker sees a whole file or none
    finally:
        partial.unlink(missing_ok=True)
    return target


def require_kube_apiserver() -> Path:
    """The binary, or fail the test (never skip: CI must run these tests)."""
    try:
        return kube_apiserver_binary()
    except KubeApiserverMissing as exc:
        import pytest

        pytest.fail(str(exc))


# -- credentials ----------------------------------------------------------------


def _write_service_account_keys(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / "sa.key"
    public = directory / "sa.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


# -- the HTTP client ------------------------------------------------------------


class KubeClient:
    """A minimal JSON client for the API server: bearer token, unverified TLS
    (the serving certificate is self-signed), one connection per request."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.tls = ssl.create_default_context()
        self.tls.check_hostname = False
        self.tls.verify_mode = ssl.CERT_NONE

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.tls, timeout=timeout)

    @staticmethod
    def _url(path: str, params: dict | None) -> str:
        if not params:
            return path
        return f"{path}?{urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})}"

    def request(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
                timeout: float = 60.0) -> tuple[int, dict | str]:
        """(HTTP status, decoded JSON body, or the text if it is not JSON)."""
        conn = self._connection(timeout)
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, self._url(path, params), body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")

    def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
             expect: int | Sequence[int] = (200, 201), timeout: float = 60.0) -> dict:
        """request() that asserts the status; returns the decoded body."""
        status, obj = self.request(method, path, body, params, timeout)
        wanted = (expect,) if isinstance(expect, int) else tuple(expect)
        assert status in wanted, f"{method} {path} {params or ''}: HTTP {status} (wanted {wanted}): {obj}"
        assert isinstance(obj, dict), obj
        return obj

    def text(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        status, body = self.request("GET", path, timeout=timeout)
        return status, body if isinstance(body, str) else json.dumps(body)

    def list_all(self, path: str, limit: int, params: dict | None = None) -> tuple[list[dict], list[dict]]:
        """Every page of a paginated list (limit + continue): (items, page metadata)."""
        items: list[dict] = []
        pages: list[dict] = []
        cont = None
        while True:
            query = {**(params or {}), "limit": limit}
            if cont:  # the token carries the first page's revision: no resourceVersion(Match) beside it
                query.update(resourceVersion=None, resourceVersionMatch=None, **{"continue": cont})
            page = self.call("GET", path, params=query, expect=200)
            items += page["items"]
            pages.append(page["metadata"])
            cont = page["metadata"].get("continue")
            if not cont:
                return items, pages

    def watch(self, path: str, resource_version: str | None, params: dict | None = None,
              timeout_seconds: int = 300) -> WatchStream:
        return WatchStream(self, path, {**(params or {}), "watch": "true", "resourceVersion": resource_version,
                                        "timeoutSeconds": timeout_seconds})


class WatchEnded(Exception):
    """The watch stream ended (EOF or a connection error); `.reason` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WatchStream:
    """One HTTP watch: a thread reads the newline-delimited JSON events into a
    queue; next_event() takes them one at a time with a bound on waiting."""

    def __init__(self, client: KubeClient, path: str, params: dict) -> None:
        self.url = client._url(path, params)
        # no socket timeout: an idle watch is normal; close() ends the reader
        self.conn = client._connection(timeout=None)  # type: ignore[arg-type]
        self.conn.request("GET", self.url, headers={"Authorization": f"Bearer {client.token}",
                                                    "Accept": "application/json"})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.events: queue.Queue = queue.Queue()
        self.ended: str | None = None
        if self.status != 200:
            body = self.resp.read().decode(errors="replace")
            self.conn.close()
            raise AssertionError(f"watch {self.url}: HTTP {self.status}: {body}")
        self.reader = threading.Thread(target=self._read, name=f"watch {path}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        reason = "EOF"
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    break
                if line.strip():
                    self.events.put(json.loads(line))
        except Exception as exc:  # connection torn down, by close() or otherwise
            reason = f"{type(exc).__name__}: {exc}"
        self.events.put(WatchEnded(reason))

    def next_event(self, timeout: float) -> dict:
        """The next event; raises WatchEnded if the stream ended, TimeoutError after `timeout` s."""
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no watch event within {timeout}s on {self.url}") from None
        if isinstance(item, WatchEnded):
            self.events.put(item)  # stays ended
            raise item
        return item

    def close(self) -> None:
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.conn.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# -- the process ----------------------------------------------------------------


class KubeApiserver:
    """A running kube-apiserver; ``stop()`` is safe to call repeatedly."""

    def __init__(self, proc: subprocess.Popen, *, port: int, token: str, directory: Path, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.token = token
        self.dir = directory
        self.log_path = log_path
        self.client = KubeClient("127.0.0.1", port, token)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def bad_log_lines(self, ignore: Iterable[str] = ()) -> list[str]:
        return bad_log_lines(self.log_path, ignore=ignore)

    def metric(self, name: str) -> dict[frozenset, float]:
        """The samples of one metric on /metrics: {frozenset of (label, value): sample}."""
        status, text = self.client.text("/metrics", timeout=30)
        assert status == 200, text[:500]
        samples = {}
        for line in text.splitlines():
            m = re.fullmatch(rf"{re.escape(name)}(?:{{(.*)}})? (\S+)", line)
            if m:
                labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
                samples[labels] = float(m.group(2))
        return samples

    def ready(self) -> bool:
        try:
            status, body = self.client.text("/readyz", timeout=5)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and body.strip() == "ok"

    def stop(self) -> None:
        """kill -9 by PID and reap (it holds no state of its own worth a graceful stop)."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def __enter__(self) -> KubeApiserver:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<KubeApiserver pid={self.pid} url={self.url}>"


def bad_log_lines(log_path: Path, patterns: Iterable[str] = BAD_LOG_PATTERNS, ignore: Iterable[str] = ()) -> list[str]:
    """The lines of kube-apiserver's log that contain any of `patterns` (default:
    every line in BAD_LOG_PATTERNS) except those in `ignore`."""
    wanted = [p for p in patterns if p not in set(ignore)]
    if not wanted:
        return []
    rx = re.compile("|".join(re.escape(p) for p in wanted))
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if rx.search(line)]


def start_kube_apiserver(
    tmp_path: Path,
    etcd_servers: Sequence[str],
    *,
    etcd_servers_overrides: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    name: str = "kube-apiserver",
    timeout: float = 180.0,
    attempts: int = 3,
) -> KubeApiserver:
    """Start kube-apiserver against `etcd_servers` (client URLs) and wait until
    /readyz answers ok. `etcd_servers_overrides` are "group/resource#url;url"
    entries. A start that fails because the picked port was taken is retried."""
    binary = kube_apiserver_binary()
    directory = Path(tmp_path) / name
    directory.mkdir(parents=True, exist_ok=True)
    sa_key, sa_pub = _write_service_account_keys(directory)
    token = secrets.token_hex(16)
    tokens = directory / "tokens.csv"
    tokens.write_text(f"{token},admin,admin-uid,system:masters\n")
    tokens.chmod(0o600)
    last = ""
    for attempt in range(attempts):
        port = free_port()
        log_path = directory / f"kube-apiserver-{attempt}.log"
        args = [
            str(binary),
            f"--etcd-servers={','.join(etcd_servers)}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={directory / 'certs'}",  # a self-signed serving certificate is made here
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=RBAC",
            f"--token-auth-file={tokens}",
            # A standalone API server has no controller-manager, so nothing creates a
            # namespace's "default" ServiceAccount; the ServiceAccount admission plugin
            # would then refuse every pod ("error looking up service account
            # NS/default"). Pods are what these tests store, not what mounts into them.
            "--disable-admission-plugins=ServiceAccount",
            *(["--etcd-servers-overrides=" + ",".join(etcd_servers_overrides)] if etcd_servers_overrides else []),
            *extra_args,
        ]
        with open(log_path, "wb") as log:
            log.write(f"=== start: {' '.join(args)}\n".encode())
            log.flush()
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=directory, start_new_session=True)
        api = KubeApiserver(proc, port=port, token=token, directory=directory, log_path=log_path)
        deadline = time.monotonic() + timeout
        try:
            while api.running() and time.monotonic() < deadline:
                if api.ready():
                    return api
                time.sleep(0.25)
        except BaseException:
            api.stop()
            raise
        exited = not api.running()
        api.stop()
        last = (f"kube-apiserver exited with code {proc.returncode}" if exited
                else f"kube-apiserver not ready within {timeout}s") + f"; log {log_path} tail:\n{api.log_tail()}"
        if not (exited and "address already in use" in api.log()):
            break
    raise KubeApiserverStartError(last)
