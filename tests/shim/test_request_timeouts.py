"""The request path's timeouts keep a cancel that arrives in the same loop pass as the answer.

Python 3.11's ``asyncio.wait_for`` returns the answer then and drops the cancel
(journal/tasks.py): a call being cancelled (its client gone, the server stopping) ran on
to its end. On ``wait_for`` the leader probe, the keep-alive and the token catch-up failed
this test (the read's lease confirm, which awaits a shielded renewal, kept its cancel even
then); on ``asyncio.timeout`` every one is cancelled.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tests.lease_log import LeaseLog
from journal.leadership import WriterLease
from shards.tokens import SimpleTokens
from shim.follower import KeepAlives, TokenCatchUp

TIMEOUT_S = 30.0  # never reached: every answer comes at once


async def cancelled_as_answered(call, answer) -> None:
    """Start ``call()``, let it wait, then give it its answer and cancel it in one loop pass:
    the call must end cancelled."""
    task = asyncio.ensure_future(call())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    answer()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def run(body) -> None:
    asyncio.run(asyncio.wait_for(body(), 10))  # a deadline for a hang, not a timing


def test_a_leader_probe():
    async def body():
        answer = asyncio.get_running_loop().create_future()
        lease = WriterLease(LeaseLog())

        async def holder():
            return await answer

        lease.holder = holder
        await cancelled_as_answered(lambda: lease.held(TIMEOUT_S), lambda: answer.set_result("writer"))

    run(body)


def test_a_read_confirming_the_writer_lease():
    async def body():
        renewal = asyncio.get_running_loop().create_future()
        lease = WriterLease(LeaseLog())
        lease.renew_now = lambda: renewal
        await cancelled_as_answered(lambda: lease.confirm(TIMEOUT_S), lambda: renewal.set_result(None))

    run(body)


def test_a_follower_keep_alive_waiting_for_the_writer():
    async def body():
        keepalives = KeepAlives(SimpleNamespace(timeout_s=TIMEOUT_S))
        keepalives._task = asyncio.get_running_loop().create_future()  # no stream to the writer in this test

        def answer():
            for waiter in keepalives.waiting.pop(7):
                waiter.set_result(60)

        await cancelled_as_answered(lambda: keepalives.keepalive(7), answer)
        keepalives._task.cancel()

    run(body)


def test_a_follower_catching_up_for_a_token():
    async def body():
        caught_up = asyncio.get_running_loop().create_future()
        store = SimpleNamespace(auth=SimpleNamespace(tokens=SimpleTokens()))
        catch_up = TokenCatchUp(SimpleNamespace(timeout_s=TIMEOUT_S), SimpleNamespace(store=store))

        async def wait_for_the_writer():
            await caught_up

        catch_up._catch_up = wait_for_the_writer
        await cancelled_as_answered(lambda: catch_up.learned("abcdefghijklmnop.12"), lambda: caught_up.set_result(None))

    run(body)
