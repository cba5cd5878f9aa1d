"""One shard's MVCC state: an in-memory key index over RocksDB rows.

Like etcd's ``treeIndex`` + bbolt: RocksDB (``rocksdict``, WAL off, on tmpfs)
maps row keys (see ``revision.py``) to serialized ``mvccpb.KeyValue`` bytes;
the Python index maps each key to its index entries, ascending: the one entry
(an int) of a key that has one, a tuple of up to ``TUPLE_MAX`` of them, a list
beyond that.
The state has no durability of its own: it is rebuilt from checkpoint +
journal on start, and its directory is removed on close.

Example, key ``a``: put@2, put@3, delete@5, put@7 gives entries
``[e(2,0), e(3,0), e(5,0,tomb), e(7,0)]``.  Read at 4 → row (3,0); at 5 or 6
→ absent; compaction at 5 drops everything but ``e(7,0)`` (then held as the
int itself); compaction at 4 keeps ``(e(3,0), e(5,0,tomb), e(7,0))``.

Why not a list per key: the cyclic garbage collector walks every list, and as
new lists pile up it runs a full collection, which walked every key's list with
the event loop stopped (0.2 s at 1M keys, recurring as keys are added; bench/
README.md, "Garbage collection pauses").  An int is no object for it, and a tuple
of ints is dropped from its sight the first time it sees one, so neither adds to
what a full collection walks or to what triggers one.  Appending to a tuple copies
it, so a key written more than ``TUPLE_MAX`` times since the last compaction gets
a list.  The int is also ~60 bytes a key smaller than a one-entry list.

Writes are applied as soon as they are assigned a revision (pending);
readers pass the revision they read at and never see rows above it.

Every RocksDB error (a full tmpfs, an I/O or checksum error) is fail-stop,
like a journal error (DESIGN.md invariant 7): the in-memory index may no
longer match the rows, so the state reports it once through ``on_failure``
and raises ``StateStoreError``; the store then stops serving and the process
exits, and a restart rebuilds the state from checkpoint + journal.  A row is
written before the index learns of it, so a failed put or delete leaves the
index as it was.

Counting keys in a range at revision R must not scan the key space: ``live``
is a sorted list of the keys live at the latest revision, and ``_log_*``
records which keys changed at which revision, so

    count(R) = live_in_range - Σ live_now(k) + Σ live_at_R(k)

over the keys in range that changed after R.
"""
from __future__ import annotations

import bisect
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from rocksdict import IngestExternalFileOptions, Options, Rdict, SstFileWriter, WriteBatch, WriteOptions
from sortedcontainers import SortedList

from journal import failpoints
from journal.checkpoint import ROW_LEN
from proto.kv_pb2 import KeyValue

from .errors import StateStoreError
from .record import CHANGE, DELETE, write_changes_at
from .revision import _ROW, entry, entry_bound, entry_main, row_key
from .steps import Steps, drain

logger = logging.getLogger(__name__)

ROW_BATCH_MAX = 4096
LOG_STEP = 1024  # change-log entries a count looks at in one step
COMPACT_CHUNK = 256  # rows of one key compaction drops between two looks at the clock
BULK_SST = "bulk-load.sst"  # in the state dir while recovery writes it; RocksDB takes it whole at the end


def open_rocks(path: Path) -> Rdict:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(mode=0o700, parents=True)  # every value is in it: this user's alone, as etcd's db file
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(str(path), opts)
    wo = WriteOptions()
    wo.disable_wal = True
    db.set_write_options(wo)
    return db


TUPLE_MAX = 64  # entries a key's tuple holds at most; more go in a list


class Index(dict):
    """The key index: a dict, of a subclass so that it stays in the collector's sight.
    CPython stops tracking an exact dict whose values are all untracked (ints, tuples of
    ints) during a full collection, and tracks it again, as a new object, when a fresh
    tuple goes in: each time, its next collections walk it whole (0.1 s at 1M keys).
    A subclass's instance is never untracked, so once frozen (collector.py) it
    is not walked again."""

    __slots__ = ()


