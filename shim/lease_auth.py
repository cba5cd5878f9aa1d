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

    async def LeaseGrant(self, request: pb.LeaseGrantRequest, context: grpc.aio.ServicerContext):
        if self.auth.enabled:
            try:
                self.access.caller(context)
            except Exception as exc:
                await abort_with(context, exc)
        return await super().LeaseGrant(request, context)

    async def LeaseRevoke(self, request: pb.LeaseRevokeRequest, context: grpc.aio.ServicerContext):
        if self.auth.enabled:
            try:
                self.access.lease_keys(self.access.caller(context), request.ID, write=True)
            except Exception as exc:
                await abort_with(context, exc)
        return await super().LeaseRevoke(request, context)

    async def LeaseTimeToLive(self, request: pb.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext):
        if self.auth.enabled:
            try:
                self.access.time_to_live(self.access.caller(context), request.ID)
            except Exception as exc:
                await abort_with(context, exc)
        return await super().LeaseTimeToLive(request, context)
