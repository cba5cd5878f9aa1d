"""A follower (``--follow``): serves reads and watches from its own state, which
follows the writer's journals, and hands everything else to the writer.

* Serializable Range and Watch: from this process's state, at the revision it
  has applied (a follower may lag; it never shows a revision that is not whole
  in the journal).
* Linearizable Range: etcd's ReadIndex.  Ask the writer for its committed
  revision R (one request answers every read that was waiting when it was
  sent), wait until R is applied here, read at R: the read sees every write
  acknowledged before it began, and no later read on the writer can see less.
* Everything that writes (Put, DeleteRange, Txn, Compact, leases, auth,
  membership, alarms, locks, elections but Observe) goes to the writer as the client sent
  it, token included; the writer's answer is returned as it is, once the
  revision in its header is applied here, so a client reads its own writes
  on the member it wrote through, as on an etcd member.

* An election's Observe is served here, as on an etcd member: from the
  writer's committed revision (as a linearizable read starts), then from this
  process's watches, so that it lasts through the writer's death and a takeover.

* Simple auth tokens: Authenticate goes to the writer, which journals the
  token it assigns before answering; this process learns it when it applies
  the record (etcd: the token travels through Raft).  A call here with a
  token this process does not know yet (assigned a moment ago, on the writer
  or another follower) first catches up with the writer (``TokenCatchUp``),
  as an etcd member waits until it has applied the token's index.

The writer publishes where it serves clients in the journal's meta bucket
(key ``writer-urls.<role>``) when it starts serving, after every takeover
too; the follower reads it again whenever the writer cannot be reached, and
when a call to it times out or a stream to it (lease renewals) goes
quiet: a writer that hangs with its connection open refuses nothing, and a
record naming another writer is how a takeover shows then.  An https://
address is called over TLS as etcd's own client side calls its members
(``WriterTLS``).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from journal.errors import JournalError
from journal.tasks import unheard
from proto import rpc_pb2 as pb
from shards.errors import LeaderChangedError, RequestTimeoutError
from shards.tokens import SimpleTokens, looks_simple

from . import wire
from .context import READ_INDEX_METADATA
from .errors import NOT_THE_WRITER, TIMED_OUT
from .grpcserver import CallDetails
from .handlers import counted
from .access import FORWARDED_CALLER, FORWARDED_METADATA_MARK, FORWARDED_SECRET, common_name, token_of

logger = logging.getLogger(__name__)

# (service, method, kind): every call a follower hands to the writer
FORWARDED: dict[str, dict[str, str]] = {
    "etcdserverpb.KV": {"Put": "unary", "DeleteRange": "unary", "Txn": "unary", "Compact": "unary"},
    "etcdserverpb.Lease": {"LeaseGrant": "unary", "LeaseRevoke": "unary", "LeaseTimeToLive": "unary",
                           "LeaseLeases": "unary"},  # LeaseKeepAlive: keepalive_handler
    "etcdserverpb.Auth": {m: "unary" for m in (
        "AuthEnable", "AuthDisable", "AuthStatus", "Authenticate", "UserAdd", "UserGet", "UserList", "UserDelete",
        "UserChangePassword", "UserGrantRole", "UserRevokeRole", "RoleAdd", "RoleGet", "RoleList", "RoleDelete",
        "RoleGrantPermission", "RoleRevokePermission")},
    "etcdserverpb.Cluster": {"MemberAdd": "unary", "MemberRemove": "unary", "MemberUpdate": "unary",
                             "MemberPromote": "unary"},
    "etcdserverpb.Maintenance": {"Alarm": "unary", "MoveLeader": "unary", "Downgrade": "unary"},
    "v3lockpb.Lock": {"Lock": "unary", "Unlock": "unary"},
    "v3electionpb.Election": {"Campaign": "unary", "Proclaim": "unary", "Leader": "unary", "Resign": "unary"},
}  # Observe: served here (shim/concurrency.py), as on an etcd member: it lasts through the writer's death
# forwarded calls answered once this process has read the journals as far as they are stored
# (read_as_stored): their effect is a record with no revision of its own, which the next call
# here must see (a compacted revision refused, a permission granted or taken away, a revoked
# lease's keep-alive answered TTL 0)
READ_AS_STORED = {("etcdserverpb.KV", "Compact"), ("etcdserverpb.Lease", "LeaseRevoke"), *(("etcdserverpb.Auth", m) for m in (
    "AuthEnable", "AuthDisable", "UserAdd", "UserDelete", "UserChangePassword", "UserGrantRole",
    "UserRevokeRole", "RoleAdd", "RoleDelete", "RoleGrantPermission", "RoleRevokePermission"))}
# forwarded calls answered once what they ask for is had, however long that takes: they are given
# as long as their client gives them, as on an etcd member (etcdctl lock and elect wait with no
# deadline), not the follower's request timeout
WAITING = {("v3lockpb.Lock", "Lock"), ("v3electionpb.Election", "Campaign")}
# what a forwarded call's client metadata may carry on to the writer
FORWARDED_METADATA = ("token", "authorization")
# the writer's answers come back whatever their size, as to a client of etcd (its default receive
# limit is 2 GiB): a forwarded Txn or DeleteRange with prev_kv can carry megabytes (gRPC's own
# default, 4 MiB, refused them with RESOURCE_EXHAUSTED)
WRITER_CHANNEL_OPTIONS = (("grpc.max_receive_message_length", -1),)
READ_INDEX_SLOW_S = 0.5  # a read index answered this late counts as slow (etcd's ReadIndexRetryTime)
STREAM_CHECK_S = 5.0  # a forwarded call unanswered this long: did the writer move?
RECHECK_EVERY_S = 1.0  # the writer record is read at most this often for such checks (a move found: at once)
KEEPALIVE_STALL_S = 2.0  # a lease renewal sent to the writer and not answered this long: did the writer move?
_identity = None  # raw bytes in and out


def writer_key(role: str) -> str:
    return f"writer-urls.{role}"


def _writer_at(record: dict) -> tuple[str, str, int]:
    """The scheme and host:port of the first client URL a writer record names, and its member id."""
    scheme, _, target = record["urls"][0].rpartition("://")
    return scheme, target, record["member_id"]


def writer_record(urls: tuple[str, ...], member_id: int, name: str, secret: str, epoch: int = 0) -> str:
    """Where the writer serves, the secret its followers' calls carry (access.FORWARDED_SECRET), and
    the writer lease's revision it took the journals over with (a replicated journal's)."""
    return json.dumps({"urls": list(urls), "member_id": member_id, "name": name, "secret": secret, "epoch": epoch})


def record_epoch(record: bytes) -> int:
    """The epoch a writer record names (0 before records named one; -1 for one that does not read)."""
    try:
        return int(json.loads(record).get("epoch", 0))
    except (ValueError, TypeError, AttributeError):
        return -1


def _header_span(raw: bytes) -> tuple[int, int] | None:
    """Where the header (field 1, a ResponseHeader, first as etcd and we encode it) of an etcd
    response is in ``raw``: (start, end) of its bytes; None if there is none."""
    if not raw or raw[0] != 0x0A:
        return None
    length, shift, pos = 0, 0, 1
    while True:
        b = raw[pos]
        length |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            break
        shift += 7
    return pos, pos + length


def header_revision(raw: bytes) -> int:
    """The header revision of an etcd response, 0 if none."""
    span = _header_span(raw)
    return 0 if span is None else pb.ResponseHeader.FromString(raw[span[0]:span[1]]).revision


def as_this_member(raw: bytes, headers) -> tuple[bytes, int]:
    """The writer's answer ``raw`` as this member gives it, and its revision: etcd fills a
    response's header with the member the client called (its id and term); the revision is
    the writer's."""
    span = _header_span(raw)
    if span is None:
        return raw, 0
    rev = pb.ResponseHeader.FromString(raw[span[0]:span[1]]).revision
    return headers.framed(rev) + raw[span[1]:], rev