def _appended(revs: int | tuple | list, e: int) -> tuple | list:
    """An index value with entry ``e`` (the newest) appended (a list in place)."""
    if type(revs) is int:
        return (revs, e)
    if type(revs) is tuple:
        return revs + (e,) if len(revs) < TUPLE_MAX else [*revs, e]
    revs.append(e)
    return revs


def _held(entries: tuple | list) -> int | tuple | list:
    """A key's entries (at least one) as the index holds them."""
    if len(entries) == 1:
        return entries[0]
    return tuple(entries) if len(entries) <= TUPLE_MAX else list(entries)


def entries_of(value: int | tuple | list | None) -> tuple[int, ...] | list[int]:
    """An index value (or None: no key) as a sequence of entries."""
    if value is None:
        return ()
    return (value,) if type(value) is int else value


def last_entry(value: int | tuple | list) -> int:
    return value if type(value) is int else value[-1]


def sorted_list(values: list) -> SortedList:
    """A SortedList of ``values``, which are in order already: built as ``SortedList.update``
    builds an empty one, without its sort (which compares every neighbour again: at 1M
    keys ~0.25 s a list)."""
    out = SortedList()
    if not all(hasattr(out, name) for name in ("_lists", "_maxes", "_load", "_len", "_index")):
        return SortedList(values)  # another sortedcontainers inside: let it sort
    load = out._load
    out._lists.extend(values[pos:pos + load] for pos in range(0, len(values), load))
    out._maxes.extend(sublist[-1] for sublist in out._lists)
    out._len = len(values)
    del out._index[:]
    return out


def checkpoint_row(row_key: bytes, value: bytes) -> bytes:
    """One row of a shard checkpoint: row key length (1 byte), row key, serialized KeyValue."""
    return len(row_key).to_bytes(1, "big") + row_key + value


def _ignore_failure(exc: BaseException) -> None:
    pass


