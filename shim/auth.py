"""etcdserverpb.Auth: users, roles, permissions, AuthEnable/Disable and simple tokens.

Requests are converted here and handed to the auth store
(``shards/auth.py``), which applies etcd 3.5's rules and makes each change
durable before it is acknowledged.  While auth is enabled every call but
Authenticate needs the root role, except that a user may UserGet themself
and RoleGet a role they hold (etcd's exceptions).  Passwords are hashed
with bcrypt (``--bcrypt-cost``, etcd's default 10) off the event loop.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from proto import auth_pb2, rpc_pb2 as pb
from shards.auth_state import Permission
from shards.errors import RoleNotFoundError, UserNotFoundError

from .context import Member, abort_with


class AuthService:
    def __init__(self, member: Member) -> None:
        self.m = member
        self.auth = member.auth
        self.access = member.access

    async def _admin(self, context: grpc.aio.ServicerContext, change: Callable[[], Awaitable] | None = None,
                     allow: Callable[[str | None], bool] | None = None):
        """Check the caller (while auth is enabled), then run ``change``; answer etcd's error if either fails."""
        try:
            if self.auth.enabled:
                user = self.access.caller(context)
                if allow is None or not allow(user):
                    self.auth.state.check_admin(user)
            return None if change is None else await change()
        except Exception as exc:
            await abort_with(context, exc)

    # -- enabling and tokens ------------------------------------------------------

    async def AuthEnable(self, request, context) -> pb.AuthEnableResponse:
        await self._admin(context, self.auth.enable)
        return pb.AuthEnableResponse(header=self.m.header())

    async def AuthDisable(self, request, context) -> pb.AuthDisableResponse:
        await self._admin(context, self.auth.disable)
        return pb.AuthDisableResponse(header=self.m.header())

    async def AuthStatus(self, request, context) -> pb.AuthStatusResponse:
        await self._admin(context)
        state = self.auth.state
        return pb.AuthStatusResponse(header=self.m.header(), enabled=state.enabled, authRevision=state.revision)

    async def Authenticate(self, request: pb.AuthenticateRequest, context) -> pb.AuthenticateResponse:
        try:
            token = await self.auth.authenticate(request.name, request.password)
        except Exception as exc:
            await abort_with(context, exc)
        return pb.AuthenticateResponse(header=self.m.header(), token=token)

    # -- users ---------------------------------------------------------------------

    async def UserAdd(self, r: pb.AuthUserAddRequest, context) -> pb.AuthUserAddResponse:
        # etcd 3.5 hashes the password itself and ignores a hashedPassword sent with UserAdd
        await self._admin(context, lambda: self.auth.user_add(r.name, r.password, r.options.no_password))
        return pb.AuthUserAddResponse(header=self.m.header())

    async def UserGet(self, r: pb.AuthUserGetRequest, context) -> pb.AuthUserGetResponse:
        await self._admin(context, allow=lambda user: (user or "") == r.name)
        user = self.auth.state.users.get(r.name)
        if user is None:
            await abort_with(context, UserNotFoundError())
        return pb.AuthUserGetResponse(header=self.m.header(), roles=list(user.roles))

    async def UserList(self, request, context) -> pb.AuthUserListResponse:
        await self._admin(context)
        return pb.AuthUserListResponse(header=self.m.header(), users=sorted(self.auth.state.users))

    async def UserDelete(self, r: pb.AuthUserDeleteRequest, context) -> pb.AuthUserDeleteResponse:
        await self._admin(context, lambda: self.auth.user_delete(r.name))
        return pb.AuthUserDeleteResponse(header=self.m.header())

    async def UserChangePassword(self, r: pb.AuthUserChangePasswordRequest, context) -> pb.AuthUserChangePasswordResponse:
        await self._admin(context, lambda: self.auth.user_password(r.name, r.password, r.hashedPassword))
        return pb.AuthUserChangePasswordResponse(header=self.m.header())

    async def UserGrantRole(self, r: pb.AuthUserGrantRoleRequest, context) -> pb.AuthUserGrantRoleResponse:
        await self._admin(context, lambda: self.auth.user_grant(r.user, r.role))
        return pb.AuthUserGrantRoleResponse(header=self.m.header())

    async def UserRevokeRole(self, r: pb.AuthUserRevokeRoleRequest, context) -> pb.AuthUserRevokeRoleResponse:
        await self._admin(context, lambda: self.auth.user_revoke(r.name, r.role))
        return pb.AuthUserRevokeRoleResponse(header=self.m.header())

    # -- roles ---------------------------------------------------------------------

    async def RoleAdd(self, r: pb.AuthRoleAddRequest, context) -> pb.AuthRoleAddResponse:
        await self._admin(context, lambda: self.auth.role_add(r.name))
        return pb.AuthRoleAddResponse(header=self.m.header())

    async def RoleGet(self, r: pb.AuthRoleGetRequest, context) -> pb.AuthRoleGetResponse:
        await self._admin(context, allow=lambda user: self.auth.state.has_role(user or "", r.role))
        role = self.auth.state.roles.get(r.role)
        if role is None:
            await abort_with(context, RoleNotFoundError())
        perms = [auth_pb2.Permission(permType=p.kind, key=p.key, range_end=p.range_end) for p in role.perms]
        return pb.AuthRoleGetResponse(header=self.m.header(), perm=perms)

    async def RoleList(self, request, context) -> pb.AuthRoleListResponse:
        await self._admin(context)
        return pb.AuthRoleListResponse(header=self.m.header(), roles=sorted(self.auth.state.roles))

    async def RoleDelete(self, r: pb.AuthRoleDeleteRequest, context) -> pb.AuthRoleDeleteResponse:
        await self._admin(context, lambda: self.auth.role_delete(r.role))
        return pb.AuthRoleDeleteResponse(header=self.m.header())

    async def RoleGrantPermission(self, r: pb.AuthRoleGrantPermissionRequest, context) -> pb.AuthRoleGrantPermissionResponse:
        perm = Permission(r.perm.permType, r.perm.key, r.perm.range_end) if r.HasField("perm") else None
        await self._admin(context, lambda: self.auth.role_grant(r.name, perm))
        return pb.AuthRoleGrantPermissionResponse(header=self.m.header())

    async def RoleRevokePermission(self, r: pb.AuthRoleRevokePermissionRequest, context) -> pb.AuthRoleRevokePermissionResponse:
        await self._admin(context, lambda: self.auth.role_revoke(r.role, r.key, r.range_end))
        return pb.AuthRoleRevokePermissionResponse(header=self.m.header())
