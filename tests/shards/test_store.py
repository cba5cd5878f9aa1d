"""The store end to end in-process: one revision space over shards, restart, watermark."""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest

from proto.kv_pb2 import KeyValue
from shards.errors import CompactedError, FutureRevisionError, LeaseNotFoundError, StoreFailedError
from shards.types import (
    CMP_MOD,
    CMP_VALUE,
    CMP_VERSION,
    RESULT_EQUAL,
    Compare,
    DeleteReq,
    PutReq,
    SORT_DESCEND,
    TARGET_MOD,
    RangeReq,
    TxnReq,
)

from shards.layout import load_layout
from shards.store import Store, StoreConfig
from tests.shards.store_helpers import open_store

POD, LEASE, EVENT, OTHER = b"/registry/pods/ns/p", b"/registry/leases/ns/l", b"/registry/events/ns/e", b"other"


def kvs(result):
    return [KeyValue.FromString(r) for r in result.kvs]


def snapshot(store, rev=0):
    """Every key-value visible at rev, as comparable tuples."""
    r = store.range(RangeReq(b"\x00", b"\x00", revision=rev))
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in kvs(r)]


def test_revisions_are_global_across_shards(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        revs = [(await store.put(PutReq(k, b"v"))).revision for k in (POD, LEASE, EVENT, OTHER)]
        assert revs == [2, 3, 4, 5]
        r = store.range(RangeReq(b"/registry/", b"/registry0"))
        assert [kv.key for kv in kvs(r)] == [EVENT, LEASE, POD] and r.count == 3 and r.revision == 5
        await store.close()

    run(go())


def test_cross_shard_txn_is_one_revision(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        await store.put(PutReq(POD, b"a"))
        txn = TxnReq(
            compare=(Compare(CMP_MOD, RESULT_EQUAL, POD, number=2),),
            success=(PutReq(LEASE, b"x"), PutReq(EVENT, b"y"), DeleteReq(POD)),
        )
        r = await store.txn(txn)
        assert r.succeeded and r.revision == 3
        assert [(k, m) for k, _, _, m, _, _ in snapshot(store)] == [(EVENT, 3), (LEASE, 3)]
        assert snapshot(store, 2) == [(POD, b"a", 2, 2, 1, 0)]
        await store.close()

    run(go())


def test_restart_restores_everything(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        for i in range(50):
            await store.put(PutReq(b"/registry/pods/ns/p%d" % (i % 7), b"v%d" % i))
            await store.put(PutReq(b"/registry/leases/ns/l%d" % (i % 5), b"w%d" % i))
        await store.delete_range(DeleteReq(b"/registry/pods/ns/p3"))
        await store.compact(40)
        before, rev, history = snapshot(store), store.committed, snapshot(store, 45)
        await store.close()

        store = await open_store(tmp_path)
        assert store.committed == rev and store.compact_rev == 40
        assert snapshot(store) == before
        assert snapshot(store, 45) == history
        with pytest.raises(CompactedError):
            store.range(RangeReq(OTHER, revision=39))
        assert (await store.put(PutReq(OTHER))).revision == rev + 1
        await store.close()

    run(go())


def test_checkpoints_bound_the_journal_and_restore(tmp_path, run):
    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=8 * 1024)
        for i in range(400):
            await store.put(PutReq(b"/registry/pods/ns/p%d" % (i % 20), b"x" * 100))
        await store.compact(300)
        for i in range(50):
            await store.put(PutReq(b"/registry/pods/ns/q%d" % i, b"y"))
        await asyncio.sleep(0.2)
        pods = store.shards[store.router.shard_for_key(POD)]
        assert pods.checkpoint_rev > 0
        assert list(pods.dir.glob("checkpoint-*.ckpt"))
        before, rev = snapshot(store), store.committed
        await store.close()

        store = await open_store(tmp_path, checkpoint_journal_bytes=8 * 1024)
        assert store.committed == rev and snapshot(store) == before
        assert store.compact_rev == 300
        await store.close()

    run(go())


def test_a_failed_checkpoint_is_tried_again_after_a_while_not_a_threshold_later(tmp_path, run, monkeypatch):
    """A checkpoint that fails (a full disk, NATS not answering an upload) is counted and tried again
    CHECKPOINT_RETRY_S later, while the journal is past the threshold: not only after another
    threshold of journal bytes, which lets the journal grow to twice its bound."""
    from types import SimpleNamespace

    from shards import shard as shard_module

    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(shard_module, "time", SimpleNamespace(monotonic=lambda: clock.now))

    opened = []

    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=8 * 1024)
        opened.append(store)
        pods = store.shards[store.router.shard_for_key(POD)]
        real, tries = pods.journal.save_checkpoint, []

        async def failing_once(rev, meta, rows):
            tries.append(rev)
            if len(tries) == 1:
                raise OSError(5, "Input/output error")
            return await real(rev, meta, rows)

        monkeypatch.setattr(pods.journal, "save_checkpoint", failing_once)
        i = 0

        async def put() -> None:
            nonlocal i
            await store.put(PutReq(b"/registry/pods/ns/p%d" % (i % 20), b"x" * 100))
            i += 1
            await asyncio.sleep(0)  # the checkpoint task runs
            await asyncio.sleep(0.001)

        while pods.checkpoint_failures == 0:
            assert i < 1000
            await put()
        failed_at = pods.journal.bytes_appended
        while pods.journal.bytes_appended - failed_at < 4 * 1024:  # within the retry time: not tried again
            await put()
        assert tries == tries[:1] and pods.checkpoints_written == 0
        clock.now += shard_module.CHECKPOINT_RETRY_S
        for _ in range(20):  # tried at the next commit
            await put()
            if len(tries) == 2:
                break
        deadline = time.monotonic() + 30  # written in a thread: however long a loaded machine takes
        while not pods.checkpoints_written and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(tries) == 2 and pods.checkpoints_written == 1 and pods.checkpoint_rev == tries[1]
        assert pods.journal.bytes_appended - failed_at < 8 * 1024  # before another threshold of bytes

    async def closing():  # a failure above leaves no store open (its GC policy would fail later tests)
        try:
            await go()
        finally:
            for store in opened:
                await store.close()

    run(closing())


def test_a_checkpoint_whose_release_fails_still_counts_as_written(tmp_path, run, monkeypatch):
    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=4 * 1024)
        pods = store.shards[store.router.shard_for_key(POD)]

        async def release(rev):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(pods.journal, "release", release)
        for i in range(2000):
            if pods.checkpoints_written:
                break
            await store.put(PutReq(b"/registry/pods/ns/p%d" % (i % 20), b"x" * 100))
            await asyncio.sleep(0.001)
        assert pods.checkpoints_written >= 1 and pods.checkpoint_failures == 0 and pods.checkpoint_rev > 0
        await store.close()

    run(go())


