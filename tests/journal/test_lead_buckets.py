"""Which bucket streams a writer leads from its own NATS server (``JetStreamLog._lead_buckets``).

The writer of a whole prefix moves its buckets' leaders (meta, writer lease, members) to its NATS
server, so losing another server never leaves its lease renewals waiting on an election. Under
``shardetcd cluster`` those buckets are shared by every partition's writer (one lease key each), each
perhaps on another NATS server: each moving them to its own would hand them back and forth every
check, an election each time, so a partition's writer leaves them where they are."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from journal import jetstream
from journal.jetstream import JetStreamConfig, JetStreamLog, writer_bucket_streams
from journal.leadership import KEY


class _Log(JetStreamLog):
    """A log whose NATS answers that every stream is led from n1, with a current replica on n0,
    the server this process is connected to; it records the leadership moves asked."""

    leading_server = "n0"

    def __init__(self) -> None:
        super().__init__(JetStreamConfig(urls=("nats://127.0.0.1:1",), prefix="p"))
        self.moved: list[str] = []

        async def stream_info(name: str):
            return SimpleNamespace(config=SimpleNamespace(name=name), cluster=SimpleNamespace(
                leader="n1", replicas=[SimpleNamespace(name="n0", current=True, offline=False)]))

        self.js = SimpleNamespace(stream_info=stream_info)

    async def hand_leadership(self, stream: str, server: str) -> str | None:
        self.moved.append(stream)
        return None


def _moved_while_writing(lease_key: str, took_over: bool = False, for_s: float = 0.2) -> list[str]:
    async def go() -> list[str]:
        log = _Log()
        log.write_under(SimpleNamespace(revision=7, key=lease_key, sure=lambda: True), took_over=took_over)
        await asyncio.sleep(for_s)  # many checks, STREAM_CHECK_S being 0.01
        await log.close()
        return log.moved

    return asyncio.run(go())


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch):
    monkeypatch.setattr(jetstream, "STREAM_CHECK_S", 0.01)


def test_the_writer_of_a_whole_prefix_leads_its_buckets_from_its_nats_server():
    moved = _moved_while_writing(KEY)
    # each asked once: a move not seen taken is asked again only after LEAD_AGAIN_S
    assert sorted(moved) == sorted(writer_bucket_streams("p")), moved


def test_a_partitions_writer_leaves_the_buckets_it_shares_with_the_other_partitions_alone():
    assert _moved_while_writing("main") == []


def test_a_start_moves_them_at_once_and_a_takeover_at_its_first_stream_check(monkeypatch):
    """At a start the buckets are moved before it serves, as its journals are (a move later is an
    election while other processes use them: a second writer's refused start saw one); a takeover's
    first writes are not to wait on elections, so its stream check moves them."""
    monkeypatch.setattr(jetstream, "STREAM_CHECK_S", 30.0)
    assert sorted(_moved_while_writing(KEY, for_s=0.1)) == sorted(writer_bucket_streams("p"))
    assert _moved_while_writing(KEY, took_over=True, for_s=0.1) == []
