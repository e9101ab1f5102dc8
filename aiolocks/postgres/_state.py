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

from typing import final

from .._core.states import ConnectionState, StateFeed

__all__ = ["ConnectionState", "StateBroadcaster"]


@final
class StateBroadcaster(StateFeed[ConnectionState]):
    """The current state, its listeners and iterators (see :class:`StateFeed`)."""

    def connected(self) -> None:
        """A working session (or statement) again: ``CONNECTED`` first, then ``RECONNECTED``."""
        if self.state is None:
            self.set(ConnectionState.CONNECTED)
        elif self.state in (ConnectionState.SUSPENDED, ConnectionState.LOST):
            self.set(ConnectionState.RECONNECTED)