def test_a_read_served_in_slices_is_open_until_it_ends(tmp_path, run):
    """Store.reads_in_flight (etcd_mvcc_db_open_read_transactions): a large range that yields to the
    loop between slices counts as open while it runs, and no longer once answered."""
    async def go():
        store = await open_store(tmp_path, slice_ms=0.01)
        for i in range(3000):
            await store.put(PutReq(b"/registry/pods/ns/p%05d" % i, b"x" * 50))
        assert store.reads_in_flight == 0
        task = asyncio.ensure_future(store.range_async(RangeReq(b"/registry/pods/", b"/registry/pods0")))
        seen = []
        while not task.done():
            seen.append(store.reads_in_flight)
            await asyncio.sleep(0)  # a turn of its own each time the range yields
        assert len(task.result().kvs) == 3000
        assert max(seen) == 1 and store.reads_in_flight == 0
        await store.close()

    run(go())


def test_errors(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        await store.put(PutReq(OTHER))
        with pytest.raises(FutureRevisionError):
            store.range(RangeReq(OTHER, revision=3))
        with pytest.raises(LeaseNotFoundError):
            await store.put(PutReq(OTHER, lease=5))
        await store.compact(2)
        with pytest.raises(CompactedError):
            await store.compact(2)
        with pytest.raises(FutureRevisionError):
            await store.compact(9)
        assert store.committed == 2
        await store.close()

    run(go())


def block_writer(shard):
    """Hold a shard's journal writer (its thread) before its next batch is written."""
    gate = threading.Event()
    shard.journal.inline_writes = False  # the loop must go on while the writer is held
    writer = shard.journal._writer
    original = writer.write_batch

    def gated(batch):
        gate.wait(10)
        return original(batch)

    writer.write_batch = gated
    return gate


def test_a_revision_is_visible_only_when_every_lower_one_is_durable(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        pods = store.shards[store.router.shard_for_key(POD)]
        gate = block_writer(pods)
        slow = asyncio.ensure_future(store.put(PutReq(POD, b"slow")))  # rev 2, pods shard blocked
        await asyncio.sleep(0)
        fast = asyncio.ensure_future(store.put(PutReq(LEASE, b"fast")))  # rev 3, leases shard
        await asyncio.sleep(0.2)
        assert not fast.done() and not slow.done(), "rev 3 acknowledged before rev 2 was durable"
        assert store.committed == 1 and snapshot(store) == []
        gate.set()
        assert (await fast).revision == 3 and (await slow).revision == 2
        assert store.committed == 3 and len(snapshot(store)) == 2
        await store.close()

    run(go())


def test_txn_compares_see_pending_writes(tmp_path, run):
    """Two concurrent create-if-absent txns on one key: exactly one succeeds."""

    async def go():
        store = await open_store(tmp_path)
        pods = store.shards[store.router.shard_for_key(POD)]
        gate = block_writer(pods)
        create = TxnReq(compare=(Compare(CMP_MOD, RESULT_EQUAL, POD, number=0),), success=(PutReq(POD, b"x"),))
        a = asyncio.ensure_future(store.txn(create))
        b = asyncio.ensure_future(store.txn(create))
        await asyncio.sleep(0.05)
        gate.set()
        results = [await a, await b]
        assert sorted(r.succeeded for r in results) == [False, True]
        await store.close()

    run(go())


def test_cross_shard_txn_torn_by_a_crash_is_discarded_whole(tmp_path, run):
    """A txn whose record reached one shard's journal but not the other's was
    never acknowledged: recovery drops it from both (DESIGN.md invariant 6)."""

    async def write():
        store = await open_store(tmp_path)
        await store.put(PutReq(POD, b"before"))
        r = await store.txn(TxnReq(success=(PutReq(POD, b"torn"), PutReq(LEASE, b"torn"))))
        assert r.revision == 3
        leases = store.shards[store.router.shard_for_key(LEASE)]
        await store.close()
        return leases.journal.segments[-1]

    segment = run(write())
    # Cut the leases shard's part of revision 3, as if the crash hit before its write.
    from journal import Journal

    records = list(Journal.open(segment.parent).records())
    assert records[-1].rev == 3
    with open(segment, "r+b") as f:
        f.truncate(records[-1].offset)
    # ... and before rev 3 was acknowledged: the watermark did not say 3 yet (it would stop the start)
    (segment.parents[3] / "watermark").unlink()

    async def check():
        store = await open_store(tmp_path)
        assert store.committed == 2
        assert snapshot(store) == [(POD, b"before", 2, 2, 1, 0)]
        pods = store.shards[store.router.shard_for_key(POD)]
        assert [r.rev for r in pods.journal.records()] == [2], "the pods part of rev 3 must be cut from its journal"
        assert (await store.put(PutReq(OTHER))).revision == 3
        await store.close()
        store = await open_store(tmp_path)
        assert store.committed == 3 and [k for k, *_ in snapshot(store)] == [POD, OTHER]
        await store.close()

    run(check())


def test_recovered_revision_prefix_rules():
    from shards.recovery import recovered_revision
    from shards.shard import Recovered

    def shard(ckpt, *writes):
        return Recovered(ckpt, -1, [(r, p, [], 0) for r, p in writes], [], [], b"")

    # rev 2 on shard 0, rev 3 on shards 0+1 (both parts), rev 4 on shard 1 only
    assert recovered_revision([shard(0, (2, (0,)), (3, (0, 1))), shard(0, (3, (0, 1)), (4, (1,)))]) == 4
    # rev 3's part on shard 1 missing: stop at 2 even though rev 4 is whole
    assert recovered_revision([shard(0, (2, (0,)), (3, (0, 1))), shard(0, (4, (1,)))]) == 2
    # shard 1 checkpointed through 3: its part of rev 3 is in the checkpoint
    assert recovered_revision([shard(0, (2, (0,)), (3, (0, 1))), shard(3, (4, (1,)))]) == 4
    # a gap: rev 3 exists nowhere
    assert recovered_revision([shard(0, (2, (0,)), (4, (0,)))]) == 2
    # everything below the newest checkpoint counts as present
    assert recovered_revision([shard(9), shard(0, (10, (1,)))]) == 10


def test_leases_survive_checkpoints_that_release_their_records(tmp_path, run):
    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=4 * 1024)
        lid, ttl, _ = await store.lease_grant(0, 100)
        await store.lease_grant(55, 10)
        await store.put(PutReq(OTHER, b"v", lease=lid))  # default shard: lease records' shard
        await store.lease_revoke(55)
        for i in range(300):  # push the default shard's journal through checkpoints
            await store.put(PutReq(b"filler%d" % (i % 10), b"x" * 100))
        await asyncio.sleep(0.2)
        default = store.lease_shard
        assert default.checkpoint_rev > 5
        await store.close()
        from journal import Journal

        first = min(r.rev for r in Journal.open(default.dir / "journal").records())
        assert first > 4, "the grant records must have been released"

        store = await open_store(tmp_path, checkpoint_journal_bytes=4 * 1024)
        assert sorted(store.leases.leases) == [lid]
        assert store.leases.leases[lid].keys == {OTHER} and store.leases.leases[lid].ttl == 100
        await store.close()

    run(go())


def test_a_write_naming_a_lease_waits_for_the_grant_to_be_durable(tmp_path, run):
    """A client-chosen lease id can be named before its grant is acknowledged;
    the write must not reach disk first, or a crash in between leaves keys held
    by a lease that never existed (they would never expire)."""

    async def go():
        store = await open_store(tmp_path)
        gate = block_writer(store.lease_shard)  # lease records' shard; the put goes to pods
        grant = asyncio.ensure_future(store.lease_grant(77, 60))
        await asyncio.sleep(0)
        put = asyncio.ensure_future(store.put(PutReq(POD, b"held", lease=77)))
        txn = asyncio.ensure_future(store.txn(TxnReq(success=(TxnReq(success=(PutReq(EVENT, b"e", lease=77),)),))))
        plain = asyncio.ensure_future(store.put(PutReq(POD + b"2", b"free")))
        await asyncio.sleep(0.2)
        assert not grant.done() and not put.done() and not txn.done()
        assert store.rev == 2, "the lease writes took a revision before the grant was durable"
        gate.set()
        assert (await grant)[0] == 77
        assert (await put).revision > (await plain).revision
        await txn
        assert store.leases.leases[77].keys == {POD, EVENT}
        await store.close()
        store = await open_store(tmp_path)
        assert store.leases.leases[77].keys == {POD, EVENT}
        await store.close()

    run(go())


def test_a_lease_grant_whose_journal_fails_is_answered_as_a_stopped_store(tmp_path, run):
    """A lease grant waits for its record to be durable; when the journal fails instead (fail-stop),
    the grant fails as every write then does (StoreFailedError: etcd's "server stopped"), not with
    the journal's own exception, which the gRPC layer would not know how to answer."""
    from journal.errors import JournalFailed

    from shards.errors import StoreFailedError

    async def go():
        store = await open_store(tmp_path)
        gate = block_writer(store.lease_shard)

        def failing(batch):
            gate.wait(10)
            raise OSError(5, "Input/output error")

        store.lease_shard.journal._writer.write_batch = failing
        grant = asyncio.ensure_future(store.lease_grant(78, 60))
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(StoreFailedError) as failed:
            await grant
        assert isinstance(failed.value.__cause__, JournalFailed)
        await store.close()

    run(go())


def test_a_compaction_whose_journal_fails_is_answered_as_a_stopped_store(tmp_path, run):
    """The same for Compact, which waits for its compaction records to be durable on every shard
    (seen in chaos: a writer deposed under a Compact logged "unexpected error serving request" and
    answered gRPC's UNKNOWN)."""
    from journal.errors import JournalFailed

    async def go():
        store = await open_store(tmp_path)
        for i in range(3):
            await store.put(PutReq(POD, b"v%d" % i))
        gate = block_writer(store.lease_shard)

        def failing(batch):
            gate.wait(10)
            raise OSError(5, "Input/output error")

        store.lease_shard.journal._writer.write_batch = failing
        compact = asyncio.ensure_future(store.compact(store.committed - 1))
        await asyncio.sleep(0.05)
        gate.set()
        with pytest.raises(StoreFailedError) as failed:
            await compact
        assert isinstance(failed.value.__cause__, JournalFailed)
        await store.close()

    run(go())


def test_default_state_dir_is_removed_on_close(tmp_path, run):
    """State in the default place (a dir under /dev/shm named after the data
    dir) is memory: closing the store leaves nothing of it behind."""

    async def go():
        store = await Store.open(StoreConfig(data_dir=tmp_path / "data", layout=load_layout(None)))
        base = store.shards[0].state.path.parent
        await store.put(PutReq(POD, b"x"))
        assert base.is_dir() and base != tmp_path
        await store.close()
        assert not base.exists()

    run(go())


def test_a_large_compaction_yields_to_other_requests_throughout(tmp_path, run):
    """Compaction runs in short slices (issue 18.6): reads keep being served
    all along instead of waiting behind a batch of thousands of keys."""

    async def go():
        store = await open_store(tmp_path)
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(60_000)]
        for _ in range(3):  # 180,000 rows, 120,000 of them history
            for i in range(0, len(keys), 1000):
                await store.txn(TxnReq(success=tuple(PutReq(k, b"v" * 40) for k in keys[i : i + 1000])))
        pods = store.states[store.router.shard_for_key(keys[0])]
        left = [len(pods._log_revs)]  # history entries still to compact, seen between reads
        compaction = asyncio.ensure_future(store.compact(store.rev, physical=True))
        while not compaction.done():
            assert kvs(store.range(RangeReq(keys[-1])))[0].version == 3
            left.append(len(pods._log_revs))
            await asyncio.sleep(0)
        await compaction
        step = max(a - b for a, b in zip(left, left[1:]))
        assert step <= 20_000, f"{step} of {left[0]} history entries were compacted without serving a read"
        assert all(type(pods.index[k]) is int for k in keys) and not pods._log_revs
        assert sum(1 for _ in pods.db.keys()) == len(keys)
        await store.close()

    run(go())


