"""A JetStream writer's close ends even when the cancel of its acknowledged-revision publisher is
lost inside a NATS request, as Python 3.11's ``wait_for`` loses one (journal/tasks.py). Seen in CI's
chaos round: a writer deposed by pause-writer hung in its stop, until its watchdog ended it."""
from __future__ import annotations

import asyncio

from shards import store as store_module
from shards.store import Store
from shards.types import PutReq

from tests.shards.test_follow_start_jetstream import config


def test_a_writer_closes_when_its_publisher_swallows_the_cancel(nats, tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "ACKNOWLEDGED_EVERY_S", 0.01)

    async def go():
        writer = await Store.open(config(tmp_path, nats))
        swallowed, publishing = [], asyncio.Event()
        real_raise_meta = writer.log.raise_meta

        async def raise_meta_losing_the_cancel(key, value):
            if swallowed:
                return await real_raise_meta(key, value)
            publishing.set()
            try:
                await asyncio.sleep(3600)  # a NATS request, under wait_for
            except asyncio.CancelledError:
                swallowed.append(value)  # its answer came in the cancel's loop pass: the cancel is lost

        writer.log.raise_meta = raise_meta_losing_the_cancel
        await writer.put(PutReq(b"/registry/pods/ns/a", b"v"))  # a revision to publish
        await asyncio.wait_for(publishing.wait(), 30)
        await asyncio.wait_for(writer.close(), 30)  # hung for ever: the publisher went on publishing
        assert swallowed

    asyncio.run(go())
