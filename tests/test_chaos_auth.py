"""tests/chaos_auth.py against a real server: a refused token is taken again, a call denied to the
chaos user is a finding, and so is an auth change a member does not hold to at the round's end."""
from __future__ import annotations

import random
from types import SimpleNamespace

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg
from tests import chaos_auth
from tests.chaos_auth import PROBE, Auth
from tests.chaos_watch import MemberWatch


@pytest.fixture
def auth(shardetcd):
    a = Auth()
    a.enable(shardetcd.endpoint)
    chaos_auth.ACTIVE = a
    yield a
    chaos_auth.ACTIVE = None


def as_root(endpoint: str):
    return pbg.AuthStub(chaos_auth.channel(endpoint, as_root=True))


def made(r: int, grant: bool) -> SimpleNamespace:
    """What Change leaves once it made round ``r``'s change."""
    return SimpleNamespace(password=f"probe-{r}", grant=grant, made=True)


def change(endpoint: str, r: int, grant: bool) -> SimpleNamespace:
    """Round ``r``'s change, made as Change makes it, at once."""
    c = chaos_auth.Change.__new__(chaos_auth.Change)
    c.password, c.grant, c.endpoints, c.errors, c._deadline = f"probe-{r}", grant, [endpoint], [], float("inf")
    c.rng = SimpleNamespace(uniform=lambda a, b: 0, choice=lambda seq: seq[0])
    c._run()
    assert c.made
    return c


def test_every_call_goes_with_a_token_and_a_refused_one_is_taken_again(shardetcd, auth):
    with chaos_auth.channel(shardetcd.endpoint) as ch:
        kv = pbg.KVStub(ch)
        kv.Put(pb.PutRequest(key=b"/registry/pods/a", value=b"1"), timeout=10)
        auth.user._token = "forgotten.1"  # as after the member that assigned it restarted: refused, made again
        assert [x.value for x in kv.Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10).kvs] == [b"1"]
        assert auth.user._token not in (None, "forgotten.1")
    with grpc.insecure_channel(shardetcd.endpoint) as ch:  # auth is on: no token, no read
        with pytest.raises(grpc.RpcError) as nobody:
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10)
        assert nobody.value.details() == "etcdserver: user name is empty"
    c = change(shardetcd.endpoint, 1, grant=True)
    assert f"tokens refused: {shardetcd.endpoint} 1" in auth.check(c, {"m0": shardetcd.endpoint})


def test_a_call_denied_to_the_chaos_user_is_a_finding(shardetcd, auth):
    as_root(shardetcd.endpoint).RoleRevokePermission(pb.AuthRoleRevokePermissionRequest(
        role=chaos_auth.CHAOS, key=b"\0", range_end=b"\0"), timeout=10)
    with chaos_auth.channel(shardetcd.endpoint) as ch:
        with pytest.raises(grpc.RpcError):
            pbg.KVStub(ch).Range(pb.RangeRequest(key=b"/registry/pods/a"), timeout=10)
    as_root(shardetcd.endpoint).RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
        name=chaos_auth.CHAOS, perm=chaos_auth.EVERYTHING), timeout=10)
    with pytest.raises(AssertionError, match="was denied"):
        auth.check(change(shardetcd.endpoint, 1, grant=True), {"m0": shardetcd.endpoint})


def test_the_rounds_change_held_passes_and_each_part_not_held_is_a_finding(shardetcd, auth):
    ep = {"m0": shardetcd.endpoint}
    assert "probe granted" in auth.check(change(shardetcd.endpoint, 1, grant=True), ep)
    with pytest.raises(AssertionError, match="password before the round"):
        auth.check(made(2, grant=False), ep)  # said made, not made: the old password still works
    as_root(shardetcd.endpoint).UserChangePassword(pb.AuthUserChangePasswordRequest(name=PROBE, password="probe-2"),
                                                   timeout=10)
    with pytest.raises(AssertionError, match="let probe put"):
        auth.check(made(2, grant=False), ep)  # the password changed, the permission not revoked
    assert "probe revoked" in auth.check(change(shardetcd.endpoint, 3, grant=False), ep)
    with pytest.raises(AssertionError, match=r"probe's put \(granted\): PERMISSION_DENIED"):
        as_root(shardetcd.endpoint).UserChangePassword(
            pb.AuthUserChangePasswordRequest(name=PROBE, password="probe-4"), timeout=10)
        auth.check(made(4, grant=True), ep)  # the permission not granted


def test_a_token_from_before_the_password_change_must_be_refused(shardetcd, auth):
    ep = {"m0": shardetcd.endpoint}
    auth.check(change(shardetcd.endpoint, 1, grant=True), ep)
    kept = auth.probe_token
    auth.check(change(shardetcd.endpoint, 2, grant=False), ep)
    auth.probe_token = kept  # refused: the password changed since
    auth.check(change(shardetcd.endpoint, 3, grant=True), ep)
    # a member that kept the token across the change: the check says so
    c = change(shardetcd.endpoint, 4, grant=False)
    auth.probe_token = auth.root.token(shardetcd.endpoint)  # a token every member takes
    with pytest.raises(AssertionError, match="took probe's token from before"):
        auth.check(c, ep)


def test_a_change_not_answered_in_time_is_a_finding(auth):
    c = chaos_auth.Change(5, ["127.0.0.1:1"], random.Random(5))  # nothing listens there
    with pytest.raises(AssertionError, match="auth change was not made"):
        c.end(timeout=1.0)
    assert c.errors and "UNAVAILABLE" in c.errors[-1]


def test_a_watch_refused_for_its_token_is_opened_again_with_a_new_one(shardetcd, auth):
    key = b"/registry/pods/w"
    with chaos_auth.channel(shardetcd.endpoint, as_root=True) as ch:  # the writes: not as the watcher
        start = pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=b"0"), timeout=10).header.revision
        auth.user._token = "forgotten.1"  # as after a restart of the member that knew it
        w = MemberWatch("m0", shardetcd.endpoint, [key], start)
        try:
            rev = pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=b"1"), timeout=10).header.revision
            assert w.wait_through(key, rev, 30)
            assert not w.seen[key].problems and [e[0] for e in w.seen[key].events] == [start, rev]
        finally:
            w.close()
    c = change(shardetcd.endpoint, 1, grant=True)
    assert f"tokens refused: {shardetcd.endpoint} 1" in auth.check(c, {"m0": shardetcd.endpoint})