def test_a_pause_between_slices_lasts_while_others_have_work(tmp_path, run):
    """Long work's pause between two slices: on a loop with nothing else to do it ends after two
    turns (it does not sleep its pause_ms away while others wait on the write gate); while others
    have work it lets them do it, turn after turn, until they are done or pause_ms has passed."""
    import time

    def busy(s: float) -> None:  # one turn's work of a gRPC call, say
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    async def go():
        store = await open_store(tmp_path, pause_ms=1_000)
        turns = 0

        async def ticker():  # ready every turn, but does next to nothing in it
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        async def worker(n: int):
            for _ in range(n):
                busy(0.0002)
                await asyncio.sleep(0)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = turns
        await store._pause()
        assert turns - before <= 3
        work = asyncio.ensure_future(worker(20))
        await store._pause()
        assert work.done()  # all 20 busy turns ran in the pause
        store.config = dataclasses.replace(store.config, pause_ms=1)
        work = asyncio.ensure_future(worker(1_000))  # 0.2 s of busy turns: more than pause_ms
        await store._pause()
        assert not work.done()
        await work
        tick.cancel()
        await store.close()

    run(go())


def test_a_held_event_loop_does_not_expire_leases_kept_alive(tmp_path, run):
    """The loop is held for 2.5 s (a long request) right after a keep-alive of a
    2 s lease: that time does not count against the lease (issue 18.3), but a
    lease nobody renews still expires afterwards."""
    import time

    async def go():
        store = await open_store(tmp_path)
        kept, _, _ = await store.lease_grant(0, 2)
        dropped, _, _ = await store.lease_grant(0, 2)
        await store.put(PutReq(POD, b"kept", lease=kept))
        await store.put(PutReq(OTHER, b"dropped", lease=dropped))
        for i in range(12):
            assert store.lease_renew(kept) == 2
            if i == 2:
                time.sleep(2.5)  # holds the loop; the expiry tick comes due meanwhile
            await asyncio.sleep(0.3)
            assert kept in store.leases, f"a lease renewed every 0.3 s was expired after the stall (step {i})"
        assert [kv.key for kv in kvs(store.range(RangeReq(b"\x00", b"\x00")))] == [POD]
        assert dropped not in store.leases
        await store.close()

    run(go())


