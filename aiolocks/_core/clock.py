"""The clocks of the coordination recipes (``once``, latches, barriers).

They read ``time.monotonic()`` and ``time.time()`` plus an offset held in a
context variable, so a test can give one "process" (a task and the tasks it
starts) a clock that is off by some seconds: :func:`aiolocks.testing.skewed_clock`.
Nothing else sets the offset; outside such a test it is 0.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

__all__ = ["OFFSETS", "monotonic", "wall"]

#: (wall offset, monotonic offset) in seconds for the current context
OFFSETS: ContextVar[tuple[float, float]] = ContextVar("aiolocks_clock_offsets", default=(0.0, 0.0))


def monotonic() -> float:
    """``time.monotonic()`` as this context sees it."""
    return time.monotonic() + OFFSETS.get()[1]


def wall() -> float:
    """``time.time()`` as this context sees it."""
    return time.time() + OFFSETS.get()[0]