class ShardState:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.db = open_rocks(path)
        except OSError:
            raise
        except Exception as exc:  # RocksDB's own errors (a full or unwritable state dir)
            raise StateStoreError(f"state store {path}: {exc}") from exc
        # told once of the first RocksDB error (the store turns it into a fail-stop)
        self.on_failure: Callable[[BaseException], None] = _ignore_failure
        self.failure: BaseException | None = None
        self.keys: SortedList = SortedList()  # every key with any entry
        self.live: SortedList = SortedList()  # keys live at the latest revision
        self.index: Index = Index()  # key -> its entries: an int, a tuple or a list (the module's doc)
        self._log_revs: list[int] = []
        self._log_keys: list[bytes] = []
        self.last_main = 0  # highest revision applied here, pending ones included
        self.bytes_in_use = 0  # row keys + values held (history included)
        self.rows_compacted = 0  # revisions compaction dropped (etcd_debugging_mvcc_db_compaction_keys_total)
        self.bytes_high = 0  # high-water mark of bytes_in_use since the last defragment
        self._bulk: WriteBatch | None = None  # set while recovery loads rows (see begin_bulk)
        self._sst: SstFileWriter | None = None  # where bulk rows go while their keys ascend (see begin_bulk)
        self._sst_rows = 0
        self._bulk_keys: list[bytes] = []
        # keys whose latest row loaded in bulk is a tombstone (None: liveness is read from the index at the end)
        self._bulk_dead: set[bytes] | None = None

    # -- bulk loading (recovery) --------------------------------------------

    def begin_bulk(self) -> None:
        """Recovery is about to load many rows, reading nothing until ``end_bulk``:
        the sorted key lists are built once at the end instead of one insertion
        per key, and the rows of an empty state go into an SST file that RocksDB
        takes whole at the end (``ingest_external_file``: no memtable insertion,
        no flush and compaction of the memtables; ~0.5 µs a row less).  An SST
        file needs ascending row keys, which recovery's rows have (checkpoint
        rows in row-key order, then the journal's revisions above them); a row
        that does not ascend ends the file early, and the rest goes to RocksDB
        in write batches."""
        self._bulk = WriteBatch(raw_mode=True)
        self._bulk_keys = []
        self._bulk_dead = set() if not self.keys else None  # from empty: track the few tombstoned keys
        if not self.index and self.bytes_in_use == 0:
            try:
                sst = SstFileWriter(options=Options(raw_mode=True))
                sst.open(str(self.path / BULK_SST))
            except Exception as exc:
                raise self._failed(exc) from exc
            self._sst, self._sst_rows = sst, 0

    def end_bulk(self) -> None:
        if self._bulk is None:
            return
        self._end_sst()
        self._flush_bulk()
        self._bulk = None
        keys = sorted([*self.keys, *self._bulk_keys]) if self.keys else sorted(self._bulk_keys)
        dead = self._bulk_dead
        if dead is None:
            index = self.index
            live = [k for k in keys if not last_entry(index[k]) & 1]
        else:  # no index lookup per key: in key order they hit memory at random (~2 µs a key at 1M keys)
            live = [k for k in keys if k not in dead] if dead else keys
        self.keys, self.live = sorted_list(keys), sorted_list(live)
        self._bulk_keys = []
        self._bulk_dead = None

    def _bulk_put(self) -> Callable[[bytes, bytes], None]:
        """Where the bulk loops put rows now: the SST file, or the write batch."""
        return self._sst.__setitem__ if self._sst is not None else self._bulk.put

    def _bulk_refused(self, rk: bytes, value: bytes, exc: Exception, uncounted: int) -> Callable[[bytes, bytes], None]:
        """The SST file refused a row (its key does not ascend): end the file, put
        the row in the write batch, and return where the next rows go; ``uncounted``:
        rows the caller put in the file and has not counted yet."""
        if self._sst is None:
            raise self._failed(exc) from exc
        self._sst_rows += uncounted
        logger.info("bulk load: the SST file takes no more rows, the rest goes in write batches path=%s "
                    "rows_in_sst=%d reason=%s", self.path, self._sst_rows, exc)
        self._end_sst()
        self._bulk.put(rk, value)
        return self._bulk.put

    def _end_sst(self) -> None:
        """Hand the SST file's rows to RocksDB (the file is moved into it)."""
        sst, self._sst = self._sst, None
        if sst is None:
            return
        path = self.path / BULK_SST
        try:
            if self._sst_rows:
                sst.finish()
                opts = IngestExternalFileOptions()
                opts.set_move_files(True)
                self.db.ingest_external_file([str(path)], opts)
            del sst
            path.unlink(missing_ok=True)
        except Exception as exc:
            raise self._failed(exc) from exc
        self._sst_rows = 0

    def _bulk_written(self, rows: int) -> None:
        """A bulk loop put ``rows`` rows: count them (SST file) or write the batch once it is full."""
        if self._sst is not None:
            self._sst_rows += rows
        elif len(self._bulk) >= ROW_BATCH_MAX:
            self._flush_bulk()

    def _flush_bulk(self) -> None:
        batch, self._bulk = self._bulk, WriteBatch(raw_mode=True)
        try:
            self.db.write(batch)
        except Exception as exc:
            raise self._failed(exc) from exc

    def close(self) -> None:
        try:
            self.db.close()
        except Exception as exc:  # noqa: BLE001 - the rows are a cache; the directory goes either way
            logger.warning("state close failed path=%s error=%r", self.path, exc)
        shutil.rmtree(self.path, ignore_errors=True)

    def _failed(self, exc: BaseException) -> StateStoreError:
        """Record the first state-store error, tell the store, and return the error to raise."""
        if self.failure is None:
            self.failure = exc
            self.on_failure(StateStoreError(f"state store {self.path}: {exc}"))
        error = StateStoreError(f"state store {self.path}: {exc}")
        error.__cause__ = exc
        return error

    def _write_row(self, rk: bytes, value: bytes) -> None:
        if self.failure is not None:
            raise self._failed(self.failure)
        if self._bulk is not None:
            if self._sst is not None:
                try:
                    self._sst[rk] = value
                    self._sst_rows += 1
                    return
                except Exception as exc:  # noqa: BLE001 - a key that does not ascend, or a failure
                    self._bulk_refused(rk, value, exc, 0)
                    return
            self._bulk.put(rk, value)
            if len(self._bulk) >= ROW_BATCH_MAX:
                self._flush_bulk()
            return
        try:
            failpoints.hit("state.write")
            self.db[rk] = value
        except Exception as exc:
            raise self._failed(exc) from exc

    def _grow(self, nbytes: int) -> None:
        self.bytes_in_use += nbytes
        if self.bytes_in_use > self.bytes_high:
            self.bytes_high = self.bytes_in_use

    def defragment(self) -> None:
        """Flush memtables and compact every file (callable from a thread; an
        error is raised as StateStoreError, for the caller to report on the loop)."""
        try:
            self.db.flush(True)
            self.db.compact_range(None, None)
        except Exception as exc:
            raise StateStoreError(f"state store {self.path}: {exc}") from exc
        self.bytes_high = self.bytes_in_use

    # -- writes ---------------------------------------------------------

    def put(self, key: bytes, main: int, sub: int, kv: bytes) -> None:
        e = (main << 33) | (sub << 1)  # entry(main, sub, False) and its row_key, without the calls
        self._write_row(_ROW.pack(main, sub), kv)
        index = self.index
        revs = index.get(key)
        if revs is None:
            index[key] = e
            if self._bulk is None:
                self.keys.add(key)
                self.live.add(key)
            else:
                self._bulk_keys.append(key)
        else:
            if self._bulk is None:
                if last_entry(revs) & 1:
                    self.live.add(key)
            elif self._bulk_dead:
                self._bulk_dead.discard(key)
            index[key] = _appended(revs, e)
        self._grow(16 + len(kv))
        self._log_revs.append(main)
        self._log_keys.append(key)
        self.last_main = main

    def delete(self, key: bytes, main: int, sub: int, tombstone_kv: bytes) -> None:
        """Tombstone a key that is live at the latest revision."""
        e = entry(main, sub, True)
        self._write_row(row_key(e), tombstone_kv)
        index = self.index
        index[key] = _appended(index[key], e)
        if self._bulk is None:
            self.live.remove(key)
        elif self._bulk_dead is not None:
            self._bulk_dead.add(key)
        self._grow(17 + len(tombstone_kv))
        self._log_revs.append(main)
        self._log_keys.append(key)
        self.last_main = main

    # -- reads ----------------------------------------------------------

    def latest_entry(self, key: bytes) -> int | None:
        """Entry of the latest live revision of ``key`` (pending included)."""
        revs = self.index.get(key)
        if revs is None:
            return None
        e = last_entry(revs)
        return None if e & 1 else e

    def entries(self, key: bytes) -> tuple[int, ...] | list[int]:
        """Every entry of ``key``, ascending (not to be changed)."""
        return entries_of(self.index.get(key))

    def entry_at(self, key: bytes, rev: int) -> int | None:
        revs = self.index.get(key)
        if revs is None:
            return None
        if type(revs) is int:
            return None if revs & 1 or revs >= entry_bound(rev) else revs
        i = bisect.bisect_left(revs, entry_bound(rev)) - 1
        if i < 0 or revs[i] & 1:
            return None
        return revs[i]

    def prev_entry_of_put(self, key: bytes, rev: int) -> int | None:
        """Entry a PUT of ``key`` at main revision ``rev`` replaced, as etcd's
        watch reports it in prev_kv: none when the put is a creation, which
        includes a key deleted and put again in one txn (the tombstone shares
        the put's main revision)."""
        revs = self.entries(key)
        if not revs:
            return None
        i = bisect.bisect_left(revs, entry_bound(rev - 1))
        if i < len(revs) and revs[i] & 1 and entry_main(revs[i]) == rev:
            return None
        if i == 0 or revs[i - 1] & 1:
            return None
        return revs[i - 1]

    def get_row(self, e: int) -> bytes:
        try:
            return self.db[row_key(e)]
        except Exception as exc:  # a missing row (KeyError) means the index and rows disagree
            raise self._failed(exc) from exc

    def get_rows(self, entries: list[int]) -> list[bytes]:
        if not entries:
            return []
        if len(entries) == 1:
            return [self.get_row(entries[0])]
        try:
            rows = self.db.get([row_key(e) for e in entries])
        except Exception as exc:
            raise self._failed(exc) from exc
        if None in rows:
            raise self._failed(KeyError(f"{rows.count(None)} indexed rows missing"))
        return rows

    def scan(self, key: bytes, end: bytes | None, rev: int) -> Iterator[tuple[bytes, int]]:
        """(key, entry) for keys live at ``rev`` in [key, end), in key order.

        ``end`` None is a single key; ``b""`` is unbounded.
        """
        if end is None:
            e = self.entry_at(key, rev)
            if e is not None:
                yield key, e
            return
        index = self.index
        bound = entry_bound(rev)
        it = self.keys.irange(key, end or None, inclusive=(True, False))
        for k in it:
            revs = index[k]
            if type(revs) is int:
                if revs >= bound:
                    continue
                e = revs
            elif revs[-1] < bound:
                e = revs[-1]
            else:
                i = bisect.bisect_left(revs, bound) - 1
                if i < 0:
                    continue
                e = revs[i]
            if not e & 1:
                yield k, e

    def count(self, key: bytes, end: bytes | None, rev: int) -> int:
        """Number of keys live at ``rev`` in [key, end) (``end`` as in scan)."""
        n = self.count_unscanned(key, end, rev)
        return sum(1 for _ in self.scan(key, end, rev)) if n is None else n

    def count_unscanned(self, key: bytes, end: bytes | None, rev: int) -> int | None:
        """``count`` at once when it needs no scan of the keys in range; None when it does."""
        if end is None:
            return 0 if self.entry_at(key, rev) is None else 1
        return drain(self.count_steps(key, end, rev))

    def count_steps(self, key: bytes, end: bytes, rev: int) -> Steps[int | None]:
        """Keys live at ``rev`` in [key, end) without a scan of them: the keys live now, less
        what changed since ``rev`` (the change log), ``LOG_STEP`` changes a step; None when more
        changed than are live in range, by far (a scan is cheaper). Between steps writes go on:
        a key changed again after it was looked at comes up again further on in the log, and is
        looked at again; the keys live now are counted in the last step, with the last changes.
        Compaction meanwhile must not go past ``rev`` (the caller holds it back)."""
        if end and end <= key:
            return 0
        if rev >= self.last_main:
            return self._live_in(key, end)
        revs, keys = self._log_revs, self._log_keys
        if len(revs) - bisect.bisect_right(revs, rev) > max(4096, 4 * self._live_in(key, end)):
            return None
        adjust: dict[bytes, int] = {}  # changed key: live at rev, less live now
        index, done = self.index, 0
        while True:
            # changes after rev stay where they are after the first of them (compaction drops
            # only changes at or below rev, from the front)
            first = bisect.bisect_right(revs, rev) + done
            last = min(len(revs), first + LOG_STEP)
            for k in {k for k in keys[first:last] if key <= k and (not end or k < end)}:
                adjust[k] = (self.entry_at(k, rev) is not None) - (not last_entry(index[k]) & 1)
            if last == len(revs):
                return self._live_in(key, end) + sum(adjust.values())
            done += last - first
            yield

    def _live_in(self, key: bytes, end: bytes) -> int:
        """Keys live now in [key, end) (``end`` b"": every key from ``key`` on)."""
        live = self.live
        return (len(live) if not end else live.bisect_left(end)) - live.bisect_left(key)

    # -- compaction -----------------------------------------------------

    def compact_slice(self, upto: int, deadline: float) -> bool:
        """Drop history at or below ``upto`` of the keys changed earliest,
        until ``deadline`` (``time.perf_counter``) has passed; trims the change
        log as it goes.  True when nothing at or below ``upto`` is left.

        Each call writes one RocksDB batch, so a caller on the event loop can
        yield between slices: a large compaction never holds the loop for
        much longer than a slice (etcd also compacts in batches, pausing
        between), also when one key has a long history: that key's rows are
        dropped ``COMPACT_CHUNK`` at a time, oldest first, and the slice can
        end between two chunks (the key's change-log entry then stays, so the
        next slice carries on with it).  Each call drops at least one chunk.
        """
        revs, keys = self._log_revs, self._log_keys
        batch = self.new_batch()
        seen: set[bytes] = set()
        n, total = 0, len(revs)
        while n < total and revs[n] <= upto:
            key = keys[n]
            if key not in seen:
                if not self.compact_key(key, upto, batch, deadline):
                    break
                seen.add(key)
            n += 1
            if not n & 63 and time.perf_counter() >= deadline:
                break
        del revs[:n]
        del keys[:n]
        self.write_batch(batch)
        return not revs or revs[0] > upto

    def compact_key(self, key: bytes, upto: int, batch: WriteBatch, deadline: float = float("inf")) -> bool:
        """Drop the history of ``key`` that no read at ``upto`` or later can see,
        oldest rows first, ``COMPACT_CHUNK`` rows at a time until ``deadline``
        has passed; True when all of it is gone."""
        revs = self.entries(key)
        if not revs:
            return True
        i = bisect.bisect_left(revs, entry_bound(upto)) - 1
        if i < 0:
            return True
        drop = i + 1 if revs[i] & 1 else i
        dropped = 0
        while dropped < drop:
            chunk = revs[dropped : min(drop, dropped + COMPACT_CHUNK)]
            row_keys = [row_key(e) for e in chunk]
            try:
                values = self.db.get(row_keys)
            except Exception as exc:
                raise self._failed(exc) from exc
            for rk, value in zip(row_keys, values):
                if value is not None:
                    self.bytes_in_use -= len(rk) + len(value)
                batch.delete(rk)
            dropped += len(chunk)
            if time.perf_counter() >= deadline:
                break
        self.rows_compacted += dropped
        if dropped == len(revs):
            del self.index[key]
            self.keys.remove(key)
        elif dropped:
            self.index[key] = _held(revs[dropped:])
        return dropped == drop

    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def write_batch(self, batch: WriteBatch) -> None:
        if self.failure is not None:
            raise self._failed(self.failure)
        try:
            failpoints.hit("state.write")
            self.db.write(batch)
        except Exception as exc:
            raise self._failed(exc) from exc

    # -- checkpoint support --------------------------------------------

    def snapshot_rows(self, upto: int) -> Iterator[bytes]:
        """Rows (row key + value, length-prefixed) with main <= upto, from a
        RocksDB snapshot taken now.  Safe to consume in another thread; a
        RocksDB error is raised as StateStoreError (the consumer reports it)."""
        pairs = self.row_snapshot(upto)
        return (checkpoint_row(k, v) for k, v in pairs())

    def row_snapshot(self, upto: int) -> Callable[[], Iterator[tuple[bytes, bytes]]]:
        """A RocksDB snapshot taken now, as a function that yields its rows with
        main <= upto, (row key, value) in revision order, each time it is called
        (the snapshot lives as long as the function).  Callable from another
        thread; a RocksDB error is raised as StateStoreError."""
        snap = self.db.snapshot()
        limit = row_key(entry(upto + 1, 0, False))
        path = self.path

        def rows() -> Iterator[tuple[bytes, bytes]]:
            it = snap.iter()
            it.seek_to_first()
            while it.valid():
                k = it.key()
                if k >= limit:
                    break
                yield k, it.value()
                it.next()
            try:
                it.status()
            except Exception as exc:
                raise StateStoreError(f"state store {path}: {exc}") from exc
            del it

        return rows

    def load_rows(self, payload: bytes, pos: int, limit: int, on_row: Callable[[bytes, int], None], progress,
                  key_lease: dict[bytes, int] | None = None) -> tuple[int, int]:
        """Load rows of a checkpoint frame (``snapshot_rows`` rows, in revision
        order, each after its ``ROW_LEN`` length), from offset ``pos``, at most
        ``limit`` of them, while bulk loading; ``on_row(key, lease id, or -1 for
        a tombstone)``.  Returns (rows loaded, offset of the next); raises
        ValueError if the rows do not add up to the payload.

        One tight loop, as this is most of a restart: the rows are read in place
        (no bytes object per row before its key and value), the row key is
        written as stored (not decoded and encoded again), the key index takes
        the entry.  With ``key_lease``, each row sets its key's lease there (or
        removes the key: a tombstone, no lease) instead of calling ``on_row``."""
        if self._bulk is None:
            raise RuntimeError("load_rows() is for bulk loading (begin_bulk)")
        index, new_keys, revs_log, keys_log = self.index, self._bulk_keys, self._log_revs, self._log_keys
        unpack, row_len, parse = _ROW.unpack_from, ROW_LEN.unpack_from, KeyValue.FromString
        put, count, main, start = self._bulk_put(), 0, self.last_main, pos
        dead = self._bulk_dead if self._bulk_dead is not None else set()
        end = len(payload)
        while pos < end and count < limit:
            (length,) = row_len(payload, pos)
            klen = payload[pos + 4]
            at = pos + 5 + klen
            rk = payload[pos + 5 : at]
            pos += 4 + length
            value = payload[at:pos]
            main, sub = unpack(rk)
            tomb = klen > 16
            kv = parse(value)
            key = kv.key
            try:
                put(rk, value)
            except Exception as exc:  # noqa: BLE001 - the SST file refused it (or RocksDB failed)
                put = self._bulk_refused(rk, value, exc, count)
            count += 1
            e = (main << 33) | (sub << 1) | tomb
            revs = index.get(key)
            if revs is None:
                index[key] = e
                new_keys.append(key)
            else:
                index[key] = _appended(revs, e)
            if tomb:
                dead.add(key)
            elif dead:
                dead.discard(key)
            revs_log.append(main)
            keys_log.append(key)
            if key_lease is None:
                on_row(key, -1 if tomb else kv.lease)
            elif not tomb and (lease := kv.lease):
                key_lease[key] = lease
            elif key in key_lease:
                del key_lease[key]
        if pos > end:
            raise ValueError(f"checkpoint rows overrun their frame by {pos - end} bytes")
        self._bulk_written(count)
        progress.add(count)
        self._grow(pos - start - 5 * count)  # row keys and values: all but each row's length and key length
        self.last_main = main
        return count, pos

    def load_write(self, main: int, payload: bytes, key_lease: dict[bytes, int]) -> int:
        """Apply a journal WRITE record's changes at revision ``main`` while bulk
        loading (``record.py`` has the payload); returns how many there were.

        The same rows, index entries and change log as ``put``/``delete`` of each
        change, in one loop over the payload (no ``Change`` per row, no call per
        row); each change sets its key's lease in ``key_lease`` (a put without a
        lease and a delete remove the key), as ``load_rows`` does, for the lease
        table's key sets to be rebuilt from it afterwards."""
        if self._bulk is None:
            raise RuntimeError("load_write() is for bulk loading (begin_bulk)")
        count, pos = write_changes_at(payload)
        index, new_keys, revs_log, keys_log = self.index, self._bulk_keys, self._log_revs, self._log_keys
        unpack, pack, parse = CHANGE.unpack_from, _ROW.pack, KeyValue.FromString
        dead = self._bulk_dead
        track = dead is not None
        put, held, base, head = self._bulk_put(), 0, main << 33, CHANGE.size
        for i in range(count):
            kind, sub, klen, vlen = unpack(payload, pos)
            pos += head
            key = payload[pos : pos + klen]
            pos += klen
            row = payload[pos : pos + vlen]
            pos += vlen
            rk = pack(main, sub) + b"t" if kind == DELETE else pack(main, sub)
            try:
                put(rk, row)
            except Exception as exc:  # noqa: BLE001 - the SST file refused it (or RocksDB failed)
                put = self._bulk_refused(rk, row, exc, i)
            if kind == DELETE:
                index[key] = _appended(index[key], base | (sub << 1) | 1)  # a KeyError for a key never put
                if track:
                    dead.add(key)
                held += 17 + vlen
                if key in key_lease:
                    del key_lease[key]
            else:
                revs = index.get(key)
                if revs is None:
                    index[key] = base | (sub << 1)
                    new_keys.append(key)
                else:
                    if dead:
                        dead.discard(key)
                    index[key] = _appended(revs, base | (sub << 1))
                held += 16 + vlen
                if lease := parse(row).lease:
                    key_lease[key] = lease
                elif key in key_lease:
                    del key_lease[key]
            revs_log.append(main)
            keys_log.append(key)
        if pos != len(payload):
            raise ValueError(f"write record has {len(payload) - pos} trailing bytes")
        self._bulk_written(count)
        self._grow(held)
        if count:
            self.last_main = main
        return count
