"""etcdserverpb.Auth: authentication is off and cannot be turned on yet.

The auth store is empty and read-only: status, lists and lookups answer as
etcd does with no users or roles; calls that would change it answer
etcd's FAILED_PRECONDITION "etcdserver: not capable" (a feature this server
does not offer); AuthEnable answers "root user does not exist", as etcd does
before a root user is added.
"""
from __future__ import annotations

import grpc

from proto import rpc_pb2 as pb

from .context import Member

NOT_ENABLED = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: authentication is not enabled")
NO_ROOT = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: root user does not exist")
USER_NOT_FOUND = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name not found")
ROLE_NOT_FOUND = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: role name not found")
NOT_CAPABLE = (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: not capable")


class AuthService:
    def __init__(self, member: Member) -> None:
        self.m = member

    async def AuthStatus(self, request, context) -> pb.AuthStatusResponse:
        return pb.AuthStatusResponse(header=self.m.header(), enabled=False, authRevision=1)

    async def AuthDisable(self, request, context) -> pb.AuthDisableResponse:
        return pb.AuthDisableResponse(header=self.m.header())

    async def AuthEnable(self, request, context):
        await context.abort(*NO_ROOT)

    async def Authenticate(self, request, context):
        await context.abort(*NOT_ENABLED)

    async def UserList(self, request, context) -> pb.AuthUserListResponse:
        return pb.AuthUserListResponse(header=self.m.header())

    async def RoleList(self, request, context) -> pb.AuthRoleListResponse:
        return pb.AuthRoleListResponse(header=self.m.header())

    async def _no_user(self, request, context):
        await context.abort(*USER_NOT_FOUND)

    async def _no_role(self, request, context):
        await context.abort(*ROLE_NOT_FOUND)

    async def _not_capable(self, request, context):
        await context.abort(*NOT_CAPABLE)

    UserGet = UserDelete = UserChangePassword = UserGrantRole = UserRevokeRole = _no_user
    RoleGet = RoleDelete = RoleGrantPermission = RoleRevokePermission = _no_role
    UserAdd = RoleAdd = _not_capable
