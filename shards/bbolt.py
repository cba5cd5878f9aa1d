"""bbolt database files: a streaming writer and a checking reader.

etcd keeps its MVCC state in a bbolt file, and an etcd snapshot is that file
(followed by a SHA-256, see ``etcd_snapshot.py``).  This module knows pages,
buckets and sorted key/value pairs, nothing of etcd.

The file is a sequence of pages of ``page_size`` bytes; page ``n`` starts at
``n * page_size``.  All integers are little-endian (bbolt writes its structs
in the machine's order; etcd runs on little-endian machines).

Page header, at the start of every page::

    | off | size | field                                                  |
    |   0 |    8 | id: the page's own number (u64)                        |
    |   8 |    2 | flags: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist |
    |  10 |    2 | count: elements on the page                            |
    |  12 |    4 | overflow: pages after this one that belong to it       |

A page with overflow ``k`` spans ``k + 1`` pages; only the first has a header.

Meta page (pages 0 and 1, both written; a reader takes the valid one with
the higher txid), after the page header::

    | off | size | field                                                  |
    |  16 |    4 | magic 0xED0CDAED                                       |
    |  20 |    4 | version 2                                              |
    |  24 |    4 | page size                                              |
    |  28 |    4 | flags (0)                                              |
    |  32 |    8 | root bucket: page id of its root page                  |
    |  40 |    8 | root bucket: sequence                                  |
    |  48 |    8 | freelist page id (all ones: the freelist is not stored) |
    |  56 |    8 | pgid: high-water mark, pages the file uses             |
    |  64 |    8 | txid                                                   |
    |  72 |    8 | checksum: FNV-1a 64 of bytes 16..71                    |

Freelist page: ``count`` page ids (u64) after the header, sorted; a count
of 0xFFFF means the first u64 holds the real count.  Every page below the
high-water mark is a meta page, the freelist, free, or reachable from the
root bucket, exactly once.

Branch page: ``count`` elements of 16 bytes after the header, then the keys::

    | off | size | field                                                  |
    |   0 |    4 | pos: from this element to its key                       |
    |   4 |    4 | ksize                                                  |
    |   8 |    8 | child page id; its first key is this element's key     |

Leaf page: ``count`` elements of 16 bytes after the header, then keys and
values (each key followed by its value)::

    | off | size | field                                                  |
    |   0 |    4 | flags: 0x01 when the value is a bucket                 |
    |   4 |    4 | pos: from this element to its key                       |
    |   8 |    4 | ksize                                                  |
    |  12 |    4 | vsize                                                  |

Keys ascend (bytewise) through a bucket's leaves, left to right.

Bucket value (a leaf element with flag 0x01; the root bucket is the meta's)::

    | off | size | field                                                  |
    |   0 |    8 | root page id; 0 for an inline bucket                   |
    |   8 |    8 | sequence                                               |
    |  16 |  ... | inline bucket only: a leaf page (header + elements)     |

bbolt writes a bucket inline when it holds no buckets and its leaf would
take at most a quarter page; the writer here does the same.

The writer builds each bucket's tree bottom up as the sorted pairs arrive,
holding one open page per level of the tree, and numbers pages as it closes
them, children before parents.  It makes two passes over every bucket: the
first keeps only sizes and learns every bucket's root page and the page
count, which the meta pages (written first) need; the second yields the
file from page 0 up.  Memory is a few pages, whatever the size of the data.
Page order: meta 0, meta 1, then bucket by bucket its pages as they close
(leaves, each branch page after its children), and last the root bucket's.  Like etcd 3.5 (bbolt's NoFreelistSync), no freelist is
stored: every page is in use, and bbolt finds that out by walking the tree.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

MAGIC = 0xED0CDAED
VERSION = 2
PAGE_SIZE = 4096
BRANCH, LEAF, META, FREELIST = 0x01, 0x02, 0x04, 0x10
BUCKET_FLAG = 0x01
NO_FREELIST = (1 << 64) - 1
DEPTH_MAX = 64  # a real tree of 4 KiB pages is a handful of levels deep

_HEADER = struct.Struct("<QHHI")
_META = struct.Struct("<IIIIQQQQQQ")
_BRANCH_ELEM = struct.Struct("<IIQ")
_LEAF_ELEM = struct.Struct("<IIII")
_BUCKET = struct.Struct("<QQ")
_U64 = struct.Struct("<Q")
HEADER_BYTES = _HEADER.size
ELEM_BYTES = 16
META_CHECKSUM_AT = HEADER_BYTES + _META.size - 8


class BoltError(ValueError):
    """The bytes are not a (whole, well-formed) bbolt database."""


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# -- writing ---------------------------------------------------------------------

@dataclass(frozen=True)
class Bucket:
    """A top-level bucket to write: ``items()`` yields its pairs sorted by key
    and must yield the same pairs each time it is called (once per pass)."""

    name: bytes
    items: Callable[[], Iterable[tuple[bytes, bytes]]]


def _pages_for(nbytes: int, page_size: int) -> int:
    return max(1, -(-nbytes // page_size))


class _OpenPage:
    __slots__ = ("elems", "used", "closed")

    def __init__(self) -> None:
        self.elems: list = []  # leaf: (flags, key, value); branch: (first key of child, child page id)
        self.used = HEADER_BYTES
        self.closed = 0  # pages of this level closed so far


class _TreeWriter:
    """Lays out one bucket's B+tree bottom up as its pairs arrive in key order.

    Each level of the tree has one open page.  A pair goes on the open leaf
    unless it would not fit, in which case the leaf is closed first (a pair
    too large for an empty page gets overflow pages); closing a page gives it
    the next page id and puts (its first key, its id) on the open page of the
    level above, which closes the same way.  ``finish`` closes the open pages
    bottom up; the first level that never closed a page holds the root.  Page
    ids are given in closing order, children before parents, so the pages come
    out in file order.  With ``build`` False nothing but sizes is kept: the
    first pass uses that to learn the root and the page count."""

    def __init__(self, first_pgid: int, page_size: int, build: bool, flags: int = 0) -> None:
        self.next = first_pgid
        self.page_size = page_size
        self.build = build
        self.flags = flags
        self.levels = [_OpenPage()]
        self.out: list[bytes] = []  # pages closed and not yet taken (build only)
        self.pairs = self.nbytes = 0  # what was added, to tell the two passes apart

    def add(self, key: bytes, value: bytes) -> None:
        self.pairs += 1
        self.nbytes += len(key) + len(value)
        self._push(0, (self.flags, key, value if self.build else None), ELEM_BYTES + len(key) + len(value))

    def _push(self, depth: int, elem: tuple, nbytes: int) -> None:
        if depth == len(self.levels):
            self.levels.append(_OpenPage())
        level = self.levels[depth]
        if level.elems and level.used + nbytes > self.page_size:
            self._close(depth)
        level.elems.append(elem)
        level.used += nbytes

    def _write(self, depth: int) -> int:
        """Give the open page of ``depth`` its id (and bytes); start a new one."""
        level, pgid = self.levels[depth], self.next
        self.next += _pages_for(level.used, self.page_size)
        if self.build:
            write = _leaf_page if depth == 0 else _branch_page
            self.out.append(write(pgid, level.elems, self.page_size))
        level.elems, level.used = [], HEADER_BYTES
        level.closed += 1
        return pgid

    def _close(self, depth: int) -> None:
        first = self.levels[depth].elems[0]
        first_key = first[1] if depth == 0 else first[0]
        pgid = self._write(depth)
        self._push(depth + 1, (first_key, pgid), ELEM_BYTES + len(first_key))

    def finish(self) -> int:
        """Close every open page; the root page's id."""
        depth = 0
        while self.levels[depth].closed:  # a level that closed pages has a parent, and pages left open
            self._close(depth)
            depth += 1
        return self._write(depth)


