"""etcd snapshots in-process: save and restore keep everything, memory stays
bounded while saving, and the import rules for etcd's own edge cases."""
from __future__ import annotations

import hashlib
import tracemalloc

import pytest

from proto import lease_pb2
from proto.kv_pb2 import KeyValue
from shards.bbolt import Bucket, plan_file, write_file
from shards.errors import CompactedError, SnapshotError
from shards.etcd_snapshot import rev_key
from shards.layout import load_layout
from shards.snapshot import SnapshotStream, freeze, restore_snapshot
from shards.store import Store, StoreConfig
from shards.types import DeleteReq, PutReq, RangeReq, TxnReq
from tests.shards.store_helpers import open_store

POD, LEASE, EVENT, OTHER = b"/registry/pods/ns/p", b"/registry/leases/ns/l", b"/registry/events/ns/e", b"other"


def save(store, path, chunk_bytes=1 << 20):
    path.write_bytes(b"".join(SnapshotStream(freeze(store)).chunks(chunk_bytes)))
    return path


def everything(store, rev=0):
    r = store.range(RangeReq(b"\0", b"\0", revision=rev))
    return [KeyValue.FromString(row) for row in r.kvs]


def test_save_then_restore_keeps_keys_history_leases_and_auth(tmp_path, run):
    async def go():
        store = await open_store(tmp_path / "a")
        lid, _, _ = await store.lease_grant(77, 600)
        for i in range(50):
            await store.put(PutReq(POD + b"%d" % (i % 7), b"v%d" % i))
            await store.put(PutReq(OTHER + b"%d" % i, b"o", lease=lid))
        await store.txn(TxnReq(success=(PutReq(LEASE, b"x"), PutReq(EVENT, b"y"), DeleteReq(POD + b"1"))))
        await store.compact(60, physical=True)
        await store.put(PutReq(POD + b"2", b"after"))
        await store.auth.user_add("root", "pw", False)
        await store.auth.user_grant("root", "root")
        await store.auth.enable()
        before = [everything(store, rev) for rev in (0, 60, 80)]
        before_hash = store.hash_kv(0)
        snap = save(store, tmp_path / "snap.db")
        await store.close()

        got = restore_snapshot(snap, tmp_path / "restored", load_layout(None))
        assert got["revision"] == 103 and got["compact_revision"] == 60 and got["hashed"]
        restored = await _open_on(tmp_path / "restored", tmp_path / "rs")
        try:
            assert [everything(restored, rev) for rev in (0, 60, 80)] == before
            assert restored.hash_kv(0) == before_hash
            with pytest.raises(CompactedError):
                restored.range(RangeReq(b"\0", b"\0", revision=59))
            assert restored.leases.table_at(restored.committed) == {77: 600}
            assert len(restored.leases.leases[77].keys) == 50
            assert restored.auth.enabled and restored.auth.state.is_root("root")
            assert (await restored.put(PutReq(b"new"))).revision == 104
        finally:
            await restored.close()

    run(go())


def test_a_restore_reads_the_key_rows_twice_whatever_the_shards_and_says_how_far_it_is(tmp_path, run,
                                                                                       monkeypatch):
    """The key rows are read once to check and route them and once more to write every shard's
    checkpoint (a pass per shard made a restore, and so a migration's downtime, several times
    longer), and a restore that takes a while says how far it is."""
    from shards import bbolt, snapshot

    async def go():
        store = await open_store(tmp_path / "a")
        for i in range(300):
            await store.put(PutReq((POD, LEASE, EVENT, OTHER)[i % 4] + b"%d" % i, b"v"))
        snap = save(store, tmp_path / "snap.db")
        await store.close()
        return snap

    snap = run(go())
    walks, real = [], bbolt.BoltBucket.items

    def counted(self):
        if self.name == b"key":
            walks.append(1)
        return real(self)

    monkeypatch.setattr(bbolt.BoltBucket, "items", counted)
    monkeypatch.setattr(snapshot, "PROGRESS_S", 0.0)
    monkeypatch.setattr(snapshot, "PROGRESS_ROWS", 64)
    lines: list[str] = []
    layout = load_layout(None)
    got = restore_snapshot(snap, tmp_path / "restored", layout, progress=lines.append)
    assert got["keys"] == 300 and len(layout.shards) > 2 and len(walks) == 2
    assert lines == [f"{snap} read and checked: 300 rows up to revision 301; writing them",
                     "written 64 of 300 rows (21 %)", "written 128 of 300 rows (42 %)",
                     "written 192 of 300 rows (64 %)", "written 256 of 300 rows (85 %)"]


async def _open_on(data_dir, state_dir):
    return await Store.open(StoreConfig(data_dir=data_dir, layout=load_layout(None), state_dir=state_dir))