def test_time_keep_alives_were_refused_does_not_count_against_leases(tmp_path, run):
    """While keep-alives cannot be answered (a writer whose lease NATS cannot confirm, as when
    JetStream has no quorum) no lease expires, and that time is given back after, as etcd
    expires nothing without a leader and gives every lease its TTL again after an election;
    a lease nobody renews after still expires."""
    async def go():
        store = await open_store(tmp_path)
        answerable = True
        store.leases_answerable = lambda: answerable
        kept, _, _ = await store.lease_grant(0, 2)
        dropped, _, _ = await store.lease_grant(0, 2)
        await store.put(PutReq(POD, b"kept", lease=kept))
        await store.put(PutReq(OTHER, b"dropped", lease=dropped))
        assert store.lease_renew(kept) == 2
        answerable = False
        await asyncio.sleep(3.0)  # past both leases' TTL: keep-alives refused all along
        assert kept in store.leases and dropped in store.leases
        answerable = True
        await asyncio.sleep(0.6)
        assert kept in store.leases, "a lease renewed just before keep-alives were refused expired after"
        for _ in range(8):  # renewed again from here on
            assert store.lease_renew(kept) == 2
            await asyncio.sleep(0.5)
        assert kept in store.leases and dropped not in store.leases
        assert [kv.key for kv in kvs(store.range(RangeReq(b"\x00", b"\x00")))] == [POD]
        await store.close()

    run(go())


def test_time_lease_expiry_waited_on_the_journal_does_not_count_against_leases(tmp_path, run):
    """A revoke that waits 5 s on the journal (stalled: keep-alives are refused meanwhile too,
    test above) holds the expiry loop; that time is given back to the leases before the next
    expiry, so a lease whose client renews it once the server answers again is still there."""
    async def go():
        store = await open_store(tmp_path)
        kept, _, _ = await store.lease_grant(0, 4)
        dropped, _, _ = await store.lease_grant(0, 2)
        revoke, stalled_ended = store.lease_revoke, asyncio.Event()

        async def stalled(lease_id):
            if lease_id == dropped:
                await asyncio.sleep(5.0)
                stalled_ended.set()
            return await revoke(lease_id)

        store.lease_revoke = stalled
        await asyncio.sleep(1.5)
        assert store.lease_renew(kept) == 4  # due at 5.5 s; the dropped one's revoke stalls from ~2 s to ~7 s
        await stalled_ended.wait()
        await asyncio.sleep(0.8)  # the expiry's next tick has come
        assert store.lease_renew(kept) == 4, "the lease ran out while the expiry waited on another's revoke"
        assert dropped not in store.leases
        await store.close()

    run(go())


def test_a_keep_alive_during_its_leases_expiry_is_answered_gone(tmp_path, run):
    """A lease that expired is revoked in steps, behind other writes; a keep-alive that comes
    meanwhile renewed it and was answered with its whole TTL, and then the revoke went on: the
    client was promised 2 s and the lease was gone at once. As etcd answers a keep-alive of an
    expired lease whose revoke is under way: not found (TTL 0)."""
    async def go():
        store = await open_store(tmp_path)
        lease, _, _ = await store.lease_grant(0, 1)
        await store.put(PutReq(b"/registry/pods/ns/held", b"v", lease=lease))
        revoke, revoking = store.lease_revoke, asyncio.Event()

        async def behind_other_writes(lease_id):
            revoking.set()
            await asyncio.sleep(1.0)
            return await revoke(lease_id)

        store.lease_revoke = behind_other_writes
        await revoking.wait()  # expired, its revoke under way
        assert store.lease_renew(lease) == 0
        await asyncio.sleep(1.5)
        assert lease not in store.leases and not store.range(RangeReq(b"/registry/pods/ns/held")).kvs
        await store.close()

    run(go())