@dataclass(slots=True)
class _BucketPlan:
    source: Bucket
    inline: list[tuple[bytes, bytes]] | None  # the pairs, when written inside the root bucket's leaf
    first: int = 0  # its first page id
    root: int = 0
    end: int = 0  # the page id after its last
    seen: tuple[int, int] = (0, 0)  # pairs and their bytes, in pass 1


@dataclass
class BoltPlan:
    """Where every page of the file goes; ``size`` is the file's length in bytes."""

    page_size: int
    buckets: list[_BucketPlan]
    root: _BucketPlan
    high_water: int
    txid: int

    @property
    def size(self) -> int:
        return self.high_water * self.page_size


def plan_file(buckets: list[Bucket], page_size: int = PAGE_SIZE, txid: int = 1) -> BoltPlan:
    """Pass 1: read every bucket once, keeping only sizes, and number the pages."""
    names = [b.name for b in buckets]
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"bucket names must be distinct and non-empty: {names}")
    next_pgid = 2  # 0, 1: meta
    plans = []
    for bucket in sorted(buckets, key=lambda b: b.name):
        plan = _BucketPlan(bucket, None, next_pgid)
        tree = _TreeWriter(next_pgid, page_size, build=False)
        inline: list | None = []
        inline_bytes = HEADER_BYTES
        for key, value in _ascending(bucket.items(), bucket.name):
            tree.add(key, value)
            if inline is not None:
                inline_bytes += ELEM_BYTES + len(key) + len(value)
                if inline_bytes <= page_size // 4:
                    inline.append((bytes(key), bytes(value)))
                else:
                    inline = None
        if inline is not None:
            plan.inline = inline
        else:
            plan.root = tree.finish()
            next_pgid = plan.end = tree.next
            plan.seen = (tree.pairs, tree.nbytes)
        plans.append(plan)
    root_pairs = [(p.source.name, _bucket_value(p, page_size)) for p in plans]  # bucket values: small
    root = _BucketPlan(Bucket(b"", lambda: root_pairs), None, next_pgid)
    tree = _TreeWriter(next_pgid, page_size, build=False)
    for key, value in root_pairs:
        tree.add(key, value)
    root.root = tree.finish()
    root.end = tree.next
    root.seen = (tree.pairs, tree.nbytes)
    return BoltPlan(page_size, plans, root, root.end, txid)