def test_saving_holds_a_page_and_a_chunk_in_memory_not_the_snapshot(tmp_path, run):
    """30 MB of values stream through with a few MB of Python memory at most."""
    async def go():
        store = await open_store(tmp_path)
        for i in range(300):
            await store.put(PutReq(POD + b"%d" % i, bytes([i % 251]) * 100_000))
        stream = SnapshotStream(freeze(store))
        tracemalloc.start()
        try:
            size = stream.measure()
            digest, total, last = hashlib.sha256(), 0, b""
            for chunk in stream.chunks(1 << 20):
                if last:
                    digest.update(last)
                total += len(chunk)
                last = chunk
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        await store.close()
        assert total == size > 30_000_000
        assert last == digest.digest()  # the stream ends with the SHA-256 of the rest
        assert peak < 8_000_000, peak

    run(go())


# -- import rules, on hand-made etcd databases ----------------------------------------

def etcd_db(path, rows, meta=(), leases=()):
    """A bbolt file holding the given key-bucket rows ((main, sub, tombstone, KeyValue))."""
    key_rows = [(rev_key(main, sub, tomb), kv.SerializeToString()) for main, sub, tomb, kv in rows]
    buckets = {b"key": key_rows, b"meta": sorted(meta),
               b"lease": [(i.to_bytes(8, "big"), lease_pb2.Lease(ID=i, TTL=t).SerializeToString()) for i, t in leases]}
    plan = plan_file([Bucket(name, lambda pairs=pairs: iter(pairs)) for name, pairs in buckets.items()])
    data = b"".join(write_file(plan))
    path.write_bytes(data + hashlib.sha256(data).digest())
    return path


def put(key, main, create, version, value=b"v"):
    return (main, 0, False, KeyValue(key=key, value=value, create_revision=create, mod_revision=main, version=version))


def tomb(key, main):
    return (main, 0, True, KeyValue(key=key))


def test_an_unfinished_compaction_is_finished_after_restore(tmp_path, run):
    """scheduledCompactRev above finishedCompactRev: etcd finishes the compaction
    on start; a restored shardetcd does too (rows below it go, reads below fail)."""
    rows = [put(POD, 2, 2, 1), put(POD, 3, 2, 2), tomb(POD, 4), put(EVENT, 5, 5, 1), put(EVENT, 6, 5, 2)]
    snap = etcd_db(tmp_path / "s.db", rows, meta=[(b"scheduledCompactRev", rev_key(5))])
    got = restore_snapshot(snap, tmp_path / "d", load_layout(None))
    assert got["revision"] == 6 and got["compact_revision"] == 5

    async def go():
        store = await _open_on(tmp_path / "d", tmp_path / "st")
        try:
            assert [(kv.key, kv.mod_revision) for kv in everything(store, 5)] == [(EVENT, 5)]
            assert store.hash_kv(0)[1] == 5
            with pytest.raises(CompactedError):
                store.range(RangeReq(POD, revision=4))
        finally:
            await store.close()

    run(go())


def test_a_tombstone_left_by_a_partial_compaction_is_skipped(tmp_path, run):
    """etcd compacts in batches, lowest revisions first: a snapshot taken between
    two batches can hold a tombstone whose put is gone already."""
    rows = [tomb(POD, 4), put(POD, 5, 5, 1), put(OTHER, 6, 6, 1)]
    meta = [(b"finishedCompactRev", rev_key(2)), (b"scheduledCompactRev", rev_key(4))]
    got = restore_snapshot(etcd_db(tmp_path / "s.db", rows, meta), tmp_path / "d", load_layout(None))
    assert got["rows"] == 3 and got["keys"] == 2 and got["revision"] == 6


@pytest.mark.parametrize("rows, meta, message", [
    ([put(POD, 2, 2, 1), tomb(OTHER, 3)], [], "tombstone of b'other' at revision 3 for a key that does not exist"),
    ([put(POD, 2, 2, 1), (3, 0, False, KeyValue(key=OTHER, mod_revision=9))], [], "says mod_revision 9"),
    ([put(POD, 2, 2, 1)], [(b"scheduledCompactRev", b"\x00" * 8)], "scheduledCompactRev is .* not a revision"),
])
def test_rows_etcd_never_writes_are_refused(tmp_path, rows, meta, message):
    with pytest.raises(SnapshotError, match=message):
        restore_snapshot(etcd_db(tmp_path / "s.db", rows, meta), tmp_path / "d", load_layout(None))
    assert not (tmp_path / "d").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_a_bbolt_file_without_etcd_buckets_is_refused(tmp_path):
    plan = plan_file([Bucket(b"widgets", lambda: iter([(b"a", b"1")]))])
    data = b"".join(write_file(plan))
    (tmp_path / "w.db").write_bytes(data)
    with pytest.raises(SnapshotError, match="not an etcd database"):
        restore_snapshot(tmp_path / "w.db", tmp_path / "d", load_layout(None))
