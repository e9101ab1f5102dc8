"""Connection states of a PostgreSQL backend, as ZooKeeper's backend reports them.

``mode=advisory``: the state follows the backend's sessions. ``CONNECTED``
once the primary session is open; ``LOST`` when the server ended (or we gave
up on) the primary session or a session that held locks: the server dropped
that session's advisory locks, and each of those holds is reported lost;
``SUSPENDED`` while the backend cannot open a session again (the server is
unreachable); ``RECONNECTED`` when it has a working primary session again
(in a new server session: advisory locks never survive their session).

``mode=lease``: the state follows the statement pool. ``CONNECTED`` once the
pool is open; ``SUSPENDED`` when a renewal, acquire or release cannot reach
the server (holds stay valid until their rows expire, so they are uncertain,
not lost); ``RECONNECTED`` at the next statement that goes through; ``LOST``
when a hold expired because no renewal got through in time.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable
from typing import final

__all__ = ["ConnectionState", "StateBroadcaster"]

logger = logging.getLogger("aiolocks.postgres")


class ConnectionState(enum.Enum):
    """Connection states of a PostgreSQL backend (the values of ZooKeeper's states)."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    RECONNECTED = "reconnected"
    LOST = "lost"


@final
class StateBroadcaster:
    """The current state, its listeners and iterators."""

    def __init__(self) -> None:
        self.state: ConnectionState | None = None
        self._listeners: list[Callable[[ConnectionState], object]] = []
        self._queues: set[asyncio.Queue[ConnectionState | None]] = set()

    def set(self, state: ConnectionState) -> None:
        """Move to ``state`` (nothing happens when it is the current one) and tell everyone."""
        if state is self.state:
            return
        self.state = state
        for listener in list(self._listeners):
            try:
                listener(state)
            except Exception:
                logger.exception("a connection-state listener failed")
        for queue in self._queues:
            queue.put_nowait(state)

    def connected(self) -> None:
        """A working session (or statement) again: ``CONNECTED`` first, then ``RECONNECTED``."""
        if self.state is None:
            self.set(ConnectionState.CONNECTED)
        elif self.state in (ConnectionState.SUSPENDED, ConnectionState.LOST):
            self.set(ConnectionState.RECONNECTED)

    def add_listener(self, listener: Callable[[ConnectionState], object]) -> Callable[[], None]:
        """Call ``listener(state)`` on every change; returns a remover."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def states(self) -> AsyncIterator[ConnectionState]:
        """Yield every change from now on, until :meth:`close`."""
        queue: asyncio.Queue[ConnectionState | None] = asyncio.Queue()
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
        for queue in self._queues:
            queue.put_nowait(None)
