"""The PostgreSQL client layer: asyncpg, and the narrow interface the recipes use of it.

Unlike ZooKeeper and etcd, PostgreSQL needs no client of our own: asyncpg
is the protocol client (TLS, SCRAM/md5 passwords, LISTEN, pooling). This
module states what the two recipes (``_driver.py``: advisory locks on
sessions of their own; ``_lease.py``: lease rows through a statement pool)
and the records (``_records.py``) call on it, as protocols, and opens the
connections a URL describes:

* :class:`Statements`: queries and statements, on a connection or a pool;
* :class:`Connection`: one server session (its pid, LISTEN, termination,
  transactions, prepared statements);
* :class:`Pool`: asyncpg's pool, for the lease mode and a pool passed in;
* :func:`connector` and :func:`pool_maker`: connections and pools opened
  with the keyword arguments of a parsed URL
  (:meth:`~._url.PostgresOptions.connect_kwargs`: host, TLS context,
  credentials; the password never leaves them).

The two private asyncpg internals the advisory recipe reads for speed (the
prepared statement's bind-and-execute, the socket for TCP keep-alives) are
version-gated in ``_asyncpg_compat.py``, which falls back to public API.
``tests/postgres/test_client.py`` checks every member below on asyncpg's
real objects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

__all__ = ["Connect", "Connection", "Pool", "Statements", "connector", "pool_maker"]

#: opens (or borrows) one connection
Connect = Callable[[], Awaitable[Any]]


class Statements(Protocol):
    """Queries and statements: what an ``asyncpg.Connection`` and an ``asyncpg.Pool`` answer."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Rows of a query."""
        ...

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        """First row of a query, or ``None``."""
        ...

    async def fetchval(
        self, query: str, *args: Any, column: int = 0, timeout: float | None = None
    ) -> Any:
        """First value of the first row, or ``None``."""
        ...

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        """Run a statement; without arguments several may be sent at once."""
        ...


class Connection(Statements, Protocol):
    """One server session: the part of an ``asyncpg.Connection`` the recipes use."""

    def get_server_pid(self) -> int:
        """The pid of the BackendKeyData message sent at login."""
        ...

    def is_closed(self) -> bool:
        """Whether the session has ended."""
        ...

    def is_in_transaction(self) -> bool:
        """Whether a transaction is open (a connection handed back must not be)."""
        ...

    def terminate(self) -> None:
        """Close the socket at once (no goodbye to the server)."""
        ...

    async def add_listener(self, channel: str, callback: Callable[..., object]) -> None:
        """``LISTEN channel``; ``callback(conn, pid, channel, payload)`` per notification."""
        ...

    def add_termination_listener(self, callback: Callable[..., object]) -> None:
        """``callback(conn)`` once the session ends, however it ends."""
        ...

    def transaction(self) -> Any:
        """A transaction, as an async context manager."""
        ...

    async def prepare(self, query: str, *, timeout: float | None = None) -> Any:
        """A prepared statement of ``query``."""
        ...


class Pool(Statements, Protocol):
    """The part of an ``asyncpg.Pool`` the lease recipe and a pool passed in use."""

    def acquire(self) -> Any:
        """A connection, awaited or as an async context manager."""
        ...

    async def release(self, connection: Any) -> None:
        """Hand ``connection`` back (asyncpg resets it)."""
        ...

    def terminate(self) -> None:
        """Close every connection at once."""
        ...


def connector(kwargs: dict[str, Any]) -> Connect:
    """Open a new connection with ``kwargs`` (those of ``asyncpg.connect``) at each call."""
    import asyncpg

    async def connect() -> Any:
        return await asyncpg.connect(**kwargs)

    return connect


def pool_maker(
    kwargs: dict[str, Any], *, max_size: int, **options: Any
) -> Callable[[bool], Awaitable[Any]]:
    """A pool of up to ``max_size`` connections; ``maker(prepared)``.

    With ``prepared`` (no pooler in the way) asyncpg's statement cache is
    on; without, ``statement_cache_size`` of ``kwargs`` stays (0 behind a
    transaction-pooling proxy, which would mix prepared statements).
    """
    import asyncpg

    async def make(prepared: bool) -> Any:
        pool_kwargs = dict(kwargs)
        if prepared:
            pool_kwargs.pop("statement_cache_size", None)
        return await asyncpg.create_pool(min_size=1, max_size=max_size, **options, **pool_kwargs)

    return make
