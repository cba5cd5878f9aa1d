"""How a process reaches NATS: TLS (``--journal-trusted-ca-file``, ``--journal-cert-file``,
``--journal-key-file``) and a NATS user's credentials (``--journal-creds-file``,
``--journal-nkey-file``, a user in the URL): what a connection is given, the one line for files
that cannot be used or flags that do not go together, which failures are final and which URLs'
secrets are hidden. Against real NATS servers: tests/integration/test_jetstream.py (TLS) and
tests/integration/test_nats_auth.py (users)."""
from __future__ import annotations

import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from journal.errors import JournalUnreachable
from journal.jetstream import ClientCertificateRequired, NatsAccess, connect_options, nats_tls, refused, shown_urls
from tests.nats_auth import OperatorMode, nkey_user
from tests.tls_certs import make_pki

REPO = Path(__file__).resolve().parents[2]


def test_plain_urls_without_files_get_no_tls_and_tls_urls_the_systems_cas():
    assert nats_tls(("nats://127.0.0.1:4222",), None) is None
    ctx = nats_tls(("tls://127.0.0.1:4222",), None)
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_the_files_given_make_the_context(tmp_path):
    pki = make_pki(tmp_path)
    ctx = nats_tls(("nats://127.0.0.1:4222",), NatsAccess(str(pki["ca"]), str(pki["client"]), str(pki["client-key"])))
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "ca test CA"),),)]


def test_files_that_cannot_be_used_are_one_line(tmp_path):
    pki = make_pki(tmp_path)
    with pytest.raises(JournalUnreachable, match=r"^NATS TLS files \(.*missing\.pem\) cannot be used: "):
        NatsAccess(str(tmp_path / "missing.pem")).context()
    with pytest.raises(JournalUnreachable, match=r"cannot be used: "):  # a key that is not the certificate's
        NatsAccess(str(pki["ca"]), str(pki["client"]), str(pki["server-key"])).context()


@pytest.mark.parametrize("args, said", [
    (["--journal-url", "nats://127.0.0.1:1", "--journal-cert-file", "c.pem"],
     "--journal-cert-file and --journal-key-file go together"),
    (["--journal-url", "nats://127.0.0.1:1", "--journal-creds-file", "u.creds", "--journal-nkey-file", "u.nk"],
     "--journal-creds-file and --journal-nkey-file are two ways to name the NATS user: give one"),
    (["--journal-nkey-file", "u.nk"],
     "--journal-trusted-ca-file, --journal-cert-file, --journal-key-file, --journal-creds-file and --journal-nkey-file "
     "go with --journal-url"),
    (["--journal-trusted-ca-file", "ca.pem"],
     "--journal-trusted-ca-file, --journal-cert-file, --journal-key-file, --journal-creds-file and --journal-nkey-file "
     "go with --journal-url"),
])
def test_flags_that_do_not_go_together_are_refused(tmp_path, args, said):
    r = subprocess.run([sys.executable, "-m", "shim", "--data-dir", str(tmp_path / "d"), *args], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_credentials_files_are_checked_before_connecting(tmp_path):
    seed, _ = nkey_user(tmp_path)
    creds = OperatorMode(tmp_path / "op").account("etcd").user("shardetcd")
    assert connect_options(("nats://h:4222",), NatsAccess(nkey_file=str(seed))) == \
        {"tls": None, "nkeys_seed": str(seed)}
    assert connect_options(("nats://h:4222",), NatsAccess(creds_file=str(creds))) == \
        {"tls": None, "user_credentials": str(creds)}
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    no_seed = tmp_path / "no-seed.creds"
    no_seed.write_text(creds.read_text().split("-----BEGIN USER NKEY SEED")[0])
    no_jwt = tmp_path / "no-jwt.creds"
    no_jwt.write_text(seed.read_text())
    for access, said in [
        (NatsAccess(nkey_file=str(tmp_path / "missing.nk")), r"^NATS NKey seed file .*missing\.nk cannot be read: "),
        (NatsAccess(nkey_file=str(creds.with_name("x.nk"))), r"cannot be read"),
        (NatsAccess(creds_file=str(no_jwt)), r"^NATS creds file .*no-jwt\.creds holds no user JWT"),
        (NatsAccess(creds_file=str(no_seed)),
         r"^NATS creds file .*no-seed\.creds holds no user NKey seed \(SU\.\.\.\)$"),
        (NatsAccess(nkey_file=str(no_seed)), r"^NATS NKey seed file .* holds no user NKey seed"),
    ]:
        with pytest.raises(JournalUnreachable, match=said):
            access.credentials()


def test_only_certificate_verification_and_refused_users_are_final():
    from nats.errors import Error, NoServersError

    assert refused(Error("nats: 'Authorization Violation'"))
    assert refused(Error("nats: 'User Authentication Expired'"))
    assert refused(ssl.SSLCertVerificationError(1, "certificate verify failed"))
    assert refused(ClientCertificateRequired("BrokenPipeError(32) from a server that verifies client certificates"))
    for passing in (ConnectionRefusedError(111, "refused"), BrokenPipeError(32, "Broken pipe"), NoServersError(),
                    Error("nats: 'Permissions Violation for Publish to foo'"), ssl.SSLError(1, "unexpected eof"),
                    Error("nats: 'Authentication Timeout'")):  # too slow to log in: a later try may not be
        assert not refused(passing), passing


@pytest.mark.parametrize("given, shown", [
    ("nats://h1:4222", "nats://h1:4222"),
    ("nats://etcd:s3cret@h1:4222", "nats://etcd:***@h1:4222"),
    ("nats://t0ken@h1:4222", "nats://***@h1:4222"),  # a token alone
    ("tls://etcd:p@ss:word@h1:4222", "tls://etcd:***@h1:4222"),
])
def test_a_password_or_token_in_a_url_is_not_shown(given, shown):
    assert shown_urls((given, "nats://h2:4222")) == f"{shown},nats://h2:4222"


def test_the_start_command_a_restore_prints_names_the_access_files_but_not_a_password():
    import argparse

    from shim.cli import start_command

    args = argparse.Namespace(cluster_layout=None, data_dir=Path("/d"), wal_dir=None,
                              journal_urls=("nats://etcd:s3cret@h1:4222", "nats://etcd:s3cret@h2:4222"),
                              journal_prefix="p", journal_trusted_ca_file="ca.pem", journal_cert_file=None,
                              journal_key_file=None, journal_creds_file="/etc/shardetcd/u.creds", journal_nkey_file=None)
    assert start_command(args) == ("shardetcd --data-dir /d --journal-url nats://etcd:***@h1:4222,nats://etcd:***@h2:4222 "
                                   "--journal-prefix p --journal-trusted-ca-file ca.pem "
                                   "--journal-creds-file /etc/shardetcd/u.creds")
