"""An in-process resync cancelled after it loaded the new state but before it swapped it in
(a standby's takeover cancels the follow task): the loaded state's files go, as they do when
loading fails, instead of staying on tmpfs."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from shards import recovery, resync


class FakeState:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("waiting_on", ["reads", "compaction"])
def test_a_resync_cancelled_before_the_swap_closes_the_state_it_loaded(monkeypatch, waiting_on):
    shadow = SimpleNamespace(states=[FakeState(), FakeState()], _compaction=None, follower=None)

    async def loaded(store):
        return object()

    monkeypatch.setattr(resync, "_shadow", lambda store: shadow)
    monkeypatch.setattr(recovery, "recover_to_follow", loaded)

    async def run() -> None:
        never = asyncio.Event()

        async def stubborn() -> None:  # a compaction that finishes its step after the cancel: resync waits
            try:
                await never.wait()
            except asyncio.CancelledError:
                await never.wait()

        compaction = asyncio.ensure_future(stubborn()) if waiting_on == "compaction" else None
        store = SimpleNamespace(committed=7, _compaction=compaction, _reads=1 if waiting_on == "reads" else 0,
                                _reads_done=asyncio.Event())
        task = asyncio.ensure_future(resync.resync(store, RuntimeError("gap")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()  # waiting before the swap
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        if compaction is not None:
            compaction.cancel()

    asyncio.run(run())
    assert all(s.closed for s in shadow.states)
