"""What ``participants()`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

from .jsonvalues import JSONValue

__all__ = ["Participant"]


@final
@dataclass(frozen=True, slots=True)
class Participant:
    """One hold or waiter of a lock, as the backend sees it.

    ``participants()`` lists holders first, then waiters in queue order where
    the backend queues (ZooKeeper, memory, Redis ``fair=True``).

    :ivar id: who: the leader latch ``participant_id``, or ``<client-id>/<task>`` for locks
    :ivar is_holder: holds the lock (or a lease) now
    :ivar fencing_token: token of the hold; ``None`` for a waiter where the backend has none yet
    :ivar mode: ``"exclusive"``, ``"lease"``, ``"read"`` or ``"write"``
    :ivar node: the backend's own key for it (znode name, hash field), for debugging
    :ivar ttl: seconds left on the lease where the backend has leases (Redis), else ``None``
    :ivar value: what a leader latch's leader advertises (``value=``, ``proclaim()``);
        ``None`` for locks and where nothing was advertised
    """

    id: str
    is_holder: bool
    fencing_token: int | None = None
    mode: str = "exclusive"
    node: str | None = None
    ttl: float | None = None
    #: (not hashed: a JSON object is not hashable, a Participant stays so)
    value: JSONValue = field(default=None, hash=False)
