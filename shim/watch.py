"""etcdserverpb.Watch: one bidirectional stream carrying many watchers."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from proto import rpc_pb2 as pb
from shards.watch import Message, WatchSpec, WatchStream

from . import wire
from .context import Member
from .errors import NO_LEADER

logger = logging.getLogger(__name__)


def watch_spec(r: pb.WatchCreateRequest) -> WatchSpec:
    return WatchSpec(
        key=r.key,
        range_end=r.range_end,
        start_revision=r.start_revision,
        watch_id=r.watch_id,
        prev_kv=r.prev_kv,
        progress_notify=r.progress_notify,
        fragment=r.fragment,
        filters=tuple(r.filters),
    )


ENCODE_STEP = 2048  # events of one message encoded between two looks at the clock
REFUSED_WATCH_ID = -1  # the watch id of a refused create (etcd's clientv3.InvalidWatchID)


class WatchService:
    def __init__(self, member: Member) -> None:
        self.m = member
        self.hub = member.store.hub

    async def Watch(self, requests: AsyncIterator[pb.WatchRequest], context: grpc.aio.ServicerContext):
        require_leader = self.m.requires_leader(context)  # refused at once while leaderless (shim/handlers.py)
        if require_leader and (unsure := self.m.unsure_writer()) is not None:
            try:
                await unsure
            except Exception:  # noqa: BLE001 - not confirmed, or another process writes now
                await context.abort(*NO_LEADER)
        stream = self.hub.open_stream()
        leaderless = []  # set when the stream was ended for want of a leader

        def end_without_leader() -> None:
            leaderless.append(True)
            stream.close()

        if require_leader:
            self.m.leader_streams.add(end_without_leader)
        reader = asyncio.ensure_future(self.apply_requests(requests, stream, context))
        framed, one_event = self.m.headers.framed, wire.watch_event_response
        try:
            while (msg := await stream.get()) is not None:
                if len(msg.events) == 1 and msg.watch_id > 0 and not (
                        msg.created or msg.canceled or msg.compact_revision or msg.cancel_reason):
                    # a live event to one watcher, most messages of a busy server: what encode makes
                    # of it (one event is never fragmented), framed here without a call or a list
                    event = msg.events[0]
                    yield one_event(framed(msg.revision), msg.watch_id, event.field or self._event_field(event))
                    continue
                for response in (self.encode(msg) if len(msg.events) < ENCODE_STEP else await self.encode_in_slices(msg)):
                    yield response
            if leaderless:
                await context.abort(*NO_LEADER)
        finally:
            self.m.leader_streams.discard(end_without_leader)
            reader.cancel()
            stream.close()

    async def apply_requests(self, requests: AsyncIterator[pb.WatchRequest], stream: WatchStream, context) -> None:
        """Apply requests as they arrive. The client closing its side keeps the
        stream open for sending, as in etcd; an error ends it."""
        try:
            async for req in requests:
                await stream.wait_room()
                if stream.closed:
                    return
                which = req.WhichOneof("request_union")
                if which == "create_request":
                    self.create(stream, req.create_request, context)
                elif which == "cancel_request":
                    stream.cancel(req.cancel_request.watch_id)
                elif which == "progress_request":
                    stream.request_progress()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken client stream ends the watch stream
            logger.debug("watch stream read ended error=%r", exc)
            stream.close()

    def create(self, stream: WatchStream, r: pb.WatchCreateRequest, context) -> None:
        """Create a watcher; while auth is enabled, one the caller may not read is refused as etcd
        >= 3.5.6 refuses it: a created and canceled response with watch id -1 (3.5.1 sent the
        requested id, 0 if none, which a client took for its watch 0) and why."""
        if self.m.auth.enabled and (refused := self.m.access.watch_refused(context, r.key, r.range_end)):
            stream.put(Message(REFUSED_WATCH_ID, self.m.store.committed, created=True, canceled=True,
                               cancel_reason=refused))
            return
        stream.create(watch_spec(r))

    @staticmethod
    def _encode_event(e) -> bytes:
        e.encoded = wire.encode_event(e.kind, e.kv, e.prev_kv)
        return e.encoded

    @classmethod
    def _event_field(cls, e) -> bytes:
        e.field = wire.event_field(e.encoded or cls._encode_event(e))
        return e.field

    async def encode_in_slices(self, msg: Message) -> list[bytes]:
        """``encode`` of a message of many events (a large DeleteRange's or lease revoke's), its
        events encoded ENCODE_STEP at a time between turns of the event loop; fragments at once."""
        if msg.fragment:
            return self.encode(msg)

        def steps():
            fields: list[bytes] = []
            events = msg.events
            for i in range(0, len(events), ENCODE_STEP):
                fields += [e.field or self._event_field(e) for e in events[i:i + ENCODE_STEP]]
                yield
            head = wire.watch_response(self.m.headers.framed(msg.revision), msg.watch_id, [], **self._flags(msg))
            return [head + b"".join(fields)]  # the events field comes last: as watch_response frames them

        return await self.m.store.in_slices(steps())

    @staticmethod
    def _flags(msg: Message) -> dict:
        """A message's fields besides its header, watch id, events and fragment flag."""
        return dict(created=msg.created, canceled=msg.canceled, compact_revision=msg.compact_revision,
                    cancel_reason=msg.cancel_reason)

    def encode(self, msg: Message) -> list[bytes]:
        """A message's response, or its fragments (Watch frames a live event to one watcher itself)."""
        header = self.m.headers.framed(msg.revision)
        events = [e.encoded or self._encode_event(e) for e in msg.events]
        flags = self._flags(msg)
        whole = wire.watch_response(header, msg.watch_id, events, **flags)
        limit = self.m.config.max_message_bytes  # as etcd
        if not msg.fragment or len(whole) < limit or len(events) < 2:
            return [whole]
        base = len(wire.watch_response(header, msg.watch_id, [], fragment=True, **flags))
        chunks = wire.fragments(events, base, limit)
        return [
            wire.watch_response(header, msg.watch_id, chunk, fragment=i < len(chunks) - 1, **flags)
            for i, chunk in enumerate(chunks)
        ]
