"""Who may read the data: etcd keeps its data dir and everything in it to its own user (the
keyspace holds every Kubernetes Secret). Its modes and its warning were probed on etcd 3.5.1:
a data dir it creates is 0700 with every missing parent, its member dir 0700 and files 0600; an
existing data dir open to others is used, with the warning this file checks word for word."""
from __future__ import annotations

import asyncio
import logging
import stat

from journal import JournalConfig
from shards.layout import load_layout
from shards.store import Store, StoreConfig
from shards.types import PutReq


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def opened(data_dir, state_dir):
    async def go():
        store = await Store.open(StoreConfig(data_dir=data_dir, layout=load_layout(None), state_dir=state_dir,
                                             journal=JournalConfig(segment_bytes_max=16 * 1024),
                                             checkpoint_journal_bytes=8 * 1024))
        try:
            for i in range(200):  # past a segment and a checkpoint
                await store.put(PutReq(key=b"/registry/secrets/ns/s%d" % (i % 20), value=b"token" * 20))
            await asyncio.sleep(0.2)
            return {p.name: mode(p) for p in state_dir.iterdir() if p.is_dir()}
        finally:
            await store.close()

    return asyncio.run(go())


def test_a_new_data_dir_and_the_state_are_readable_by_this_user_only(tmp_path):
    data = tmp_path / "var" / "lib" / "shardetcd"
    states = opened(data, tmp_path / "state")
    assert [mode(p) for p in (tmp_path / "var", tmp_path / "var" / "lib", data)] == [0o700] * 3  # as MkdirAll 0700
    assert mode(data / "shards") == 0o700  # where the journals are, as etcd's member dir
    assert mode(tmp_path / "state") == 0o700
    assert states and set(states.values()) == {0o700}, states  # each shard's RocksDB state
    segments, checkpoints = list(data.glob("shards/*/journal/*.wal")), list(data.glob("shards/*/*.ckpt"))
    assert segments and checkpoints  # and their files, as etcd's WAL files and db: 0600
    assert {p.name: mode(p) for p in segments + checkpoints} == {p.name: 0o600 for p in segments + checkpoints}
    files = [p for p in data.rglob("*") if p.is_file()]  # meta.json, LOCK, the watermark, ...
    assert {"meta.json", "LOCK", "watermark"} <= {p.name for p in files}
    assert {str(p.relative_to(data)): mode(p) for p in files} == {str(p.relative_to(data)): 0o600 for p in files}


def test_an_existing_data_dir_open_to_others_is_used_with_etcds_warning(tmp_path, caplog):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    (data / "shards").mkdir(mode=0o755)  # as an earlier shardetcd left it
    (data / "shards").chmod(0o755)
    with caplog.at_level(logging.WARNING):
        opened(data, tmp_path / "state")
    assert mode(data) == 0o755  # the operator's choice, as etcd leaves it
    assert mode(data / "shards") == 0o700
    said = [r.getMessage() for r in caplog.records if "check file permission" in r.getMessage()]
    assert said == [f'check file permission error=directory "{data}" exist, but the permission is "drwxr-xr-x". '
                    'The recommended permission is "-rwx------" to prevent possible unprivileged access to the data']
