"""The garbage collector's policy while a store is open (shards/collector.py)."""
from __future__ import annotations

import gc

from shards import collector
from shards.state import ShardState
from shards.types import PutReq
from tests.shards.store_helpers import open_store


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_survivors_of_a_full_collection_are_frozen_while_a_store_is_open(tmp_path, run):
    """With a store open, what a full collection leaves alive is frozen (the next one does
    not walk it), garbage is still collected, and the last store to close thaws it all."""
    async def go():
        store = await open_store(tmp_path)
        await store.put(PutReq(b"/registry/pods/ns/a", b"v"))
        index = store.states[store.router.shard_for_key(b"/registry/pods/ns/a")].index
        gc.collect()
        assert gc.get_freeze_count() > 0
        assert not any(o is index for o in gc.get_objects())  # frozen: out of the collector's sight
        Cycle()  # garbage made after the freeze is collected as ever
        assert gc.collect() >= 1
        second = await open_store(tmp_path / "second")
        await store.close()
        assert gc.get_freeze_count() > 0  # one store still open
        await second.close()
        assert gc.get_freeze_count() == 0 and Cycle not in [type(o) for o in gc.get_objects()]

    run(go())


def test_a_store_that_fails_to_open_leaves_no_policy_behind(tmp_path, run, monkeypatch):
    def failing(self, main, payload, key_lease):
        raise RuntimeError("state store broke")

    async def go():
        store = await open_store(tmp_path)
        await store.put(PutReq(b"/registry/pods/ns/a", b"v"))
        await store.close()
        callbacks = list(gc.callbacks)
        monkeypatch.setattr(ShardState, "load_write", failing)
        try:
            await open_store(tmp_path)
        except RuntimeError:
            pass
        assert gc.callbacks == callbacks and gc.get_freeze_count() == 0

    run(go())


def test_paused_turns_the_collector_off_and_freezes_a_large_recovery(monkeypatch):
    frozen = gc.get_freeze_count()
    with collector.paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == frozen  # a small one: nothing frozen
    monkeypatch.setattr(collector, "FREEZE_AFTER", -1)  # as if it were large
    with collector.paused():
        keep = [[] for _ in range(10)]
    assert gc.isenabled() and gc.get_freeze_count() > frozen
    assert not any(o is keep[0] for o in gc.get_objects())
    gc.unfreeze()