def _ascending(pairs: Iterable[tuple[bytes, bytes]], name: bytes) -> Iterator[tuple[bytes, bytes]]:
    prev: bytes | None = None
    for key, value in pairs:
        if not key or (prev is not None and key <= prev):
            raise ValueError(f"bucket {name!r}: keys must be non-empty and ascending: {key!r} after {prev!r}")
        prev = key
        yield key, value


def _bucket_value(plan: _BucketPlan, page_size: int) -> bytes:
    if plan.inline is None:
        return _BUCKET.pack(plan.root, 0)
    return _BUCKET.pack(0, 0) + _leaf_page(0, [(0, k, v) for k, v in plan.inline], page_size, pad=False)


def write_file(plan: BoltPlan) -> Iterator[bytes]:
    """Pass 2: the file's bytes from page 0 up, each chunk one page (with its overflow)."""
    ps = plan.page_size
    for pgid in (0, 1):
        yield _meta_page(plan, pgid)
    written = 2 * ps
    for bucket, flags in [(b, 0) for b in plan.buckets if b.inline is None] + [(plan.root, BUCKET_FLAG)]:
        if written != bucket.first * ps:
            raise AssertionError(f"bucket {bucket.source.name!r} starts at offset {written}, not page {bucket.first}")
        tree = _TreeWriter(bucket.first, ps, build=True, flags=flags)
        for key, value in bucket.source.items():
            tree.add(key, value)
            if tree.out:
                yield from tree.out
                written += sum(len(page) for page in tree.out)
                tree.out.clear()
        root = tree.finish()
        yield from tree.out
        written += sum(len(page) for page in tree.out)
        if (root, tree.next, (tree.pairs, tree.nbytes)) != (bucket.root, bucket.end, bucket.seen):
            raise ValueError(f"bucket {bucket.source.name!r} changed between the two passes")
    if written != plan.size:
        raise AssertionError(f"wrote {written} bytes, planned {plan.size}")


