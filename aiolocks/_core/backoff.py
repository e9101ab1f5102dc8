"""One backoff for every retry loop of the drivers.

A driver retries a command through a short outage (a restart, a failover)
and gives up at a time limit; every such loop in aiolocks uses
:class:`Backoff`, so delays and limits behave the same everywhere. A loop
that retries for as long as its owner lives (a reconnect loop) gives up at
``math.inf``; one that many clients run at once (a reconnect after a server
restart) spreads its delays with ``jitter``.

A pause that is not a retry (a keep-alive cadence, a short random pause
that breaks a tie) carries a ``# not a retry: <why>`` comment instead, which
``tests/test_retry_loops.py`` looks for.
"""

from __future__ import annotations

import asyncio
import random
import time

__all__ = ["Backoff"]


class Backoff:
    """Exponential delays between tries of one command, until ``give_up``.

    Each delay doubles the previous one up to ``cap``; with ``jitter`` (a
    fraction below 1) each sleep is the delay times a random factor in
    ``[1 - jitter, 1 + jitter]``, while the doubling follows the plain delay.

    >>> backoff = Backoff(time.monotonic() + 5)  # doctest: +SKIP
    >>> while True:  # doctest: +SKIP
    ...     try:
    ...         return await send()
    ...     except ConnectionError:
    ...         if not await backoff.wait():
    ...             raise
    """

    __slots__ = ("cap", "delay", "give_up", "jitter")

    def __init__(
        self, give_up: float, *, first: float = 0.05, cap: float = 1.0, jitter: float = 0.0
    ) -> None:
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter must be a fraction in [0, 1), got {jitter!r}")
        #: ``time.monotonic()`` after which no further try starts (``math.inf``: never)
        self.give_up = give_up
        self.delay = first
        self.cap = cap
        self.jitter = jitter

    def exhausted(self) -> bool:
        """The next delay would end past ``give_up``."""
        return time.monotonic() + self.delay > self.give_up

    def next_delay(self) -> float | None:
        """The sleep before the next try (jittered), then on to the next; ``None``: give up."""
        if self.exhausted():
            return None
        delay = self.delay
        self.delay = min(delay * 2, self.cap)
        if self.jitter:
            delay *= random.uniform(1.0 - self.jitter, 1.0 + self.jitter)
        return delay

    async def wait(self) -> bool:
        """Sleep before the next try and return ``True``; ``False`` at once when exhausted."""
        delay = self.next_delay()
        if delay is None:
            return False
        await asyncio.sleep(delay)
        return True
