"""What the record-based recipes (groups, latches, ``once``, count-down latches, barriers) share.

* :func:`store_of`: the backend's record store, or ``NotImplementedError``
  naming the backend, at construction time (no I/O);
* :func:`finish`: run one store call in a task owned by the backend and wait
  for its outcome even when the caller is cancelled meanwhile, so the caller
  knows what the server did and can undo it before the cancellation goes on
  (a ``create`` whose reply was lost to a cancellation would otherwise leave a
  record nobody knows of);
* :func:`dumps`/:func:`loads`: the JSON values of the records.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from .records import Records, SupportsRecords
from .tasks import wait_finished

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["dumps", "finish", "loads", "store_of"]

T = TypeVar("T")


def store_of(engine: Engine, recipe: str) -> Records:
    """The record store of ``engine``'s driver; ``NotImplementedError`` when it has none."""
    driver = engine.driver
    if not isinstance(driver, SupportsRecords):
        raise NotImplementedError(
            f"{recipe} needs a record store, which the backend {engine.url} does not offer yet"
        )
    return driver.records()


async def finish(
    engine: Engine, coro: Coroutine[Any, Any, T], name: str
) -> tuple[asyncio.Task[T], asyncio.CancelledError | None]:
    """Run ``coro`` to its end in an owned task, whatever happens to the caller.

    Returns the finished task (its result or error) and the cancellation the
    caller received while waiting (``None`` if none): the caller looks at
    the outcome, undoes what must be undone, then raises the cancellation.
    """
    task = engine.tasks.spawn(coro, name=name, log_errors=False)
    cancelled = await wait_finished(task)
    return task, cancelled


def dumps(value: dict[str, object]) -> bytes:
    """A record value: compact JSON."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def loads(value: bytes) -> dict[str, Any]:
    """A record value written by :func:`dumps` (an unreadable one reads as ``{}``)."""
    try:
        decoded = json.loads(value)
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}
