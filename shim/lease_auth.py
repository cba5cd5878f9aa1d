"""etcdserverpb.Lease with etcd's checks while auth is enabled.

Only the calls etcd checks are wrapped; LeaseKeepAlive and LeaseLeases,
which etcd checks nowhere, are ``lease.py``'s own, so the keep-alive path
costs nothing more.

    LeaseGrant        a valid token if one is given (no permission)
    LeaseRevoke       WRITE on every key the lease holds
    LeaseTimeToLive   READ on every key the lease holds (a later etcd 3.5's
                      fix: 3.5.1 tells anyone any lease's keys)
"""
from __future__ import annotations

import grpc

from proto import rpc_pb2 as pb

from .context import Member, abort_with
from .lease import LeaseService


class CheckedLeaseService(LeaseService):
    def __init__(self, member: Member) -> None:
        super().__init__(member)
        self.auth = member.auth
        self.access = member.access

    async def _checked(self, context: grpc.aio.ServicerContext, check=lambda user: None) -> None:
        """While auth is on: the caller's token must be valid, and ``check(user)`` pass."""
        if self.auth.enabled:
            try:
                check(self.access.caller(context))
            except Exception as exc:
                await abort_with(context, exc)

    async def LeaseGrant(self, request: pb.LeaseGrantRequest, context: grpc.aio.ServicerContext):
        await self._checked(context)
        return await super().LeaseGrant(request, context)

    async def LeaseRevoke(self, request: pb.LeaseRevokeRequest, context: grpc.aio.ServicerContext):
        await self._checked(context, lambda user: self.access.lease_keys(user, request.ID, write=True))
        return await super().LeaseRevoke(request, context)

    async def LeaseTimeToLive(self, request: pb.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext):
        await self._checked(context, lambda user: self.access.time_to_live(user, request.ID))
        return await super().LeaseTimeToLive(request, context)
