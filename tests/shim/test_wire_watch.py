"""The hand-encoded watch responses are protobuf's encoding of the same WatchResponse."""
from __future__ import annotations

import random

from proto import kv_pb2, rpc_pb2 as pb
from shim import wire


def test_one_event_response_is_protobufs_encoding():
    rnd = random.Random(11)
    for _ in range(300):
        revision = rnd.choice([1, 127, 128, 2**31, 2**62])
        header = pb.ResponseHeader(cluster_id=17, member_id=99, revision=revision, raft_term=2)
        watch_id = rnd.choice([1, 2, 127, 128, 300, 2**40])
        kv = kv_pb2.KeyValue(key=rnd.randbytes(rnd.randrange(1, 300)), value=rnd.randbytes(rnd.randrange(0, 3000)),
                             create_revision=revision, mod_revision=revision, version=rnd.randrange(1, 500))
        prev = kv_pb2.KeyValue(key=kv.key, value=b"old") if rnd.random() < 0.5 else None
        kind = rnd.choice([kv_pb2.Event.PUT, kv_pb2.Event.DELETE])
        event = kv_pb2.Event(type=kind, kv=kv, prev_kv=prev)
        expected = pb.WatchResponse(header=header, watch_id=watch_id, events=[event]).SerializeToString()
        framed_header = b"\x0a" + wire.varint(header.ByteSize()) + header.SerializeToString()
        encoded_event = wire.encode_event(kind, kv.SerializeToString(), prev.SerializeToString() if prev else None)
        got = wire.watch_event_response(framed_header, watch_id, wire.event_field(encoded_event))
        assert got == expected
        assert got == wire.watch_response(framed_header, watch_id, [encoded_event])


def test_a_message_of_many_events_encoded_in_slices_is_the_one_encoded_at_once():
    """A large DeleteRange's events go to a watcher in one message: encoded ENCODE_STEP events
    a slice, the loop serving between slices, the bytes are those encode() makes at once."""
    import asyncio
    from types import SimpleNamespace

    from shards.watch import Event, Message
    from shim.watch import ENCODE_STEP, WatchService

    rng = random.Random(3)
    events = [Event(rng.choice((0, 1)), kv_pb2.KeyValue(key=b"k%d" % i, mod_revision=9).SerializeToString(),
                    kv_pb2.KeyValue(key=b"k%d" % i, value=b"v").SerializeToString() if i % 3 else None)
              for i in range(2 * ENCODE_STEP + 5)]
    slices = []

    async def in_slices(steps):
        try:
            while True:
                next(steps)
                slices.append(1)
        except StopIteration as end:
            return end.value

    def member():
        return SimpleNamespace(headers=wire.Headers(1, 2, 3), config=SimpleNamespace(max_message_bytes=1 << 21),
                               store=SimpleNamespace(in_slices=in_slices))

    for flags in ({}, {"created": True}, {"canceled": True, "cancel_reason": "x", "compact_revision": 4}):
        msg = Message(7, 9, [Event(e.kind, e.kv, e.prev_kv) for e in events], **flags)
        at_once = WatchService.__new__(WatchService)
        at_once.m = member()
        want = at_once.encode(Message(7, 9, [Event(e.kind, e.kv, e.prev_kv) for e in events], **flags))
        sliced = WatchService.__new__(WatchService)
        sliced.m = member()
        slices.clear()
        assert asyncio.run(sliced.encode_in_slices(msg)) == want
        assert len(slices) == 3
        parsed = pb.WatchResponse.FromString(want[0])
        assert len(parsed.events) == len(events) and parsed.watch_id == 7
