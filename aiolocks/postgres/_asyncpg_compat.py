"""The only place aiolocks touches asyncpg's private attributes, behind one version gate.

Two things asyncpg has no public API for:

* **The uncontended cycle's statements** (advisory mode's lock and unlock
  calls). Each is prepared once per session with the public
  ``Connection.prepare``; the fast path then binds and executes the prepared
  statement's protocol-level state (``PreparedStatement._state``) on the
  connection's protocol (``Connection._protocol.bind_execute``, asking for
  one row), skipping ``PreparedStatement.fetch``'s per-call layers (the
  connection and statement validity checks, two more coroutine frames and a
  closure, the status bookkeeping) while keeping asyncpg's timeout and
  cancellation handling. The public fallback is ``PreparedStatement.fetch``,
  with the same rows. What the fast path saves is measured and written down
  in ``docs/architecture.md`` ("PostgreSQL: asyncpg's private
  attributes").
* **The client socket** (``Connection._transport``), to turn TCP
  keep-alives on at the client end of advisory mode's sessions. asyncpg has
  no keep-alive option; without the socket only the server end sends
  keep-alives (set through the session's ``tcp_keepalives_*`` settings,
  public SQL), which still ends a silent session on the server's side.

:data:`ENABLED` is ``True`` only on the asyncpg releases these were tested
with (:data:`TESTED`) and only when the objects have the attributes; on any
other release, or a connection-like object without them (a proxy), every
function here answers ``None`` and the caller takes the public API. Tests
set :data:`ENABLED` to ``False`` to run the public path on a real server.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import asyncpg

__all__ = [
    "ENABLED",
    "TESTED",
    "bind_execute",
    "client_socket",
    "gate",
    "stale",
    "statement_state",
]

#: the asyncpg ``major.minor`` releases the private calls were tested with
#: (the ``bind_execute`` signature and the ``_state``/``_transport`` attributes
#: are the same in all of them)
TESTED = frozenset({(0, 29), (0, 30), (0, 32)})


def gate(version: str) -> bool:
    """Whether asyncpg ``version`` (its ``__version__``) is one of :data:`TESTED`."""
    parts = version.split(".")[:2]
    if len(parts) < 2 or not all(part.isdigit() for part in parts):
        return False
    return (int(parts[0]), int(parts[1])) in TESTED


#: the version gate: private attributes are read only while this is true
ENABLED: bool = gate(str(getattr(asyncpg, "__version__", "")))


def statement_state(conn: Any, prepared: Any) -> Any:
    """``prepared``'s protocol-level state for :func:`bind_execute`, or ``None``.

    ``None`` (take ``prepared.fetch``) outside the gate, or when ``conn``'s
    protocol has no ``bind_execute`` or ``prepared`` no state.
    """
    if not ENABLED:
        return None
    protocol = getattr(conn, "_protocol", None)
    if protocol is None or not hasattr(protocol, "bind_execute"):
        return None
    state = getattr(prepared, "_state", None)
    if state is None or not hasattr(state, "closed"):
        return None
    return state


def stale(state: Any) -> bool:
    """Whether ``state`` (from :func:`statement_state`) was closed by asyncpg: prepare again."""
    return state is not None and bool(state.closed)


def bind_execute(
    conn: Any, state: Any, args: tuple[Any, ...], timeout: float | None
) -> Awaitable[list[Any]] | None:
    """At most one row of the prepared ``state`` run with ``args`` on ``conn``.

    ``None`` when the caller must take the public call instead: the gate is
    off, ``state`` is ``None`` or closed, or ``conn`` has no protocol (a
    closed connection: the public call raises asyncpg's own error). Not a
    coroutine: the protocol's awaitable is returned as is.
    """
    if not ENABLED or state is None or state.closed:
        return None
    protocol = getattr(conn, "_protocol", None)
    if protocol is None:
        return None
    rows: Awaitable[list[Any]] = protocol.bind_execute(state, args, "", 1, False, timeout)
    return rows


def client_socket(conn: Any) -> Any:
    """``conn``'s socket (a :class:`socket.socket` or asyncio's wrapper of one), or ``None``.

    ``None`` outside the gate, or when ``conn`` has no transport to ask.
    """
    if not ENABLED:
        return None
    transport = getattr(conn, "_transport", None)
    if transport is None or not hasattr(transport, "get_extra_info"):
        return None
    return transport.get_extra_info("socket")
