"""etcdserverpb.Maintenance and etcdserverpb.Cluster, as far as a single member answers them."""
from __future__ import annotations

import grpc

from proto import rpc_pb2 as pb

from .config import ETCD_API_VERSION
from .context import Member
from .errors import MEMBER_NOT_SUPPORTED


class MaintenanceService:
    def __init__(self, member: Member) -> None:
        self.m = member

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        store = self.m.store
        size = store.db_size()
        return pb.StatusResponse(
            header=self.m.header(),
            version=ETCD_API_VERSION,
            dbSize=size,
            dbSizeInUse=size,
            leader=self.m.member_id,
            raftIndex=store.committed,
            raftAppliedIndex=store.committed,
            raftTerm=self.m.raft_term,
        )


class ClusterService:
    def __init__(self, member: Member) -> None:
        self.m = member

    def _me(self) -> pb.Member:
        return pb.Member(ID=self.m.member_id, name=self.m.config.name, clientURLs=list(self.m.config.client_urls))

    async def MemberList(self, request: pb.MemberListRequest, context: grpc.aio.ServicerContext) -> pb.MemberListResponse:
        # etcd's Cluster service header carries no revision
        header = pb.ResponseHeader(cluster_id=self.m.cluster_id, member_id=self.m.member_id, raft_term=self.m.raft_term)
        return pb.MemberListResponse(header=header, members=[self._me()])

    async def _unsupported(self, request, context: grpc.aio.ServicerContext):
        await context.abort(*MEMBER_NOT_SUPPORTED)

    MemberAdd = MemberRemove = MemberUpdate = MemberPromote = _unsupported
