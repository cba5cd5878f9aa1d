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
