"""etcdserverpb.Maintenance and etcdserverpb.Cluster, as far as a single member answers them."""
from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import grpc

from proto import rpc_pb2 as pb

from .config import ETCD_API_VERSION
from shards.alarms import NAMES, NONE
from shards.errors import AuthError
from shards.etcd_snapshot import HASH_BYTES
from shards.snapshot import SnapshotStream, freeze

from .histogram import LoopHistogram, exponential, go_float, timed
from .context import READ_INDEX_METADATA, Member, abort_with, confirmed_or_abort
from .errors import (BAD_LEADER_TRANSFEREE, DOWNGRADE_TARGET, DOWNGRADE_VERSION_FORMAT, MEMBER_BAD_URLS, MEMBER_NOT_FOUND,
                     MEMBER_NOT_LEARNER, MEMBER_NOT_SUPPORTED, NOT_ENOUGH_STARTED, NOT_THE_WRITER, PEER_URL_EXISTS,
                     NO_INFLIGHT_DOWNGRADE, UNKNOWN_METHOD, unconverted_auth_status)

SNAPSHOT_CHUNK_BYTES = 1024 * 1024
CLUSTER_VERSION = ".".join(ETCD_API_VERSION.split(".")[:2]) + ".0"  # etcd's cluster version keeps major.minor
# a semantic version as etcd's downgrade parses it (also accepted: MAJOR.MINOR)
_SEMVER = re.compile(r"(\d+)\.(\d+)\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")


def downgrade_target(version: str) -> tuple[int, int] | None:
    """(major, minor) of a downgrade target, or None if etcd could not parse it."""
    m = _SEMVER.fullmatch(version) or _SEMVER.fullmatch(version + ".0")
    return (int(m[1]), int(m[2])) if m else None


async def _require_root(m: Member, context: grpc.aio.ServicerContext) -> None:
    """While auth is enabled: the caller holds the root role.  etcd's Hash, HashKV,
    Defragment and Snapshot answer a refusal with the auth error unconverted."""
    if m.auth.enabled:
        try:
            m.access.admin(context)
        except AuthError as exc:
            await context.abort(*unconverted_auth_status(exc))


# etcd's maintenance timings (successful calls), with its names, help texts and buckets
DEFRAG_S = LoopHistogram("etcd_disk_backend_defrag_duration_seconds",
                         "The latency distribution of backend defragmentation.", exponential(0.1, 13), bound_text=go_float)
SNAPSHOT_S = LoopHistogram("etcd_disk_backend_snapshot_duration_seconds", "The latency distribution of backend snapshots.",
                           exponential(0.01, 17), bound_text=go_float)
HASH_S = LoopHistogram("etcd_mvcc_hash_duration_seconds", "The latency distribution of storage hash operation.",
                       exponential(0.01, 15), bound_text=go_float)
HASH_REV_S = LoopHistogram("etcd_mvcc_hash_rev_duration_seconds",
                           "The latency distribution of storage hash by revision operation.", exponential(0.01, 15),
                           bound_text=go_float)


class Defragmenting:
    """Defragmentations under way (etcd_disk_defrag_inflight: 1 while one is)."""

    now = 0


