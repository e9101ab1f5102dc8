"""Skewing this process's clocks as aiolocks sees them, to test clock-independence.

``once``, count-down latches and barriers read the time through
``aiolocks._core.clock``, which adds an offset kept in a context variable.
:func:`skewed_clock` sets that offset for the code inside the ``with`` block
and every task started from it (tasks copy the context they start in), so
two tasks of one test can act as two processes whose clocks disagree:

    with skewed_clock(wall=-90.0, monotonic=3600.0):
        task = asyncio.create_task(replica())  # sees clocks 90 s behind, 1 h ahead

The servers' clocks (and ``memory://``'s, the event loop's) are unaffected,
as a real clock skew between machines would leave them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from .._core.clock import OFFSETS

__all__ = ["skewed_clock"]


@contextmanager
def skewed_clock(*, wall: float = 0.0, monotonic: float = 0.0) -> Iterator[None]:
    """Offset (seconds) the wall and monotonic clocks aiolocks reads in this context.

    Offsets add to any already in effect; both are restored on exit.

    :raises ValueError: an offset that is not a finite number.
    """
    for what, value in (("wall", wall), ("monotonic", monotonic)):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"{what} offset must be a finite number of seconds, got {value!r}")
    old_wall, old_monotonic = OFFSETS.get()
    token = OFFSETS.set((old_wall + wall, old_monotonic + monotonic))
    try:
        yield
    finally:
        OFFSETS.reset(token)
