"""--client-cert-auth with auth enabled: a request that carries no token acts as
the user its TLS client certificate's Common Name names; a token, when sent,
wins (and a bad one is refused). Differential: the same calls, over mutual
TLS, against etcd 3.5.1, shardetcd, and a follower of another shardetcd
(which hands writes to its writer over TLS with a certificate of its own),
must have the same outcomes."""
from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests.integration.authkit import enable_with_user
from tests.etcd_fixture import free_port, start_etcd
from tests.shardetcd_fixture import ShardetcdProcess
from tests.tls_certs import make_pki

CNS = ("alice", "root", "nobody")  # "nobody" is not a user


def _tls_flags(pki: dict[str, Path]) -> list[str]:
    return ["--cert-file", str(pki["server"]), "--key-file", str(pki["server-key"]),
            "--trusted-ca-file", str(pki["ca"]), "--client-cert-auth"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), client_cns=CNS)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, pki):
    """{"etcd": tls endpoint, "shardetcd": tls endpoint}; both stopped by PID at the end."""
    tmp = tmp_path_factory.mktemp("cn")
    etcd_tls = free_port()
    etcd = start_etcd(tmp / "etcd", extra_client_urls=(f"https://127.0.0.1:{etcd_tls}",),
                      extra_args=tuple(_tls_flags(pki)))
    started = []

    def shardetcd(name: str, *extra: str) -> tuple[ShardetcdProcess, str]:
        port, tls_port = free_port(), free_port()
        urls = f"https://127.0.0.1:{tls_port},http://127.0.0.1:{port}"  # https first: followers call it
        proc = ShardetcdProcess(
            data_dir=tmp / name / "data", state_dir=tmp / name / "state", port=port, log_path=tmp / name / "log",
            extra_args=("--listen-client-urls", urls, "--advertise-client-urls", urls, *_tls_flags(pki), *extra))
        started.append(proc)
        return proc.start(), f"127.0.0.1:{tls_port}"

    try:
        _, endpoint = shardetcd("s")
        writer, _ = shardetcd("w")
        # the follower calls its writer as root: a client's call it hands on must not act as root
        _, follower = shardetcd("f", "--follow", "--follow-data-dir", str(writer.data_dir),
                                "--client-cert-file", str(pki["client:root"]),
                                "--client-key-file", str(pki["client:root-key"]))
        yield {"etcd": f"127.0.0.1:{etcd_tls}", "shardetcd": endpoint, "follower": follower}
    finally:
        for proc in reversed(started):
            proc.stop()
        etcd.stop()


def channel(endpoint: str, pki, cn: str) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes(),
                                         private_key=pki[f"client:{cn}-key"].read_bytes(),
                                         certificate_chain=pki[f"client:{cn}"].read_bytes())
    return grpc.secure_channel(endpoint, creds)


def outcome(fn, *args, **kw):
    try:
        resp = fn(*args, timeout=10, **kw)
    except grpc.RpcError as exc:
        return ("error", exc.code().name, exc.details())
    return ("ok", resp)


