"""bbolt pages: what the writer lays out, the reader reads back, and what the
reader refuses.  (That real bbolt — etcdutl — reads the writer's files is
checked in tests/integration/test_etcd_snapshot.py.)"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from shards.bbolt import (BRANCH, HEADER_BYTES, LEAF, PAGE_SIZE, BoltError, BoltReader, Bucket, fnv1a64, plan_file,
                          write_file)


def build(buckets: dict[bytes, list[tuple[bytes, bytes]]], page_size: int = PAGE_SIZE) -> bytes:
    plan = plan_file([Bucket(name, lambda pairs=pairs: iter(pairs)) for name, pairs in buckets.items()], page_size)
    data = b"".join(write_file(plan))
    assert len(data) == plan.size
    return data


def read(data: bytes) -> dict[bytes, list[tuple[bytes, bytes]]]:
    return {name: list(b.items()) for name, b in BoltReader(data).buckets()}


def pages(data: bytes, page_size: int = PAGE_SIZE) -> list[tuple[int, int, int, int]]:
    """(id, flags, count, overflow) of every page that starts a run of pages."""
    out, pgid = [], 0
    while pgid * page_size < len(data):
        head = struct.unpack_from("<QHHI", data, pgid * page_size)
        out.append(head)
        pgid += 1 + head[3]
    return out


pairs_st = st.dictionaries(st.binary(min_size=1, max_size=40),
                           st.one_of(st.binary(max_size=60), st.integers(3000, 9000).map(lambda n: b"L" * n)),
                           max_size=120)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.binary(min_size=1, max_size=12), pairs_st, max_size=6), st.sampled_from([512, 4096]))
def test_what_is_written_reads_back(buckets, page_size):
    buckets = {name: sorted(pairs.items()) for name, pairs in buckets.items()}
    data = build(buckets, page_size)
    assert read(data) == buckets
    # every page is a meta page or reachable exactly once: the reader walked them all
    assert {flags for _, flags, _, _ in pages(data, page_size)[2:]} <= {BRANCH, LEAF}


def test_layout_of_a_small_file():
    """Meta pages 0 and 1, then the bucket's leaf; small buckets inline in the root's leaf."""
    many = [(b"%06d" % i, b"x" * 100) for i in range(200)]  # ~23 KiB: leaves and a branch
    data = build({b"key": many, b"meta": [(b"a", b"1")], b"none": []})
    heads = pages(data)
    assert heads[0] == (0, 0x04, 0, 0) and heads[1] == (1, 0x04, 0, 0)
    leaves = [h for h in heads if h[1] == LEAF]
    branches = [h for h in heads if h[1] == BRANCH]
    assert len(branches) == 1 and branches[0][2] == len(leaves) - 1  # one leaf is the root bucket's
    assert sum(h[2] for h in leaves[:-1]) == 200
    magic, version, page_size, _, root, _, freelist, hwm, txid, checksum = struct.unpack_from("<IIIIQQQQQQ", data, 16)
    assert (magic, version, page_size, freelist, hwm) == (0xED0CDAED, 2, 4096, (1 << 64) - 1, len(heads))
    assert root == heads[-1][0] and checksum == fnv1a64(data[16:72])
    root_leaf = data[root * 4096 :]
    assert struct.unpack_from("<QHHI", root_leaf)[2] == 3  # key, meta, none
    assert read(data) == {b"key": many, b"meta": [(b"a", b"1")], b"none": []}


def test_a_value_larger_than_a_page_gets_overflow_pages():
    data = build({b"big": [(b"k", b"v" * 10_000), (b"l", b"w")]})
    heads = pages(data)
    assert (2, LEAF, 1, 2) in heads  # 16 + 16 + 1 + 10,000 bytes: three pages
    assert read(data) == {b"big": [(b"k", b"v" * 10_000), (b"l", b"w")]}


def test_an_empty_file_has_an_empty_root():
    data = build({})
    assert len(data) == 3 * PAGE_SIZE and read(data) == {}


def test_a_source_that_changes_between_the_passes_is_caught():
    calls = []

    def items():
        calls.append(1)
        return iter([(b"a", b"1")] * 1 + ([(b"b", b"2" * 2000)] if len(calls) == 1 else []))

    plan = plan_file([Bucket(b"k", items)])
    with pytest.raises(ValueError, match="changed between the two passes"):
        b"".join(write_file(plan))


def test_keys_must_ascend():
    with pytest.raises(ValueError, match="ascending"):
        plan_file([Bucket(b"k", lambda: iter([(b"b", b""), (b"a", b"")]))])


# -- what the reader refuses --------------------------------------------------------

def _file() -> bytearray:
    return bytearray(build({b"key": [(b"%06d" % i, b"x" * 300) for i in range(100)], b"meta": [(b"a", b"1")]}))


def _put_u64(data: bytearray, offset: int, value: int) -> None:
    struct.pack_into("<Q", data, offset, value)


def _fix_meta_checksums(data: bytearray) -> None:
    for page in (0, 1):
        start = page * PAGE_SIZE
        _put_u64(data, start + 72, fnv1a64(bytes(data[start + 16 : start + 72])))


def _branch_page(data: bytearray) -> int:
    return next(pgid for pgid, flags, _, _ in pages(bytes(data)) if flags == BRANCH)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.__setitem__(slice(0, 2 * PAGE_SIZE), bytes(2 * PAGE_SIZE)), "not a bbolt file"),
    (lambda d: d.__delitem__(slice(len(d) - PAGE_SIZE, None)), "truncated"),
    (lambda d: (_put_u64(d, 16 + 40, 10**9), _put_u64(d, PAGE_SIZE + 16 + 40, 10**9), _fix_meta_checksums(d)), "truncated"),
    (lambda d: d.__setitem__(_branch_page(d) * PAGE_SIZE + 8, 0x10), "not a branch or leaf"),
    (lambda d: _put_u64(d, _branch_page(d) * PAGE_SIZE, 7), "says it is page 7"),
    # a branch pointing at itself: a cycle
    (lambda d: _put_u64(d, _branch_page(d) * PAGE_SIZE + HEADER_BYTES + 8, _branch_page(d)), "reached twice"),
    (lambda d: _put_u64(d, _branch_page(d) * PAGE_SIZE + HEADER_BYTES + 8, 10**6), "outside the file"),
    # two children swapped: keys out of order
    (lambda d: _swap_children(d), "out of order"),
    (lambda d: struct.pack_into("<I", d, 2 * PAGE_SIZE + HEADER_BYTES + 12, 10**6), "damaged"),
])
def test_the_reader_refuses_damage(damage, message):
    data = _file()
    damage(data)
    with pytest.raises(BoltError, match=message):
        read(bytes(data))


def _swap_children(d: bytearray) -> None:
    at = _branch_page(d) * PAGE_SIZE + HEADER_BYTES
    first, second = (struct.unpack_from("<Q", d, at + 8 + 16 * i)[0] for i in (0, 1))
    _put_u64(d, at + 8, second)
    _put_u64(d, at + 24, first)


def test_the_newer_valid_meta_page_wins_and_a_damaged_one_is_skipped():
    data = _file()
    good = read(bytes(data))
    struct.pack_into("<Q", data, PAGE_SIZE + 64, 2)  # meta 1: txid 2, stale checksum
    with_bad_meta1 = read(bytes(data))
    assert with_bad_meta1 == good  # meta 1 fails its checksum: meta 0 is used
    data[16] ^= 0xFF  # and if meta 0 is damaged too, nothing is left
    with pytest.raises(BoltError, match="not a bbolt file"):
        read(bytes(data))


def test_writing_holds_a_few_pages_whatever_the_size():
    """Both passes keep one open page per tree level: the memory they need does
    not grow with the number of pages (a 60,000-pair bucket is ~2,000 pages)."""
    import tracemalloc

    def peak(n: int) -> int:
        def items():
            return ((i.to_bytes(8, "big") + b"_" + bytes(8), b"x" * 100) for i in range(n))

        tracemalloc.start()
        try:
            plan = plan_file([Bucket(b"key", items)])
            assert sum(len(page) for page in write_file(plan)) == plan.size > n * 130
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(10_000), peak(60_000)
    assert large < 200_000 and large < small * 1.3, (small, large)