@dataclass(frozen=True)
class WriterTLS:
    """How a member calls a writer that serves https://, as etcd's client side does (its
    gateway's calls to its own port, a member's to its peers): the writer's certificate
    checked against ``ca_file`` (the system's CAs without one), and ``cert_file``/``key_file``
    presented, for a writer that asks for client certificates. The files are read for each
    new channel, so a certificate renewed on disk is used from the next connection on."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @classmethod
    def of(cls, config) -> WriterTLS:
        """etcd's choice: --client-cert-file/--client-key-file, else --cert-file/--key-file."""
        if config.client_cert_file is not None:
            return cls(config.trusted_ca_file, config.client_cert_file, config.client_key_file)
        return cls(config.trusted_ca_file, config.cert_file, config.key_file)

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return None if path is None else path.read_bytes()

        both = self.cert_file is not None and self.key_file is not None
        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file),
                                            private_key=read(self.key_file) if both else None,
                                            certificate_chain=read(self.cert_file) if both else None)


class WriterLink:
    """The writer of the journals this process follows: where it is, a channel to it."""

    def __init__(self, log, role: str, store, timeout_s: float = 7.0, tls: WriterTLS = WriterTLS()) -> None:
        self.log = log
        self.tls = tls
        self.key = writer_key(role)
        self.store = store
        self.timeout_s = timeout_s
        self.member_id = 0
        self._leader, self._leader_read_at = 0, -RECHECK_EVERY_S  # leader(): the record's writer, when read
        self.secret = ""  # the writer's, from its record: sent with every call handed to it
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[grpc.aio.Channel, int] = {}  # calls (and streams) under way, by channel
        self._recheck: asyncio.Future | None = None  # a look at the writer record after a call timed out
        self._rechecked_at = 0.0
        self._target = ""
        self._index: asyncio.Future | None = None  # the read index request in flight
        self._next_index: asyncio.Future | None = None  # the one asked for after it
        self.tokens: TokenCatchUp | None = None  # set by the server: learns tokens Authenticate returns
        self.active = True  # False once this process took over as the writer (--follow --standby)

    async def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            record = await self.log.get_meta(self.key)
            if record is None:
                raise RequestTimeoutError()  # no writer has served yet
            found = json.loads(record)
            before = self._target, self.member_id
            scheme, self._target, self.member_id = _writer_at(found)
            self.secret = found.get("secret", "") if scheme == "https" else ""  # over TLS only
            if scheme == "https":
                try:
                    credentials = self.tls.credentials()
                except OSError as exc:  # as a refused connection: looked up again, the call waits for it
                    logger.warning("cannot read the TLS files to call the writer error=%s", exc)
                    raise RequestTimeoutError() from None
                self._channel = grpc.aio.secure_channel(self._target, credentials, options=WRITER_CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.insecure_channel(self._target, options=WRITER_CHANNEL_OPTIONS)
            # said once a writer: while one is down, every call looks it up again, ten times a second
            (logger.info if (self._target, self.member_id) != before else logger.debug)(
                "following writer target=%s member=%x", self._target, self.member_id)
        return self._channel

    def signed(self, metadata) -> tuple:
        """A forwarded call's metadata with the secret of the writer the channel leads to (over TLS);
        over plaintext without the client's Common Name too (the writer would not believe it)."""
        if self.secret:
            return (*metadata, (FORWARDED_SECRET, self.secret))
        return tuple(m for m in metadata if m[0] != FORWARDED_CALLER)

    @contextlib.asynccontextmanager
    async def calling(self):
        """The channel to the writer, for one call or stream on it: a channel forgotten meanwhile
        is closed once the last of them has ended."""
        channel = await self.channel()
        self._calls[channel] = self._calls.get(channel, 0) + 1
        try:
            yield channel
        finally:
            self._calls[channel] -= 1
            if not self._calls[channel]:
                del self._calls[channel]
                if channel is not self._channel:
                    await channel.close()

    @property
    def writer(self) -> tuple[str, int]:
        """The writer the channel calling() gives leads to: its address and member id."""
        return self._target, self.member_id

    def leads_to(self, channel: grpc.aio.Channel) -> bool:
        """Whether calls to the writer still go over ``channel`` (not looked up again since)."""
        return self._channel is channel

    async def leader(self) -> int:
        """etcd's leader as this follower names it (Status): the member id of the writer the writer
        record names, 0 while none has served. Read at most every RECHECK_EVERY_S and waited for no
        longer (unread, the last one read), so that it follows a takeover with or without a call
        handed to the writer; the channel's writer is only looked up for a call."""
        if time.monotonic() - self._leader_read_at >= RECHECK_EVERY_S:
            self._leader_read_at = time.monotonic()
            named = None  # unread (the journal is not answering): the last one read
            try:
                async with asyncio.timeout(RECHECK_EVERY_S):  # not wait_for: it can drop a cancel (journal/tasks.py)
                    named = await self._named()
            except TimeoutError:
                pass
            if named is not None:  # (a writer record, once written, is never removed)
                self._leader = named[1]
        return self._leader

    async def forget_if_moved(self) -> tuple[str, int] | None:
        """A call timed out: a writer that hangs with its connection open (frozen, or its machine
        cut off) times calls out rather than refusing them. If the writer record names another
        writer by now (a standby took over), look it up again. Calls timing out together share
        one look at the record (at most one a RECHECK_EVERY_S, but at once after a move was
        found). The writer the record names: its address and member id (None: not read)."""
        recheck = self._recheck
        if recheck is None or recheck.done() and (
                recheck.result() not in (None, self.writer) or time.monotonic() - self._rechecked_at >= RECHECK_EVERY_S):
            self._rechecked_at = time.monotonic()
            recheck = self._recheck = asyncio.ensure_future(self._named())
        named = await asyncio.shield(recheck)
        if named is not None and named != self.writer and self._channel is not None:
            logger.info("writer moved while a call to it timed out from=%s member=%x to=%s member=%x",
                        *self.writer, *named)
            await self.forget()
        return named

    async def _named(self) -> tuple[str, int] | None:
        """The writer the writer record names now: its address and member id (None: none, or not read)."""
        try:
            record = await self.log.get_meta(self.key)
        except Exception as exc:  # noqa: BLE001 - the journal is not answering either: the caller's answer says enough
            logger.debug("writer record not read error=%r", exc)
            return None
        return None if record is None else _writer_at(json.loads(record))[1:]

    async def forget(self) -> None:
        """The writer did not answer: look it up again next time (a takeover moves it). Calls
        still on the old channel end on their own (a writer that is gone fails them, one that
        answers completes them, a stream goes on): the channel is closed after the last one.
        Closed at once, it would cancel them, and a cancelled call ends as if this server were
        stopping (a write the writer may be applying among them), the coalesced lease
        keep-alive stream as if this process were."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            if channel not in self._calls:
                await channel.close()

    async def close(self) -> None:
        """This process stops: its calls to the writer with it."""
        channels = {*self._calls, *((self._channel,) if self._channel is not None else ())}
        self._channel = None
        for channel in channels:
            await channel.close()

    # -- ReadIndex ------------------------------------------------------

    async def synced(self, context: grpc.aio.ServicerContext) -> int:
        """The writer's committed revision, asked after this call began, once applied here: where a
        linearizable read starts. When it cannot be had, the call is answered with the writer's
        error, or with etcd's timeout."""
        try:
            index = await self.read_index()
            await self.store.wait_committed(index)
        except grpc.aio.AioRpcError as exc:
            await _relay_error(context, exc)
        except RequestTimeoutError:
            await context.abort(*TIMED_OUT)
        return index

    async def read_index(self) -> int:
        """The writer's committed revision, asked after this call began.  Callers
        share requests: one in flight serves those that came before it was sent;
        later callers share the next one."""
        if self._index is None:
            self._index = asyncio.ensure_future(self._ask_index())  # its failure is counted; its callers
            self._index.add_done_callback(unheard)  # may all be gone (cancelled) when it comes
            index = self._index
        else:
            if self._next_index is None:
                self._next_index = asyncio.ensure_future(self._after(self._index))
                self._next_index.add_done_callback(unheard)
            index = self._next_index
        return await asyncio.shield(index)

    async def _after(self, previous: asyncio.Future) -> int:
        await asyncio.gather(previous, return_exceptions=True)
        self._index, self._next_index = self._next_index, None
        return await self._ask_index()

    async def _ask_index(self) -> int:
        stats = self.store.follow_stats
        asked = time.monotonic()
        try:
            # Status: its header carries the committed revision, and it needs no permission
            raw = await self.unary("etcdserverpb.Maintenance", "Status", b"", (READ_INDEX_METADATA,))
            rev = header_revision(raw)
            stats.learned(rev)
            return rev
        except Exception:
            stats.read_index_failures += 1
            raise
        finally:
            if time.monotonic() - asked >= READ_INDEX_SLOW_S:
                stats.slow_read_indexes += 1
            if self._next_index is None:
                self._index = None

    async def answers(self, timeout_s: float) -> bool:
        """Whether the writer tells its committed revision within ``timeout_s``: a local
        journal's follower's way of knowing it has a leader (it shares a read index in flight)."""
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for: it can drop a cancel (journal/tasks.py)
                await self.read_index()
            return True
        except Exception as exc:  # noqa: BLE001 - down, starting again, or slow: no leader for now
            logger.debug("writer not answering error=%r", exc)
            return False

    # -- forwarding -----------------------------------------------------

    async def unary(self, service: str, method: str, request: bytes, metadata, *, waits: bool = False,
                    client_timeout_s: float | None = None) -> bytes:
        """Call the writer.  While no writer can be reached (a takeover under way),
        wait for one, as an etcd member holds requests while it elects a leader,
        up to the request timeout: a call the writer refused to connect to never
        reached it, so sending it again cannot apply it twice; nor did one that a
        member answered NOT_THE_WRITER (the writer record still named its address).
        A call that ``waits`` (WAITING: for a lock, a leadership) is given as long as its
        client gives it (``client_timeout_s``, None: no end), as an etcd member waits; should the
        writer go away meanwhile (it stopped or crashed, or hangs and a standby took over), it is
        asked of the next writer: the same lease asks for the same key there, so a lock or a
        leadership is not had twice, and the place in its queue is kept."""
        deadline = time.monotonic() + self.timeout_s
        client_deadline = None if client_timeout_s is None else time.monotonic() + client_timeout_s
        while True:
            try:
                async with self.calling() as channel:
                    call = channel.unary_unary(f"/{service}/{method}", request_serializer=_identity,
                                               response_deserializer=_identity)
                    if not waits:
                        return await call(request, metadata=self.signed(metadata),
                                          timeout=max(deadline - time.monotonic(), 0.1))
                    timeout = None if client_deadline is None else max(client_deadline - time.monotonic(), 0.1)
                    return await self._answered(call(request, metadata=self.signed(metadata), timeout=timeout),
                                                self.writer)
            except grpc.aio.AioRpcError as exc:
                if waits and _went_away(exc):  # the writer it waited at is gone: asked again of the next one
                    await self.forget()
                    deadline = time.monotonic() + self.timeout_s
                else:
                    await self._unapplied(exc, deadline)
            except RequestTimeoutError:  # no writer has published where it serves yet
                if time.monotonic() > deadline:
                    raise
            except LeaderChangedError:  # it waited at a writer that is one no more: ask the new one
                deadline = time.monotonic() + self.timeout_s
                continue
            await asyncio.sleep(0.1)

    async def _answered(self, call, sent_to: tuple[str, int], answer=None):
        """What ``call`` to the writer ``sent_to`` answers (``answer``: the awaitable
        that gives it; by default the call itself). A writer that hangs with
        its connection open never answers nor fails: while the answer is slow to come, whether the
        writer moved is looked at every STREAM_CHECK_S, and once it has, the call is cancelled and
        LeaderChangedError raised."""
        pending = asyncio.ensure_future(call if answer is None else answer)
        try:
            while True:
                done, _ = await asyncio.wait((pending,), timeout=STREAM_CHECK_S)
                if done:
                    return pending.result()
                if await self._moved_from(sent_to):
                    call.cancel()
                    raise LeaderChangedError()
        finally:
            pending.cancel()

    async def _moved_from(self, sent_to: tuple[str, int]) -> bool:
        """Whether the writer record names another writer than ``sent_to`` (the one a waiting call
        or stream went to): found so now, or by an earlier look that moved the link on. A channel
        forgotten for another reason (a call to the same writer failed) is no move: a call still
        waiting on it is let be."""
        named = await self.forget_if_moved()
        return (self.writer if named is None else named) != sent_to

    async def _unapplied(self, exc: grpc.aio.AioRpcError, deadline: float) -> None:
        """Return if the call ``exc`` ended surely never reached a writer and there is time to
        ask again (the writer is looked up again); else raise it."""
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            await self.forget_if_moved()
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise exc
        await self.forget()
        if not _never_reached(exc) or time.monotonic() > deadline:
            raise exc  # it may have reached the writer: the client decides


def _never_reached(exc: grpc.aio.AioRpcError) -> bool:
    """Whether an UNAVAILABLE call surely reached no writer: the connection was refused, or the
    member there answered that it is not the writer."""
    details = exc.details() or ""
    return "failed to connect" in details.lower() or details == NOT_THE_WRITER


def _went_away(exc: grpc.aio.AioRpcError) -> bool:
    """Whether a call that reached the writer ended because its connection did (the writer
    stopped or crashed), not with an answer of the writer's (those are etcd's or ours)."""
    return exc.code() == grpc.StatusCode.UNAVAILABLE and not _never_reached(exc) and \
        not (exc.details() or "").startswith(("etcdserver: ", "shardetcd: "))


async def read_as_stored(*shards) -> None:
    """Until this process has read (and applied what it can of) the journals of ``shards``
    as far as they are stored now.  After a forwarded call whose answer carries no revision
    of its own (a compaction, an auth change: a record tagged at the current revision), this
    is how the member a client called sees the call's effect next, as an etcd member has
    applied an entry before it answers the proposal.  A writer answers once its record is
    stored, so what is stored when the answer is here holds it."""
    tails = [(shard, shard.journal) for shard in shards
             if hasattr(shard.journal, "stored_tail")]  # a follower's (after a takeover, the writer's own: nothing to read)
    stored = await asyncio.gather(*(journal.stored_tail() for _, journal in tails))  # asked together: one round trip
    for (shard, journal), end in zip(tails, stored):
        while shard.journal is journal and journal.read_tail < end:
            await asyncio.sleep(0.005)


def _metadata(context: grpc.aio.ServicerContext) -> tuple:
    """What a forwarded call carries: the client's credentials (its token; the Common Name of its
    TLS certificate), and the mark of a forwarded call (WriterLink.signed adds the writer's secret)."""
    cn = common_name(context)
    return (*((k, v) for k, v in context.invocation_metadata() or () if k in FORWARDED_METADATA),
            *(() if cn is None else ((FORWARDED_CALLER, cn),)), FORWARDED_METADATA_MARK)


async def refuse_if_forwarded(context: grpc.aio.ServicerContext) -> None:
    """A call another follower handed on reached this follower: it is not the writer."""
    if FORWARDED_METADATA_MARK in (context.invocation_metadata() or ()):
        await context.abort(grpc.StatusCode.UNAVAILABLE, NOT_THE_WRITER)


async def _relay_error(context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError):
    """The writer's error as it came; a call to the writer that ran out of this member's time (the
    writer hanging, or slow) as etcd's member that waited for its proposal in vain says it."""
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        await context.abort(*TIMED_OUT)
    await context.abort(exc.code(), exc.details() or "")


def forwarding_handlers(link: WriterLink, headers, calls: dict[str, dict[str, str]] = FORWARDED,
                        count: bool = True) -> list[grpc.GenericRpcHandler]:
    """Generic handlers (registered before the follower's own services) that hand
    ``calls`` to the writer as raw bytes; answers carry this member's ``headers``. Each is
    ``count``ed here as etcd's member counts the calls its clients make (its gRPC metrics: a
    write that fails through this member shows in this member's failed-call rate)."""
    store = link.store

    def unary(service: str, method: str):
        waits = (service, method) in WAITING

        async def handle(request: bytes, context) -> bytes:
            await refuse_if_forwarded(context)
            try:
                raw = await link.unary(service, method, request, _metadata(context), waits=waits,
                                       client_timeout_s=context.time_remaining() if waits else None)
            except grpc.aio.AioRpcError as exc:
                await _relay_error(context, exc)
            except RequestTimeoutError:
                await context.abort(*TIMED_OUT)
            raw, rev = as_this_member(raw, headers)
            store.follow_stats.learned(rev)
            if rev > store.committed:  # read your own writes on this member
                try:
                    await store.wait_committed(rev)
                except RequestTimeoutError:
                    await context.abort(*TIMED_OUT)
            if method == "Authenticate" and link.tokens is not None:  # the token works here once answered
                await link.tokens.learned(pb.AuthenticateResponse.FromString(raw).token)
            elif (service, method) in READ_AS_STORED:
                try:
                    async with asyncio.timeout(link.timeout_s):  # not wait_for (journal/tasks.py)
                        await read_as_stored(*store.shards)
                except (TimeoutError, JournalError):  # not read that far in time, or NATS did not say how far
                    await context.abort(*TIMED_OUT)
                if method == "Compact" and (compaction := pb.CompactionRequest.FromString(request)).physical:
                    await store.compacted(compaction.revision)  # as the writer: however long it takes
            return raw

        return handle

    def stream_stream(service: str, method: str):
        async def handle(requests, context):
            await refuse_if_forwarded(context)
            async with link.calling() as channel:
                call = channel.stream_stream(f"/{service}/{method}", request_serializer=_identity,
                                             response_deserializer=_identity)(
                    metadata=link.signed(_metadata(context)))

                async def pump() -> None:
                    async for raw in requests:
                        await call.write(raw)
                    await call.done_writing()

                pumping = asyncio.ensure_future(pump())
                try:
                    async for raw in call:
                        yield as_this_member(raw, headers)[0]
                except grpc.aio.AioRpcError as exc:
                    await _relay_error(context, exc)
                finally:
                    pumping.cancel()
                    call.cancel()

        return handle

    kinds = {"unary": unary, "stream_stream": stream_stream}
    wrap = {"unary": grpc.unary_unary_rpc_method_handler, "stream_stream": grpc.stream_stream_rpc_method_handler}

    def handler(service: str, method: str, kind: str):
        fn = kinds[kind](service, method)
        return wrap[kind](counted(service, method, kind, fn) if count else fn)

    return [WhileFollowing(link, grpc.method_handlers_generic_handler(
                service, {m: handler(service, m, kind) for m, kind in methods.items()}))
            for service, methods in calls.items()]


class WhileFollowing(grpc.GenericRpcHandler):
    """``handler`` while this process follows a writer; nothing once it took over
    (grpc asks the handlers in turn for every call: the server's own services,
    registered after, answer then)."""

    def __init__(self, link: WriterLink, handler: grpc.GenericRpcHandler) -> None:
        self.link = link
        self.handler = handler

    def service(self, handler_call_details):
        return self.handler.service(handler_call_details) if self.link.active else None


class TokenCatchUp:
    """Before a call served here with a simple token this process does not know:
    catch up with the writer, then let the call check the token as usual.

    A token the writer assigned is in its journal before Authenticate answers,
    so once this process has applied up to the writer's committed revision
    (its read index, asked now) and read the default shard's journal up to
    what is stored now, it knows every token assigned before the call began.
    etcd waits the same way (until it has applied the token's raft index).  A
    token still unknown after that, or after the request timeout, is invalid:
    the call answers "invalid auth token" as on any member."""

    def __init__(self, link: WriterLink, member) -> None:
        self.link = link
        self.member = member
        self.timeout_s = link.timeout_s

    async def __call__(self, context: grpc.aio.ServicerContext) -> None:
        if self.link.active and self.member.auth.enabled:
            token = token_of(context.invocation_metadata())
            if token is not None:
                await self.learned(token)

    async def learned(self, token: str) -> None:
        tokens = self.member.store.auth.tokens
        if not isinstance(tokens, SimpleTokens) or tokens.known(token) or not looks_simple(token):
            return
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it can lose a cancel (journal/tasks.py)
                await self._catch_up()
        except (TimeoutError, RequestTimeoutError, grpc.aio.AioRpcError, JournalError) as exc:
            logger.info("could not catch up with the writer for a token error=%r", exc)

    async def _catch_up(self) -> None:
        store = self.member.store
        index = await self.link.read_index()
        await store.wait_committed(index)
        await read_as_stored(store.lease_shard)


class KeepAlives:
    """A follower's keep-alives, coalesced as etcd's grpc-proxy does: a keep-alive
    for a lease this process renewed at the writer within the last two batch
    intervals is answered here at once (the TTL the writer granted: the lease
    lives at least that less 1 s past the answer), and the lease is renewed at the
    writer with the next batch; every ``interval_s`` one stream to the writer
    carries one renewal per lease kept alive since the last batch, however many
    clients sent how many keep-alives.  A keep-alive for a lease the follower
    cannot vouch for (not renewed through it that recently, too close to its
    deadline, or revoked or expired in the journal as far as it has read) waits
    for the writer's own answer."""

    def __init__(self, link: WriterLink, interval_s: float = 0.5) -> None:
        self.link = link
        self.interval_s = interval_s
        self.pending: set[int] = set()  # leases to renew with the next batch
        self.renewed: dict[int, tuple[float, int]] = {}  # lease -> (when its last renewal was sent, TTL granted)
        self.sent: dict[int, float] = {}  # lease -> when the renewal in flight was sent
        self.waiting: dict[int, list[asyncio.Future]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def keepalive(self, lease_id: int) -> int:
        """The TTL to answer a keep-alive of ``lease_id`` with (0: no such lease)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        renewed = self.renewed.get(lease_id)
        self.pending.add(lease_id)
        if renewed is not None:
            since, ttl = renewed
            if lease_id not in self.link.store.leases:  # revoked, or expired, as far as this process has read
                del self.renewed[lease_id]
            # the answer promises the whole TTL, the writer promised it from ``since``: so only just after
            # a renewal (the next batch renews it again), and not near the deadline of a short lease
            elif time.monotonic() - since < min(ttl - 3 * self.interval_s, 2 * self.interval_s):
                return ttl
        future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(lease_id, []).append(future)
        self._wake.set()
        try:
            async with asyncio.timeout(self.link.timeout_s):
                return await asyncio.shield(future)
        except TimeoutError:
            raise RequestTimeoutError() from None

    async def _run(self) -> None:
        while True:
            try:
                await self._stream()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the writer went away: find it again
                logger.info("keep-alive stream to the writer ended error=%r", exc)
                await self.link.forget()
                await asyncio.sleep(self.interval_s)

    async def _stream(self) -> None:
        async with self.link.calling() as channel:
            await self._stream_on(channel)

    async def _stream_on(self, channel: grpc.aio.Channel) -> None:
        call = channel.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive", request_serializer=_identity,
                                     response_deserializer=_identity)(metadata=(FORWARDED_METADATA_MARK,))
        reader = asyncio.ensure_future(self._answers(call))
        # renewals sent on an earlier stream get no answer on this one: those still awaited go again
        self.sent.clear()
        self.pending.update(self.waiting)
        try:
            while not reader.done():
                try:
                    async with asyncio.timeout(self.interval_s):  # not wait_for: it can drop a cancel (journal/tasks.py)
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()
                now = time.monotonic()
                # a writer that hangs with its connection open answers nothing and ends nothing: once
                # a renewal waits this long, whether the writer moved is looked at; if it has (or the
                # link looked it up again for another call), this stream gives way to one to the new writer
                if self.sent and now - min(self.sent.values()) > KEEPALIVE_STALL_S:
                    await self.link.forget_if_moved()
                if not self.link.leads_to(channel):
                    return
                batch, self.pending = self.pending, set()
                try:
                    for lease_id in batch:
                        self.sent[lease_id] = now
                        await call.write(pb.LeaseKeepAliveRequest(ID=lease_id).SerializeToString())
                except asyncio.InvalidStateError:  # the call ended (the writer went away): why, its reader says
                    await asyncio.wait([reader])
                    break
            reader.result()
        finally:
            reader.cancel()
            call.cancel()

    async def _answers(self, call) -> None:
        async for raw in call:
            resp = pb.LeaseKeepAliveResponse.FromString(raw)
            sent = self.sent.pop(resp.ID, time.monotonic())
            if resp.TTL > 0:
                self.renewed[resp.ID] = (sent, resp.TTL)
            else:
                self.renewed.pop(resp.ID, None)
            for future in self.waiting.pop(resp.ID, ()):
                if not future.done():
                    future.set_result(resp.TTL)


def keepalive_handler(link: WriterLink, member) -> grpc.GenericRpcHandler:
    """Lease.LeaseKeepAlive on a follower: coalesced (KeepAlives) while auth is
    off; with auth on, each client's stream goes to the writer with its token."""
    keepalives = KeepAlives(link)
    forward = forwarding_handlers(link, member.headers, {"etcdserverpb.Lease": {"LeaseKeepAlive": "stream_stream"}},
                                  count=False)[0]  # counted below, either way
    forwarded = forward.handler.service(CallDetails("/etcdserverpb.Lease/LeaseKeepAlive"))

    async def handle(requests, context):
        await refuse_if_forwarded(context)
        if member.auth.enabled:
            async for raw in forwarded.stream_stream(requests, context):
                yield raw
            return
        headers, store = member.headers, member.store
        async for raw in requests:
            lease_id = pb.LeaseKeepAliveRequest.FromString(raw).ID
            try:
                ttl = await keepalives.keepalive(lease_id)
            except RequestTimeoutError:
                await context.abort(*TIMED_OUT)
            yield wire.keepalive_response(headers.framed(store.committed), lease_id, ttl)

    return WhileFollowing(link, grpc.method_handlers_generic_handler("etcdserverpb.Lease", {
        "LeaseKeepAlive": grpc.stream_stream_rpc_method_handler(
            counted("etcdserverpb.Lease", "LeaseKeepAlive", "stream_stream", handle))}))


def follower_kv(member, link: WriterLink):
    """The KV service of a follower: linearizable Range through the read index."""
    from .kv import KVService

    class FollowerKV(KVService):
        async def Range(self, request: pb.RangeRequest, context: grpc.aio.ServicerContext) -> bytes:
            if request.serializable or not link.active:  # not active: this process took over as the writer
                return await super().Range(request, context)
            index = await link.synced(context)
            # a revision asked for that this process has, past the read index: it is in the journals (this
            # process applied it, and may have shown it in a watch) before the writer has taken their
            # answer, and it never changes: read there, not refused as a future revision
            return await self.range_at(request, context, max(index, min(request.revision, self.store.committed)))

    return FollowerKV(member)
