"""Expirable permits: a lease's ``lease_time`` and ``Semaphore.release_by_id``.

Redisson's ``PermitExpirableSemaphore`` gives each permit an id that any
process may release, and a lease of its own after which the permit frees
itself. Built once here, over the lease holds of every backend and its
record store:

* ``lease.id`` is the lease's fencing token as text: unique among the leases
  of one name for ever, and visible to every process in
  ``sem.participants()``, so a caller can tell at once that an id is not held.
* ``lease_time``: a timer in the holder's event loop ends the lease when it
  runs out. The lease is reported lost (``is_lost``; a running ``async with``
  body gets :class:`LockLostError`) and given back on the server. A holder
  that dies frees its permits with its session, as every lease does.
* ``release_by_id(id)`` from another process: a request record
  ``permit-release/<name>/<id>`` (expiring after the caller's timeout).
  Every process that holds leases of that name keeps one :class:`_Desk`
  watching those requests (a record-store snapshot, event-driven); the desk
  of the holder ends the lease like an expiry, gives it back on the server
  and deletes the request, which tells the caller it is done.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import TYPE_CHECKING

from .backoff import Backoff
from .driver import Family
from .errors import LockTimeoutError
from .records import Records, SupportsRecords
from .tasks import cancelled_again

if TYPE_CHECKING:
    from .engine import Engine
    from .hold import Hold

__all__ = ["expire_after", "forget", "register", "release_by_id"]

logger = logging.getLogger("aiolocks")

#: where the requests of ``release_by_id`` live in the record store
_PREFIX = "permit-release"


def _records(engine: Engine) -> Records | None:
    driver = engine.driver
    return driver.records() if isinstance(driver, SupportsRecords) else None


def _take_away(hold: Hold, reason: str) -> bool:
    """Report a held lease lost (its body gets :class:`LockLostError`); ``False`` if it ended."""
    if hold.released or hold.grant.lost:
        return False
    forget(hold)
    hold.grant.mark_lost(reason)
    return True


async def _give_back(hold: Hold) -> None:
    """Release a taken-away lease on the server; the engine then tracks it no more.

    The hold is not marked released: the holder's own ``release()`` still
    raises :class:`LockLostError` (loss is never silent), and sends an
    idempotent release that finds nothing.
    """
    try:
        await hold.engine.release_grant(hold.grant)
    except Exception:
        # the lease lapses with its session; the holder's release() tries again
        logger.warning("giving back the permit of %r failed", hold.name, exc_info=True)
    else:
        hold.engine.holds.discard(hold)


def _expire(hold: Hold, lease_time: float) -> None:
    if _take_away(hold, f"its lease_time of {lease_time:g} s ran out"):
        engine = hold.engine
        if not engine.closed:
            engine.spawn(_give_back(hold), name=f"aiolocks-permit-expired:{hold.name}")


def expire_after(hold: Hold, lease_time: float) -> asyncio.TimerHandle:
    """End the lease ``lease_time`` seconds from now (cancel the handle on release)."""
    return asyncio.get_running_loop().call_later(lease_time, _expire, hold, lease_time)


class _Desk:
    """Answers ``release_by_id`` requests for this process's leases of one name."""

    def __init__(self, engine: Engine, records: Records | None, key: str) -> None:
        self.engine = engine
        self.records = records
        self.prefix = f"{_PREFIX}/{key}"
        self.leases: dict[str, Hold] = {}
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.records is not None and (self.task is None or self.task.done()):
            self.task = self.engine.tasks.spawn(
                self._serve(), name=f"aiolocks-permits:{self.prefix}", service=True
            )

    def stop(self) -> None:
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # (from inside, its loop ends by itself: no lease left)

    async def _serve(self) -> None:
        backoff = Backoff(float("inf"), first=0.1, cap=2.0)
        while self.leases:
            try:
                await self._serve_once()
                backoff = Backoff(float("inf"), first=0.1, cap=2.0)
            except Exception:
                logger.warning(
                    "watching release_by_id requests of %r failed", self.prefix, exc_info=True
                )
                await backoff.wait()

    async def _serve_once(self) -> None:
        assert self.records is not None
        with await self.records.snapshot(self.prefix) as snapshot:
            for child, record in snapshot.records.items():
                hold = self.leases.get(child)
                if hold is None:
                    continue
                if _take_away(hold, "released by id (release_by_id) by another process"):
                    await _give_back(hold)
                await self.records.delete(f"{self.prefix}/{child}", version=record.version)
            if self.leases:
                await snapshot.changed(None)


