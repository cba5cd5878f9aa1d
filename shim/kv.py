"""etcdserverpb.KV: Range, Put, DeleteRange, Txn, Compact."""
from __future__ import annotations

import grpc

from proto import rpc_pb2 as pb

from . import convert, quota, txn, validate, wire
from shards.types import PutReq, PutResult, TxnReq, TxnResult

from .context import Member, abort_with, ended_with
from .handlers import batched, eager


class KVService:
    def __init__(self, member: Member) -> None:
        self.m = member
        self.store = member.store
        self.auth = member.auth
        self.access = member.access

    @eager
    async def Range(self, request: pb.RangeRequest, context: grpc.aio.ServicerContext) -> bytes:
        return await self.range_at(request, context)

    async def range_at(self, request: pb.RangeRequest, context: grpc.aio.ServicerContext,
                       current: int | None = None) -> bytes | wire.Parts:
        """Range, reading ``current`` as the latest revision (None: the committed one). A large
        answer is encoded in slices, as it was read, and given as wire.Parts."""
        try:
            validate.check_range(request)
            if self.auth.enabled:
                self.access.range(self.access.caller(context), request)
            if not request.serializable and (unsure := self.m.unsure_writer()) is not None:
                await unsure
            if self.store.committed < request.revision <= self.store.rev and not request.serializable:
                # a write of this writer's in flight (no member shows it before it is committed, but a
                # client may ask the next revision): answered once it is committed, not refused
                await self.store.wait_committed(request.revision)
            r = await self.store.range_async(convert.range_req(request), current)
        except Exception as exc:
            await abort_with(context, exc)
        if len(r.kvs) <= wire.PART_ROWS:
            return wire.range_response(self.m.headers.framed(r.revision), r.kvs, r.more, r.count)
        return await self.store.in_slices(wire.range_parts(self.m.headers.framed(r.revision), r.kvs, r.more,
                                                           r.count))

    def _admit(self, request, context: grpc.aio.ServicerContext, written, permitted) -> None:
        """A write's checks after its own, in etcd's order: the partition its keys belong to, the
        caller's token, the request's size, then ``permitted(user, request)``."""
        if self.m.guard is not None:
            validate.check_partition(self.m.guard, written)
        if auth := self.auth.enabled:
            user = self.access.caller(context)
        validate.check_size(request, self.m.config.max_request_bytes)
        if auth:
            permitted(user, request)

    def _put_req(self, request: pb.PutRequest, context: grpc.aio.ServicerContext) -> PutReq:
        """A Put's checks, in etcd's order, and the store's request for it."""
        req = validate.checked_put(request)
        self._admit(request, context, (req.key,), self.access.put)
        self.m.quota.check(quota.cost_put(req), capped=True)
        return req

    def _put_answer(self, r: PutResult) -> bytes:
        return wire.put_response(self.m.headers.framed(r.revision), r.prev_kv)

    async def put_batch(self, requests: list, contexts: list) -> list:
        """Put for calls that arrived together: checked one by one, stored as one (Store.put_many)."""
        return await self._batch(requests, contexts, self._put_req, self.store.put_many, self._put_answer)

    @batched(put_batch)
    async def Put(self, request: pb.PutRequest, context: grpc.aio.ServicerContext) -> bytes:
        try:
            r = await self.store.put(self._put_req(request, context))
        except Exception as exc:
            await abort_with(context, exc)
        return self._put_answer(r)

    async def DeleteRange(self, request: pb.DeleteRangeRequest, context: grpc.aio.ServicerContext) -> bytes | wire.Parts:
        try:
            validate.check_delete(request)
            self._admit(request, context, (request.key,), self.access.delete)
            r = await self.store.delete_range(convert.delete_req(request))
        except Exception as exc:
            await abort_with(context, exc)
        if len(r.prev_kvs) <= wire.PART_ROWS:
            return wire.delete_response(self.m.headers.framed(r.revision), r.deleted, r.prev_kvs)
        return await self.store.in_slices(wire.delete_parts(self.m.headers.framed(r.revision), r.deleted,
                                                            r.prev_kvs))

    def _txn_req(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> TxnReq:
        """A Txn's checks, in etcd's order, and the store's request for it."""
        checked = txn.check_txn(request, self.m.config.max_txn_ops)
        self._admit(request, context, checked.written, self.access.txn)
        self.m.quota.check(checked.cost, capped=checked.cost > 0)
        return checked.req

    def _txn_answer(self, r: TxnResult) -> bytes | TxnResult:
        """The answer's bytes; a result of more than PART_ROWS rows as it is, for
        ``_large_answer`` to encode in slices."""
        if wire.txn_rows(r) > wire.PART_ROWS:
            return r
        return wire.txn_response(self.m.headers.framed(r.revision), r)

    async def _large_answer(self, r: TxnResult) -> wire.Parts:
        return await self.store.in_slices(wire.txn_parts(self.m.headers.framed(r.revision), r))

    async def txn_batch(self, requests: list, contexts: list) -> list:
        """Txn for calls that arrived together: checked one by one, stored as one (Store.txn_many)."""
        answers = await self._batch(requests, contexts, self._txn_req, self.store.txn_many, self._txn_answer)
        for i, a in enumerate(answers):
            if type(a) is TxnResult:
                answers[i] = await self._large_answer(a)
        return answers

    @batched(txn_batch)
    async def Txn(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> bytes | wire.Parts:
        try:
            r = await self.store.txn(self._txn_req(request, context))
        except Exception as exc:
            await abort_with(context, exc)
        a = self._txn_answer(r)
        return a if type(a) is bytes else await self._large_answer(a)

    @staticmethod
    async def _batch(requests: list, contexts: list, check, store_many, answer) -> list:
        """Calls that arrived together (shim.handlers.batched): each checked (``check``: its
        store request, or the error it is refused with), the rest stored as one (``store_many``),
        each answered (``answer``). Per call: its response, or what ended it (``ended_with``)."""
        results: list = []
        reqs = []
        for request, context in zip(requests, contexts):
            try:
                reqs.append(check(request, context))
                results.append(None)
            except Exception as exc:
                results.append(ended_with(context, exc))
        if reqs:
            try:
                done = await store_many(reqs)
            except Exception as exc:  # the store's own error: every call's
                done = [exc] * len(reqs)
            stored = iter(done)
            for i, result in enumerate(results):
                if result is None:
                    r = next(stored)
                    results[i] = ended_with(contexts[i], r) if isinstance(r, BaseException) else answer(r)
        return results

    async def Compact(self, request: pb.CompactionRequest, context: grpc.aio.ServicerContext) -> pb.CompactionResponse:
        try:
            if self.auth.enabled:
                self.access.caller(context)  # no permission needed, but a bad token is refused
            rev = await self.store.compact(request.revision, request.physical)
        except Exception as exc:
            await abort_with(context, exc)
        return pb.CompactionResponse(header=self.m.header(rev))
