"""Connection states of an etcd backend (no gRPC import: ``aiolocks.etcd`` exposes it lazily).

The enum is the core's one :class:`~aiolocks._core.states.ConnectionState`;
for etcd the session is the backend's lease: ``SUSPENDED`` while keeping it
alive fails but its deadline (last answered refresh + TTL) has not passed,
``LOST`` once it expired or was revoked (a new lease is granted in the
background, then ``RECONNECTED``).
"""

from __future__ import annotations

from .._core.states import ConnectionState

__all__ = ["ConnectionState"]
