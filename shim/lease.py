"""etcdserverpb.Lease: grant, revoke, keep-alive, time-to-live, list."""
from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from proto import rpc_pb2 as pb

from . import wire
from .context import Member, abort_with, confirmed_or_abort
from .quota import LEASE_OVERHEAD_BYTES


class LeaseService:
    def __init__(self, member: Member) -> None:
        self.m = member
        self.store = member.store

    async def LeaseGrant(self, request: pb.LeaseGrantRequest, context: grpc.aio.ServicerContext) -> pb.LeaseGrantResponse:
        try:
            self.m.quota.check(LEASE_OVERHEAD_BYTES, capped=True)
            lease_id, ttl, rev = await self.store.lease_grant(request.ID, request.TTL)
        except Exception as exc:
            await abort_with(context, exc)
        return pb.LeaseGrantResponse(header=self.m.header(rev), ID=lease_id, TTL=ttl)

    async def LeaseRevoke(self, request: pb.LeaseRevokeRequest, context: grpc.aio.ServicerContext) -> pb.LeaseRevokeResponse:
        try:
            rev = await self.store.lease_revoke(request.ID)
        except Exception as exc:
            await abort_with(context, exc)
        return pb.LeaseRevokeResponse(header=self.m.header(rev))

    async def LeaseKeepAlive(self, requests: AsyncIterator[pb.LeaseKeepAliveRequest], context: grpc.aio.ServicerContext):
        """Each request renews one lease; an unknown or expired lease answers TTL 0."""
        renew, store, headers, unsure_writer = self.store.lease_renew, self.store, self.m.headers, self.m.unsure_writer
        async for req in requests:
            if (unsure := unsure_writer()) is not None:  # a deposed writer must not keep a lease alive
                await confirmed_or_abort(context, unsure)
            yield wire.keepalive_response(headers.framed(store.committed), req.ID, renew(req.ID))

    async def LeaseTimeToLive(
        self, request: pb.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaseTimeToLiveResponse:
        await self._surely_the_writer(context)
        lease = self.store.leases.leases.get(request.ID)
        if lease is None:
            return pb.LeaseTimeToLiveResponse(header=self.m.header(), ID=request.ID, TTL=-1)
        remaining = int(lease.remaining_s(self.store.leases.clock()))
        return pb.LeaseTimeToLiveResponse(
            header=self.m.header(),
            ID=lease.id,
            TTL=max(remaining, 0),
            grantedTTL=lease.ttl,
            keys=sorted(lease.keys) if request.keys else [],
        )

    async def LeaseLeases(self, request: pb.LeaseLeasesRequest, context: grpc.aio.ServicerContext) -> pb.LeaseLeasesResponse:
        await self._surely_the_writer(context)
        # as etcd: the lease that expires first first (its lessor sorts by remaining time)
        leases = sorted(self.store.leases.leases.values(), key=lambda lease: (lease.expiry, lease.id))
        return pb.LeaseLeasesResponse(header=self.m.header(), leases=[pb.LeaseStatus(ID=lease.id) for lease in leases])

    async def _surely_the_writer(self, context: grpc.aio.ServicerContext) -> None:
        """The writer's lessor is etcd's leader's: answer from it only while surely the writer."""
        if (unsure := self.m.unsure_writer()) is not None:
            await confirmed_or_abort(context, unsure)
