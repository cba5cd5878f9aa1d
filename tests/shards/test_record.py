"""The WRITE record's payload, as journals hold it: participants (u16 count, u16 each), changes
(u32 count; per change u8 kind, u32 sub, u32 key length, u32 row length, key, row), little-endian.
A journal written by one build is replayed by the next, so the bytes are fixed."""
from __future__ import annotations

import struct

import pytest

from shards.record import DELETE, PUT, Change, decode_write, encode_changes, encode_write, write_participants


def by_hand(participants, changes) -> bytes:
    out = struct.pack("<H", len(participants)) + b"".join(struct.pack("<H", p) for p in participants)
    out += struct.pack("<I", len(changes))
    for c in changes:
        out += struct.pack("<BIII", c.kind, c.sub, len(c.key), len(c.row)) + c.key + c.row
    return out


@pytest.mark.parametrize("participants, changes", [
    ((3,), [Change(PUT, 0, b"/registry/pods/ns/p", b"row" * 100)]),  # one change on one shard: most writes
    ((0,), [Change(DELETE, 7, b"k", b"")]),
    ((65535,), [Change(PUT, 2**32 - 1, b"", b"r")]),
    ((0, 4), [Change(PUT, 0, b"a", b"1")]),  # one shard's part of a txn over two
    ((1,), [Change(PUT, 0, b"a", b"1"), Change(DELETE, 1, b"b", b"2")]),
    ((1, 2, 4), [Change(PUT, i, b"k%d" % i, b"v" * i) for i in range(5)]),
    ((2,), []),
])
def test_a_write_record_is_the_documented_bytes_and_reads_back(participants, changes):
    payload = encode_write(participants, changes)
    assert payload == by_hand(participants, changes)
    assert decode_write(payload) == (participants, changes)
    assert write_participants(payload) == participants
    # the same bytes when some changes were encoded ahead, in parts (a write of thousands does so
    # between its steps): at every split into at most three parts
    for a in range(len(changes) + 1):
        for b in range(a, len(changes) + 1):
            parts = [encode_changes(changes[:a]), encode_changes(changes[a:b])]
            assert encode_write(participants, changes, (b, parts)) == payload, (a, b)


@pytest.mark.parametrize("key", [b"", b"k", b"x" * 127, b"x" * 128, b"x" * 300, b"\xff" * 20_000])
@pytest.mark.parametrize("rev", [0, 1, 127, 128, 2**35 + 3])
def test_tombstone_rows_and_delete_events_are_encoded_as_protobuf_encodes_them(key, rev):
    from proto.kv_pb2 import KeyValue
    from shards.record import deleted_kv, tombstone_row

    assert tombstone_row(key) == KeyValue(key=key).SerializeToString()
    assert deleted_kv(key, rev) == KeyValue(key=key, mod_revision=rev).SerializeToString()