def _page(pgid: int, flags: int, count: int, body: bytes, ps: int, pad: bool = True) -> bytes:
    nbytes = HEADER_BYTES + len(body)
    pages = _pages_for(nbytes, ps)
    head = _HEADER.pack(pgid, flags, count, pages - 1 if pad else 0)
    return head + body + (bytes(pages * ps - nbytes) if pad else b"")


def _leaf_page(pgid: int, elems: list[tuple[int, bytes, bytes]], ps: int, pad: bool = True) -> bytes:
    heads, data = [], []
    pos = ELEM_BYTES * len(elems)  # from element 0 to the first key
    for i, (flags, key, value) in enumerate(elems):
        heads.append(_LEAF_ELEM.pack(flags, pos - ELEM_BYTES * i, len(key), len(value)))
        data += (key, value)
        pos += len(key) + len(value)
    return _page(pgid, LEAF, len(elems), b"".join(heads + data), ps, pad)


def _branch_page(pgid: int, elems: list[tuple[bytes, int]], ps: int) -> bytes:
    heads, data = [], []
    pos = ELEM_BYTES * len(elems)
    for i, (key, child) in enumerate(elems):
        heads.append(_BRANCH_ELEM.pack(pos - ELEM_BYTES * i, len(key), child))
        data.append(key)
        pos += len(key)
    return _page(pgid, BRANCH, len(elems), b"".join(heads + data), ps)


def _meta_page(plan: BoltPlan, pgid: int) -> bytes:
    body = _META.pack(MAGIC, VERSION, plan.page_size, 0, plan.root.root, 0, NO_FREELIST, plan.high_water, plan.txid, 0)
    body = body[:-8] + _U64.pack(fnv1a64(body[:-8]))
    return _page(pgid, META, 0, body, plan.page_size)


# -- reading ---------------------------------------------------------------------

@dataclass(frozen=True)
class Meta:
    page_size: int
    root: int
    freelist: int
    high_water: int
    txid: int


