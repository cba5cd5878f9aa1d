"""Journals on NATS servers that require a user (real nats-server, tests/nats_auth.py).

Production NATS runs with authentication: NKey users, an operator whose accounts issue users
creds files (JWT + NKey seed), or users and passwords; each user with the permissions it needs
and each account with JetStream or not. The server, a follower, a standby, `journal verify`
and `snapshot restore` reach them with --journal-creds-file or --journal-nkey-file (or a user
in the URL), and each way of being turned away is one line at once (not a 15 s wait for a
connection that will never be made, nor a traceback after 30 s of retries) saying what to give,
with no password shown.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import grpc

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.nats_auth import OperatorMode, nkey_user
from tests.nats_fixture import shardetcd_on, start_nats_cluster, wait_standing_by

REPO = Path(__file__).resolve().parents[2]
PODS = (b"/registry/pods/", b"/registry/pods0")
# what README's "NATS users" says a journal's user needs
JOURNAL_PERMISSIONS = {"pub": {"allow": ["$JS.API.>", "$JS.FC.>", "$KV.>", "$O.>", "journal.>"]},
                       "sub": {"allow": ["_INBOX.>", "journal.acked.>"]}}


def as_user(url: str) -> SimpleNamespace:
    """NATS at ``url`` (a user and password in it), for ``shardetcd_on``."""
    return SimpleNamespace(urls=url)


def refused_start(nats, base: Path, *flags: str) -> str:
    """The one stderr line of a server start NATS turns away (exit 2, no traceback)."""
    try:
        r = subprocess.run(shardetcd_on(nats, base, "--journal-replicas", "1", *flags).args(), cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # it went on instead: what it logged says why
        raise AssertionError(f"not refused: {str(exc.stderr)[-5000:]}") from None
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and lines[-1].startswith("shardetcd: "), r.stderr[-3000:]
    return lines[-1]


def no_account_jetstream_line(url: str) -> str:
    return (f"shardetcd: NATS at {url}: JetStream is not enabled for this user's account (JetStream not enabled "
            "for account): enable it for the account")


def no_jetstream_line(nats) -> str:
    return (f"shardetcd: NATS at {nats.urls} answers no JetStream requests of this user: is JetStream enabled on the "
            "NATS servers (-js, or jetstream {} in their configuration) and for the user's account?")


def put_pods(endpoint: str, n: int) -> None:
    with grpc.insecure_channel(endpoint) as ch:
        kv = pbg.KVStub(ch)
        for i in range(n):
            kv.Put(pb.PutRequest(key=b"/registry/pods/ns/p%d" % i, value=b"v" * 200), timeout=10)


def pods(endpoint: str) -> int:
    with grpc.insecure_channel(endpoint) as ch:
        return pbg.KVStub(ch).Range(pb.RangeRequest(key=PODS[0], range_end=PODS[1], count_only=True), timeout=10).count


def verify(nats, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shim", "journal", "verify", "--journal-url", nats.urls, *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_nkey_users_passwords_and_the_refusals_of_a_nats_that_requires_a_user(tmp_path):
    seed, public = nkey_user(tmp_path / "keys")
    users = (f"authorization {{ users = [ {{nkey: {public}}}, {{user: etcd, password: s3cret}}, "
             "{user: narrow, password: n, permissions: {publish: \"foo.>\", subscribe: \"_INBOX.>\"}}, "
             "{user: api, password: a, permissions: {publish: \"$JS.API.>\", subscribe: \"_INBOX.>\"}} ] }\n")
    nats = start_nats_cluster(tmp_path / "nats", size=1, config=users)
    host = nats.urls.removeprefix("nats://")
    try:
        anonymous = refused_start(nats, tmp_path / "x")
        assert anonymous.startswith(f"shardetcd: NATS at {nats.urls} refused this process: ") and \
            "Authorization Violation" in anonymous and "--journal-creds-file, --journal-nkey-file" in anonymous
        wrong = refused_start(as_user(f"nats://etcd:wrong-one@{host}"), tmp_path / "x")
        assert wrong.startswith(f"shardetcd: NATS at nats://etcd:***@{host} refused this process: ") and \
            "do not accept the user and password" in wrong and "wrong-one" not in wrong
        other, _ = nkey_user(tmp_path / "keys", "unknown")
        unknown = refused_start(nats, tmp_path / "x", "--journal-nkey-file", str(other))
        assert "Authorization Violation" in unknown and "do not know the user of the credentials file" in unknown
        narrow = refused_start(as_user(f"nats://narrow:n@{host}"), tmp_path / "x")
        assert narrow.startswith(f"shardetcd: NATS at nats://narrow:***@{host} does not permit this user JetStream's "
                                 "API: ") and "permissions violation" in narrow

        api_only = refused_start(as_user(f"nats://api:a@{host}"), tmp_path / "x")  # its lease's KV put is not
        assert api_only.startswith("shardetcd: NATS does not permit this user the writer lease ") and \
            "permissions violation for publish to \"$kv.shardetcd-writer." in api_only, api_only

        writer = shardetcd_on(nats, tmp_path / "w", "--journal-replicas", "1", "--journal-nkey-file", str(seed)).start()
        try:
            put_pods(writer.endpoint, 5)
        finally:
            writer.stop()
        # another user of the same account (the same streams), with its password in the URL
        second = shardetcd_on(as_user(f"nats://etcd:s3cret@{host}"), tmp_path / "w2", "--journal-replicas", "1").start()
        try:
            assert pods(second.endpoint) == 5
        finally:
            second.stop()
        logged = [line for line in (tmp_path / "w2" / "shardetcd.log").read_text().splitlines()
                  if not line.startswith("=== start:")]  # the fixture's own line: the command it ran
        assert logged and not any("s3cret" in line for line in logged), logged

        checked = verify(nats, "--journal-nkey-file", str(seed))
        assert checked.returncode == 0 and "pods: stream shardetcd_pods: ok, " in checked.stdout, checked.stderr
        plain = verify(nats)
        assert plain.returncode == 2 and plain.stderr.startswith(f"shardetcd: NATS at {nats.urls} refused this "
                                                                 "process: "), plain.stderr
    finally:
        nats.stop()


def test_operator_mode_creds_files_for_writer_follower_standby_verify_and_restore(tmp_path):
    op = OperatorMode(tmp_path / "op")
    creds = op.account("etcd").user("shardetcd", JOURNAL_PERMISSIONS)
    deaf = op.account("etcd").user("deaf", {**JOURNAL_PERMISSIONS, "sub": {"allow": ["_INBOX.>"]}})
    no_jetstream = op.account("apps", jetstream=False).user("app")
    nats = start_nats_cluster(tmp_path / "nats", size=1, config=op.config())
    auth = ("--journal-replicas", "1", "--journal-creds-file", str(creds))
    try:
        line = refused_start(nats, tmp_path / "x", "--journal-creds-file", str(no_jetstream))
        assert line == no_account_jetstream_line(nats.urls), line

        writer = shardetcd_on(nats, tmp_path / "w", *auth, "--checkpoint-journal-bytes", "20000").start()
        follower = standby = None
        try:
            put_pods(writer.endpoint, 200)  # ~50 KB of records: checkpoints are written to the object store too
            follower = shardetcd_on(nats, tmp_path / "f", *auth, "--follow").start()
            line = refused_start(nats, tmp_path / "x", "--journal-creds-file", str(deaf), "--follow")
            assert line.startswith("shardetcd: NATS does not permit this user to subscribe to journal.acked.shardetcd "
                                   "(where writers tell what JetStream acknowledged to them") and \
                "permissions violation" in line.lower(), line
            standby = shardetcd_on(nats, tmp_path / "s", *auth, "--standby")
            standby.start(wait=False)
            wait_standing_by(standby)
            deadline = time.monotonic() + 30
            while pods(follower.endpoint) != 200:
                assert time.monotonic() < deadline, follower.log_tail(50)
                time.sleep(0.2)
            writer.stop()
            standby.wait_ready(30)
            assert pods(standby.endpoint) == 200
            snap = tmp_path / "snap.db"
            r = subprocess.run(["etcdctl", "--endpoints", standby.endpoint, "snapshot", "save", str(snap)],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        finally:
            for p in (writer, follower, standby):
                if p is not None:
                    p.stop()
        for p in ("w", "f", "s"):
            log = (tmp_path / p / "shardetcd.log").read_text()
            assert "violation" not in log.lower(), log[-3000:]  # the documented permissions are enough

        checked = verify(nats, "--journal-creds-file", str(creds))
        assert checked.returncode == 0 and "all sound" in checked.stdout, (checked.stdout, checked.stderr)
        r = subprocess.run([sys.executable, "-m", "shim", "snapshot", "restore", str(snap), "--data-dir",
                            str(tmp_path / "r" / "data"), "--journal-url", nats.urls, "--journal-prefix", "restored",
                            *auth], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"--journal-creds-file {creds}" in r.stdout, (r.stdout, r.stderr)
        restored = shardetcd_on(nats, tmp_path / "r", *auth, "--journal-prefix", "restored").start()
        try:
            assert pods(restored.endpoint) == 200
        finally:
            restored.stop()
    finally:
        nats.stop()


def test_jetstream_missing_on_the_servers_or_for_the_account_is_one_line(tmp_path):
    nats = start_nats_cluster(tmp_path / "plain", size=1, jetstream=False)
    try:
        assert refused_start(nats, tmp_path / "x") == no_jetstream_line(nats)
    finally:
        nats.stop()
    accounts = ("accounts { A: { jetstream: enabled, users: [ {user: a, password: a} ] }, "
                "B: { users: [ {user: b, password: b} ] } }\n")
    nats = start_nats_cluster(tmp_path / "accounts", size=1, config=accounts)
    host = nats.urls.removeprefix("nats://")
    try:
        line = refused_start(as_user(f"nats://b:b@{host}"), tmp_path / "y")
        assert line == no_account_jetstream_line(f"nats://b:***@{host}"), line
        served = shardetcd_on(as_user(f"nats://a:a@{host}"), tmp_path / "a", "--journal-replicas", "1").start()
        served.stop()
    finally:
        nats.stop()