class MaintenanceService:
    def __init__(self, member: Member) -> None:
        self.m = member
        self.store = member.store

    async def Alarm(self, request: pb.AlarmRequest, context: grpc.aio.ServicerContext) -> pb.AlarmResponse:
        if self.m.auth.enabled:
            try:
                self.m.access.caller(context)  # etcd checks no permission here, but refuses a bad token
            except Exception as exc:
                await abort_with(context, exc)
        alarms = self.m.alarms
        resp = pb.AlarmResponse(header=self.m.header())
        if request.action == pb.AlarmRequest.GET:
            found = alarms.get(request.alarm)
        elif request.action == pb.AlarmRequest.ACTIVATE:
            found = [alarms.activate(request.memberID, request.alarm)] if request.alarm != NONE else []
        elif request.action == pb.AlarmRequest.DEACTIVATE:
            gone = alarms.deactivate(request.memberID, request.alarm)
            found = [gone] if gone else []
        else:
            found = []
        resp.alarms.extend(pb.AlarmMember(memberID=m, alarm=a) for m, a in found)
        return resp

    async def Defragment(self, request: pb.DefragmentRequest, context: grpc.aio.ServicerContext) -> pb.DefragmentResponse:
        await _require_root(self.m, context)
        with timed(DEFRAG_S):
            Defragmenting.now += 1
            try:
                await self.store.defragment()
            finally:
                Defragmenting.now -= 1
        return pb.DefragmentResponse()  # etcd 3.5 answers with no header at all

    async def Snapshot(self, request: pb.SnapshotRequest, context: grpc.aio.ServicerContext):
        """Stream the store at the committed revision as an etcd 3.5 snapshot
        (a bbolt database, then its SHA-256), measured and written straight from
        the shards' RocksDB snapshots (``shards/snapshot.py``)."""
        await _require_root(self.m, context)
        with timed(SNAPSHOT_S):  # the whole stream sent (not observed when the client goes away)
            stream = SnapshotStream(freeze(self.store))
            db_bytes = await asyncio.to_thread(stream.measure) - HASH_BYTES
            chunks = stream.chunks(SNAPSHOT_CHUNK_BYTES)
            sent = 0
            # as etcd 3.5: no header, remaining_bytes counts the database only, the SHA-256 comes last with 0
            while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                sent = min(sent + len(chunk), db_bytes)
                yield pb.SnapshotResponse(remaining_bytes=db_bytes - sent, blob=chunk)

    async def Hash(self, request: pb.HashRequest, context: grpc.aio.ServicerContext) -> pb.HashResponse:
        await _require_root(self.m, context)
        with timed(HASH_S):
            h, _ = await self.store.hash_kv_async(0)
        return pb.HashResponse(header=self.m.header(), hash=h)

    async def HashKV(self, request: pb.HashKVRequest, context: grpc.aio.ServicerContext) -> pb.HashKVResponse:
        await _require_root(self.m, context)
        try:
            with timed(HASH_REV_S):  # a refused one is not observed
                h, compact = await self.store.hash_kv_async(request.revision)
        except Exception as exc:
            await abort_with(context, exc)
        return pb.HashKVResponse(header=self.m.header(), hash=h, compact_revision=compact)

    async def MoveLeader(self, request: pb.MoveLeaderRequest, context: grpc.aio.ServicerContext) -> pb.MoveLeaderResponse:
        """The only member is the leader: moving leadership to it is done at
        once (etcd answers with an empty response), to anyone else refused."""
        if request.targetID != self.m.member_id:
            await context.abort(*BAD_LEADER_TRANSFEREE)
        return pb.MoveLeaderResponse()

    async def Downgrade(self, request: pb.DowngradeRequest, context: grpc.aio.ServicerContext) -> pb.DowngradeResponse:
        """VALIDATE answers as etcd; a downgrade itself is not something this
        server can do, so ENABLE of a valid target is refused as not capable."""
        if request.action == pb.DowngradeRequest.CANCEL:
            await context.abort(*NO_INFLIGHT_DOWNGRADE)
        if request.action not in (pb.DowngradeRequest.VALIDATE, pb.DowngradeRequest.ENABLE):
            await context.abort(*UNKNOWN_METHOD)
        target = downgrade_target(request.version)
        if target is None:
            await context.abort(*DOWNGRADE_VERSION_FORMAT)
        major, minor = map(int, CLUSTER_VERSION.split(".")[:2])
        if target != (major, minor - 1):
            await context.abort(*DOWNGRADE_TARGET)
        if request.action == pb.DowngradeRequest.ENABLE:
            await context.abort(*MEMBER_NOT_SUPPORTED)
        return pb.DowngradeResponse(header=self.m.header(), version=CLUSTER_VERSION)

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusResponse:
        store = self.m.store
        if READ_INDEX_METADATA in (context.invocation_metadata() or ()):
            if self.m.link is not None:  # a follower: its revision is not the writer's committed one
                await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_THE_WRITER)
            if (unsure := self.m.unsure_writer()) is not None:
                await confirmed_or_abort(context, unsure)
        return pb.StatusResponse(
            header=self.m.header(),
            version=ETCD_API_VERSION,
            dbSize=store.db_size(),
            dbSizeInUse=store.db_size_in_use(),
            leader=await self.m.leader_id(),
            raftIndex=store.committed,
            raftAppliedIndex=store.committed,
            raftTerm=self.m.raft_term,
            errors=[f"memberID:{m} alarm:{NAMES[a]} " for m, a in self.m.alarms.get()],
        )