class BoltReader:
    """A read-only view of a bbolt file held in ``data`` (bytes, mmap or memoryview).

    Every structural fault (a page out of bounds, a wrong page type or id, an
    element past its page, keys out of order, a page reached twice) raises
    BoltError naming the page, never an IndexError or a wrong answer."""

    def __init__(self, data) -> None:
        self.data = memoryview(data)
        self.meta = self._pick_meta()

    def _pick_meta(self) -> Meta:
        metas, errors = [], []
        for ps_guess, index in self._meta_spots():
            try:
                metas.append(_read_meta(self.data, ps_guess * index, index))
            except BoltError as exc:
                errors.append(str(exc))
        if not metas:
            raise BoltError(f"not a bbolt file: {errors[0] if errors else 'too short'}")
        meta = max(metas, key=lambda m: m.txid)
        if meta.high_water * meta.page_size > len(self.data):
            raise BoltError(f"truncated: the meta page says {meta.high_water} pages of {meta.page_size} bytes "
                            f"({meta.high_water * meta.page_size} bytes), the file holds {len(self.data)}")
        return meta

    def _meta_spots(self) -> list[tuple[int, int]]:
        """(page size, page index) of where meta pages may be: page 0, and page 1
        at the page size page 0 names (or common sizes if page 0 is unreadable)."""
        spots = [(0, 0)]
        if len(self.data) >= HEADER_BYTES + _META.size:
            ps = struct.unpack_from("<I", self.data, HEADER_BYTES + 8)[0]
            sizes = [ps] if _plausible_page_size(ps) else [4096, 8192, 16384, 65536, 2048, 1024, 512]
            spots += [(s, 1) for s in sizes]
        return spots

    @property
    def size(self) -> int:
        """Bytes the database uses (the high-water mark); a file may be longer."""
        return self.meta.high_water * self.meta.page_size

    def buckets(self) -> Iterator[tuple[bytes, BoltBucket]]:
        """The top-level buckets, by name."""
        for flags, name, value in self._entries(self.meta.root, b"root bucket"):
            if not flags & BUCKET_FLAG:
                raise BoltError(f"root bucket holds a plain key {bytes(name)!r}, not a bucket")
            yield bytes(name), self._bucket(value, bytes(name))

    def bucket(self, name: bytes) -> BoltBucket | None:
        for found, b in self.buckets():
            if found == name:
                return b
        return None

    def _bucket(self, value: memoryview, name: bytes) -> BoltBucket:
        if len(value) < _BUCKET.size:
            raise BoltError(f"bucket {name!r}: value of {len(value)} bytes is too short for a bucket header")
        root, _seq = _BUCKET.unpack_from(value)
        if root == 0:
            return BoltBucket(self, name, 0, value[_BUCKET.size:])
        return BoltBucket(self, name, root, None)

    def _entries(self, root: int, name: bytes, inline: memoryview | None = None) -> Iterator[tuple[int, memoryview, memoryview]]:
        """(flags, key, value) of a bucket's leaves in key order, checking as it goes."""
        prev: bytes | None = None
        for flags, key, value in (self._inline(inline, name) if inline is not None else self._walk(root, name)):
            if prev is not None and bytes(key) <= prev:
                raise BoltError(f"bucket {name!r}: keys out of order ({bytes(key)!r} after {prev!r})")
            prev = bytes(key)
            yield flags, key, value

    def _inline(self, page: memoryview, name: bytes) -> Iterator[tuple[int, memoryview, memoryview]]:
        if len(page) < HEADER_BYTES:
            raise BoltError(f"bucket {name!r}: inline page of {len(page)} bytes is too short")
        _pgid, flags, count, _overflow = _HEADER.unpack_from(page)
        if flags != LEAF:
            raise BoltError(f"bucket {name!r}: inline page has flags {flags:#x}, not a leaf")
        yield from _leaf_elements(page, count, f"inline page of bucket {name!r}")

    def _walk(self, root: int, name: bytes) -> Iterator[tuple[int, memoryview, memoryview]]:
        """Depth-first through branch pages to the leaves, left to right."""
        seen: set[int] = set()
        stack = [(root, 0)]
        while stack:
            pgid, depth = stack.pop()
            if depth > DEPTH_MAX:
                raise BoltError(f"bucket {name!r}: tree deeper than {DEPTH_MAX} levels at page {pgid}")
            if pgid in seen:
                raise BoltError(f"bucket {name!r}: page {pgid} is reached twice")
            seen.add(pgid)
            page, flags, count = self._page(pgid, name)
            if flags == LEAF:
                yield from _leaf_elements(page, count, f"page {pgid}")
            else:
                children = [child for _, child in _branch_elements(page, count, pgid)]
                stack.extend((child, depth + 1) for child in reversed(children))

    def _page(self, pgid: int, name: bytes) -> tuple[memoryview, int, int]:
        m = self.meta
        if not 2 <= pgid < m.high_water:
            raise BoltError(f"bucket {name!r}: page {pgid} is outside the file's pages 2..{m.high_water - 1}")
        start = pgid * m.page_size
        own, flags, count, overflow = _HEADER.unpack_from(self.data, start)
        if own != pgid:
            raise BoltError(f"page {pgid} says it is page {own}")
        if flags not in (BRANCH, LEAF):
            raise BoltError(f"bucket {name!r}: page {pgid} has flags {flags:#x}, not a branch or leaf page")
        if pgid + overflow >= m.high_water:
            raise BoltError(f"page {pgid}: {overflow} overflow pages run past the end of the file")
        return self.data[start : start + (overflow + 1) * m.page_size], flags, count


