"""v3lockpb.Lock and v3electionpb.Election: etcd's server-side lock and election.

etcd serves these by running its client concurrency recipes (Mutex, Election)
against itself; here the same steps run directly on the store:

* a caller's *session* is its lease; lease 0 means a new 60 s lease that
  nobody renews (etcd grants one and orphans it);
* a lock or a candidacy is the key ``<name>/<lease in hex>`` put with that
  lease if absent; the key with the lowest create revision under ``<name>/``
  holds the lock or leads;
* a waiter waits, oldest first, for every key created before its own to be
  deleted (a Range sorted by create revision with max_create_revision, then a
  watch for that key's delete), then checks its own key still exists.

Errors reach the client as etcd sends them: gRPC UNKNOWN with etcd's text
(``election: no leader``, ``etcdserver: requested lease not found``...).
"""
from __future__ import annotations

import asyncio
from contextlib import aclosing

import grpc

from proto import kv_pb2, v3election_pb2 as epb, v3lock_pb2 as lpb
from shards.errors import AuthError, CompactedError
from shards.layout import prefix_end
from shards.record import DELETE
from shards.types import (CMP_CREATE, RESULT_EQUAL, SORT_ASCEND, SORT_DESCEND, TARGET_CREATE, Compare, DeleteReq,
                          PutReq, RangeReq, TxnReq)
from shards.watch import WatchSpec

from .context import Member
from .errors import EMPTY_KEY, status_of

SESSION_TTL_S = 60  # clientv3 concurrency's default session TTL
NO_LEADER = "election: no leader"
NOT_LEADER = "election: not leader"
MISSING_LEADER = '"leader" field must be provided'
SESSION_EXPIRED = "mutex: session is expired"
WATCH_LOST = "lost watcher waiting for delete"


class RecipeError(Exception):
    """An error the recipes return as plain text (gRPC UNKNOWN)."""


async def _fail(context: grpc.aio.ServicerContext, exc: Exception):
    """etcd's in-process client hands every error back as UNKNOWN with its text."""
    if isinstance(exc, RecipeError):
        await context.abort(grpc.StatusCode.UNKNOWN, str(exc))
    status = status_of(exc)
    if status is None:
        raise exc
    await context.abort(grpc.StatusCode.UNKNOWN, status[1])


def _kv(raw: bytes) -> kv_pb2.KeyValue:
    return kv_pb2.KeyValue.FromString(raw)


def _first_created(pfx: bytes) -> RangeReq:
    return RangeReq(pfx, prefix_end(pfx), limit=1, sort_order=SORT_ASCEND, sort_target=TARGET_CREATE)


def _created_at(key: bytes, rev: int) -> Compare:
    return Compare(CMP_CREATE, RESULT_EQUAL, key, number=rev)


