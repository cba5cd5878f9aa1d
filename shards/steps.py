"""Work that may take long, as generators that yield between bounded steps.

A request whose work grows with the data (a compare or delete over a large
range, a large read) is written as a generator: each ``yield`` marks a point
where the store may let the event loop serve others before going on
(``Store._run`` for writes, ``Store.range_async`` for reads).  ``drain`` runs
such a generator at once, for callers that must not wait.
"""
from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]


def drain(steps: Steps[T]) -> T:
    """Run a generator of steps to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