def test_a_long_txn_yields_and_holds_other_writes_back(tmp_path, run):
    """A txn whose compares walk 20,000 keys 32 times runs in slices (issue
    18.3): reads are served while it runs, and a write sent meanwhile is
    ordered after it (so its compares still see what they saw).  A large
    delete whose caller goes away mid-way is finished, not left half applied
    with its revision handed out again."""
    from shards.types import CMP_VERSION, RESULT_LESS

    async def go():
        store = await open_store(tmp_path)
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(20_000)]
        for i in range(0, len(keys), 1000):
            await store.txn(TxnReq(success=tuple(PutReq(k, b"v") for k in keys[i : i + 1000])))
        base = store.rev
        cmp = Compare(CMP_VERSION, RESULT_LESS, keys[0], number=2, range_end=b"/registry/pods0")
        heavy = TxnReq(compare=(cmp,) * 32, success=(PutReq(OTHER, b"all at version 1"),))
        txn = asyncio.ensure_future(store.txn(heavy))
        served = 0
        await asyncio.sleep(0)
        while store.rev == base and not txn.done():
            assert kvs(store.range(RangeReq(keys[-1])))[0].version == 1
            served += 1
            if served == 5:  # makes the compares false if it were applied first
                put = asyncio.ensure_future(store.put(PutReq(keys[-1], b"v2")))
            await asyncio.sleep(0)
        assert served >= 20, f"only {served} reads were served while the txn evaluated its compares"
        r = await txn
        assert r.succeeded and r.revision == base + 1
        assert (await put).revision == base + 2

        wipe = asyncio.ensure_future(store.delete_range(DeleteReq(b"/registry/pods/", b"/registry/pods0")))
        while store._gate is None:  # until the delete is between two slices
            await asyncio.sleep(0)
        wipe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wipe
        assert (await store.put(PutReq(OTHER, b"after"))).revision == base + 4
        assert store.range(RangeReq(b"/registry/pods/", b"/registry/pods0", count_only=True)).count == 0
        assert len(store.range(RangeReq(b"/registry/pods/", b"/registry/pods0", revision=base + 2)).kvs) == 20_000
        before = snapshot(store)
        await store.close()
        store = await open_store(tmp_path)
        assert store.committed == base + 4 and snapshot(store) == before
        await store.close()

    run(go())


def test_checkpoints_keep_bounding_the_journal_as_it_ages(tmp_path, run):
    """Segments released by a checkpoint must not delay the next one (issue
    18.5): 4 MiB through a 64 KiB checkpoint interval gives a checkpoint about
    every 64 KiB, and the journal on disk never holds much more than two
    intervals (plus the segment being written)."""
    interval, segment = 64 * 1024, 16 * 1024

    async def go():
        from journal import JournalConfig

        store = await open_store(tmp_path, checkpoint_journal_bytes=interval,
                                 journal=JournalConfig(segment_bytes_max=segment))
        pods = store.shards[store.router.shard_for_key(POD)]
        checkpoints, last, peak = 0, 0, 0
        for i in range(200):
            await asyncio.gather(*(store.put(PutReq(POD + b"%d" % j, b"x" * 1000)) for j in range(20)))
            if pods.checkpoint_task is not None:  # a slow machine must not look like a late trigger
                await pods.checkpoint_task
            if pods.checkpoint_rev != last:
                checkpoints, last = checkpoints + 1, pods.checkpoint_rev
            peak = max(peak, pods.journal.bytes_total)
        appended = pods.journal.bytes_appended
        await store.close()
        return appended, checkpoints, peak

    appended, checkpoints, peak = run(go())
    assert checkpoints >= appended // interval // 2, f"{checkpoints} checkpoints for {appended} bytes"
    assert peak <= 2 * interval + 2 * segment, f"the journal grew to {peak} bytes"


async def compaction_meanwhile(store: Store, read):
    """Run the sliced ``read``, other loop turns beside it, and a physical compaction to the
    latest revision requested as soon as it has yielded: (its result, how many other turns ran,
    the compaction's future)."""
    read = asyncio.ensure_future(read)
    others, compaction = 0, None
    while not read.done():
        others += 1
        if store.reads_in_flight and compaction is None:
            compaction = asyncio.ensure_future(store.compact(store.rev, physical=True))
        await asyncio.sleep(0)
    assert compaction is not None, "the read never yielded"
    return await read, others, compaction


def test_a_large_read_yields_and_holds_compaction_back(tmp_path, run):
    """A Range over 40,000 keys fetches its rows in slices (issue 18.3): other
    requests run in between, and a compaction requested meanwhile past the
    read's revision waits for it instead of removing rows it is about to fetch."""

    async def go():
        store = await open_store(tmp_path, slice_ms=0.5)  # many slices: the compaction runs meanwhile
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(40_000)]
        for version in (b"1", b"2"):
            for i in reversed(range(0, len(keys), 1000)):  # compaction walks the keys from the last one
                await store.txn(TxnReq(success=tuple(PutReq(k, version * 300) for k in keys[i : i + 1000])))
        old = 1 + len(keys) // 1000  # every key at version 1
        result, others, compaction = await compaction_meanwhile(
            store, store.range_async(RangeReq(b"/registry/pods/", b"/registry/pods0", revision=old)))
        got = kvs(result)
        assert others >= 5 and len(got) == 40_000 and {kv.version for kv in got} == {1}
        await compaction
        with pytest.raises(CompactedError):
            store.range(RangeReq(keys[0], revision=old))
        assert store.failure is None
        await store.close()

    run(go())


