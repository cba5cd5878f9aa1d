"""Stopping tasks that await NATS.

On Python 3.11, ``asyncio.wait_for`` hands back the inner result when a cancellation arrives
in the same loop pass as that result, and the cancellation is lost (3.12 reimplemented
``wait_for`` on ``asyncio.timeout`` and keeps it). nats-py awaits every fetch, request and
``next_msg`` that way. A task cancelled while it waits on NATS can therefore go on running:
a follow loop goes on following, a standby's lease poll goes on polling, and whoever
awaits their end waits for ever. Seen in CI: a standby that had just taken the writer lease
never took over, its journal-follow tasks having swallowed the cancel meant to stop them.

``cancel_and_wait`` cancels again until the task has really ended.
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
