"""``list_streams``: every stream, also one electing a leader (real three-server NATS), and every page."""
from __future__ import annotations

import asyncio
import json

import pytest

from journal.errors import JournalFailed
from journal.jetstream import list_streams, of_prefix
from tests.nats_fixture import start_nats_cluster


def test_a_stream_electing_a_leader_is_listed(tmp_path):
    """JetStream's stream list leaves out a stream whose leader is being elected (after a server
    restart, or a leadership move) and names it only under "missing"; a check over such a list
    (``journal verify``, ``cluster``'s partition-left-out check) passed over that stream. Each
    round moves a stream's leader and lists at once: every stream is there, with its messages."""
    import nats
    import nats.errors
    import nats.js.errors

    cluster = start_nats_cluster(tmp_path, size=3)

    async def go():
        nc = await nats.connect(cluster.urls.split(","))
        try:
            js = nc.jetstream(timeout=10.0)
            names = [f"s{n}" for n in range(4)]
            for name in names:
                for attempt in range(5):  # a loaded machine's young cluster can take its time to answer
                    try:
                        await js.add_stream(name=name, subjects=[f"{name}.>"], num_replicas=3)  # the same again: ok
                        break
                    except nats.errors.TimeoutError:
                        if attempt == 4:
                            raise
                for _ in range(100):  # a new R3 stream answers once it has elected its leader
                    try:
                        await js.publish(f"{name}.x", b"1", stream=name)
                        break
                    except nats.js.errors.NoStreamResponseError:  # no responder: nothing was stored
                        await asyncio.sleep(0.1)
            rounds = []
            for name in names * 2:
                answer = json.loads((await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{name}", b"",
                                                      timeout=10)).data)
                assert answer.get("success"), answer
                rounds.append({i.config.name: i.state.messages for i in await list_streams(js)})
            return rounds
        finally:
            await nc.close()

    try:
        rounds = asyncio.run(go())
    finally:
        cluster.stop()
    assert rounds == [{"s0": 1, "s1": 1, "s2": 1, "s3": 1}] * 8, rounds


class Pages:
    """A JetStream context whose stream list answers from ``answers`` in turn (offset checked)."""
    _prefix = "$JS.API"
    _timeout = 1.0

    def __init__(self, answers):
        self.answers, self.asked = list(answers), []

    async def _api_request(self, subject, payload, timeout):
        assert subject == "$JS.API.STREAM.LIST"
        self.asked.append(json.loads(payload)["offset"])
        return self.answers.pop(0)


def info(name: str) -> dict:
    state = {"messages": 0, "bytes": 0, "first_seq": 0, "last_seq": 0, "consumer_count": 0}
    return {"config": {"name": name, "subjects": [f"{name}.>"]}, "state": state}


def test_every_page_is_read_and_a_list_with_a_stream_missing_is_asked_again():
    js = Pages([
        {"total": 3, "offset": 0, "streams": [info("a"), info("b")], "missing": ["c"]},  # c electing
        {"total": 3, "offset": 2, "streams": [], "missing": ["c"]},
        {"total": 3, "offset": 0, "streams": [info("a"), info("b")]},  # a page of two (JetStream's: 256)
        {"total": 3, "offset": 2, "streams": [info("c")]},
    ])
    got = asyncio.run(list_streams(js))
    assert [i.config.name for i in got] == ["a", "b", "c"]
    assert js.asked == [0, 2, 0, 2]


def test_a_stream_missing_past_the_deadline_fails_the_list():
    js = Pages([{"total": 1, "offset": 0, "streams": [], "missing": ["c"]}] * 100)
    with pytest.raises(JournalFailed, match=r"did not list streams \['c'\]"):
        asyncio.run(list_streams(js, deadline_s=0.3))


def test_only_a_wanted_stream_missing_is_waited_for():
    """A stream of another deployment whose only server is lost stays missing for good: a check
    of one prefix's streams neither waits for it nor fails on it, and still waits for its own."""
    lost = {"total": 3, "offset": 0, "streams": [info("p_a"), info("KV_p-meta")], "missing": ["other_x"]}
    js = Pages([lost, {"total": 3, "offset": 2, "streams": []}])
    got = asyncio.run(list_streams(js, deadline_s=5, wanted=of_prefix("p")))
    assert [i.config.name for i in got] == ["p_a", "KV_p-meta"] and js.asked == [0, 2]

    electing = {"total": 3, "offset": 0, "streams": [info("p_a")], "missing": ["other_x", "OBJ_p_a-checkpoints"]}
    js = Pages([electing, {"total": 3, "offset": 1, "streams": []},
                {"total": 3, "offset": 0, "streams": [info("p_a"), info("OBJ_p_a-checkpoints")], "missing": ["other_x"]},
                {"total": 3, "offset": 2, "streams": []}])
    got = asyncio.run(list_streams(js, deadline_s=5, wanted=of_prefix("p")))
    assert [i.config.name for i in got] == ["p_a", "OBJ_p_a-checkpoints"] and js.asked == [0, 1, 0, 2]


def test_a_prefix_owns_its_journals_and_buckets_only():
    mine = of_prefix("p")
    assert [n for n in ["p_pods", "OBJ_p_pods-checkpoints", "KV_p-meta", "KV_p-writer", "KV_p-members", "px_pods",
                        "p-x", "OBJ_px_a-checkpoints", "KV_px-meta", "other_p_a"] if mine(n)] == \
        ["p_pods", "OBJ_p_pods-checkpoints", "KV_p-meta", "KV_p-writer", "KV_p-members"]


def test_a_stream_missing_from_one_page_and_listed_by_the_next_is_listed_once():
    """The total counts the missing streams, so the page after one that missed a stream starts among
    what was already listed: a stream that answered by then came once under "missing" and once
    listed (verify reported it both unavailable and sound), and others came twice."""
    js = Pages([
        {"total": 3, "offset": 0, "streams": [info("a"), info("c")], "missing": ["b"]},
        {"total": 3, "offset": 2, "streams": [info("b"), info("c")]},  # b elected meanwhile
    ])
    got = asyncio.run(list_streams(js, deadline_s=5))
    assert sorted(i.config.name for i in got) == ["a", "b", "c"] and js.asked == [0, 2]
