"""etcd's own command line starts shardetcd: what etcd 3.5.1 refuses, shardetcd refuses with
the same words and exit status; kubeadm's etcd command line, the same settings as ETCD_*
variables, and the same settings as an etcd configuration file start both, and both then
serve a TLS client and kubeadm's health probe."""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.etcd_fixture import etcd_binary, free_ports
from tests.tls_certs import make_pki

REPO = Path(__file__).resolve().parents[2]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}


def etcd_cmd() -> list[str]:
    return [etcd_binary()]


def shardetcd_cmd() -> list[str]:
    return [sys.executable, "-m", "shim"]


def outcome(cmd: list[str], argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """(exit status, the one line that says why) of a start that must be refused. One that is not
    refused serves on free loopback ports until stopped by PID (a test failure, not a hang)."""
    proc = subprocess.Popen([*cmd, *argv], env={**CLEAN_ENV, **env}, cwd=cwd if cmd == etcd_cmd() else REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=20)
        return -1, f"started: {cmd} {argv} {env}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    if cmd == shardetcd_cmd():
        last = lines[-1] if lines else ""
        return proc.returncode, last.removeprefix("shardetcd: ").removesuffix(" (see shardetcd --help)")
    for line in lines:  # etcd: its zap line (exit 1), or Go's flag error before the usage text (exit 2)
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("msg") == "failed to verify flags":
                return proc.returncode, entry["error"]
            if entry.get("level") == "fatal":
                return proc.returncode, f"{entry['msg']} {entry.get('environment-variable', '')}"
        elif not line.startswith("Usage"):
            return proc.returncode, line
    return proc.returncode, ""


def own_ports(cmd: list[str], tmp: Path) -> list[str]:
    """Flags that keep a server that does start on free loopback ports and under ``tmp``."""
    client, peer = free_ports(2)
    urls = [f"--listen-client-urls=http://127.0.0.1:{client}", f"--advertise-client-urls=http://127.0.0.1:{client}"]
    if cmd == etcd_cmd():
        return [*urls, f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}"]
    return [*urls, f"--state-dir={tmp / 'state'}"]


REFUSED = [  # (command line, environment)
    (["--foo"], {}),
    (["--data"], {}),
    (["-name"], {}),
    (["---name=x"], {}),
    (["--snapshot-count=abc"], {}),
    (["--client-cert-auth=yes"], {}),
    (["--client-cert-auth", "true"], {}),
    (["--name", "a", "extra"], {}),
    (["--listen-client-urls=localhost:2379"], {}),
    (["--listen-client-urls=http://localhost"], {}),
    (["--listen-client-urls=http://127.0.0.1:2379/x"], {}),
    (["--initial-cluster-state=old"], {}),
    (["--max-request-bytes=-1"], {}),
    (["--grpc-keepalive-timeout=5"], {}),
    (["--heartbeat-interval=1e3"], {}),
    (["--quota-backend-bytes=0x"], {}),
    (["--v2-deprecation=bogus"], {}),
    (["--experimental-compaction-batch-limit=9223372036854775808"], {}),
    (["--cors=example.com"], {}),
    (["--snapshot-count=abc", "--foo"], {}),
    (["--foo", "--snapshot-count=abc"], {}),
    (["-proxy-failure-wait", "1_000", "--cluster-sync-interval", "yes"], {}),  # found by a random probe
    (["--auto-compaction-mode", "-x", "1e3"], {}),
    (["--auth-token=bogus", "--enable-pprof=0x10"], {}),
    (["--log-outputs=stderr,no-such-dir/etcd.log"], {}),
    (["--enable-log-rotation"], {}),  # on standard error: not a file
    (["--enable-log-rotation", "--log-outputs=a.log,b.log"], {}),
    (["--logger=capnslog"], {}),
    (["--logger=foo"], {}),
    *((["--enable-log-rotation", "--log-outputs=a.log", f"--log-rotation-config-json={config}"], {}) for config in (
        "{bad", "", '{"maxsize": 1}x', "[1]", '"str"', '{"MaxSize": "x"}', '{"maxsize": 1.5}', '{"maxsize": 1e2}',
        '{"maxsize": 99999999999999999999}', '{"maxsize": {}}', '{"compress": 1}', '{"maxsize": null, "localtime": "x"}',
        '{"maxsize": "y", "maxsize": 1}', '{"filename": 3}')),
    # etcd's checks once its settings are read: addresses to bind, hosts to advertise, Raft's timing
    (["--listen-client-urls=http://example.com:2379"], {}),
    (["--listen-peer-urls=http://localhost:2380,http://etcd-0:2380"], {}),
    (["--advertise-client-urls=http://:2379"], {}),
    (["--initial-advertise-peer-urls=http://127.0.0.1:2380,http://:2380"], {}),
    (["--initial-cluster=default=http://127.0.0.1:2380", "--discovery=http://127.0.0.1:1/x"], {}),
    (["--heartbeat-interval=300"], {}),
    (["--heartbeat-interval=0"], {}),
    (["--election-timeout=60000"], {}),
    ([], {"ETCD_LISTEN_METRICS_URLS": "http://metrics:2381"}),
    ([], {"ETCD_SNAPSHOT_COUNT": "abc"}),
    ([], {"ETCD_CLIENT_CERT_AUTH": "yes"}),
    ([], {"ETCD_MAX_REQUEST_BYTES": "-1"}),
]


@pytest.mark.parametrize("argv, env", REFUSED, ids=[" ".join(a) or str(e) for a, e in REFUSED])
def test_refused_as_etcd_refuses(tmp_path, argv, env):
    got = {}
    for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):
        got[name] = outcome(cmd, ["--data-dir", str(tmp_path / name), *own_ports(cmd, tmp_path / name), *argv],
                            env, tmp_path)
    assert got["shardetcd"] == got["etcd"] and got["etcd"][0] in (1, 2) and got["etcd"][1]


