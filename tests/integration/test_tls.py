"""TLS as etcd: https client URLs; with --client-cert-auth, only CA-signed clients."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.etcd_fixture import free_port
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
         "--listen-client-urls", f"https://127.0.0.1:{port}", "--log-level", "warn",
         "--cert-file", str(pki["server"]), "--key-file", str(pki["server-key"]),
         "--trusted-ca-file", str(pki["ca"]), "--client-cert-auth"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert "serving" in proc.stdout.readline()
        yield f"127.0.0.1:{port}", pki, rogue
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
         "--listen-client-urls", f"https://127.0.0.1:{free_port()}"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == "shardetcd: https:// client URLs need --cert-file and --key-file"