def test_a_read_only_txn_in_slices_lets_writes_through_and_reads_one_revision(tmp_path, run):
    """A txn of compares and ranges only (etcdctl txn reading a prefix) runs in slices as a Range
    does, beside writes, not holding them back as a write's slices do (a 100 MB answer held every
    Put for 1.9 s): puts are answered between its slices, and none shows in it: its compare over
    every key, the compare on one key after it and its range all read the revision it began at;
    it holds compaction back at that revision while it has yielded, as a sliced Range does, and a
    compaction asked for meanwhile does not refuse its later reads (etcd's read txn began before it)."""

    async def go():
        store = await open_store(tmp_path, slice_ms=0.5)  # many slices
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(20_000)]
        for i in range(0, len(keys), 1000):
            await store.txn(TxnReq(success=tuple(PutReq(k, b"1" * 100) for k in keys[i : i + 1000])))
        began, last = store.rev, keys[-1]
        pods, end = b"/registry/pods/", b"/registry/pods0"
        req = TxnReq(compare=(Compare(CMP_VERSION, RESULT_EQUAL, pods, end, number=1),
                              Compare(CMP_VALUE, RESULT_EQUAL, last, value=b"1" * 100)),
                     success=(RangeReq(pods, end), RangeReq(pods, end, keys_only=True)), failure=(RangeReq(last),))
        txn = asyncio.ensure_future(store.txn(req))
        await asyncio.sleep(0)  # its first slice
        answered_meanwhile, compaction, held = [], None, []
        while not txn.done():
            held.append(store.reads_in_flight)  # compaction held back at its revision while it yields
            await store.put(PutReq(last, b"2"))
            answered_meanwhile.append(not txn.done())
            if compaction is None:  # past the revision it reads: the row of `last` it will read goes
                compaction = asyncio.ensure_future(store.compact(store.rev, physical=True))
            await asyncio.sleep(0)
        result = txn.result()
        assert result.succeeded, "a compare saw a put made after the txn began"
        assert any(answered_meanwhile), f"every put waited for the read-only txn: {answered_meanwhile}"
        assert store.rev > began and result.revision == began, (store.rev, began, result.revision)
        assert max(held) == 1 and store.reads_in_flight == 0
        got = kvs(result.responses[0])
        assert len(got) == len(keys) and {(kv.version, kv.value) for kv in got} == {(1, b"1" * 100)}
        # the second range began after the compaction was asked for, past its revision: still answered
        assert [(kv.key, kv.value) for kv in kvs(result.responses[1])] == [(k, b"") for k in keys]
        await compaction
        assert store.failure is None
        await store.close()

    run(go())


async def stepped_with_writes(store: Store, req: RangeReq, meanwhile):
    """``req`` read at once, then in steps with ``await meanwhile(steps taken)`` between every two:
    (the answer at once, the answer in steps, how many steps it yielded)."""
    from shards.read import range_at, range_steps

    current = store.committed
    want = range_at(store, req, current)
    steps, took = range_steps(store, req, current), 0
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return want, stop.value, took
        took += 1
        await meanwhile(took)


def test_a_large_range_lists_and_counts_its_keys_in_steps_unmoved_by_writes_meanwhile(tmp_path, run):
    """A Range over many keys lists them LIST_KEYS a step (each step scans again from after the
    last key listed; at once, 100,000 keys held the event loop ~0.1 s), decodes rows for a sort or
    keys_only in steps, and counts by a scan in steps when most keys changed since its revision:
    keys written, deleted or written again between two steps change none of its answers."""
    from shards.read import LIST_KEYS

    async def go():
        store = await open_store(tmp_path)
        keys = [b"/registry/pods/ns/p%06d" % (2 * i) for i in range(3 * LIST_KEYS)]
        for i in range(0, len(keys), 1000):
            await store.txn(TxnReq(success=tuple(PutReq(k, b"v%d" % (len(k) + i)) for k in keys[i : i + 1000])))
        old = store.rev
        survivors = keys[::10]
        gone = [k for k in keys if k not in set(survivors)]
        for i in range(0, len(gone), 1000):  # so many changes that counting at the old revision scans
            await store.txn(TxnReq(success=tuple(DeleteReq(k) for k in gone[i : i + 1000])))
        await store.put(PutReq(survivors[-1], b"newer"))
        pods, end = b"/registry/pods/", b"/registry/pods0"
        reqs = [RangeReq(pods, end, revision=old), RangeReq(pods, end, revision=old, keys_only=True),
                RangeReq(pods, end, revision=old, sort_target=TARGET_MOD, sort_order=SORT_DESCEND),
                RangeReq(pods, end, revision=old, count_only=True), RangeReq(pods, end, revision=old, limit=3)]
        async def meanwhile(took: int) -> None:
            odd = b"/registry/pods/ns/p%06d" % (2 * took * LIST_KEYS // 3 + 1)  # between two listed keys
            await store.put(PutReq(odd, b"meanwhile"))
            await store.txn(TxnReq(success=(DeleteReq(keys[took * 97 % len(keys)]),
                                            PutReq(keys[took * 89 % len(keys)], b"again"))))

        for req in reqs:
            want, got, took = await stepped_with_writes(store, req, meanwhile)
            assert took >= 2, f"{req} took one step"
            assert got == want, req
            listed = [KeyValue.FromString(r).key for r in got.kvs]  # and the keys there were, once each
            assert got.count == len(keys) and len(listed) == len(set(listed))
            assert len(listed) == (0 if req.count_only else req.limit or len(keys))
        await store.close()

    run(go())


def test_a_large_delete_range_lists_its_keys_in_steps_with_other_writes_held_back(tmp_path, run):
    """A DeleteRange over many keys lists them LIST_KEYS a step (at once, 50,000 keys held the
    event loop ~40 ms), other turns running between; a write sent meanwhile waits for it, and it
    deletes every key live when it began, once."""
    from shards.read import LIST_KEYS

    async def go():
        store = await open_store(tmp_path, slice_ms=0.01)  # a pause after every step
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(3 * LIST_KEYS + 5)]
        for i in range(0, len(keys), 1000):
            await store.txn(TxnReq(success=tuple(PutReq(k, b"v") for k in keys[i : i + 1000])))
        pods = store.states[store.router.shard_for_key(keys[0])]
        before = pods.last_main
        wipe = asyncio.ensure_future(store.delete_range(DeleteReq(b"/registry/pods/", b"/registry/pods0")))
        listing, late = 0, None
        while not wipe.done():
            if store._gate is not None and pods.last_main == before:  # yielded, nothing deleted yet
                listing += 1
                if late is None:
                    late = asyncio.ensure_future(store.put(PutReq(keys[7], b"late")))
            await asyncio.sleep(0)
        r = await wipe
        assert listing >= 2, "the keys were listed at once"
        assert r.deleted == len(keys)
        assert (await late).revision == r.revision + 1
        left = store.range(RangeReq(b"/registry/pods/", b"/registry/pods0"))
        assert [kv.key for kv in kvs(left)] == [keys[7]]
        await store.close()

    run(go())