def scenario(endpoint: str, pki) -> list[tuple]:
    """Set up users over TLS before auth is on, then call as each certificate."""
    chans = {cn: channel(endpoint, pki, cn) for cn in CNS}
    try:
        kv = {cn: pbg.KVStub(ch) for cn, ch in chans.items()}
        auth = {cn: pbg.AuthStub(ch) for cn, ch in chans.items()}
        lease = {cn: pbg.LeaseStub(ch) for cn, ch in chans.items()}
        kv["alice"].Put(pb.PutRequest(key=b"/bob/k", value=b"before"), timeout=10)
        enable_with_user(auth["alice"], "alice", "alicepw", b"/alice/", b"/alice0")
        root_token = auth["alice"].Authenticate(pb.AuthenticateRequest(name="root", password="rootpw"), timeout=10).token
        as_root = (("token", root_token),)
        out = []

        def rec(label, fn, *args, shape=None, **kw):
            o = outcome(fn, *args, **kw)
            if o[0] == "ok":
                o = ("ok", shape(o[1]) if shape else None)
            out.append((label, o))

        kvs = lambda r: [(kv.key, kv.value) for kv in r.kvs]  # noqa: E731
        rec("alice put own", kv["alice"].Put, pb.PutRequest(key=b"/alice/k", value=b"v"))
        rec("alice get own", kv["alice"].Range, pb.RangeRequest(key=b"/alice/k"), shape=kvs)
        rec("alice get prefix", kv["alice"].Range, pb.RangeRequest(key=b"/alice/", range_end=b"/alice0"), shape=kvs)
        rec("alice put other", kv["alice"].Put, pb.PutRequest(key=b"/bob/k", value=b"v"))
        rec("alice get other", kv["alice"].Range, pb.RangeRequest(key=b"/bob/k"), shape=kvs)
        rec("alice delete other", kv["alice"].DeleteRange, pb.DeleteRangeRequest(key=b"/bob/k"))
        rec("alice txn mixed", kv["alice"].Txn, pb.TxnRequest(success=[
            pb.RequestOp(request_put=pb.PutRequest(key=b"/alice/t", value=b"1")),
            pb.RequestOp(request_range=pb.RangeRequest(key=b"/bob/k"))]), shape=lambda r: r.succeeded)
        rec("alice user list", auth["alice"].UserList, pb.AuthUserListRequest())
        rec("alice auth status", auth["alice"].AuthStatus, pb.AuthStatusRequest(), shape=lambda r: r.enabled)
        rec("alice lease grant", lease["alice"].LeaseGrant, pb.LeaseGrantRequest(ID=4242, TTL=60), shape=lambda r: r.ID)
        rec("alice put own with lease", kv["alice"].Put, pb.PutRequest(key=b"/alice/l", value=b"v", lease=4242))
        rec("root user list", auth["root"].UserList, pb.AuthUserListRequest(), shape=lambda r: sorted(r.users))
        rec("root put anywhere", kv["root"].Put, pb.PutRequest(key=b"/bob/k", value=b"root"))
        rec("root role get", auth["root"].RoleGet, pb.AuthRoleGetRequest(role="alice-rw"),
            shape=lambda r: [(p.permType, p.key, p.range_end) for p in r.perm])
        rec("nobody get", kv["nobody"].Range, pb.RangeRequest(key=b"/alice/k"))
        rec("nobody put", kv["nobody"].Put, pb.PutRequest(key=b"/alice/k", value=b"x"))
        rec("nobody auth status", auth["nobody"].AuthStatus, pb.AuthStatusRequest(), shape=lambda r: r.enabled)
        # a token wins over the certificate; a bad token is refused even with a good certificate
        rec("alice cert, root token: put other", kv["alice"].Put, pb.PutRequest(key=b"/bob/k", value=b"tok"),
            metadata=as_root)
        rec("alice cert, root token: user list", auth["alice"].UserList, pb.AuthUserListRequest(),
            metadata=as_root, shape=lambda r: sorted(r.users))
        rec("alice cert, bad token", kv["alice"].Range, pb.RangeRequest(key=b"/alice/k"),
            metadata=(("token", "bogusbogusbogusx.1"),))
        rec("root cert, final read", kv["root"].Range, pb.RangeRequest(key=b"/", range_end=b"0"), shape=kvs)
        # watches: allowed on alice's prefix, canceled (permission denied) elsewhere
        for label, key, end in (("alice watch own", b"/alice/", b"/alice0"), ("alice watch other", b"/bob/", b"/bob0")):
            call = pbg.WatchStub(chans["alice"]).Watch(
                iter([pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, range_end=end))]), timeout=10)
            first = next(call)
            out.append((label, ("ok", (first.created, first.canceled, first.cancel_reason))))
            call.cancel()
        rec("root auth disable", auth["root"].AuthDisable, pb.AuthDisableRequest())
        return out
    finally:
        for ch in chans.values():
            ch.close()


def test_certificate_common_name_is_the_user_as_in_etcd(servers, pki):
    got = {name: scenario(endpoint, pki) for name, endpoint in servers.items()}
    assert got["shardetcd"] == got["etcd"]
    assert got["follower"] == got["etcd"]
    # and the scenario shows what it is about: alice acts as alice, root as root, nobody as no-one
    seen = dict(got["etcd"])
    assert seen["alice put own"] == ("ok", None)
    assert seen["alice put other"][0:2] == ("error", "PERMISSION_DENIED")
    assert seen["root user list"] == ("ok", ["alice", "root"])
    assert seen["alice cert, root token: put other"] == ("ok", None)
    assert seen["alice watch other"][1][1] is True
