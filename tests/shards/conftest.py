"""Fixtures for the shard tests."""
from __future__ import annotations

import asyncio

import pytest


@pytest.fixture
def run():
    """Run a coroutine to completion on a fresh event loop."""
    return lambda coro: asyncio.run(coro)