@pytest.mark.parametrize("how", ["flags", "environment"])
def test_listen_client_urls_without_advertise_client_urls_are_refused_as_etcd(tmp_path, how):
    """What clients and followers are told to dial must be said: etcd will not guess it from a listen
    URL (which may be 0.0.0.0), though its configuration file keeps the default."""
    got = {}
    for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):
        argv = [a for a in own_ports(cmd, tmp_path / name) if not a.startswith("--advertise-client-urls")]
        listen = [a for a in argv if a.startswith("--listen-client-urls")]
        rest = [a for a in argv if a not in listen]
        env = {"ETCD_LISTEN_CLIENT_URLS": listen[0].partition("=")[2]} if how == "environment" else {}
        got[name] = outcome(cmd, ["--data-dir", str(tmp_path / name), *rest, *(listen if how == "flags" else ())],
                            env, tmp_path)
    assert got["shardetcd"] == got["etcd"] == (
        1, "--advertise-client-urls is required when --listen-client-urls is set explicitly")


def test_a_flag_and_its_variable_together_are_refused_as_etcd(tmp_path):
    for cmd in (etcd_cmd(), shardetcd_cmd()):
        code, why = outcome(cmd, ["--data-dir", str(tmp_path / "d"), *own_ports(cmd, tmp_path), "--name=a"],
                            {"ETCD_NAME": "b"}, tmp_path)
        assert code == 1 and "ETCD_NAME" in why and "shadowed" in why, (cmd, why)


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["--version"], ["-version=true"]])
def test_help_and_version_exit_0_as_etcd(tmp_path, argv):
    for cmd in (etcd_cmd(), shardetcd_cmd()):
        r = subprocess.run([*cmd, *argv], env=CLEAN_ENV, cwd=tmp_path if cmd == etcd_cmd() else REPO,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and (r.stdout + r.stderr).strip(), (cmd, r.stderr)


# -- kubeadm's command line, the environment, a configuration file -----------------------------

def kubeadm_flags(pki: dict[str, Path], data_dir: Path, client: int, peer: int, metrics: int) -> dict[str, str]:
    """kubeadm's etcd static pod flags (etcd 3.5), on this machine's loopback ports."""
    return {
        "advertise-client-urls": f"https://127.0.0.1:{client}", "cert-file": str(pki["server"]),
        "client-cert-auth": "true", "data-dir": str(data_dir), "experimental-initial-corrupt-check": "true",
        "experimental-watch-progress-notify-interval": "5s", "initial-advertise-peer-urls": f"https://127.0.0.1:{peer}",
        "initial-cluster": f"node1=https://127.0.0.1:{peer}", "key-file": str(pki["server-key"]),
        "listen-client-urls": f"https://127.0.0.1:{client}", "listen-metrics-urls": f"http://127.0.0.1:{metrics}",
        "listen-peer-urls": f"https://127.0.0.1:{peer}", "name": "node1", "peer-cert-file": str(pki["server"]),
        "peer-client-cert-auth": "true", "peer-key-file": str(pki["server-key"]),
        "peer-trusted-ca-file": str(pki["ca"]), "snapshot-count": "10000", "trusted-ca-file": str(pki["ca"]),
    }


def config_file(flags: dict[str, str], path: Path) -> Path:
    """The same settings as etcd's YAML configuration file (TLS nested, durations in nanoseconds)."""
    security = ("cert-file", "key-file", "client-cert-auth", "trusted-ca-file")
    lines = ["client-transport-security:"]
    lines += [f"  {k}: {flags[k]}" for k in security]
    lines += ["peer-transport-security:", f"  cert-file: {flags['peer-cert-file']}",
              f"  key-file: {flags['peer-key-file']}", "  client-cert-auth: true",
              f"  trusted-ca-file: {flags['peer-trusted-ca-file']}"]
    for k, v in flags.items():
        if k in security or k.startswith("peer-"):
            continue
        if k == "experimental-watch-progress-notify-interval":
            v = "5000000000"
        elif k == "snapshot-count" or v == "true":
            pass
        else:
            v = json.dumps(v)
        lines.append(f"{k}: {v}")
    path.write_text("\n".join(lines) + "\n")
    return path


def started(cmd: list[str], how: str, flags: dict[str, str], directory: Path, extra: tuple[str, ...] = ()
            ) -> subprocess.Popen:
    """``cmd`` given kubeadm's settings ``how`` (as flags, as ETCD_* variables, or in a
    configuration file) and the command-line flags ``extra``."""
    argv, env = list(extra), {}
    if how == "flags":
        argv = [f"--{k}={v}" for k, v in flags.items()] + argv
    elif how == "environment":
        env = {"ETCD_" + k.upper().replace("-", "_"): v for k, v in flags.items()}
    else:
        argv = ["--config-file", str(config_file(flags, directory / "config.yaml"))] + argv
    with open(directory / "server.log", "wb") as log:
        return subprocess.Popen([*cmd, *argv], env={**CLEAN_ENV, **env}, cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)


def probe(metrics: int, tls: ssl.SSLContext | None = None) -> tuple[int, dict]:
    """kubeadm's liveness probe of etcd (``tls``: on an https:// metrics URL)."""
    scheme = "https" if tls else "http"
    with urllib.request.urlopen(f"{scheme}://127.0.0.1:{metrics}/health?exclude=NOSPACE&serializable=true",
                                timeout=2, context=tls) as r:
        return r.status, json.load(r)


def client_tls(pki: dict[str, Path], cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca"])
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def etcdctl(pki: dict[str, Path], client: int, *args: str, cert: bool = True) -> subprocess.CompletedProcess:
    tls = [f"--cacert={pki['ca']}"] + ([f"--cert={pki['client']}", f"--key={pki['client-key']}"] if cert else [])
    return subprocess.run(["etcdctl", f"--endpoints=https://127.0.0.1:{client}", f"--dial-timeout={3 if cert else 1}s",
                           f"--command-timeout={5 if cert else 1}s", *tls, *args], env={**CLEAN_ENV, "ETCDCTL_API": "3"},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("how", ["flags", "environment", "config-file"])
def test_kubeadms_etcd_settings_start_both_and_serve_tls_clients(tmp_path, how):
    pki = make_pki(tmp_path / "pki")
    servers = start_both(tmp_path, pki, how=how)
    try:
        for name, (_, client, metrics) in servers.items():
            status, body = probe(metrics)
            assert (status, body["health"]) == (200, "true"), (name, body)
            put = etcdctl(pki, client, "put", "/registry/pods/default/p", "v")
            assert put.stdout == "OK\n", (name, put.stderr)
            got = etcdctl(pki, client, "get", "/registry/pods/default/p", "--print-value-only")
            assert got.stdout == "v\n", (name, got.stderr)
            refused = etcdctl(pki, client, "get", "k", cert=False)  # --client-cert-auth: no certificate, no call
            assert refused.returncode != 0 and refused.stdout == "", name
    finally:
        stop_all(servers)


def start_both(tmp_path: Path, pki: dict[str, Path], extra: tuple[str, ...] = (), how: str = "flags",
               metrics_tls: bool = False) -> dict[str, tuple]:
    """etcd and shardetcd from kubeadm's settings (``how``, see ``started``) plus the flags
    ``extra``, each serving its metrics URL (https:// with ``metrics_tls``): {name: (process,
    client port, metrics port)}."""
    servers = {}
    tls = client_tls(pki, pki["client"], pki["client-key"]) if metrics_tls else None
    try:
        for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):
            client, peer, metrics = free_ports(3)
            flags = kubeadm_flags(pki, tmp_path / name / "data", client, peer, metrics)
            if metrics_tls:
                flags["listen-metrics-urls"] = f"https://127.0.0.1:{metrics}"
            (tmp_path / name).mkdir()
            proc = started(cmd, how, flags, tmp_path / name, extra)
            servers[name] = (proc, client, metrics)
            deadline = time.monotonic() + 30
            while True:
                assert proc.poll() is None, (name, (tmp_path / name / "server.log").read_text()[-2000:])
                try:
                    probe(metrics, tls)
                    break
                except OSError:
                    assert time.monotonic() < deadline, name
                    time.sleep(0.1)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: dict[str, tuple]) -> None:
    for proc, *_ in servers.values():
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_etcds_data_dir_is_refused_with_the_way_over_which_works(tmp_path):
    """A swapped manifest keeps etcd's --data-dir: shardetcd refuses it and names the command
    that brings its keys over; that command, run as printed, does."""
    from tests.etcd_fixture import start_etcd
    from tests.shardetcd_fixture import start_shardetcd

    etcd = start_etcd(tmp_path / "etcd")
    try:
        put = subprocess.run(["etcdctl", f"--endpoints={etcd.endpoint}", "put", "/registry/pods/default/a", "1"],
                             env={**CLEAN_ENV, "ETCDCTL_API": "3"}, capture_output=True, text=True, timeout=30)
        assert put.stdout == "OK\n", put.stderr
        etcd.proc.terminate()  # a clean stop: bbolt has every applied write
        etcd.proc.wait(30)
    finally:
        etcd.stop()
    r = subprocess.run([*shardetcd_cmd(), f"--data-dir={etcd.data_dir}", *own_ports(shardetcd_cmd(), tmp_path)],
                       env=CLEAN_ENV, cwd=REPO, capture_output=True, text=True, timeout=30)
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "holds an etcd member" in line, r.stderr
    restore = line.split("`")[3]  # the second command named: for a stopped etcd
    assert restore.startswith("shardetcd snapshot restore ") and restore.endswith(" --data-dir NEW")
    new = tmp_path / "new"
    argv = [*shardetcd_cmd(), *restore.split()[1:-1], str(new)]
    done = subprocess.run(argv, env=CLEAN_ENV, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    server = start_shardetcd(tmp_path, extra_args=("--data-dir", str(new)))
    try:
        got = subprocess.run(["etcdctl", f"--endpoints={server.endpoint}", "get", "/registry/pods/default/a",
                              "--print-value-only"], env={**CLEAN_ENV, "ETCDCTL_API": "3"}, capture_output=True,
                             text=True, timeout=30)
        assert got.stdout == "1\n", got.stderr
    finally:
        server.stop()


def handshake(port: int, pki: dict[str, Path], tls12_cipher: str | None) -> str | None:
    """The cipher a TLS client gets from 127.0.0.1:port (TLS 1.2 offering only ``tls12_cipher``,
    or TLS 1.3 when None); None if the server refused the handshake."""
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    ctx.load_cert_chain(str(pki["client"]), str(pki["client-key"]))
    if tls12_cipher is not None:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(tls12_cipher)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.cipher()[0]
    except ssl.SSLError:
        return None


def test_cipher_suites_restrict_tls12_as_etcd(tmp_path):
    """--cipher-suites (Go's names): a TLS 1.2 client offering only another suite is refused by both
    servers, one offering the listed suite gets it, TLS 1.3 is not restricted; an unknown name stops
    both starts."""
    pki = make_pki(tmp_path / "pki")
    suites = "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256"  # the certs are ECDSA
    servers, got = start_both(tmp_path, pki, (suites,)), {}
    try:
        for name, (_, client, _) in servers.items():
            got[name] = [handshake(client, pki, c) for c in ("ECDHE-ECDSA-AES256-GCM-SHA384",
                                                              "ECDHE-ECDSA-AES128-GCM-SHA256")]
            got[name].append(handshake(client, pki, None) is not None)  # TLS 1.3 (Go prefers AES-128, OpenSSL the
            # client's first choice: which of the three is not compared)
    finally:
        stop_all(servers)
    assert got["shardetcd"] == got["etcd"]
    assert got["etcd"][0] is None and got["etcd"][1] == "ECDHE-ECDSA-AES128-GCM-SHA256" and got["etcd"][2]
    for cmd in (etcd_cmd(), shardetcd_cmd()):
        r = subprocess.run([*cmd, f"--data-dir={tmp_path / 'bogus'}", *own_ports(cmd, tmp_path / "bogus"),
                            "--cipher-suites=TLS_BOGUS"], env=CLEAN_ENV, cwd=tmp_path if cmd == etcd_cmd() else REPO,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and 'unexpected TLS cipher suite "TLS_BOGUS"' in r.stderr.replace('\\"', '"'), (
            cmd, r.stderr)


def test_cipher_suites_without_http2s_required_one_stop_both_starts(tmp_path):
    """Go's HTTP/2 server needs an ECDHE AES_128_GCM_SHA256 suite in the list; etcd 3.5.1's client
    listener fails without one, and shardetcd refuses to start."""
    pki = make_pki(tmp_path / "pki")
    for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):
        client, peer, metrics = free_ports(3)
        argv = [f"--{k}={v}" for k, v in kubeadm_flags(pki, tmp_path / name / "data", client, peer, metrics).items()]
        code, why = outcome(cmd, [*argv, "--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"], {}, tmp_path)
        assert code in (1, 2), (name, code, why)
        if name == "shardetcd":
            assert "missing an HTTP/2-required AES_128_GCM_SHA256 cipher" in why, why


def served(pki: dict[str, Path], client: int, cert: Path, key: Path) -> bool:
    """Whether a client with this certificate gets an answer."""
    r = subprocess.run(["etcdctl", f"--endpoints=https://127.0.0.1:{client}", "--dial-timeout=2s",
                        "--command-timeout=2s", f"--cacert={pki['ca']}", f"--cert={cert}", f"--key={key}", "get", "k"],
                       env={**CLEAN_ENV, "ETCDCTL_API": "3"}, capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def test_client_crl_file_cuts_off_revoked_certificates_as_etcd(tmp_path):
    """--client-crl-file: a revoked client certificate is cut off and another served, on both
    servers; a certificate revoked later (the file rewritten, no restart) is cut off from then on."""
    from tests.tls_certs import write_crl

    pki = make_pki(tmp_path / "pki", client_cns=("alice", "bob"))
    alice, bob = (pki["client:alice"], pki["client:alice-key"]), (pki["client:bob"], pki["client:bob-key"])
    crl = write_crl(tmp_path / "crl.pem", pki, (pki["client:alice"],))
    servers = start_both(tmp_path, pki, (f"--client-crl-file={crl}",))
    try:
        got = {name: [served(pki, client, *alice), served(pki, client, *bob)]
               for name, (_, client, _) in servers.items()}
        time.sleep(0.05)  # a new modification time for the rewritten list, however coarse the clock
        write_crl(crl, pki, (pki["client:alice"], pki["client:bob"]))
        for name, (_, client, _) in servers.items():
            got[name].append(served(pki, client, *bob))
    finally:
        stop_all(servers)
    assert got["shardetcd"] == got["etcd"] == [False, True, False]


def test_client_cert_allowed_hostname_as_etcd(tmp_path):
    """--client-cert-allowed-hostname: only a client certificate naming that host is served."""
    pki = make_pki(tmp_path / "pki", client_dns=("client.example.com", "other.example.com"))
    servers = start_both(tmp_path, pki, ("--client-cert-allowed-hostname=client.example.com",))
    try:
        got = {name: [served(pki, client, pki[f"client-dns:{d}"], pki[f"client-dns:{d}-key"])
                      for d in ("client.example.com", "other.example.com")]
               + [served(pki, client, pki["client"], pki["client-key"])] for name, (_, client, _) in servers.items()}
    finally:
        stop_all(servers)
    assert got["shardetcd"] == got["etcd"] == [True, False, False]


def test_https_metrics_urls_serve_with_the_client_tls_as_etcd(tmp_path):
    """--listen-metrics-urls=https://...: /health and /metrics over the client port's TLS, a client
    certificate required (--client-cert-auth) and checked against --client-crl-file, as etcd does."""
    from tests.tls_certs import write_crl

    pki = make_pki(tmp_path / "pki", client_cns=("alice",))
    crl = write_crl(tmp_path / "crl.pem", pki, (pki["client:alice"],))
    servers = start_both(tmp_path, pki, (f"--client-crl-file={crl}",), metrics_tls=True)

    def answers(metrics: int, path: str, tls: ssl.SSLContext | None) -> str:
        scheme = "https" if tls else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{metrics}{path}", timeout=3, context=tls) as r:
                body = r.read().decode()
        except (OSError, http.client.HTTPException):  # a refused handshake, a closed connection
            return "refused"
        return "has_leader" if "etcd_server_has_leader 1" in body else body

    clients = {"client": client_tls(pki, pki["client"], pki["client-key"]), "none": client_tls(pki),
               "revoked": client_tls(pki, pki["client:alice"], pki["client:alice-key"]), "plain http": None}
    try:
        got = {name: {who: [answers(metrics, path, tls) for path in ("/health", "/metrics")]
                      for who, tls in clients.items()} for name, (_, _, metrics) in servers.items()}
    finally:
        stop_all(servers)
    assert got["etcd"]["client"] == ['{"health":"true","reason":""}', "has_leader"], got
    assert got["shardetcd"] == got["etcd"], got
    for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):  # no certificate to serve TLS with
        metrics = free_ports(1)[0]
        code, why = outcome(cmd, ["--data-dir", str(tmp_path / f"{name}-2"), *own_ports(cmd, tmp_path / f"{name}-2"),
                                  f"--listen-metrics-urls=https://127.0.0.1:{metrics}"], {}, tmp_path)
        assert code != 0, (name, why)
        if name == "shardetcd":  # in etcd's words (its zap line says them beside "discovery failed")
            assert why == f"cannot listen on TLS for 127.0.0.1:{metrics}: KeyFile and CertFile are not presented"


def test_log_outputs_send_the_log_lines_where_etcd_sends_them(tmp_path):
    """--log-outputs=FILE,stdout: each server's log lines are appended to the file and written to
    standard output (etcd's JSON lines, shardetcd's key=value ones)."""
    for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):
        log = tmp_path / f"{name}.log"
        log.write_text("kept\n")  # appended to, as etcd's file sink appends
        argv = ["--data-dir", str(tmp_path / name), *own_ports(cmd, tmp_path / name), f"--log-outputs={log},stdout"]
        proc = subprocess.Popen([*cmd, *argv], env=CLEAN_ENV, cwd=tmp_path if name == "etcd" else REPO,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            deadline = time.monotonic() + 30
            while log.read_text().count("\n") < 3:
                assert proc.poll() is None and time.monotonic() < deadline, name
                time.sleep(0.1)
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
        lines = log.read_text().splitlines()
        assert lines[0] == "kept" and len(lines) >= 3, (name, lines)
        assert lines[1] in out.splitlines(), (name, lines[1], out[:500])  # the same line on standard output


def test_log_rotation_rotates_the_file_as_etcd_does(tmp_path):
    """--enable-log-rotation with maxsize 1 (MiB): a log file already at 1 MiB is renamed
    NAME-<UTC time to the ms>.log at the first line, with its content, and the lines go to a new
    file, on etcd and on shardetcd."""
    for name, cmd in (("etcd", etcd_cmd()), ("shardetcd", shardetcd_cmd())):
        log = tmp_path / name / "logs" / "server.log"
        log.parent.mkdir(parents=True)
        full = b"old line\n" * (1024 * 1024 // 9) + b"x" * (1024 * 1024 % 9)
        log.write_bytes(full)
        argv = ["--data-dir", str(tmp_path / name / "data"), *own_ports(cmd, tmp_path / name),
                f"--log-outputs={log}", "--enable-log-rotation", '--log-rotation-config-json={"maxsize": 1}']
        proc = subprocess.Popen([*cmd, *argv], env=CLEAN_ENV, cwd=tmp_path if name == "etcd" else REPO,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not (log.exists() and log.stat().st_size and len(list(log.parent.iterdir())) == 2):
                assert proc.poll() is None and time.monotonic() < deadline, (name, list(log.parent.iterdir()))
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        backups = [p for p in log.parent.iterdir() if p != log]
        assert len(backups) == 1 and re.fullmatch(r"server-\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d{3}\.log", backups[0].name), \
            (name, backups)
        assert backups[0].read_bytes() == full, name
        assert b"old line" not in log.read_bytes() and log.stat().st_size < 1024 * 1024, name
