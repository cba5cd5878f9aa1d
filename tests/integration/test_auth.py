"""Auth is off: status and lookups as etcd with no users; changes refused with etcd's errors."""
from __future__ import annotations

import subprocess

import grpc
import pytest

from proto import rpc_pb2 as pb, rpc_pb2_grpc as pbg


def test_auth_status_and_refusals(shardetcd, real_etcd):
    for ep in (shardetcd.endpoint, real_etcd.endpoint):  # identical on a fresh etcd
        with grpc.insecure_channel(ep) as ch:
            auth = pbg.AuthStub(ch)
            assert auth.AuthStatus(pb.AuthStatusRequest()).enabled is False
            assert list(auth.UserList(pb.AuthUserListRequest()).users) == []
            assert list(auth.RoleList(pb.AuthRoleListRequest()).roles) == []
            for call, msg in (
                (lambda: auth.AuthEnable(pb.AuthEnableRequest()), "etcdserver: root user does not exist"),
                (lambda: auth.Authenticate(pb.AuthenticateRequest(name="root", password="x")),
                 "etcdserver: authentication is not enabled"),
                (lambda: auth.UserGet(pb.AuthUserGetRequest(name="nobody")), "etcdserver: user name not found"),
                (lambda: auth.RoleGet(pb.AuthRoleGetRequest(role="nobody")), "etcdserver: role name not found"),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert (err.value.code(), err.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, msg), ep
    with grpc.insecure_channel(shardetcd.endpoint) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pbg.AuthStub(ch).UserAdd(pb.AuthUserAddRequest(name="root", password="x"))
        assert err.value.details() == "etcdserver: not capable"
    r = subprocess.run(["/usr/bin/etcdctl", f"--endpoints={shardetcd.endpoint}", "auth", "enable"],
                       capture_output=True, text=True, env={"ETCDCTL_API": "3"}, timeout=30)
    assert r.returncode != 0 and "root user does not exist" in r.stderr
