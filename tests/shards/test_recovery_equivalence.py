"""Recovery's bulk loading gives exactly the state of the plain per-row path.

A restart loads each checkpoint's rows and replays each journal above it in
tight loops (``ShardState.load_rows``, ``ShardState.load_write``) that set
keys' leases in the lease table's map and rebuild each lease's key set at the
end.  The plain path applies every change through ``put``/``delete`` and the
lease table's ``attach``/``detach``, as a follower does.  Both must leave the
same rows, key index, key lists, change log (watch history), byte counts,
leases and their keys, compaction and auth state, on a data dir with deletes,
re-created keys, leases re-attached and detached, revocations, txns across
shards, a compaction and checkpoints on several shards.
"""
from __future__ import annotations

import hashlib
import random
import shutil

import pytest

from journal.checkpoint import RTYPE_ROWS, _unpack_rows
from journal.record import Frame
from proto.kv_pb2 import KeyValue
from shards.record import decode_write
from shards.shard import Shard
from shards.state import ShardState
from shards.types import DeleteReq, PutReq, RangeReq, TxnReq
from tests.shards.store_helpers import open_store

PREFIXES = [b"/registry/pods/ns%d/" % i for i in range(3)] + [
    b"/registry/events/ns/", b"/registry/leases/ns/", b"/registry/minions/", b"/other/"]


def state_digest(store) -> dict:
    """Everything recovery rebuilds, in comparable form."""
    out = {"rev": (store.rev, store.committed, store.compact_rev, store.compacted_through),
           "auth": store.auth.encode_table()}
    for shard in store.shards:
        s = shard.state
        rows = hashlib.sha256()
        it = s.db.iter()
        it.seek_to_first()
        while it.valid():
            rows.update(len(it.key()).to_bytes(4, "big") + it.key() + len(it.value()).to_bytes(4, "big") + it.value())
            it.next()
        del it
        out[shard.name] = {
            "index": sorted(s.index.items()), "keys": list(s.keys), "live": list(s.live),
            "log": (list(s._log_revs), list(s._log_keys)), "last_main": s.last_main,
            "bytes": (s.bytes_in_use, s.bytes_high), "rows": rows.hexdigest(), "bulk": s._bulk,
            "checkpoint_rev": shard.checkpoint_rev,
        }
    leases = store.leases
    out["leases"] = sorted((l.id, l.ttl, sorted(l.keys)) for l in leases.leases.values())
    out["key_lease"] = sorted(leases.key_lease.items())
    out["expiry_heap"] = sorted(lease_id for _, lease_id in leases._expiry_heap)
    return out


def visible(store, rev: int = 0) -> list[tuple]:
    r = store.range(RangeReq(b"\x00", b"\x00", revision=rev))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
            for kv in map(KeyValue.FromString, r.kvs)]


async def build(store, rng: random.Random, ops: int) -> None:
    """A history with every kind of change recovery must get right."""
    keys = [p + b"k%03d" % i for p in PREFIXES for i in range(25)]
    granted: list[int] = []
    next_lease = 1
    compacted = False
    await store.auth.role_add("reader")
    for n in range(ops):
        roll = rng.random()
        if roll < 0.08 or not granted:
            await store.lease_grant(next_lease, rng.choice([60, 3600]))
            granted.append(next_lease)
            next_lease += 1
        elif roll < 0.45:
            lease = rng.choice([0, 0, *granted])
            await store.put(PutReq(rng.choice(keys), b"v%d" % n * rng.randint(1, 40), lease=lease))
        elif roll < 0.55:
            await store.delete_range(DeleteReq(rng.choice(keys)))
        elif roll < 0.58:
            p = rng.choice(PREFIXES)
            await store.delete_range(DeleteReq(p + b"k01", p + b"k04"))
        elif roll < 0.85:  # a txn across shards: puts (a key put twice), a delete
            ops_ = [PutReq(k, b"t%d" % n, lease=rng.choice([0, *granted])) for k in rng.sample(keys, rng.randint(2, 6))]
            ops_.append(DeleteReq(rng.choice(keys)))
            await store.txn(TxnReq((), tuple(ops_), ()))
        elif roll < 0.92:
            lease = granted.pop(rng.randrange(len(granted)))
            await store.lease_revoke(lease)
        elif roll < 0.94 and not compacted and store.committed > 50:
            await store.compact(store.committed - 40)
            compacted = True
        else:
            await store.put(PutReq(rng.choice(keys), b"plain"))  # detaches a lease the key had
    await store.auth.role_add("writer")


def plain_load_write(owners: dict):
    """The per-change path: ``Shard.apply_recovered`` through put/delete and the lease table's attach/detach."""

    def load_write(self, main, payload, key_lease):
        _, changes = decode_write(payload)
        owners[id(self)].apply_recovered(main, changes)
        return len(changes)

    return load_write


def plain_load_rows(self, payload, pos, limit, on_row, progress, key_lease=None):
    """The whole frame, one checkpoint row at a time through put/delete, its lease
    through ``on_row`` (the lease table's attach/detach)."""
    assert pos == 0
    n = 0
    for row in _unpack_rows(Frame(RTYPE_ROWS, 0, payload, 0), None):
        klen = row[0]
        rk, value = row[1:1 + klen], row[1 + klen:]
        main, sub = int.from_bytes(rk[:8], "big"), int.from_bytes(rk[8:16], "big")
        kv = KeyValue.FromString(value)
        if klen > 16:
            self.index.setdefault(kv.key, ())  # a tombstone whose put was compacted away: no entry yet
            self.delete(kv.key, main, sub, value)
            if len(self.index[kv.key]) == 1:  # held as the int, as every key with one entry is
                self.index[kv.key] = self.index[kv.key][0]
            on_row(kv.key, -1)
        else:
            self.put(kv.key, main, sub, value)
            on_row(kv.key, kv.lease)
        n += 1
    return n, len(payload)


