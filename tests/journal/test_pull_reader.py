"""journal.jetstream.PullReader on a real NATS server: a request brings no more bytes than it asks
for (the rest comes with the next), a message larger than that still comes (the reader asks for
more), a request ends as soon as nothing more is there rather than when its number is reached,
and an empty stream is nats-py's TimeoutError."""
from __future__ import annotations

import asyncio
import os

import pytest

from journal.jetstream import PullReader
from tests.nats_fixture import start_nats_cluster

SIZES = [1000, 3000, 5000, 20000, 1000]


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory):
    cluster = start_nats_cluster(tmp_path_factory.mktemp("nats"), size=1)
    yield cluster
    cluster.stop()


def on_stream(nats_server, body):
    """``body(nc, js, reader, subject)`` with a PullReader of a fresh stream of its own."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def main():
        nc = await nats.connect(servers=nats_server.urls.split(","))
        try:
            js = nc.jetstream()
            name = f"pull{os.urandom(4).hex()}"
            await js.add_stream(name=name, subjects=[f"{name}.x"])
            reader = await PullReader.open(js, nc, f"{name}.x", name, ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
            try:
                return await body(nc, js, reader, f"{name}.x")
            finally:
                await reader.close()
        finally:
            await nc.close()

    return asyncio.run(main())


def test_a_request_brings_what_fits_in_its_bytes_and_a_larger_message_still_comes(nats_server):
    async def body(nc, js, reader, subject):
        for size in SIZES:
            await js.publish(subject, b"x" * size)
        reader.max_bytes = 10_000  # (twice what NATS takes, 2 MB here, as opened)
        got = []
        while sum(len(b) for b in got) < len(SIZES):
            got.append([len(m.data) for m in await reader.fetch(batch=256, timeout=5)])
        return got, reader.max_bytes

    got, max_bytes = on_stream(nats_server, body)
    # 1000 + 3000 + 5000 and their headers fit in 10,000 bytes, 20,000 does not: asked for twice, then 4x
    assert got == [[1000, 3000, 5000], [20000, 1000]]
    assert max_bytes == 40_000


def test_a_request_ends_when_nothing_more_is_there_and_an_empty_one_is_a_timeout(nats_server):
    from nats.errors import TimeoutError as NatsTimeout

    async def body(nc, js, reader, subject):
        with pytest.raises(NatsTimeout):
            await reader.fetch(batch=256, timeout=0.5)

        async def later():
            await asyncio.sleep(0.3)
            await js.publish(subject, b"late")

        publishing = asyncio.ensure_future(later())
        # had it waited for its 256 messages or its 60 s, wait_for would have cancelled it
        msgs = await asyncio.wait_for(reader.fetch(batch=256, timeout=60), 20)
        await publishing
        return [m.data for m in msgs]

    assert on_stream(nats_server, body) == [b"late"]
