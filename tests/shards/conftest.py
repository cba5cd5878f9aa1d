"""Fixtures for the shard tests."""
from __future__ import annotations

import asyncio

import pytest

from tests.nats_fixture import start_nats_cluster


@pytest.fixture
def run():
    """Run a coroutine to completion on a fresh event loop."""
    return lambda coro: asyncio.run(coro)


@pytest.fixture(scope="module")
def nats(tmp_path_factory):
    """One NATS server (JetStream) for a module's tests."""
    cluster = start_nats_cluster(tmp_path_factory.mktemp("nats"), size=1)
    yield cluster
    cluster.stop()
