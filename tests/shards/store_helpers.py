"""Helpers to run a Store in-process on a temporary data dir."""
from __future__ import annotations

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
