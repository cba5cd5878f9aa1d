"""A standby's start on JetStream journals whose writer checkpoints, and so releases them, between
the start's fetch of the checkpoints and its read of the journals (tests/shards/test_follow_start.py
has the same decisions on journals of its own making)."""
from __future__ import annotations

import asyncio

from journal.jetstream import JetStreamConfig, JetStreamJournal
from proto.kv_pb2 import KeyValue
from shards.layout import load_layout
from shards.store import Store, StoreConfig
from shards.types import PutReq, RangeReq

KEY = b"/registry/pods/ns/k%03d"


def config(where, nats) -> StoreConfig:
    return StoreConfig(data_dir=where / "data", layout=load_layout(None), state_dir=where / "state",
                       jetstream=JetStreamConfig(urls=tuple(nats.urls.split(",")), prefix="followstart", replicas=1))


async def checkpoint(shard, store: Store) -> None:
    shard.start_checkpoint(store.committed, store.compact_rev)
    await shard.checkpoint_task


def test_a_standby_whose_journal_is_released_down_to_a_fence_loads_the_newer_checkpoint(nats, tmp_path, monkeypatch,
                                                                                       caplog):
    """A release purges what a checkpoint covers but the stream's newest message, here the fence a
    writer publishes when it takes its lapsed lease again: the standby's read finds no record, and
    the writes between the checkpoint it fetched and the newer one are in nothing it read. It must
    fetch the newer checkpoint; it took the read as whole, and then refused to start or stood by
    without those writes."""
    async def go():
        writer = await Store.open(config(tmp_path / "w", nats))
        standby = None
        try:
            pods = next(s for s in writer.shards if s.journal.stream.endswith("pods"))
            for i in range(10):
                await writer.put(PutReq(KEY % i, b"before"))
            await checkpoint(pods, writer)  # the checkpoint the standby fetches
            real_catch_up, moved = JetStreamJournal.catch_up, []

            async def writer_moves_on(journal):  # between the standby's fetch and its read of the pods journal
                if journal.following and journal.stream == pods.journal.stream and not moved:
                    for i in range(10, 20):
                        await writer.put(PutReq(KEY % i, b"after"))
                    await writer.put(PutReq(b"/registry/configmaps/ns/c", b"elsewhere"))  # (a release keeps
                    await writer.fence_journals()  # records tagged with the checkpoint's revision itself)
                    await checkpoint(pods, writer)  # releases every message but the newest: the fence
                    moved.append(writer.committed)
                return await real_catch_up(journal)

            monkeypatch.setattr(JetStreamJournal, "catch_up", writer_moves_on)
            standby = await Store.open(config(tmp_path / "s", nats), follow=True)
            assert moved == [writer.committed]
            assert "released past the checkpoint fetched" in caplog.text and "no record read" in caplog.text
            following = asyncio.ensure_future(standby.follow_journals())
            await asyncio.wait_for(standby.wait_committed(writer.committed), 30)
            got = standby.range(RangeReq(KEY % 0, KEY % 999))
            assert [KeyValue.FromString(kv).key for kv in got.kvs] == [KEY % i for i in range(20)]
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        finally:
            if standby is not None:
                await standby.close()
            await writer.close()

    asyncio.run(go())
