"""etcdserverpb.KV: Range, Put, DeleteRange, Txn, Compact."""
from __future__ import annotations

import grpc

from proto import rpc_pb2 as pb

from . import convert, quota, txn, validate, wire
from .context import Member, abort_with
from .handlers import eager


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
                       current: int | None = None) -> bytes:
        """Range, reading ``current`` as the latest revision (None: the committed one)."""
        try:
            validate.check_range(request)
            if self.auth.enabled:
                self.access.range(self.access.caller(context), request)
            if not request.serializable and (unsure := self.m.unsure_writer()) is not None:
                await unsure
            r = await self.store.range_async(convert.range_req(request), current)
        except Exception as exc:
            await abort_with(context, exc)
        return wire.range_response(self.m.headers.framed(r.revision), r.kvs, r.more, r.count)

    async def Put(self, request: pb.PutRequest, context: grpc.aio.ServicerContext) -> bytes:
        try:
            validate.check_put(request)
            if self.m.guard is not None:
                validate.check_partition(self.m.guard, (request.key,))
            if auth := self.auth.enabled:
                user = self.access.caller(context)
            validate.check_size(request, self.m.config.max_request_bytes)
            if auth:
                self.access.put(user, request)
            self.m.quota.check(quota.cost_put(request), capped=True)
            r = await self.store.put(convert.put_req(request))
        except Exception as exc:
            await abort_with(context, exc)
        return wire.put_response(self.m.headers.framed(r.revision), r.prev_kv)

    async def DeleteRange(self, request: pb.DeleteRangeRequest, context: grpc.aio.ServicerContext) -> bytes:
        try:
            validate.check_delete(request)
            if self.m.guard is not None:
                validate.check_partition(self.m.guard, (request.key,))
            if auth := self.auth.enabled:
                user = self.access.caller(context)
            validate.check_size(request, self.m.config.max_request_bytes)
            if auth:
                self.access.delete(user, request)
            r = await self.store.delete_range(convert.delete_req(request))
        except Exception as exc:
            await abort_with(context, exc)
        return wire.delete_response(self.m.headers.framed(r.revision), r.deleted, r.prev_kvs)

    async def Txn(self, request: pb.TxnRequest, context: grpc.aio.ServicerContext) -> bytes:
        try:
            checked = txn.check_txn(request, self.m.config.max_txn_ops)
            if self.m.guard is not None:
                validate.check_partition(self.m.guard, checked.written)
            if auth := self.auth.enabled:
                user = self.access.caller(context)
            validate.check_size(request, self.m.config.max_request_bytes)
            if auth:
                self.access.txn(user, request)
            self.m.quota.check(checked.cost, capped=checked.cost > 0)
            r = await self.store.txn(checked.req)
        except Exception as exc:
            await abort_with(context, exc)
        return wire.txn_response(self.m.headers.framed(r.revision), r)

    async def Compact(self, request: pb.CompactionRequest, context: grpc.aio.ServicerContext) -> pb.CompactionResponse:
        try:
            if self.auth.enabled:
                self.access.caller(context)  # no permission needed, but a bad token is refused
            rev = await self.store.compact(request.revision, request.physical)
        except Exception as exc:
            await abort_with(context, exc)
        return pb.CompactionResponse(header=self.m.header(rev))