def test_a_lease_with_many_keys_is_revoked_in_key_order_sorted_in_steps(tmp_path, run):
    """Revoking a lease with many keys sorts them SORT_RUN a step (at once, 50,000 keys held the
    event loop ~30 ms), other turns running between, and deletes them in key order, one sub
    revision each."""
    import random

    from shards.store import SORT_RUN

    async def go():
        store = await open_store(tmp_path, slice_ms=0.01)  # a pause after every step
        lid, _, _ = await store.lease_grant(0, 1000)
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(3 * SORT_RUN + 5)]
        shuffled = random.Random(3).sample(keys, len(keys))
        for i in range(0, len(keys), 1000):
            await store.txn(TxnReq(success=tuple(PutReq(k, b"v", lease=lid) for k in shuffled[i : i + 1000])))
        pods = store.states[store.router.shard_for_key(keys[0])]
        before = pods.last_main
        revoke = asyncio.ensure_future(store.lease_revoke(lid))
        sorting = 0
        while not revoke.done():
            sorting += store._gate is not None and pods.last_main == before  # yielded, nothing deleted yet
            await asyncio.sleep(0)
        await revoke
        assert sorting >= 2, "the keys were sorted at once"
        tombstones = [pods.entries(k)[-1] for k in keys]
        assert all(e & 1 for e in tombstones) and len({e >> 33 for e in tombstones}) == 1
        assert [(e >> 1) & 0xFFFFFFFF for e in tombstones] == list(range(len(keys)))  # key order
        await store.close()

    run(go())


def test_a_count_from_the_change_log_in_steps_is_unmoved_by_writes_and_compaction_meanwhile(tmp_path, run):
    """A count at an old revision with thousands of changes since (a paginated list's later pages,
    kube-apiserver's) goes through the change log LOG_STEP changes a step (at once, 100,000 changes
    held the event loop ~0.19 s): keys created, deleted or changed again after they were looked at,
    and a compaction up to the count's revision, between two steps, change none of its answers."""
    from shards.state import LOG_STEP

    async def go():
        store = await open_store(tmp_path)
        keys = [b"/registry/pods/ns/p%06d" % (2 * i) for i in range(8 * LOG_STEP)]
        for i in range(0, len(keys), 1000):
            await store.txn(TxnReq(success=tuple(PutReq(k, b"v") for k in keys[i : i + 1000])))
        old = store.rev
        changed = keys[: 4 * LOG_STEP]  # fewer changes than live keys: counted from the change log
        for i in range(0, len(changed), 1000):
            await store.txn(TxnReq(success=tuple(DeleteReq(k) if j % 3 == 0 else PutReq(k, b"w")
                                                 for j, k in enumerate(changed[i : i + 1000]))))
        pods, end = b"/registry/pods/", b"/registry/pods0"
        live_at_old = len(keys)
        async def meanwhile(took: int) -> None:
            if took == 1 and store.compact_rev < old:  # drops changes at or below old from the log's front
                await store.compact(old, physical=True)
            await store.put(PutReq(b"/registry/pods/ns/p%06d" % (2 * took + 1), b"new"))
            await store.txn(TxnReq(success=(DeleteReq(changed[took * 7 + 1]),  # looked at in the first step
                                            PutReq(changed[took * 3], b"again"))))  # deleted or rewritten

        for req in [RangeReq(pods, end, revision=old, count_only=True), RangeReq(pods, end, revision=old, limit=3),
                    RangeReq(b"/registry/pods/ns/p001000", end, revision=old, count_only=True)]:
            want, got, took = await stepped_with_writes(store, req, meanwhile)
            assert took >= 3, f"{req} took {took} steps"
            assert got == want, req
            if req.key == pods:
                assert got.count == live_at_old
        assert store.failure is None
        await store.close()

    run(go())


def test_a_hash_of_many_rows_yields_and_holds_compaction_back(tmp_path, run):
    """HashKV over 60,000 rows hashes them in slices (at once it held the event loop 0.6 s
    at 100,000 keys): other requests run in between, the hash is the one taken at once,
    and a compaction requested meanwhile waits for it rather than drop rows it hashes."""

    async def go():
        store = await open_store(tmp_path, slice_ms=0.5)
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(20_000)]
        for version in (b"1", b"2", b"3"):  # a compaction meets each key at version 1 and drops 1 and 2
            for i in range(0, len(keys), 1000):
                await store.txn(TxnReq(success=tuple(PutReq(k, version * 100) for k in keys[i : i + 1000])))
        want = store.hash_kv(0)
        got, others, compaction = await compaction_meanwhile(store, store.hash_kv_async(0))
        assert got == want and others >= 5
        await compaction
        assert store.failure is None and store.hash_kv(0) != want  # the history is gone now
        with pytest.raises(CompactedError):
            await store.hash_kv_async(2)
        await store.close()

    run(go())


def test_a_compaction_in_slices_reports_its_pauses(tmp_path, run):
    """A compaction told to the metrics (etcd's compaction histograms): the loop held by every
    slice, each slice that a pause followed, the whole; a small one is one slice and no pause."""

    async def go():
        store = await open_store(tmp_path, slice_ms=0.5)
        seen = []
        store.on_compaction = lambda held, paused, total: seen.append((held, paused, total))
        keys = [b"/registry/pods/ns/p%06d" % i for i in range(20_000)]
        for version in (b"1", b"2"):
            for i in range(0, len(keys), 1000):
                await store.txn(TxnReq(success=tuple(PutReq(k, version * 100) for k in keys[i : i + 1000])))
        await store.compact(store.rev, physical=True)
        (held, paused, total), = seen
        assert len(paused) >= 2 and sum(paused) <= held <= total
        await store.put(PutReq(POD, b"a"))
        await store.put(PutReq(POD, b"b"))
        await store.compact(store.rev - 1, physical=True)
        assert len(seen) == 2 and seen[1][1] == []
        await store.close()

    run(go())