_desks: weakref.WeakKeyDictionary[Engine, dict[str, _Desk]] = weakref.WeakKeyDictionary()


def register(hold: Hold) -> None:
    """Answer ``release_by_id`` for this lease while it is held.

    In this process always; from other processes where the backend has a
    record store (the desk watches the requests there).
    """
    engine = hold.engine
    if hold.degraded:
        return
    desks = _desks.setdefault(engine, {})
    desk = desks.get(hold.name)
    if desk is None:
        desk = desks[hold.name] = _Desk(engine, _records(engine), hold.name)
    desk.leases[str(hold.token)] = hold
    desk.start()


def forget(hold: Hold) -> None:
    """The lease ended: stop answering for it."""
    desk = _desks.get(hold.engine, {}).get(hold.name)
    if desk is None:
        return
    desk.leases.pop(str(hold.token), None)
    if not desk.leases:
        desk.stop()
        del _desks[hold.engine][hold.name]


async def release_by_id(engine: Engine, key: str, lease_id: str, timeout: float) -> bool:
    """Release the lease ``lease_id`` of semaphore ``key``, held by any process.

    ``True`` when it was held and its holder gave it back; ``False`` when no
    lease with that id is held. :class:`LockTimeoutError` when the holder did
    not answer within ``timeout`` (its event loop blocked, or an aiolocks
    without this feature).
    """
    local = _desks.get(engine, {}).get(key)
    hold = None if local is None else local.leases.get(lease_id)
    if hold is not None and _take_away(hold, "released by id (release_by_id)"):
        await _give_back(hold)  # held by this process: no request through the store
        return True
    if not await _held(engine, key, lease_id):
        return False
    records = _records(engine)
    if records is None:
        raise NotImplementedError(f"release_by_id needs a record store; {engine.url} has none")
    request = f"{_PREFIX}/{key}/{lease_id}"
    version = await records.create(request, b"release", ttl=timeout)
    try:
        return await _wait_answered(engine, records, key, lease_id, timeout)
    finally:
        if version is not None:
            engine.spawn(_withdraw(records, request), name=f"aiolocks-permit-withdraw:{key}")


async def _held(engine: Engine, key: str, lease_id: str) -> bool:
    token = int(lease_id)
    holders = await engine.participants(Family.SEMAPHORE, key)
    return any(p.is_holder and p.fencing_token == token for p in holders)


async def _wait_answered(
    engine: Engine, records: Records, key: str, lease_id: str, timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    prefix = f"{_PREFIX}/{key}"
    # a client library may swallow a cancellation (redis-py's Sentinel and
    # Cluster clients): the task is still cancelling, so raise it again
    task = asyncio.current_task()
    baseline = task.cancelling() if task is not None else 0
    while True:
        with await records.snapshot(prefix) as snapshot:
            # (checked after each read, before the wait: a cancellation
            # swallowed while reading would otherwise wait out ``timeout``)
            if task is not None and task.cancelling() > baseline:
                await cancelled_again()
            left = deadline - time.monotonic()
            if lease_id not in snapshot.records or left <= 0:
                break
            await snapshot.changed(left)
    if not await _held(engine, key, lease_id):
        return True
    raise LockTimeoutError(
        f"semaphore {key!r}: the holder of lease {lease_id} did not give it back "
        f"within {timeout:g} s"
    )


async def _withdraw(records: Records, request: str) -> None:
    """Delete an unanswered request (the caller gave up or was cancelled)."""
    try:
        await records.delete(request)
    except Exception:
        logger.debug("withdrawing %r failed; it expires by itself", request, exc_info=True)