class BoltBucket:
    def __init__(self, db: BoltReader, name: bytes, root: int, inline: memoryview | None) -> None:
        self.db, self.name, self.root, self._inline = db, name, root, inline

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Its pairs in key order (a nested bucket is refused: etcd has none)."""
        for flags, key, value in self.db._entries(self.root, self.name, self._inline):
            if flags & BUCKET_FLAG:
                raise BoltError(f"bucket {self.name!r} holds a nested bucket {bytes(key)!r}")
            yield bytes(key), bytes(value)


def _leaf_elements(page: memoryview, count: int, where: str) -> Iterator[tuple[int, memoryview, memoryview]]:
    end = len(page)
    if HEADER_BYTES + count * ELEM_BYTES > end:
        raise BoltError(f"{where}: {count} elements do not fit in the page")
    for i in range(count):
        at = HEADER_BYTES + i * ELEM_BYTES
        flags, pos, ksize, vsize = _LEAF_ELEM.unpack_from(page, at)
        k = at + pos
        if flags & ~BUCKET_FLAG or k + ksize + vsize > end or ksize == 0:
            raise BoltError(f"{where}: element {i} (flags {flags:#x}, {ksize}+{vsize} bytes at {k}) is damaged")
        yield flags, page[k : k + ksize], page[k + ksize : k + ksize + vsize]


def _branch_elements(page: memoryview, count: int, pgid: int) -> Iterator[tuple[memoryview, int]]:
    end = len(page)
    if count == 0 or HEADER_BYTES + count * ELEM_BYTES > end:
        raise BoltError(f"page {pgid}: a branch page with {count} elements is damaged")
    for i in range(count):
        at = HEADER_BYTES + i * ELEM_BYTES
        pos, ksize, child = _BRANCH_ELEM.unpack_from(page, at)
        if at + pos + ksize > end:
            raise BoltError(f"page {pgid}: branch element {i} points past the page")
        yield page[at + pos : at + pos + ksize], child


def _plausible_page_size(ps: int) -> bool:
    return 512 <= ps <= 1 << 20 and ps & (ps - 1) == 0


def _read_meta(data: memoryview, offset: int, index: int) -> Meta:
    if offset + HEADER_BYTES + _META.size > len(data):
        raise BoltError(f"meta page {index} is missing (the file has {len(data)} bytes)")
    _pgid, flags, _count, _overflow = _HEADER.unpack_from(data, offset)
    magic, version, ps, _flags, root, _seq, freelist, hwm, txid, checksum = _META.unpack_from(data, offset + HEADER_BYTES)
    if magic != MAGIC:
        raise BoltError(f"meta page {index} has magic {magic:#010x}, not {MAGIC:#010x}")
    if version != VERSION:
        raise BoltError(f"meta page {index} has bbolt format version {version}, not {VERSION}")
    body = bytes(data[offset + HEADER_BYTES : offset + META_CHECKSUM_AT])
    if checksum and checksum != fnv1a64(body):
        raise BoltError(f"meta page {index} fails its checksum")
    if not flags & META or not _plausible_page_size(ps) or (index and offset != ps * index):
        raise BoltError(f"meta page {index} is damaged (flags {flags:#x}, page size {ps})")
    if not 2 <= root < hwm or (freelist != NO_FREELIST and not 2 <= freelist < hwm):
        raise BoltError(f"meta page {index} points outside the file (root {root}, freelist {freelist}, {hwm} pages)")
    return Meta(ps, root, freelist, hwm, txid)
