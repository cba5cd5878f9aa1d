"""A hand-encoded RangeResponse or DeleteRangeResponse, whole or in parts, is protobuf's encoding of the same message."""
from __future__ import annotations

import random

import pytest

from proto import kv_pb2, rpc_pb2 as pb
from shim import wire


def _steps(gen):
    """Run ``gen`` to its end: (how many steps it took, what it returned)."""
    steps = 0
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return steps, stop.value
        steps += 1


@pytest.mark.parametrize("rows", [0, 1, wire.PART_ROWS - 1, wire.PART_ROWS, wire.PART_ROWS + 1,
                                  3 * wire.PART_ROWS + 7])
def test_range_answer_whole_and_in_parts_is_protobufs_encoding(rows):
    rnd = random.Random(rows)
    header = pb.ResponseHeader(cluster_id=17, member_id=99, revision=rnd.choice([5, 300, 2**40]), raft_term=2)
    framed = b"\x0a" + wire.varint(header.ByteSize()) + header.SerializeToString()
    kvs = [kv_pb2.KeyValue(key=b"/k/%06d" % i, value=rnd.randbytes(rnd.choice([0, 5, 200])),
                           create_revision=i + 2, mod_revision=i + 3, version=1 + i % 3, lease=i % 2)
           for i in range(rows)]
    rows_bytes = [kv.SerializeToString() for kv in kvs]
    for more, count in ((False, 0), (False, rows), (True, rows + 1000)):
        expected = pb.RangeResponse(header=header, kvs=kvs, more=more, count=count).SerializeToString()
        assert wire.range_response(framed, rows_bytes, more, count) == expected
        steps, parts = _steps(wire.range_parts(framed, rows_bytes, more, count))
        assert type(parts) is wire.Parts
        assert parts.joined() == expected and parts.size == len(expected)
        # one part (and one step) per PART_ROWS rows; no rows: the header (and tail) alone
        assert len(parts) == max(1, -(-rows // wire.PART_ROWS)) and steps == -(-rows // wire.PART_ROWS)
        assert all(parts)


@pytest.mark.parametrize("rows", [0, 1, wire.PART_ROWS, wire.PART_ROWS + 1, 2 * wire.PART_ROWS + 3])
def test_delete_answer_whole_and_in_parts_is_protobufs_encoding(rows):
    rnd = random.Random(rows)
    header = pb.ResponseHeader(cluster_id=17, member_id=99, revision=rnd.choice([5, 2**40]), raft_term=2)
    framed = b"\x0a" + wire.varint(header.ByteSize()) + header.SerializeToString()
    kvs = [kv_pb2.KeyValue(key=b"/k/%06d" % i, value=rnd.randbytes(rnd.choice([0, 200])), create_revision=i + 2,
                           mod_revision=i + 3, version=1) for i in range(rows)]
    rows_bytes = [kv.SerializeToString() for kv in kvs]
    for deleted, prev in ((rows, rows_bytes), (rows, []), (0, [])):
        expected = pb.DeleteRangeResponse(header=header, deleted=deleted, prev_kvs=kvs if prev else []).SerializeToString()
        assert wire.delete_response(framed, deleted, prev) == expected
        steps, parts = _steps(wire.delete_parts(framed, deleted, prev))
        assert parts.joined() == expected and parts.size == len(expected)
        assert len(parts) == max(1, -(-len(prev) // wire.PART_ROWS)) and steps == -(-len(prev) // wire.PART_ROWS)
