"""One backoff for every retry loop of the drivers.

A driver retries a command through a short outage (a restart, a failover)
and gives up at a time limit; every such loop in aiolocks uses
:class:`Backoff`, so delays and limits behave the same everywhere.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Backoff"]


class Backoff:
    """Exponential delays between tries of one command, until ``give_up``.

    >>> backoff = Backoff(time.monotonic() + 5)  # doctest: +SKIP
    >>> while True:  # doctest: +SKIP
    ...     try:
    ...         return await send()
    ...     except ConnectionError:
    ...         if not await backoff.wait():
    ...             raise
    """

    __slots__ = ("cap", "delay", "give_up")

    def __init__(self, give_up: float, *, first: float = 0.05, cap: float = 1.0) -> None:
        #: ``time.monotonic()`` after which no further try starts
        self.give_up = give_up
        self.delay = first
        self.cap = cap

    def exhausted(self) -> bool:
        """The next delay would end past ``give_up``."""
        return time.monotonic() + self.delay > self.give_up

    async def wait(self) -> bool:
        """Sleep before the next try and return ``True``; ``False`` at once when exhausted."""
        if self.exhausted():
            return False
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)
        return True
