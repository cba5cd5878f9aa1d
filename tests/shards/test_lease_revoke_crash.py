"""A lease revocation and its key deletions recover together or not at all
(issue 18.4), whatever the schedule of journal writes and checkpoints.

Each test stalls one shard's journal writer, takes a copy of the data dir
while the write is held (what a crash at that moment leaves on disk), lets
the original finish, and then recovers the copy.
"""
from __future__ import annotations

import asyncio
import shutil

from journal import Journal
from proto.kv_pb2 import KeyValue
from shards.types import PutReq, RangeReq
from tests.shards.store_helpers import open_store
from tests.shards.test_store import POD, block_writer

LEASE_ID = 0x1234


def crash_image(tmp_path, name):
    image = tmp_path / name
    shutil.copytree(tmp_path / "data", image / "data")
    return image


async def held_keys(store) -> list[tuple[bytes, int]]:
    """(key, lease) of the pods."""
    r = store.range(RangeReq(b"/registry/pods/", b"/registry/pods0"))
    return [(kv.key, kv.lease) for kv in map(KeyValue.FromString, r.kvs)]


async def assert_revoke_is_all_or_nothing(image) -> None:
    """Either the lease and its key are both gone, or both are there and the
    lease still holds the key (so revoking it again deletes the key)."""
    store = await open_store(image)
    try:
        keys = await held_keys(store)
        if LEASE_ID not in store.leases:
            assert keys == [], f"keys outlived their revoked lease: {keys}"
            return
        assert keys == [(POD, LEASE_ID)]
        assert store.leases.leases[LEASE_ID].keys == {POD}
        await store.lease_revoke(LEASE_ID)
        assert await held_keys(store) == []
    finally:
        await store.close()


def test_checkpoint_while_a_revoke_is_in_flight_keeps_the_lease(tmp_path, run):
    """The lease shard checkpoints at R-1 while the deletion of R waits on the
    pods shard's journal; a crash then loses R.  The checkpoint must still
    hold the lease, or the key comes back held by a lease that is gone."""

    async def go():
        store = await open_store(tmp_path)
        await store.lease_grant(LEASE_ID, 100)
        await store.put(PutReq(POD, b"held", lease=LEASE_ID))
        for i in range(4):  # roll the lease shard's journal past its grant record
            await store.put(PutReq(b"filler%d" % i, b"x" * 10_000))
        pods = store.shards[store.router.shard_for_key(POD)]
        gate = block_writer(pods)
        revoke = asyncio.ensure_future(store.lease_revoke(LEASE_ID))
        await asyncio.sleep(0.1)
        assert not revoke.done()
        shard = store.lease_shard
        shard.start_checkpoint(store.committed, store.compact_rev, store.checkpoint_extra(shard, store.committed))
        await shard.checkpoint_task
        image = crash_image(tmp_path, "crash")
        records = Journal.open(image / "data" / "shards" / shard.name / "journal").records()
        assert min(r.rev for r in records) > 1, "the grant record must have been released"
        gate.set()
        await revoke
        await store.close()
        return image

    image = run(go())
    run(assert_revoke_is_all_or_nothing(image))


def test_revoke_record_and_deletions_recover_together(tmp_path, run):
    """The deletion reaches the pods journal but the lease shard's write is
    held when the crash comes: the revision must be cut, lease and key kept."""

    async def go():
        store = await open_store(tmp_path)
        await store.lease_grant(LEASE_ID, 100)
        await store.put(PutReq(POD, b"held", lease=LEASE_ID))
        gate = block_writer(store.lease_shard)
        revoke = asyncio.ensure_future(store.lease_revoke(LEASE_ID))
        await asyncio.sleep(0.2)  # the pods part is written meanwhile
        assert not revoke.done()
        image = crash_image(tmp_path, "crash")
        gate.set()
        assert await revoke == 3
        await store.close()
        return image

    image = run(go())
    run(assert_revoke_is_all_or_nothing(image))

    async def after_full_run():  # the original, having finished, has neither
        store = await open_store(tmp_path)
        try:
            assert LEASE_ID not in store.leases and await held_keys(store) == []
        finally:
            await store.close()

    run(after_full_run())


def test_revoking_a_lease_without_keys_makes_no_revision(tmp_path, run):
    async def go():
        store = await open_store(tmp_path)
        await store.lease_grant(LEASE_ID, 100)
        await store.put(PutReq(POD, b"free"))
        assert await store.lease_revoke(LEASE_ID) == 2
        assert store.rev == 2 and LEASE_ID not in store.leases
        await store.close()
        store = await open_store(tmp_path)
        assert LEASE_ID not in store.leases and store.committed == 2
        await store.close()

    run(go())
