"""TLS as etcd: https client URLs; with --client-cert-auth, only CA-signed clients."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import client_url_flags, free_port
from tests.shardetcd_fixture import stop_by_pid
from tests.tls_certs import make_pki

REPO = Path(__file__).resolve().parents[2]


def tls_channel(endpoint: str, ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )
    return grpc.secure_channel(endpoint, creds)


@pytest.fixture
def tls_server(tmp_path):
    pki, rogue = make_pki(tmp_path / "pki"), make_pki(tmp_path / "rogue", name="rogue")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shim", "--data-dir", str(tmp_path / "d"), "--state-dir", str(tmp_path / "s"),
         *client_url_flags(f"https://127.0.0.1:{port}"), "--log-level", "warn",
         "--cert-file", str(pki["server"]), "--key-file", str(pki["server-key"]),
         "--trusted-ca-file", str(pki["ca"]), "--client-cert-auth"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert "serving" in proc.stdout.readline()
        yield f"127.0.0.1:{port}", pki, rogue
    finally:
        stop_by_pid(proc, grace=10)


def test_client_with_ca_signed_cert_is_served(tls_server):
    endpoint, pki, _ = tls_server
    with tls_channel(endpoint, pki["ca"], pki["client"], pki["client-key"]) as ch:
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=b"/registry/pods/tls", value=b"ok"), timeout=10)
        assert kv.Range(pb.RangeRequest(key=b"/registry/pods/tls"), timeout=10).kvs[0].value == b"ok"


@pytest.mark.parametrize("who", ["no certificate", "certificate from another CA"])
def test_other_clients_are_refused(tls_server, who):
    endpoint, pki, rogue = tls_server
    cert, key = (None, None) if who == "no certificate" else (rogue["client"], rogue["client-key"])
    with tls_channel(endpoint, pki["ca"], cert, key) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"k"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_is_refused(tls_server):
    endpoint, _, _ = tls_server
    with grpc.insecure_channel(endpoint) as ch:
        with pytest.raises(grpc.RpcError):
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"k"), timeout=5)


def test_etcdctl_over_mutual_tls(tls_server):
    endpoint, pki, _ = tls_server
    base = ["/usr/bin/etcdctl", f"--endpoints=https://{endpoint}", f"--cacert={pki['ca']}",
            f"--cert={pki['client']}", f"--key={pki['client-key']}"]
    env = {"ETCDCTL_API": "3", "PATH": os.environ["PATH"]}
    assert subprocess.run(base + ["put", "k", "v"], capture_output=True, text=True, env=env, timeout=30).stdout == "OK\n"
    out = subprocess.run(base + ["get", "k", "--print-value-only"], capture_output=True, text=True, env=env, timeout=30)
    assert out.stdout == "v\n"


def test_https_url_without_certificates_fails_to_start(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "shim", "--data-dir", str(tmp_path / "d"), "--state-dir", str(tmp_path / "s"),
         *client_url_flags(f"https://127.0.0.1:{free_port()}")],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == "shardetcd: https:// client URLs need --cert-file and --key-file"


def test_a_client_certificate_without_its_key_stops_the_start_as_in_etcd(tmp_path):
    """--client-cert-file (what this member presents when it calls another) needs --client-key-file:
    etcd 3.5.1 refuses to start its TLS listener with one and not the other, in these words."""
    pki = make_pki(tmp_path / "pki")
    r = subprocess.run(
        [sys.executable, "-m", "shim", "--data-dir", str(tmp_path / "d"), "--state-dir", str(tmp_path / "s"),
         *client_url_flags(f"https://127.0.0.1:{free_port()}"), "--cert-file", str(pki["server"]),
         "--key-file", str(pki["server-key"]), "--client-cert-file", str(pki["client"])],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == ("shardetcd: ClientKeyFile and ClientCertFile must both be present or "
                                                 f"both absent: key: , cert: {pki['client']}]")


def test_http_over_h2_on_the_tls_client_port_answers_as_etcds(tmp_path):
    """An HTTPS client negotiates h2 by ALPN (curl does) and asks for /health, /metrics, the
    JSON gateway: etcd's Go server answers these as HTTP on its TLS client port, so must we —
    not as a gRPC call. Status, headers (but Date) and bodies as etcd's, a streamed watch too."""
    import re
    import ssl

    import httpx

    from tests.etcd_fixture import start_etcd
    from tests.shardetcd_fixture import ShardetcdProcess

    pki = make_pki(tmp_path / "pki")
    tls = ("--cert-file", str(pki["server"]), "--key-file", str(pki["server-key"]))
    etcd_port, port, tls_port = free_port(), free_port(), free_port()
    etcd = start_etcd(tmp_path / "etcd", extra_client_urls=(f"https://127.0.0.1:{etcd_port}",), extra_args=tls)
    ours = ShardetcdProcess(data_dir=tmp_path / "s" / "data", state_dir=tmp_path / "s" / "state", port=port,
                            log_path=tmp_path / "s" / "log",
                            extra_args=(*client_url_flags(f"http://127.0.0.1:{port},https://127.0.0.1:{tls_port}"),
                                        *tls))
    context = ssl.create_default_context(cafile=str(pki["ca"]))

    def masked(text: str) -> str:
        return re.sub(r'"(cluster_id|member_id|raft_term)":"\d+"', r'"\1":"N"', text)

    def answer(client: httpx.Client, method: str, path: str, body: str | None = None):
        r = client.request(method, path, content=body)
        assert r.http_version == "HTTP/2"
        headers = sorted((k, v) for k, v in r.headers.items() if k not in ("date", "content-length"))
        return r.status_code, headers, masked(r.text)

    try:
        ours.start()
        with httpx.Client(http2=True, verify=context, base_url=f"https://127.0.0.1:{tls_port}", timeout=10) as mine, \
                httpx.Client(http2=True, verify=context, base_url=f"https://127.0.0.1:{etcd_port}", timeout=10) as theirs:
            for method, path, body in [
                ("GET", "/health", None),
                ("GET", "/nothing", None),
                ("HEAD", "/version", None),
                ("OPTIONS", "/v3/kv/range", None),
                ("GET", "/v3/kv/put", None),
                ("POST", "/v3/kv/put", '{"key": "aA==", "value": "MQ=="}'),
                ("POST", "/v3/kv/range", '{"key": "aA=="}'),
                ("POST", "/v3/kv/range", '{"key": ""}'),
                ("POST", "/v3/kv/range", "not json"),
            ]:
                assert answer(mine, method, path, body) == answer(theirs, method, path, body), (method, path)
            version = mine.get("/version")  # the version told differs (3.5.16, for kube-apiserver)
            assert version.status_code == 200 and version.json().keys() == theirs.get("/version").json().keys()
            # /metrics (not gzipped) is larger than a stream's initial window: the answer waits for WINDOW_UPDATEs
            metrics = mine.get("/metrics", headers={"Accept-Encoding": "identity"})
            assert metrics.status_code == 200 and len(metrics.content) > 65535
            assert re.search(r"\netcd_server_has_leader 1(\.0)?\n", metrics.text)
            # a streamed answer: a watch from revision 1 sees the put at once; read two lines, close
            watch = '{"create_request": {"key": "aA==", "start_revision": "1"}}'
            lines = {}
            for name, client in (("ours", mine), ("theirs", theirs)):
                with client.stream("POST", "/v3/watch", content=watch) as r:
                    it = r.iter_lines()
                    lines[name] = (r.status_code, masked(next(it)), re.sub(r'"revision":"\d+"', "R", masked(next(it))))
            assert lines["ours"] == lines["theirs"]
            # and gRPC on the same port
            with tls_channel(f"127.0.0.1:{tls_port}", pki["ca"]) as ch:
                assert pbg.KVStub(ch).Range(pb.RangeRequest(key=b"h"), timeout=10).kvs[0].value == b"1"
        # HTTP/1.1 over TLS: etcd's Go server reads every request line itself (no cmux, whose 4 KiB
        # limit and silent close hold on the plain-text port only)
        http1 = ssl.create_default_context(cafile=str(pki["ca"]))
        http1.set_alpn_protocols(["http/1.1"])

        def status_line(port: int, request: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    http1.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                conn.sendall(request)
                answer = b""
                while b"\r\n" not in answer and (chunk := conn.recv(4096)):
                    answer += chunk
                return answer.split(b"\r\n", 1)[0]

        for request in (b"GET /health?" + b"a" * 4100 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                        b"GET  /health HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"):
            assert status_line(tls_port, request) == status_line(etcd_port, request), request[:40]
    finally:
        ours.stop()
        etcd.stop()


def _served_serial(endpoint: str, pki: dict[str, Path]) -> int:
    """The serial number of the certificate a new TLS connection to ``endpoint`` is served."""
    import ssl

    from cryptography import x509

    context = ssl.create_default_context(cafile=pki["ca"])
    context.load_cert_chain(pki["client"], pki["client-key"])
    context.set_alpn_protocols(["h2"])
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


@pytest.mark.parametrize("server", ["etcd", "native", "grpcio"])
def test_a_renewed_certificate_serves_new_connections_as_in_etcd(tmp_path, server):
    """etcd reads --cert-file and --key-file again for every new TLS connection: a certificate
    renewed on disk (kubeadm certs renew, cert-manager) serves from the next connection on, with no
    restart, while connections already open go on. Files it cannot load fail new handshakes until
    they can be loaded again (etcd, and shardetcd's native server; grpc.aio's goes on serving the
    last certificate it loaded)."""
    import shutil
    import ssl

    from cryptography import x509

    from tests.etcd_fixture import start_etcd
    from tests.shardetcd_fixture import ShardetcdProcess
    from tests.tls_certs import server_cert

    pki = make_pki(tmp_path / "pki")
    cert, key = tmp_path / "live" / "server.pem", tmp_path / "live" / "server-key.pem"
    cert.parent.mkdir()
    shutil.copy(pki["server"], cert)
    shutil.copy(pki["server-key"], key)
    flags = ("--cert-file", str(cert), "--key-file", str(key), "--trusted-ca-file", str(pki["ca"]),
             "--client-cert-auth")
    port = free_port()
    if server == "etcd":
        proc = start_etcd(tmp_path / "etcd", extra_client_urls=(f"https://127.0.0.1:{port}",), extra_args=flags)
    else:
        plain = free_port()
        proc = ShardetcdProcess(
            data_dir=tmp_path / "d", state_dir=tmp_path / "s", port=plain, log_path=tmp_path / "log",
            extra_args=(*client_url_flags(f"http://127.0.0.1:{plain},https://127.0.0.1:{port}"),
                        "--grpc-server", server, *flags)).start()
    endpoint = f"127.0.0.1:{port}"
    try:
        first = x509.load_pem_x509_certificate(pki["server"].read_bytes()).serial_number
        assert _served_serial(endpoint, pki) == first
        with tls_channel(endpoint, pki["ca"], pki["client"], pki["client-key"]) as before:
            kv = pbg.KVStub(before)
            kv.Put(pb.PutRequest(key=b"k", value=b"1"), timeout=10)
            renewed = server_cert(pki, cert, key)
            assert _served_serial(endpoint, pki) == renewed != first
            kv.Put(pb.PutRequest(key=b"k", value=b"2"), timeout=10)  # the open connection goes on
            with tls_channel(endpoint, pki["ca"], pki["client"], pki["client-key"]) as after:
                assert pbg.KVStub(after).Range(pb.RangeRequest(key=b"k"), timeout=10).kvs[0].value == b"2"
            if server == "grpcio":
                return
            cert.write_bytes(b"not a certificate\n")
            with pytest.raises(ssl.SSLError):
                _served_serial(endpoint, pki)
            kv.Put(pb.PutRequest(key=b"k", value=b"3"), timeout=10)
            again = server_cert(pki, cert, key)
            assert _served_serial(endpoint, pki) == again
    finally:
        proc.stop()
