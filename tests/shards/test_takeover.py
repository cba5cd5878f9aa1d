"""A standby store taking over JetStream journals from a writer that is still running.

The writer being replaced (frozen, then resumed: its lease lapsed meanwhile) may store messages
after those the standby followed, and checkpoint and release its journals while the standby
reads them before fencing. What was released under that read is in no state the standby has: it
rebuilds from the newer checkpoint and takes over again, so every revision the old writer
stored is in the state it serves.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from journal.jetstream import JetStreamConfig
from proto.kv_pb2 import KeyValue
from shards.layout import load_layout
from shards.store import Store, StoreConfig
from shards.types import PutReq, RangeReq

KEY = b"/registry/pods/ns/k%03d"


def config(where, nats, **kwargs) -> StoreConfig:
    return StoreConfig(data_dir=where / "data", layout=load_layout(None), state_dir=where / "state",
                       jetstream=JetStreamConfig(urls=tuple(nats.urls.split(",")), prefix="takeover", replicas=1),
                       **kwargs)


async def followed_writes(writer: Store, standby: Store, keys: range, value: bytes) -> None:
    """The writer puts ``keys``; the standby follows its journals until it has them, then stops."""
    for i in keys:
        await writer.put(PutReq(KEY % i, value))
    following = asyncio.ensure_future(standby.follow_journals())
    await asyncio.wait_for(standby.wait_committed(writer.committed), 30)
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)


def test_a_takeover_whose_journal_is_released_under_its_read_rebuilds_and_loses_nothing(nats, tmp_path, caplog):
    async def go():
        writer = await Store.open(config(tmp_path / "w", nats))
        standby = await Store.open(config(tmp_path / "s", nats), follow=True)
        try:
            await followed_writes(writer, standby, range(20), b"before")
            for i in range(20, 40):  # stored after what the standby followed: its first fence is refused
                await writer.put(PutReq(KEY % i, b"after"))
            last = writer.committed
            pods = next(s for s in writer.shards if s.journal.stream.endswith("pods"))
            followed = next(s for s in standby.shards if s.journal.stream == pods.journal.stream).journal
            real_read, released = followed._read_range, []

            async def released_first(*args, **kwargs):  # the old writer's checkpoint lands as the read begins
                if not released:
                    pods.start_checkpoint(writer.committed, writer.compact_rev)
                    await pods.checkpoint_task
                    released.append(pods.checkpoint_rev)
                return await real_read(*args, **kwargs)

            followed._read_range = released_first
            rev = await asyncio.wait_for(standby.take_over(), 60)
            assert released == [last] and rev == last
            assert "journal released under the takeover's read" in caplog.text
            got = standby.range(RangeReq(KEY % 0, KEY % 999))
            assert [KeyValue.FromString(kv).key for kv in got.kvs] == [KEY % i for i in range(40)]
            assert (await standby.put(PutReq(KEY % 40, b"new writer"))).revision == last + 1
        finally:
            await standby.close()
            await writer.close()

    asyncio.run(go())


def test_a_replaced_writer_resumed_before_it_noticed_does_not_announce_itself_over_the_new_one(nats):
    """Followers send their writes where the meta bucket's writer record says the writer serves. A
    writer frozen after its lease lapsed and its journals were taken over, resumed before it
    noticed, must not write its record over the new writer's (which is said once, at takeover):
    every follower's writes then went to a writer about to fail-stop, for good. It stops instead."""
    from types import SimpleNamespace

    from journal.errors import JournalFenced
    from journal.jetstream import JetStreamLog
    from shim.follower import writer_key
    from shim.server import announce_writer

    async def go():
        log = await JetStreamLog(JetStreamConfig(urls=tuple(nats.urls.split(",")), prefix="announce",
                                                 replicas=1)).connect()
        try:
            def writer(epoch: int, port: int):
                log.epoch = epoch
                return (SimpleNamespace(log=log, key="writer"), SimpleNamespace(member_id=port, forward_secret="s"),
                        SimpleNamespace(client_urls=(f"http://127.0.0.1:{port}",), name=f"w{port}"))

            async def serving() -> int:
                return json.loads(await log.get_meta(writer_key("writer")))["member_id"]

            await announce_writer(*writer(7, 1001))
            await announce_writer(*writer(9, 1002))  # took over
            with pytest.raises(JournalFenced):
                await announce_writer(*writer(7, 1001))  # the old one, resumed
            assert await serving() == 1002
            await announce_writer(*writer(9, 1002))  # the same writer again (its lease taken again)
            await announce_writer(*writer(12, 1003))
            assert await serving() == 1003
        finally:
            await log.close()

    asyncio.run(go())


def test_a_replaced_writers_late_acknowledged_revision_does_not_set_the_new_writers_back(nats, tmp_path):
    """A writer publishes the revision it acknowledged up to, once a second, for later starts to
    tell acknowledged records that are gone from records never acknowledged. A writer replaced
    while it still runs publishes its own, lower, revision after the new writer's: a start then
    checked the journals only up to it (the new writer publishes again only once it commits more)."""
    from shards.store import acknowledged_key

    async def go():
        writer = await Store.open(config(tmp_path / "w", nats))
        standby = await Store.open(config(tmp_path / "s", nats), follow=True)
        key = acknowledged_key(writer.config.layout)
        try:
            await followed_writes(writer, standby, range(5), b"old writer")
            old = writer.committed
            await standby.take_over()
            for i in range(5, 8):
                await standby.put(PutReq(KEY % i, b"new writer"))
            await standby._publish_committed()
            assert int(await standby.log.get_meta(key)) == standby.committed > old
            await writer._publish_committed()  # the old writer, late
            assert int(await standby.log.get_meta(key)) == standby.committed
        finally:
            await standby.close()
            await writer.close()

    asyncio.run(go())
