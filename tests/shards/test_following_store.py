"""A store that follows another writer's journals writes nothing of its own.

Its state is what the writer's journals say: a write applied to it would show reads a
revision no journal holds (a JSON-gateway Put on a follower did that once: the row went
into the follower's state, then the journal append failed). Every kind of write is
refused with NotTheWriterError before anything changes, and the store goes on following.
"""
from __future__ import annotations

import asyncio

import pytest

from proto.kv_pb2 import KeyValue
from shards.errors import NotTheWriterError
from shards.store import Store
from shards.types import DeleteReq, PutReq, RangeReq, TxnReq
from tests.shards.store_helpers import following, open_store

KEY = b"/registry/pods/a"


def test_a_following_store_refuses_every_write_before_touching_its_state(tmp_path):
    async def go():
        writer = await open_store(tmp_path / "w")
        rev = (await writer.put(PutReq(KEY, b"1"))).revision
        async with following(tmp_path / "f", writer) as follower:
            before = follower.range(RangeReq(KEY))
            assert [KeyValue.FromString(kv).value for kv in before.kvs] == [b"1"] and follower.rev == rev
            writes = {
                "put": lambda: follower.put(PutReq(KEY, b"2")),
                "delete": lambda: follower.delete_range(DeleteReq(KEY)),
                "txn": lambda: follower.txn(TxnReq(success=(PutReq(KEY, b"3"),))),
                "compact": lambda: follower.compact(rev),
                "lease grant": lambda: follower.lease_grant(0, 60),
                "lease revoke": lambda: follower.lease_revoke(1),
                "auth change": lambda: follower.auth.role_add("r"),
            }
            for name, write in writes.items():
                with pytest.raises(NotTheWriterError):
                    await write()
                after = follower.range(RangeReq(KEY))
                assert (after.kvs, follower.rev, follower.compact_rev) == (before.kvs, rev, -1), name
            assert follower.auth.state.seq == writer.auth.state.seq
            rev2 = (await writer.put(PutReq(KEY, b"4"))).revision  # and it goes on following
            await asyncio.wait_for(follower.wait_committed(rev2), 10)
            assert [KeyValue.FromString(kv).value for kv in follower.range(RangeReq(KEY)).kvs] == [b"4"]

    asyncio.run(go())


@pytest.mark.parametrize("newest, loaded, covered", [
    (0, 0, False),  # released, yet no checkpoint to be seen: a listing that missed it, never "nothing lost"
    (0, 40, False),
    (40, 40, True),  # the checkpoint loaded is the newest: what was released is in it
    (90, 40, False),  # a newer one released them: rebuild from it
])
def test_released_messages_count_as_covered_only_by_the_checkpoint_loaded(newest, loaded, covered):
    """A follower finding messages released before it read them skips them only if the checkpoint
    it loaded holds them. An empty checkpoint listing (seen as a standby that applied nothing for
    seconds and then refused to take over) must not read as 'no newer checkpoint'."""
    from types import SimpleNamespace

    async def newest_checkpoint_rev():
        return newest

    shard = SimpleNamespace(checkpoint_rev=loaded, journal=SimpleNamespace(newest_checkpoint_rev=newest_checkpoint_rev))
    assert asyncio.run(Store._covered_by_checkpoint(shard)(5, 9)) is covered
