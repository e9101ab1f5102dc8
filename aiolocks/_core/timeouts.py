"""Checking ``timeout`` arguments and turning them into deadlines."""

from __future__ import annotations

import math
import time

__all__ = [
    "LEASE_TIME_RANGE",
    "SETTING_RANGE",
    "check_seconds",
    "check_timeout",
    "deadline_from",
]

#: ``lease_time`` (seconds), on every backend and for every lock: at least 10 ms
#: (the watchdog renews every third of it, and Redis counts whole milliseconds),
#: at most a day (a longer lease no longer bounds how long a crashed holder
#: blocks the others; Redis refuses expiry times far beyond it)
LEASE_TIME_RANGE: tuple[float, float] = (0.01, 86400.0)

#: ``connect_timeout``, ``request_timeout``, ``session_timeout`` (seconds): above
#: 0, at most an hour (ZooKeeper sends the session timeout as a 32-bit count of
#: milliseconds; a longer wait than an hour is a mistake, not a setting)
SETTING_RANGE: tuple[float, float] = (0.0, 3600.0)


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


def check_seconds(value: object, what: str, bounds: tuple[float, float]) -> float:
    """``value`` as seconds within ``bounds`` (``low`` excluded when it is 0), or ``ValueError``.

    The one check of every seconds option (:data:`LEASE_TIME_RANGE`,
    :data:`SETTING_RANGE`), keywords and URL query alike, so an out-of-range
    value fails here, before any I/O, and not as an ``OverflowError`` or a
    server's error at the first acquire.
    """
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}")
    seconds = float(value)
    too_low = seconds <= 0 if low == 0 else seconds < low
    if not math.isfinite(seconds) or too_low or seconds > high:
        lowest = "> 0" if low == 0 else f">= {low:g}"
        raise ValueError(
            f"{what}={value!r} must be a number of seconds {lowest} and <= {high:g}"
        )
    return seconds


def deadline_from(timeout: float | None) -> float | None:
    """Absolute ``time.monotonic()`` deadline for a checked timeout."""
    if timeout is None:
        return None
    return time.monotonic() + timeout
