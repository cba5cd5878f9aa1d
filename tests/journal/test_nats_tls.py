"""TLS to the NATS servers (``--journal-trusted-ca-file``, ``--journal-cert-file``,
``--journal-key-file``): what a connection is given, and the one line for files that cannot be
used or flags that do not go together. The handshake itself against a real NATS server that
verifies clients is in tests/integration/test_jetstream.py."""
from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from journal.errors import JournalUnreachable
from journal.jetstream import NatsTls, nats_tls
from tests.tls_certs import make_pki

REPO = Path(__file__).resolve().parents[2]


def test_plain_urls_without_files_get_no_tls_and_tls_urls_the_systems_cas():
    assert nats_tls(("nats://127.0.0.1:4222",), None) is None
    ctx = nats_tls(("tls://127.0.0.1:4222",), None)
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_the_files_given_make_the_context(tmp_path):
    pki = make_pki(tmp_path)
    ctx = nats_tls(("nats://127.0.0.1:4222",), NatsTls(str(pki["ca"]), str(pki["client"]), str(pki["client-key"])))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "ca test CA"),),)]


def test_files_that_cannot_be_used_are_one_line(tmp_path):
    pki = make_pki(tmp_path)
    with pytest.raises(JournalUnreachable, match=r"^NATS TLS files \(.*missing\.pem\) cannot be used: "):
        NatsTls(str(tmp_path / "missing.pem")).context()
    with pytest.raises(JournalUnreachable, match=r"cannot be used: "):  # a key that is not the certificate's
        NatsTls(str(pki["ca"]), str(pki["client"]), str(pki["server-key"])).context()


@pytest.mark.parametrize("args, said", [
    (["--journal-url", "nats://127.0.0.1:1", "--journal-cert-file", "c.pem"],
     "--journal-cert-file and --journal-key-file go together"),
    (["--journal-trusted-ca-file", "ca.pem"],
     "--journal-trusted-ca-file, --journal-cert-file and --journal-key-file go with --journal-url"),
])
def test_flags_that_do_not_go_together_are_refused(tmp_path, args, said):
    r = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(tmp_path / "d"), *args], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr
