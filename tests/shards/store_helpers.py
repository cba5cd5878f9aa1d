"""Helpers to run a Store in-process on a temporary data dir."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from journal import JournalConfig
from shards.layout import load_layout
from shards.store import Store, StoreConfig


def make_config(tmp_path: Path, **kw) -> StoreConfig:
    journal = kw.pop("journal", JournalConfig(segment_bytes_max=16 * 1024))
    return StoreConfig(
        data_dir=tmp_path / "data", layout=load_layout(None), state_dir=tmp_path / "state", journal=journal, **kw
    )


async def open_store(tmp_path: Path, **kw) -> Store:
    return await Store.open(make_config(tmp_path, **kw))


@contextlib.asynccontextmanager
async def following(tmp_path: Path, writer: Store, **kw) -> AsyncIterator[Store]:
    """A store following ``writer``'s journals on this machine (data under ``tmp_path``), its
    following running; closed afterwards (the writer too)."""
    from journal.tail import LocalFollowLog

    log = LocalFollowLog(writer.datadir.path, load_layout(None).names)
    follower = await Store.open(StoreConfig(data_dir=tmp_path / "data", layout=load_layout(None),
                                            state_dir=tmp_path / "state", **kw), log=log, follow=True)
    task = asyncio.ensure_future(follower.follow_journals())
    try:
        yield follower
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await follower.close()
        await log.close()
        await writer.close()


def count_under(store: Store, key: bytes) -> int:
    """Keys ``store`` holds under ``key``'s prefix (up to a ``%`` in it: a key pattern will do)."""
    from shards.types import RangeReq

    prefix = key.split(b"%")[0]
    return store.range(RangeReq(prefix, prefix[:-1] + bytes([prefix[-1] + 1]), count_only=True)).count
