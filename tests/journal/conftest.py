"""Shared fixtures for the journal tests (sync tests drive async code with asyncio.run)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from journal import Journal, JournalConfig, failpoints


@pytest.fixture(autouse=True)
def _no_failpoints():
    failpoints.disarm()
    yield
    failpoints.disarm()


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.fixture
def write_journal():
    """write_journal(directory, [(rtype, rev, payload), ...], config) -> Journal (closed)."""

    def write(directory: Path, items, config: JournalConfig = JournalConfig()) -> Journal:
        async def go() -> Journal:
            journal = Journal.open(directory, config)
            await journal.start()
            for rtype, rev, payload in items:
                journal.append(rtype, rev, payload)
            await journal.sync()
            await journal.close()
            return journal

        return asyncio.run(go())

    return write


@pytest.fixture
def count_fdatasync(monkeypatch):
    """Counts os.fdatasync calls (still performing them); returns a one-element list."""
    calls = [0]
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls[0] += 1
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


def items(count: int, payload_bytes: int = 16, first_rev: int = 1) -> list[tuple[int, int, bytes]]:
    return [(1 + i % 3, first_rev + i, bytes([i % 256]) * payload_bytes) for i in range(count)]


@pytest.fixture
def make_items():
    return items


def read_all(directory: Path, config: JournalConfig = JournalConfig(), after_rev: int = 0):
    return [(r.rtype, r.rev, r.payload) for r in Journal.open(directory, config).records(after_rev)]


@pytest.fixture
def reopen_records():
    """reopen_records(directory, config=..., after_rev=0) -> [(rtype, rev, payload)] after a fresh open()."""
    return read_all
