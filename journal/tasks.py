"""Stopping tasks that await NATS.

On Python 3.11, ``asyncio.wait_for`` hands back the inner result when a cancellation arrives
in the same loop pass as that result, and the cancellation is lost (3.12 reimplemented
``wait_for`` on ``asyncio.timeout`` and keeps it). nats-py awaits every fetch, request and
``next_msg`` that way. A task cancelled while it waits on NATS can therefore go on running:
a follow loop goes on following, a standby's lease poll goes on polling, and whoever
awaits their end waits for ever. Seen in CI: a standby that had just taken the writer lease
never took over, its journal-follow tasks having swallowed the cancel meant to stop them.

``cancel_and_wait`` cancels again until the task has really ended. Our own timeouts use
``asyncio.timeout`` instead of ``wait_for``: it runs the awaited call in the caller's task, so
there is no inner result to hand back in place of the cancel.
"""
from __future__ import annotations

import asyncio

RECANCEL_S = 0.5  # how long a cancelled task has to end (its own clean-up) before it is cancelled again


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel ``tasks`` (None ones are passed over) and return once every one has ended,
    cancelling those still running again every RECANCEL_S. What they raised is theirs to
    report (``task.exception()``): it is not raised here. Cancelled while waiting, this cancels
    them once more and raises."""
    given = [t for t in tasks if t is not None]
    for task in given:
        task.cancel()
    pending = {t for t in given if not t.done()}
    try:
        while pending:
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
            for task in pending:
                task.cancel()
    except asyncio.CancelledError:
        for task in pending:
            task.cancel()
        raise
    await asyncio.gather(*given, return_exceptions=True)  # all done: only marks their exceptions retrieved


def unheard(fut: asyncio.Future) -> None:
    """A done callback for a task whose failure is nobody else's to read (its waiters may all be
    gone, or it is reported otherwise): its exception marked retrieved, so asyncio does not log it
    as never retrieved when the task is dropped."""
    if not fut.cancelled():
        fut.exception()


async def together(*aws):
    """Await ``aws`` at once; their results, in order. The first to fail ends the others
    (``cancel_and_wait``) and its own exception is raised, not an ExceptionGroup: callers answer
    each kind of failure in its own words."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        await cancel_and_wait(*tasks)
        raise
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    if failed:
        await cancel_and_wait(*pending)
        raise failed[0].exception()
    return [t.result() for t in tasks]


def awaiting(task: asyncio.Future) -> str:
    """Where ``task`` waits: its chain of awaits, outermost first, one ``file:line function``
    each (what a stuck stop reports; a task's own ``get_stack`` shows its outer frame only)."""
    parts = []
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:  # finished, or not a coroutine (a future, an awaitable object)
            break
        where = "/".join(frame.f_code.co_filename.rsplit("/", 2)[-2:])  # package/module.py
        parts.append(f"{where}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(parts) or repr(task)
