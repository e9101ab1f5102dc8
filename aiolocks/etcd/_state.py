"""Connection states of an etcd backend (no gRPC import: ``aiolocks.etcd`` exposes it lazily)."""

from __future__ import annotations

import enum

__all__ = ["ConnectionState"]


class ConnectionState(enum.Enum):
    """Connection states of an etcd backend, whose session is its lease.

    * ``CONNECTED``: the backend's first session lease is granted and kept alive.
    * ``SUSPENDED``: keeping the lease alive fails (no member answers), but its
      deadline (last answered refresh + TTL) has not passed: holds are uncertain,
      not lost yet.
    * ``RECONNECTED``: a refresh was answered again, in the same lease (holds
      kept), or a new lease was granted after ``LOST``.
    * ``LOST``: the lease expired (its deadline passed with no refresh
      answered) or was revoked; every hold of the backend is lost. The backend
      grants a new lease in the background (``RECONNECTED`` then); waiters keep
      waiting across it.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    RECONNECTED = "reconnected"
    LOST = "lost"
