"""What every service shares: the store, the config, this member's identity."""
from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc

from journal.errors import JournalUnreachable
from journal.leadership import LeaseLost, WriterLease
from proto import rpc_pb2 as pb
from shards.alarms import AlarmStore
from shards.errors import LeaderChangedError, RequestTimeoutError
from shards.partition import PartitionGuard
from shards.store import Store

from .access import Access
from .config import ServerConfig
from .errors import status_of
from .handlers import Leader, requires_a_leader
from .quota import Quota
from .wire import Headers

logger = logging.getLogger(__name__)

# sent by a follower with the Status call that is its read index: the writer answers it only
# while it surely is the writer, as it answers a linearizable read (Member.unsure_writer)
READ_INDEX_METADATA = ("shardetcd-read-index", "1")
NO_LEADER_CHECKS = 3  # etcd's maxNoLeaderCnt: checks in a row without a leader before such streams end


@dataclass
class Member:
    store: Store
    config: ServerConfig
    guard: PartitionGuard | None = None  # set when serving one partition of a `shardetcd cluster`

    def __post_init__(self) -> None:
        d = self.store.datadir
        self.cluster_id, self.member_id, self.raft_term = d.cluster_id, d.member_id, self.store.term
        self.headers = Headers(self.cluster_id, self.member_id, self.raft_term)
        self.alarms = AlarmStore(self.store.datadir)
        self.quota = Quota(self.store, self.alarms, self.member_id, self.config.quota_backend_bytes)
        self.auth = self.store.auth  # auth.enabled is the one thing a request checks while auth is off
        # published with this member's address when it is the writer: its followers' calls carry it
        self.forward_secret = secrets.token_hex(16)
        self.access = Access(self.store.auth, self.store.leases, cert_users=self.config.client_cert_auth,
                             forward_secret=self.forward_secret)
        self.store.on_term = self.new_term  # a follower that sees a new writer reports its term
        self.store.read_guard = self.unsure_writer  # a Txn or DeleteRange that only read is a linearizable read
        # keep-alives are refused while the writer lease is not sure: that time does not count against leases
        self.store.leases_answerable = self.surely_writer
        self.standing_by = False  # --follow --standby: True until it takes over (set by the server)
        self.lease: WriterLease | None = None  # the writer lease this process writes under (JetStream)
        self.leader_streams: set[Callable[[], None]] = set()  # ends each open stream that requires a leader
        # whether this member knows a leader (set by the server with a replicated journal): a writer,
        # while its lease is sure; a follower, while NATS says a writer holds the lease
        self.leader_probe: Callable[[], Awaitable[bool]] | None = None

    def new_term(self, term: int) -> None:
        self.raft_term = term
        self.headers.set_term(term)

    def took_over(self, lease: WriterLease) -> None:
        """This member became the writer (--follow --standby): the leader from now on, in
        the new term of the writer lease it holds."""
        self.link = None
        self.standing_by = False
        self.lease = lease
        self.leader_probe = self.lease_sure
        self.new_term(self.store.term)

    async def lease_sure(self) -> bool:
        """The writer's leader probe: it is its own leader while its lease is sure."""
        return self.lease is not None and self.lease.sure()

    def surely_writer(self) -> bool:
        """Nobody else can write now: no writer lease (a local journal), or a sure one."""
        return self.lease is None or self.lease.sure()

    def unsure_writer(self) -> Awaitable[None] | None:
        """Before a linearizable answer from this process's own state: None while it surely
        is the writer (or writes under no lease: a local journal), else what to await first
        (journal/leadership.py: a writer cut off from NATS must not answer from a state a new
        writer has moved past).  Raises LeaderChangedError once another process holds the
        lease, RequestTimeoutError while NATS cannot confirm it (etcd's answers)."""
        if self.surely_writer():
            return None
        return asyncio.ensure_future(self._confirm(self.lease))  # a task of its own: a Range starts outside one (handlers.eager)

    def requires_leader(self, context: grpc.aio.ServicerContext) -> bool:
        """A stream opened with WithRequireLeader on a member that can lose its leader while it
        runs (one with a replicated journal)."""
        return self.leader_probe is not None and requires_a_leader(context)

    async def end_streams_without_a_leader(self, interval_s: float) -> None:
        """etcd's monitorLeader: when the leader probe fails NO_LEADER_CHECKS times in a row (a
        writer whose lease is not sure: it cannot reach NATS, or lost the lease; a follower that
        cannot read from NATS that a writer holds it), streams that require a leader end with
        "etcdserver: no leader", so that their clients open them elsewhere."""
        unsure = 0
        while True:
            await asyncio.sleep(interval_s)
            if self.leader_probe is None or await self.leader_probe():
                if Leader.missing:
                    logger.warning("leader known again")
                unsure, Leader.missing = 0, False
                continue
            unsure += 1
            if unsure >= NO_LEADER_CHECKS and not Leader.missing:
                logger.warning("no leader known, ending streams that require one streams=%d checks=%d",
                               len(self.leader_streams), unsure)
            Leader.missing = unsure >= NO_LEADER_CHECKS  # from now on calls that require a leader are refused
            if Leader.missing and self.leader_streams:
                ended, self.leader_streams = self.leader_streams, set()
                for end in ended:
                    end()

    async def _confirm(self, lease: WriterLease) -> None:
        try:
            await lease.confirm(self.store.config.request_timeout_s)
        except LeaseLost:
            raise LeaderChangedError() from None
        except JournalUnreachable:
            raise RequestTimeoutError() from None

    async def leader_id(self) -> int:
        """etcd's leader: this member, or the writer a follower follows; 0, etcd's "no leader", while
        none has served yet, or while this member has gone without one (its writer's lease held by
        nobody, or not surely by itself: as an etcd member during an election, or cut off)."""
        if Leader.missing:
            return 0
        link = getattr(self, "link", None)
        return self.member_id if link is None else await link.leader()

    def header(self, revision: int | None = None) -> pb.ResponseHeader:
        return pb.ResponseHeader(
            cluster_id=self.cluster_id,
            member_id=self.member_id,
            revision=self.store.committed if revision is None else revision,
            raft_term=self.raft_term,
        )


async def confirmed_or_abort(context: grpc.aio.ServicerContext, unsure: Awaitable[None]) -> None:
    """Await ``unsure`` (Member.unsure_writer's answer); if it fails, answer the call with its error."""
    try:
        await unsure
    except Exception as exc:
        await abort_with(context, exc)


def ended_with(context, exc: BaseException) -> BaseException:
    """abort_with for a call answered in a batch (handlers.batched, the native server's Call):
    the call ends now with etcd's status for ``exc`` and the AbortError its handler would have
    raised is returned; an unexpected error is logged and returned as it is."""
    status = status_of(exc)
    if status is None:
        logger.error("unexpected error serving request", exc_info=exc)
        return exc
    context.end(*status)
    return grpc.aio.AbortError()


async def abort_with(context: grpc.aio.ServicerContext, exc: Exception):
    """Answer with etcd's status for ``exc``; unexpected errors are logged and re-raised."""
    status = status_of(exc)
    if status is None:
        logger.exception("unexpected error serving request")
        raise exc
    await context.abort(status[0], status[1])
