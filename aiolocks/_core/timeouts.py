"""Checking ``timeout`` arguments and turning them into deadlines."""

from __future__ import annotations

import math
import time

__all__ = ["deadline_from", "check_timeout"]


def check_timeout(timeout: object, what: str = "timeout") -> float | None:
    """Return ``timeout`` as seconds (``None`` = wait forever) or raise a clear error.

    ``0`` tries once; ``inf`` is the same as ``None``; negative numbers, NaN,
    booleans and non-numbers are refused before any I/O.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"{what} must be a number of seconds or None, got {type(timeout).__name__} {timeout!r}"
        )
    value = float(timeout)
    if math.isnan(value):
        raise ValueError(f"{what} must be a number of seconds or None, not NaN")
    if value < 0:
        raise ValueError(f"{what} must be >= 0 seconds (0 tries once), got {timeout!r}")
    if math.isinf(value):
        return None
    return value


def deadline_from(timeout: float | None) -> float | None:
    """Absolute ``time.monotonic()`` deadline for a checked timeout."""
    if timeout is None:
        return None
    return time.monotonic() + timeout
