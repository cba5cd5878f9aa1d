"""What every task and thread of this process is doing, as text (``--enable-pprof``: ``/debug/tasks``).

etcd's ``--enable-pprof`` serves the Go runtime's profiles, among them every goroutine's stack, the
first thing to read when a server hangs. Here the work runs as asyncio tasks on one event loop
(and a few threads): a suspended task's own stack ends at its outermost coroutine, so each task is
shown down the chain of what it awaits (``cr_await``), to the future it waits on.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from types import FrameType


def _awaited_frames(coro) -> tuple[list[FrameType], object]:
    """The frames of ``coro`` and of what it awaits, outermost first, and the last awaitable (a
    future, usually) that has no frame."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
    return frames, coro


def _frame_lines(frames: list[FrameType]) -> list[str]:
    return traceback.format_list(traceback.StackSummary.extract((f, f.f_lineno) for f in frames))


def tasks_text(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every asyncio task of ``loop`` (the running one) down to what it waits on, then every thread's stack."""
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    out = [f"{len(tasks)} asyncio tasks\n"]
    for task in tasks:
        coro = task.get_coro()
        out.append(f"\ntask {task.get_name()}: {getattr(coro, '__qualname__', coro)!s}\n")
        frames, waits_on = _awaited_frames(coro)
        out.extend(_frame_lines(frames))
        if waits_on is not None:  # asyncio's C future iterator shows nothing of its future
            what = "a future" if type(waits_on).__name__ == "FutureIter" else repr(waits_on)[:300]
            out.append(f"  waiting on {what}\n")
    threads = {t.ident: t.name for t in threading.enumerate()}
    stacks = sys._current_frames()  # noqa: SLF001 - the documented way to every thread's stack
    out.append(f"\n{len(stacks)} threads\n")
    for ident, frame in sorted(stacks.items(), key=lambda kv: threads.get(kv[0], "")):
        out.append(f"\nthread {threads.get(ident, ident)}\n")
        out.extend(traceback.format_stack(frame))
    return "".join(out)