class ClusterService:
    def __init__(self, member: Member) -> None:
        self.m = member

    def _me(self) -> pb.Member:
        config = self.m.config
        return pb.Member(ID=self.m.member_id, name=config.name, peerURLs=list(config.initial_advertise_peer_urls),
                         clientURLs=list(config.client_urls))

    async def MemberList(self, request: pb.MemberListRequest, context: grpc.aio.ServicerContext) -> pb.MemberListResponse:
        # etcd's Cluster service header carries no revision
        header = pb.ResponseHeader(cluster_id=self.m.cluster_id, member_id=self.m.member_id, raft_term=self.m.raft_term)
        return pb.MemberListResponse(header=header, members=await self._members())

    async def _members(self) -> list[pb.Member]:
        registry = getattr(self.m, "registry", None)  # a replicated journal: the writer and its followers
        return await registry.members() if registry is not None else [self._me()]

    async def _admin(self, context: grpc.aio.ServicerContext) -> None:
        """Membership changes need the root role while auth is enabled."""
        if self.m.auth.enabled:
            try:
                self.m.access.admin(context)
            except Exception as exc:
                await abort_with(context, exc)

    async def MemberAdd(self, request: pb.MemberAddRequest, context: grpc.aio.ServicerContext):
        """etcd's checks (peer URLs first, then permission, then URLs in use), then refused: members
        are not added to this server."""
        if not valid_peer_urls(request.peerURLs):
            await context.abort(*MEMBER_BAD_URLS)
        await self._admin(context)
        taken = {u for m in await self._members() for u in m.peerURLs}
        if taken.intersection(request.peerURLs):
            await context.abort(*PEER_URL_EXISTS)
        await context.abort(*MEMBER_NOT_SUPPORTED)

    async def _named(self, member_id: int, context: grpc.aio.ServicerContext) -> tuple[pb.Member, int]:
        """A change to one member, as etcd checks it first: the root role, then that the member
        exists. The member and how many there are."""
        await self._admin(context)
        members = await self._members()
        member = next((m for m in members if m.ID == member_id), None)
        if member is None:
            await context.abort(*MEMBER_NOT_FOUND)
        return member, len(members)

    async def MemberRemove(self, request: pb.MemberRemoveRequest, context: grpc.aio.ServicerContext):
        _, count = await self._named(request.ID, context)
        if count == 1:  # etcd's strict reconfiguration check: the last voting member stays
            await context.abort(*NOT_ENOUGH_STARTED)
        await context.abort(*MEMBER_NOT_SUPPORTED)

    async def MemberUpdate(self, request: pb.MemberUpdateRequest, context: grpc.aio.ServicerContext):
        await self._named(request.ID, context)
        await context.abort(*MEMBER_NOT_SUPPORTED)

    async def MemberPromote(self, request: pb.MemberPromoteRequest, context: grpc.aio.ServicerContext):
        member, _ = await self._named(request.ID, context)
        if not member.isLearner:
            await context.abort(*MEMBER_NOT_LEARNER)
        await context.abort(*MEMBER_NOT_SUPPORTED)


def valid_peer_urls(urls) -> bool:
    """etcd's types.NewURLs: at least one, each http(s)/unix(s)://host:port with no path."""
    if not urls:
        return False
    for url in urls:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            return False
        if parts.scheme not in ("http", "https", "unix", "unixs") or parts.path:
            return False
        host, sep, port = parts.netloc.rpartition(":")
        if not sep or (host.startswith("[") != host.endswith("]")):
            return False
    return True
