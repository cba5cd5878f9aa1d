"""cancel_and_wait: a cancellation lost inside what a task awaits does not leave the task running;
together: awaits run at once, the first failure ends the rest and is raised as itself."""
import asyncio

import pytest

from journal.tasks import awaiting, cancel_and_wait, together


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))  # a deadline for a hang, not a timing


def test_a_follow_loop_that_loses_its_cancel_in_wait_for_is_ended():
    """The shape of nats-py's fetch: a loop over wait_for(queue.get()). A message arriving in
    the same loop pass as the cancel makes Python 3.11's wait_for return it and drop the
    cancel; the loop goes on (on 3.12 and later the cancel is kept: the test still holds)."""
    async def main():
        queue: asyncio.Queue = asyncio.Queue()
        received = []

        async def follow():
            while True:
                try:
                    received.append(await asyncio.wait_for(queue.get(), 30))
                except TimeoutError:
                    pass

        task = asyncio.create_task(follow())
        await asyncio.sleep(0)
        queue.put_nowait("m1")
        await cancel_and_wait(task)
        assert task.cancelled()
        queue.put_nowait("m2")
        await asyncio.sleep(0.01)
        assert "m2" not in received

    run(main())


def test_a_task_that_swallows_cancels_is_cancelled_until_it_ends_and_its_clean_up_runs():
    async def main():
        swallowed, cleaned = [], []

        async def stubborn():
            try:
                while True:
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        swallowed.append(1)
                        if len(swallowed) == 3:
                            raise
            finally:
                await asyncio.sleep(0)  # a clean-up that awaits, as unsubscribing does
                cleaned.append(1)

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        await cancel_and_wait(task, None)
        assert task.cancelled() and len(swallowed) == 3 and cleaned == [1]

    run(main())


def test_what_the_tasks_raised_is_not_raised_by_cancel_and_wait():
    async def main():
        async def fails():
            raise ValueError("theirs")

        async def sleeps():
            await asyncio.sleep(30)

        failing, sleeping = asyncio.create_task(fails()), asyncio.create_task(sleeps())
        await asyncio.sleep(0)
        await cancel_and_wait(failing, sleeping)
        assert isinstance(failing.exception(), ValueError) and sleeping.cancelled()

    run(main())


def test_cancelled_while_waiting_it_cancels_them_again_and_raises():
    async def main():
        count = []

        async def stubborn():
            while len(count) < 3:
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    count.append(1)

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(cancel_and_wait(task))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)
        assert len(count) == 2 and not task.done()  # the first cancel and the one on the way out
        task.cancel()
        await task  # its third swallowed cancel ends its loop

    run(main())


def test_awaiting_names_each_coroutine_a_task_waits_in_outermost_first():
    async def main():
        gate = asyncio.Event()

        async def inner():
            await gate.wait()

        async def outer():
            await inner()

        task = asyncio.create_task(outer(), name="stuck")
        await asyncio.sleep(0)
        chain = awaiting(task)
        gate.set()
        await task
        names = [part.split(" ")[-1] for part in chain.split(" > ")]
        assert names[:3] == ["outer", "inner", "wait"], chain  # Event.wait: the await it is parked in
        assert chain.startswith("journal/test_tasks.py:"), chain
        assert awaiting(task) == repr(task)  # ended: nothing to walk

    run(main())


def test_together_runs_the_awaits_at_once_and_gives_their_results_in_order():
    async def main():
        b_ran = asyncio.Event()

        async def a():
            await b_ran.wait()  # awaited one after the other, this would never end
            return "a"

        async def b():
            b_ran.set()
            return "b"

        assert await together(a(), b(), asyncio.sleep(0, "c")) == ["a", "b", "c"]

    run(main())


def test_together_raises_the_first_failure_as_itself_and_ends_the_rest():
    async def main():
        ended = []

        async def slow():
            try:
                await asyncio.sleep(30)
            finally:
                ended.append("slow")

        async def fails():
            await asyncio.sleep(0)
            raise KeyError("refused")

        with pytest.raises(KeyError, match="refused"):  # not an ExceptionGroup
            await together(slow(), fails())
        assert ended == ["slow"]  # cancelled and finished before together returned

    run(main())


def test_together_cancelled_cancels_every_await():
    async def main():
        ended = []

        async def slow(name):
            try:
                await asyncio.sleep(30)
            finally:
                ended.append(name)

        task = asyncio.create_task(together(slow("a"), slow("b")))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(ended) == ["a", "b"]

    run(main())