def test_a_write_not_durable_in_time_times_out_and_may_still_commit(tmp_path, run):
    """etcd's request timeout: a write whose journal does not answer in time is
    answered "request timed out" (the journal is slow, or a replicated journal
    has no quorum); the store keeps going, and the write commits once it can."""
    from shards.errors import RequestTimeoutError

    async def go():
        store = await open_store(tmp_path, request_timeout_s=0.3)
        pods = store.shards[store.router.shard_for_key(POD)]
        gate = block_writer(pods)
        with pytest.raises(RequestTimeoutError):
            await store.put(PutReq(POD, b"slow"))
        assert store.failure is None and snapshot(store) == []
        gate.set()
        assert (await store.put(PutReq(POD, b"after"))).revision == 3
        assert [(k, v, mod) for k, v, _, mod, _, _ in snapshot(store)] == [(POD, b"after", 3)]
        assert [kv.value for kv in kvs(store.range(RangeReq(POD, revision=2)))] == [b"slow"]
        await store.close()

    run(go())


def test_recovery_yields_to_the_event_loop_so_the_writer_lease_is_renewed(tmp_path, run, monkeypatch):
    """A recovery of many rows is CPU work; unless it yields, nothing else runs
    meanwhile, and a JetStream writer's lease (renewed by a task every TTL/3)
    lapses and a standby takes the journals from a writer about to serve.
    Measured in rows, not seconds: a task running beside the recovery sees it
    part-way (between 0 and all rows loaded) about once per YIELD_EVERY rows,
    in the checkpoint load and in the journal replay."""
    from shards.shard import YIELD_EVERY
    from shards.state import ShardState
    from shards.types import TxnReq

    rows = 3 * YIELD_EVERY // 100 * 100

    async def write(store, prefix: bytes) -> None:
        for j in range(rows // 100):
            ops = tuple(PutReq(prefix + b"%06d" % (j * 100 + k), b"v") for k in range(100))
            await store.txn(TxnReq((), ops, ()))

    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=1 << 40)
        await write(store, b"/registry/pods/ns/a")
        pods = store.shards[store.router.shard_for_key(POD)]
        pods.start_checkpoint(store.committed, store.compact_rev)
        await pods.checkpoint_task
        await write(store, b"/registry/pods/ns/b")  # in the journal only
        await store.close()

        loaded = [0]
        load_rows, load_write = ShardState.load_rows, ShardState.load_write

        def counting_load(self, payload, pos, limit, on_row, progress, key_lease=None):
            n, pos = load_rows(self, payload, pos, limit, on_row, progress, key_lease)
            loaded[0] += n
            return n, pos

        def counting_write(self, rev, payload, key_lease):
            n = load_write(self, rev, payload, key_lease)
            loaded[0] += n
            return n

        monkeypatch.setattr(ShardState, "load_rows", counting_load)
        monkeypatch.setattr(ShardState, "load_write", counting_write)
        seen = set()

        async def watch():
            while True:
                seen.add(loaded[0])
                await asyncio.sleep(0)

        task = asyncio.ensure_future(watch())
        store = await open_store(tmp_path, checkpoint_journal_bytes=1 << 40)
        task.cancel()
        assert loaded[0] == 2 * rows and len(store.states[pods.sid].live) == 2 * rows
        await store.close()
        part_way = {n for n in seen if 0 < n < 2 * rows}
        assert len(part_way) >= 2 * rows // YIELD_EVERY - 1, sorted(part_way)

    run(go())


def test_deleted_and_recreated_keys_are_live_as_before_a_restart(tmp_path, run):
    """Recovery loads rows in bulk and works out which keys are live at the end
    (state.live: what a Range and a count see): keys deleted, re-created, deleted
    again, in the checkpoint and in the journal above it."""
    async def go():
        store = await open_store(tmp_path, checkpoint_journal_bytes=4 * 1024)
        keys = [b"/registry/pods/ns/k%02d" % i for i in range(30)]
        for round_ in range(6):
            for i, k in enumerate(keys):
                if (i + round_) % 3 == 0:
                    await store.delete_range(DeleteReq(k))
                else:
                    await store.put(PutReq(k, b"v%d" % round_ * 40))
        pods = store.shards[store.router.shard_for_key(POD)]
        assert pods.checkpoint_rev > 0  # some history is in the checkpoint, some in the journal
        for k in keys[:10]:  # the newest rows of these: in the journal only
            await store.delete_range(DeleteReq(k))
        await store.put(PutReq(keys[0], b"back"))
        live_before = list(pods.state.live)
        before, rev = snapshot(store), store.committed
        await store.close()

        store = await open_store(tmp_path, checkpoint_journal_bytes=4 * 1024)
        pods = store.shards[store.router.shard_for_key(POD)]
        assert store.committed == rev and snapshot(store) == before
        assert list(pods.state.live) == live_before and keys[0] in live_before and keys[1] not in live_before
        assert list(pods.state.keys) == sorted(keys)
        await store.close()

    run(go())


def test_a_write_a_journal_refuses_stops_the_store(tmp_path):
    """A journal that refuses a write's record (here as a journal refuses a revision below its last)
    leaves the state holding a write no journal took, and no revision after it could commit: the
    store fail-stops (StoreFailedError for this write and every later one) instead of timing every
    later write out while it goes on serving."""
    async def go():
        store = await open_store(tmp_path)
        shard = store.shards[store.router.shard_for_key(b"/registry/pods/b")]
        try:
            await store.put(PutReq(b"/registry/pods/a", b"1"))

            def refuse(rev, participants, changes, ahead=None):
                raise ValueError(f"revision tag {rev} is below the last appended tag {rev + 10}")

            shard.append_write = refuse
            with pytest.raises(StoreFailedError, match="below the last appended tag"):
                await store.put(PutReq(b"/registry/pods/b", b"2"))
            assert store.failure_source == "journal"
            with pytest.raises(StoreFailedError):
                await store.put(PutReq(b"/registry/other", b"3"))
        finally:
            del shard.append_write
            await store.close()

    asyncio.run(go())
