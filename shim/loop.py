"""Which event loop the server runs on: uvloop (libuv, its loop machinery in C) by default,
or the standard library's asyncio loop (--event-loop asyncio)."""
from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
EVENT_LOOPS = ("uvloop", "asyncio")


def default_event_loop() -> str:
    """uvloop where it is installed (a dependency, except where uvloop does not run)."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def run(main: Coroutine[Any, Any, T], event_loop: str) -> T:
    """asyncio.run(main) on the chosen loop."""
    if event_loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