class Recipes:
    """The steps both services share, on one member's store."""

    def __init__(self, member: Member) -> None:
        self.m = member
        self.store = member.store

    async def session(self, lease: int) -> int:
        if lease == 0:
            lease, _, _ = await self.store.lease_grant(0, SESSION_TTL_S)
        return lease

    def check(self, context, writes: tuple[bytes, ...] = (), reads: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """While auth is on, the caller needs what the recipe's own requests need."""
        if not self.m.auth.enabled:
            return
        user = self.m.access.caller(context)
        for key in writes:
            self.m.access.check(user, key, b"", True)
        for key, end in reads:
            self.m.access.check(user, key, end, False)

    async def wait_deletes(self, pfx: bytes, max_create_rev: int) -> None:
        """Until no key under ``pfx`` created at or before ``max_create_rev`` is left."""
        while True:
            r = self.store.range(RangeReq(pfx, prefix_end(pfx), limit=1, sort_order=SORT_DESCEND,
                                          sort_target=TARGET_CREATE, max_create_revision=max_create_rev))
            if not r.kvs:
                return
            await self.wait_delete(_kv(r.kvs[0]).key, r.revision)

    async def wait_delete(self, key: bytes, rev: int) -> None:
        async with aclosing(self.events(WatchSpec(key=key, start_revision=rev))) as messages:
            async for msg in messages:
                if any(ev.kind == DELETE for ev in msg.events):
                    return
        raise RecipeError(WATCH_LOST)

    async def events(self, spec: WatchSpec):
        """Messages with events of one internal watch, until it ends; CompactedError if history is gone."""
        stream = self.store.hub.open_stream()
        try:
            stream.create(spec)
            while (msg := await stream.get()) is not None:
                if msg.canceled:
                    if msg.compact_revision:
                        raise CompactedError
                    return
                if msg.events:
                    yield msg
        finally:
            stream.close()

    async def join(self, context, name: bytes, lease: int, value: bytes, with_owner: bool = False):
        """The recipes' first Txn: put ``<name>/<lease in hex>`` with the lease if it is absent (else
        read it), and with ``with_owner`` read the oldest key under the prefix too. Returns
        (prefix, lease, key, txn result, the key's create revision)."""
        pfx = name + b"/"
        lease = await self.session(lease)
        key = pfx + f"{lease:x}".encode()
        self.check(context, writes=(key,), reads=((pfx, prefix_end(pfx)),))
        also = (_first_created(pfx),) if with_owner else ()
        r = await self.store.txn(TxnReq(compare=(_created_at(key, 0),), success=(PutReq(key, value, lease), *also),
                                        failure=(RangeReq(key), *also)))
        rev = r.revision if r.succeeded else _kv(r.responses[0].kvs[0]).create_revision
        return pfx, lease, key, r, rev

    async def delete_quietly(self, key: bytes, guard_rev: int | None = None) -> None:
        """Clean up after a cancelled wait, as the recipes do (their context is gone, the client's is not)."""
        delete = (self.store.delete_range(DeleteReq(key)) if guard_rev is None else
                  self.store.txn(TxnReq(compare=(_created_at(key, guard_rev),), success=(DeleteReq(key),))))
        try:
            await asyncio.shield(delete)
        except Exception:  # noqa: BLE001 - best effort; the lease still bounds the key's life
            pass


class LockService:
    def __init__(self, member: Member) -> None:
        self.r = Recipes(member)
        self.m = member

    async def Lock(self, request: lpb.LockRequest, context: grpc.aio.ServicerContext) -> lpb.LockResponse:
        store = self.r.store
        try:
            pfx, _, my_key, r, my_rev = await self.r.join(context, request.name, request.lease, b"", with_owner=True)
            owner = r.responses[1].kvs
            header_rev = r.revision
            if owner and _kv(owner[0]).create_revision != my_rev:
                try:
                    await self.r.wait_deletes(pfx, my_rev - 1)
                except BaseException:
                    await self.r.delete_quietly(my_key)
                    raise
                mine = store.range(RangeReq(my_key))
                if not mine.kvs:
                    raise RecipeError(SESSION_EXPIRED)
                header_rev = mine.revision
        except Exception as exc:
            await _fail(context, exc)
        return lpb.LockResponse(header=self.m.header(header_rev), key=my_key)

    async def Unlock(self, request: lpb.UnlockRequest, context: grpc.aio.ServicerContext) -> lpb.UnlockResponse:
        try:
            if not request.key:
                raise RecipeError(EMPTY_KEY[1])
            self.r.check(context, writes=(request.key,))
            r = await self.r.store.delete_range(DeleteReq(request.key))
        except Exception as exc:
            await _fail(context, exc)
        return lpb.UnlockResponse(header=self.m.header(r.revision))


class ElectionService:
    def __init__(self, member: Member) -> None:
        self.r = Recipes(member)
        self.m = member

    async def Campaign(self, request: epb.CampaignRequest, context: grpc.aio.ServicerContext) -> epb.CampaignResponse:
        try:
            pfx, lease, key, r, leader_rev = await self.r.join(context, request.name, request.lease, request.value)
            if not r.succeeded:
                mine = _kv(r.responses[0].kvs[0])
                if mine.value != request.value:
                    try:
                        await self._proclaim(key, leader_rev, lease, request.value)
                    except BaseException:
                        await self.r.delete_quietly(key, leader_rev)
                        raise
            try:
                await self.r.wait_deletes(pfx, leader_rev - 1)
            except asyncio.CancelledError:
                await self.r.delete_quietly(key, leader_rev)  # resign, as Campaign does when its context ends
                raise
        except Exception as exc:
            await _fail(context, exc)
        return epb.CampaignResponse(header=self.m.header(r.revision),
                                    leader=epb.LeaderKey(name=request.name, key=key, rev=leader_rev, lease=lease))

    async def _proclaim(self, key: bytes, rev: int, lease: int, value: bytes) -> int:
        r = await self.r.store.txn(TxnReq(compare=(_created_at(key, rev),), success=(PutReq(key, value, lease),)))
        if not r.succeeded:
            raise RecipeError(NOT_LEADER)
        return r.revision

    async def Proclaim(self, request: epb.ProclaimRequest, context: grpc.aio.ServicerContext) -> epb.ProclaimResponse:
        try:
            if not request.HasField("leader"):
                raise RecipeError(MISSING_LEADER)
            leader = request.leader
            lease = await self.r.session(leader.lease)
            self.r.check(context, writes=(leader.key,), reads=((leader.key, b""),))
            rev = await self._proclaim(leader.key, leader.rev, lease, request.value)
        except Exception as exc:
            await _fail(context, exc)
        return epb.ProclaimResponse(header=self.m.header(rev))

    async def Resign(self, request: epb.ResignRequest, context: grpc.aio.ServicerContext) -> epb.ResignResponse:
        try:
            if not request.HasField("leader"):
                raise RecipeError(MISSING_LEADER)
            leader = request.leader
            await self.r.session(leader.lease)
            self.r.check(context, writes=(leader.key,), reads=((leader.key, b""),))
            r = await self.r.store.txn(TxnReq(compare=(_created_at(leader.key, leader.rev),),
                                              success=(DeleteReq(leader.key),)))
        except Exception as exc:
            await _fail(context, exc)
        return epb.ResignResponse(header=self.m.header(r.revision))

    async def Leader(self, request: epb.LeaderRequest, context: grpc.aio.ServicerContext) -> epb.LeaderResponse:
        try:
            pfx = request.name + b"/"
            self.r.check(context, reads=((pfx, prefix_end(pfx)),))
            r = self.r.store.range(_first_created(pfx))
            if not r.kvs:
                raise RecipeError(NO_LEADER)
        except Exception as exc:
            await _fail(context, exc)
        return epb.LeaderResponse(header=self.m.header(r.revision), kv=_kv(r.kvs[0]))

    async def Observe(self, request: epb.LeaderRequest, context: grpc.aio.ServicerContext):
        """Each leader's proclamations in order: the current (or next) leader's key-value, then every
        put to that key until it is deleted, then the next leader's, and so on. Ends if history it
        needs was compacted, or quietly at once if the caller may not read the election (etcd's
        observer gives up on any error of its reads, and the stream ends with OK)."""
        pfx = request.name + b"/"
        try:
            self.r.check(context, reads=((pfx, prefix_end(pfx)),))
        except AuthError:
            return
        if (link := self.m.link) is not None and link.active:  # a follower: from where a linearizable read
            await link.synced(context)                         # starts, as etcd's observer's first Get
        try:
            while True:
                r = self.r.store.range(_first_created(pfx))
                if r.kvs:
                    rev, kv = r.revision, _kv(r.kvs[0])
                else:  # nobody leads: the first put under the prefix is the next leader
                    kv = await self._first_put(WatchSpec(key=pfx, range_end=prefix_end(pfx), start_revision=r.revision))
                    if kv is None:
                        return
                    rev = kv.mod_revision
                yield epb.LeaderResponse(header=self.m.header(rev), kv=kv)
                async with aclosing(self.r.events(WatchSpec(key=kv.key, start_revision=rev + 1))) as messages:
                    async for msg in messages:
                        for ev in msg.events:
                            if ev.kind == DELETE:
                                break
                            yield epb.LeaderResponse(header=self.m.header(msg.revision), kv=_kv(ev.kv))
                        else:
                            continue
                        break  # the leader's key is gone: find the next leader
                    else:
                        return  # the watch ended
        except CompactedError:
            return

    async def _first_put(self, spec: WatchSpec) -> kv_pb2.KeyValue | None:
        async with aclosing(self.r.events(spec)) as messages:
            async for msg in messages:
                for ev in msg.events:
                    if ev.kind != DELETE:
                        return _kv(ev.kv)
        return None