def test_bulk_recovery_equals_the_plain_path(tmp_path, run, monkeypatch):
    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=12 * 1024)
        await build(store, random.Random(7), 900)
        before, history = visible(store), {r: visible(store, r) for r in range(store.compact_rev, store.committed + 1, 37)}
        assert store.compact_rev > 0
        await store.close()
        shutil.copytree(tmp_path / "data", tmp_path / "plain" / "data")
        checkpointed = [p.parent.name for p in (tmp_path / "data").glob("shards/*/checkpoint-*.ckpt")]
        assert len(checkpointed) >= 3, checkpointed  # several shards load a checkpoint and replay a journal above it

        fast = await open_store(tmp_path, checkpoint_journal_bytes=1 << 40)
        got = state_digest(fast)
        assert visible(fast) == before
        assert {r: visible(fast, r) for r in history} == history
        await fast.close()

        owners: dict = {}
        init = Shard.__init__

        def remember(self, *a, **kw):
            init(self, *a, **kw)
            owners[id(self.state)] = self

        monkeypatch.setattr(Shard, "__init__", remember)
        monkeypatch.setattr(ShardState, "load_write", plain_load_write(owners))
        monkeypatch.setattr(ShardState, "load_rows", plain_load_rows)
        plain = await open_store(tmp_path / "plain", checkpoint_journal_bytes=1 << 40)
        want = state_digest(plain)
        await plain.close()
        assert got.keys() == want.keys()
        for part in want:
            assert got[part] == want[part], part

    run(go())


def test_the_collector_is_paused_while_recovering_and_on_again_after(tmp_path, run, monkeypatch):
    """Recovery's objects all live on: the cyclic collector is off while they are made (it
    would walk them over and over) and on again afterwards, also when recovery fails."""
    import gc

    seen = []
    load_write = ShardState.load_write

    def watching(self, main, payload, key_lease):
        seen.append(gc.isenabled())
        return load_write(self, main, payload, key_lease)

    async def go():
        store = await open_store(tmp_path)
        await store.put(PutReq(b"/registry/pods/ns/a", b"v"))
        await store.close()
        monkeypatch.setattr(ShardState, "load_write", watching)
        assert gc.isenabled()
        store = await open_store(tmp_path)
        assert seen == [False] and gc.isenabled()
        await store.close()

        def failing(self, main, payload, key_lease):
            assert not gc.isenabled()
            raise RuntimeError("state store broke")

        monkeypatch.setattr(ShardState, "load_write", failing)
        with pytest.raises(RuntimeError, match="state store broke"):
            await open_store(tmp_path)
        assert gc.isenabled() and gc.get_freeze_count() == 0

    run(go())


@pytest.mark.parametrize("tail, reason", [(b"\x09\x00\x00\x00ab", "row overruns its frame"),
                                          (b"\x01\x00", "row length prefix cut short")])
def test_a_checkpoint_whose_rows_do_not_add_up_stops_the_start(tmp_path, run, tail, reason):
    """The rows are read in place from each checkpoint frame: a frame whose CRC holds but
    whose rows overrun it or end in a cut-short length (a writer's bug) is JournalCorrupt."""
    from journal import JournalCorrupt
    from journal.reader import iter_frames
    from journal.record import encode_frame

    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=1 << 40)
        for i in range(50):
            await store.put(PutReq(b"/registry/pods/ns/p%02d" % i, b"v" * 100))
        pods = store.shards[store.router.shard_for_key(b"/registry/pods/ns/p00")]
        pods.start_checkpoint(store.committed, store.compact_rev)
        await pods.checkpoint_task
        await store.close()
        (path,) = (tmp_path / "data" / "shards" / pods.name).glob("checkpoint-*.ckpt")
        raw = path.read_bytes()
        with open(path, "rb") as f:
            frames = list(iter_frames(f, 0, len(raw), 1 << 26, 1 << 20))
        rows = frames[1]
        assert rows.rtype == RTYPE_ROWS and len(frames) == 3  # header, one frame of rows, trailer
        path.write_bytes(raw[:rows.offset] + encode_frame(RTYPE_ROWS, rows.rev, bytes(rows.payload) + tail)
                         + raw[rows.end:])
        with pytest.raises(JournalCorrupt, match=reason):
            await open_store(tmp_path, checkpoint_journal_bytes=1 << 40)

    run(go())


def test_a_recovery_that_fills_the_state_dir_is_a_state_store_error(tmp_path, run):
    """Bulk rows go into an SST file in the state dir: when that dir fills up, the start
    fails with the state store's error (no rows quietly missing), and a start with room
    recovers everything."""
    import os

    from shards.errors import StateStoreError
    from tests.shards.store_helpers import make_config
    from shards.store import Store
    from tests.tmpfs import mounted_tmpfs

    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=1 << 20)
        for i in range(60):  # incompressible: ~3.6 MB of rows, partly in a checkpoint
            await store.put(PutReq(b"/registry/pods/ns/p%02d" % i, os.urandom(60_000)))
        before = visible(store)
        await store.close()
        with mounted_tmpfs(tmp_path / "small", "2m") as small:
            config = make_config(tmp_path)
            config = type(config)(**{**config.__dict__, "state_dir": small / "state"})
            with pytest.raises(StateStoreError, match="No space left on device"):
                await Store.open(config)
        store = await open_store(tmp_path)
        assert visible(store) == before
        await store.close()

    run(go())
