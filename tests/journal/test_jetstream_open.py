"""open_or_create: a bucket or stream found, or made and then found. Against real NATS servers
(made, found, refused): tests/integration/test_jetstream.py."""
from __future__ import annotations

import asyncio

import pytest
from nats.js.errors import NotFoundError

from journal import jetstream
from journal.errors import JournalUnreachable
from journal.jetstream import open_or_create


def made_but_unknown_for(times: int, asked: list[str]):
    """get/create of a stream that this connection's server does not know for ``times`` gets after
    its creation was acknowledged (on a NATS cluster, the stream reaches each server a little after
    the creation)."""
    made = []

    async def get():
        asked.append("get")
        if not made or asked.count("get") <= 1 + times:
            raise NotFoundError(code=404, err_code=10059, description="stream not found")
        return "info"

    async def create():
        asked.append("create")
        made.append(1)
        return "created"

    return get, create


def test_what_was_just_made_is_got_again_until_the_server_knows_it():
    asked: list[str] = []
    get, create = made_but_unknown_for(2, asked)
    assert asyncio.run(open_or_create("stream s", get, create, NotFoundError)) == "info"
    assert asked == ["get", "create", "get", "get", "get"]


def test_what_stays_unknown_after_its_creation_is_one_line(monkeypatch):
    monkeypatch.setattr(jetstream, "KNOWN_WITHIN_S", 0.3)
    get, create = made_but_unknown_for(10**6, [])
    with pytest.raises(JournalUnreachable, match=r"^JetStream created the stream s but did not find it 0.3 s later$"):
        asyncio.run(open_or_create("stream s", get, create, NotFoundError))


def test_what_exists_is_got_and_not_made():
    asked: list[str] = []

    async def get():
        asked.append("get")
        return "info"

    async def create():
        raise AssertionError("made although it exists")

    assert asyncio.run(open_or_create("stream s", get, create, NotFoundError)) == "info" and asked == ["get"]
