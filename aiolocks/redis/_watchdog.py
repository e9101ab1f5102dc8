"""The lease watchdog: one task per hold, renewing every ``lease_time / 3``.

Redisson's watchdog, with the holes its users fell into closed:

* A renewal that finds the hold gone (deleted, overwritten, taken, lapsed)
  marks the grant lost at once (``grant.mark_lost``), so the core cancels
  the ``async with`` body and raises ``LockLostError``. A renewal error is a
  loss signal, not a log line.
* Transient errors are retried quickly, but the hold is only trusted until
  ``valid_until`` = the time the last *successful* renewal (or the acquire)
  was *sent* + lease: past that, another client may hold the lock, so the
  hold is declared lost even if Redis never answered.
* ``release`` sets the hold's released flag and cancels this task
  synchronously before it sends the unlock; a renewal already on the wire
  cannot resurrect the lease because ``renew.lua`` only extends a field that
  still exists (Redisson #7272), and its answer is ignored once released.
* When the owner task has ended without releasing, renewing stops and the
  lease lapses (the core also releases such orphans at once).
* With ``watchdog=False`` nothing is renewed: the hold is marked lost when
  its lease runs out, because past that point it protects nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.driver import Grant
from .._core.errors import BackendUnavailableError

__all__ = ["run_watchdog"]

TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError, BackendUnavailableError)


async def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_watchdog(
    grant: Grant,
    *,
    renew: Callable[[], Awaitable[str | None]],
    released: Callable[[], bool],
    lease: float,
    valid_until: float,
    enabled: bool,
    owner: asyncio.Task[object] | None,
    drift: float = 0.0,
) -> None:
    """Keep ``grant`` alive until released; mark it lost when that fails.

    ``renew()`` returns ``None`` when renewed or the reason the hold is gone;
    it raises a transient error (connection, timeout) when Redis could not
    say. ``valid_until`` is the monotonic time until which the acquire
    vouches for the hold; ``drift`` is subtracted from every later one
    (Redlock's clock-drift allowance).
    """
    if not enabled:
        await _sleep_until(valid_until)
        if not released():
            grant.mark_lost(f"its lease of {lease:g} s ran out (watchdog=False)")
        return
    interval = lease / 3
    next_at = valid_until - lease + interval
    while True:
        await _sleep_until(next_at)
        if released():
            return
        if owner is not None and owner.done():
            # The owner ended without releasing: stop renewing so the lease
            # lapses even if nobody ever calls release.
            return
        sent = time.monotonic()
        if sent >= valid_until:
            grant.mark_lost(f"no successful renewal within its lease of {lease:g} s")
            return
        try:
            async with asyncio.timeout(valid_until - sent):
                reason = await renew()
        except TimeoutError:
            if not released():
                grant.mark_lost(f"Redis did not confirm a renewal within its lease of {lease:g} s")
            return
        except TRANSIENT:
            # Retry soon; valid_until still bounds how long we trust the hold.
            next_at = time.monotonic() + min(interval / 4, 0.25)
            continue
        except RedisError as exc:
            # WRONGTYPE (key overwritten with another type) and the like.
            if not released():
                grant.mark_lost(f"renewal failed: {exc}")
            return
        if released():
            return
        if reason is not None:
            grant.mark_lost(reason)
            return
        valid_until = sent + lease - drift
        grant.valid_until = valid_until
        grant.note_renewed()
        next_at = sent + interval
