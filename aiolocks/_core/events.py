"""Event hooks: what happened to which lock, for metrics and tracing.

A hook is any callable taking a :class:`LockEvent`; register it with
``backend.add_event_hook(hook)``. Hooks run synchronously in the event loop
and must be quick; an exception in a hook is logged and swallowed (a metrics
bug never breaks locking). With no hook registered, no event object is
built: metrics cost nothing unless asked for.

Kinds:

============  ===============================================  ==========================
kind          when                                             timing field
============  ===============================================  ==========================
acquired      a hold was granted by the server                 ``wait_time``
timeout       an acquire gave up at its timeout                ``wait_time``
cancelled     an acquire was cancelled while waiting           ``wait_time``
failed        an acquire raised (``reason``: the error class)   ``wait_time``
released      a hold was released on the server                ``hold_time``
lost          a hold was lost (session, lease, key taken)      ``hold_time``
orphaned      the owner task ended while holding               ``hold_time``
renewed       a lease was renewed (Redis watchdog)             ``hold_time``
degraded      the server was unreachable; a process-local      ``wait_time``
              hold was taken instead (``on_unavailable=
              "local"``; ``reason``: the error class); an
              ``acquired`` event with ``degraded=True`` follows
============  ===============================================  ==========================

Every event about a hold taken from the process-local fallback store
(``acquired``, ``released``, ...) has ``degraded=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, final

__all__ = ["EventHook", "EventKind", "LockEvent"]

EventKind = Literal[
    "acquired",
    "timeout",
    "cancelled",
    "failed",
    "released",
    "lost",
    "orphaned",
    "renewed",
    "degraded",
]


@final
@dataclass(frozen=True, slots=True)
class LockEvent:
    """One thing that happened to a lock.

    :ivar kind: see the module table
    :ivar lock_kind: ``"mutex"``, ``"semaphore mutex"``, ``"semaphore lease"``,
        ``"read lock"``, ``"write lock"`` or ``"leader latch"``
    :ivar name: the canonical lock name
    :ivar backend: the backend URL (no credentials)
    :ivar fencing_token: token of the hold, where there is one
    :ivar wait_time: seconds spent waiting (acquired, timeout, cancelled, failed)
    :ivar hold_time: seconds held so far (released, lost, orphaned, renewed)
    :ivar reason: why a hold was lost; for ``failed``, the error's class name
        reported by the backend (``BackendUnavailableError``, ...); for
        ``degraded``, the class of the error that sent the acquire to the
        process-local fallback
    :ivar degraded: the hold comes from the process-local fallback store
        (``on_unavailable="local"``), not from the server
    """

    kind: EventKind
    lock_kind: str
    name: str
    backend: str
    fencing_token: int | None = None
    wait_time: float | None = None
    hold_time: float | None = None
    reason: str | None = None
    degraded: bool = False


EventHook = Callable[[LockEvent], None]


def lock_kind(family_value: str, mode_value: str) -> str:
    """The ``LockEvent.lock_kind`` of a request's family and mode."""
    if family_value == "rwlock":
        return f"{mode_value} lock"
    return _KINDS.get(family_value, family_value)


_KINDS = {
    "mutex": "mutex",
    "semaphore-mutex": "semaphore mutex",
    "semaphore": "semaphore lease",
    "leader": "leader latch",
}
