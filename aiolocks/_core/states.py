"""A backend's connection state, its listeners and its async iterators.

ZooKeeper, etcd and PostgreSQL each report a session state (``CONNECTED``,
``SUSPENDED``, ``RECONNECTED``, ``LOST``); the fan-out to
``add_connection_listener`` callbacks and ``connection_states()`` iterators is
the same everywhere and lives here, with :class:`ReportsConnectionState`,
the protocol a backend with such states satisfies (``PrometheusHook`` asks
``isinstance(backend, ReportsConnectionState)``, not ``getattr``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

__all__ = ["ConnectionState", "ReportsConnectionState", "StateFeed"]

logger = logging.getLogger("aiolocks")

S = TypeVar("S")


class ConnectionState(enum.Enum):
    """Connection states of a backend with a session (Curator's ``ConnectionState``).

    One enum for ZooKeeper, etcd and PostgreSQL (``aiolocks.zookeeper``,
    ``aiolocks.etcd`` and ``aiolocks.postgres`` export this same class):

    * ``CONNECTED``: the backend's first session is up (ZooKeeper connection,
      etcd lease granted and kept alive, PostgreSQL session).
    * ``SUSPENDED``: the server cannot be reached, but the session may still
      be alive there (the session or lease deadline has not passed): holds are
      uncertain, not lost yet (ZooKeeper: lost only with
      ``suspended_is_lost=True``).
    * ``RECONNECTED``: reachable again, in the same session (holds kept) or
      in a new one (then ``LOST`` came first).
    * ``LOST``: the session ended (expired, revoked, terminated, or unreachable
      for a whole session/lease timeout): every hold of the backend is lost.
      The backend starts a new session by itself; waiters keep waiting.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    RECONNECTED = "reconnected"
    LOST = "lost"


@runtime_checkable
class ReportsConnectionState(Protocol):
    """A backend whose session has connection states (ZooKeeper, etcd, PostgreSQL)."""

    @property
    def connection_state(self) -> enum.Enum | None:
        """The last state reported (``None`` before ``open()``)."""
        ...

    def add_connection_listener(self, listener: Callable[[Any], object]) -> Callable[[], None]:
        """Call ``listener(state)`` on every change; returns a remover."""
        ...


class StateFeed(Generic[S]):
    """The current state; every change goes to each listener and iterator."""

    def __init__(self) -> None:
        self.state: S | None = None
        self._listeners: list[Callable[[S], object]] = []
        self._queues: set[asyncio.Queue[S | None]] = set()

    def set(self, state: S) -> None:
        """Move to ``state`` (nothing happens when it is the current one) and tell everyone."""
        if state is not self.state:
            self.publish(state)

    def publish(self, state: S) -> None:
        """Make ``state`` current and tell everyone, even when it already was."""
        self.state = state
        for queue in list(self._queues):
            queue.put_nowait(state)
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                logger.exception("connection state listener %r failed", listener)

    def add_listener(self, listener: Callable[[S], object]) -> Callable[[], None]:
        """Call ``listener(state)`` on every change; returns a remover."""
        self._listeners.append(listener)

        return lambda: self.remove_listener(listener)

    def remove_listener(self, listener: Callable[[S], object]) -> None:
        """Stop calling ``listener`` (nothing happens if it is not registered)."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    async def states(self) -> AsyncIterator[S]:
        """Yield every change from now on, until :meth:`close`."""
        queue: asyncio.Queue[S | None] = asyncio.Queue()
        self._queues.add(queue)
        try:
            while True:
                state = await queue.get()
                if state is None:
                    return
                yield state
        finally:
            self._queues.discard(queue)

    def close(self) -> None:
        """End every iterator (the backend closed)."""
        for queue in list(self._queues):
            queue.put_nowait(None)
