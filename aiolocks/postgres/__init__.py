"""PostgreSQL backend (``postgresql://``, ``postgres://``) on asyncpg.

``mode=advisory`` (the default) holds session-level advisory locks on
connections of its own; ``mode=lease`` keeps a row per hold in the lease
table, renewed in the background, and works through transaction-pooling
proxies. See ``docs/postgres.md``.

Importing this package loads asyncpg only when a backend is built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, final

from .._core.backend import Backend
from ._sql import PostgresSetupError, TableNames
from ._state import ConnectionState, StateBroadcaster
from ._url import PostgresOptions, parse_postgres_url

if TYPE_CHECKING:
    from .._core.driver import Driver
    from ._driver import PostgresPoolerError

__all__ = [
    "ConnectionState",
    "PostgresBackend",
    "PostgresPoolerError",
    "PostgresSetupError",
    "from_url",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresPoolerError":
        from ._driver import PostgresPoolerError

        return PostgresPoolerError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _describe(options: PostgresOptions) -> str:
    hosts = ",".join(str(hp) for hp in options.hosts)
    return f"postgresql://{hosts}/{options.database}"


@final
class PostgresBackend(Backend):
    """The PostgreSQL backend (``mode=advisory``, or ``mode=lease`` from a URL).

    Built from a URL (what :func:`aiolocks.connect` does), or around an
    ``asyncpg.Pool`` you already have::

        backend = PostgresBackend(pool)             # borrows its own connections
        backend = PostgresBackend("postgresql://app@db/app?heartbeat=5")

    With a pool, the backend borrows connections from it and keeps each one
    for as long as it holds locks; it never hands one back with a lock on it
    (asyncpg's reset would run ``pg_advisory_unlock_all()``): a borrowed
    connection is closed, not reused, when the backend is done with it. The
    pool must allow ``1 + max_sessions`` connections for this backend.

    :param heartbeat: seconds; a hold is declared lost within ``heartbeat`` +
        1 s of its session's end.
    :param max_sessions: extra connections for blocking waits and the locks
        they win (besides the primary one); see ``docs/postgres.md``.
    :param listen_url: ``mode=lease``: a direct ``postgresql://`` URL for the
        connection that ``LISTEN``s for releases, when the main URL goes
        through a transaction pooler (default: the main URL).
    :param pool_size: ``mode=lease``: connections of the statement pool.
    """

    def __init__(
        self,
        target: str | Any,
        *,
        heartbeat: float | None = None,
        max_sessions: int | None = None,
        tables: TableNames | None = None,
        create_tables: bool | None = None,
        listen_url: str | None = None,
        pool_size: int = 10,
    ) -> None:
        driver: Driver
        if not isinstance(target, str):
            driver = _advisory_driver_on_pool(
                target,
                heartbeat=heartbeat,
                max_sessions=max_sessions,
                tables=tables,
                create_tables=create_tables,
            )
        elif (options := parse_postgres_url(target)).mode == "lease":
            driver = _lease_driver_from_url(
                options,
                tables=tables,
                create_tables=create_tables,
                listen_url=listen_url,
                pool_size=pool_size,
            )
        else:
            driver = _advisory_driver_from_url(
                options,
                heartbeat=heartbeat,
                max_sessions=max_sessions,
                tables=tables,
                create_tables=create_tables,
            )
        super().__init__(driver)

    @property
    def _states(self) -> StateBroadcaster:
        states: StateBroadcaster = getattr(self._engine.driver, "states")  # noqa: B009
        return states

    @property
    def connection_state(self) -> ConnectionState | None:
        """The last connection state reported (``None`` before ``open()``).

        ``mode=advisory``: ``LOST`` when the server ended a session of the
        backend that held locks (or the primary one), ``SUSPENDED`` while it
        cannot connect again, ``RECONNECTED`` once it has a session again.
        ``mode=lease``: ``SUSPENDED`` while statements (renewals) fail,
        ``RECONNECTED`` when they go through again, ``LOST`` when a hold
        expired unrenewed. See ``docs/postgres.md``.
        """
        return self._states.state

    def add_connection_listener(
        self, listener: Callable[[ConnectionState], object]
    ) -> Callable[[], None]:
        """Call ``listener(state)`` on every connection-state change; returns a remover.

        The listener runs in the event loop and must not block. Added before
        ``open()``, it also sees the first ``CONNECTED``.
        """
        return self._states.add_listener(listener)

    def connection_states(self) -> AsyncIterator[ConnectionState]:
        """Iterate over connection-state changes from now on, until the backend closes.

        >>> async for state in backend.connection_states():  # doctest: +SKIP
        ...     if state is ConnectionState.LOST: ...
        """
        return self._states.states()


def _lease_driver_from_url(
    options: PostgresOptions,
    *,
    tables: TableNames | None,
    create_tables: bool | None,
    listen_url: str | None,
    pool_size: int,
) -> Driver:
    """``mode=lease``: a statement pool, and one direct connection that ``LISTEN``s."""
    from ._client import connector, pool_maker
    from ._lease import PostgresLeaseDriver, pool_options

    kwargs = options.connect_kwargs()
    listen_kwargs = (
        dict(kwargs) if listen_url is None else parse_postgres_url(listen_url).connect_kwargs()
    )
    listen_kwargs.pop("statement_cache_size", None)

    return PostgresLeaseDriver(
        pool_maker(kwargs, max_size=pool_size, **pool_options()),
        describe=_describe(options),
        lease_time=options.lease_time,
        tables=tables or options.tables,
        create_tables=options.create_tables if create_tables is None else create_tables,
        listen=connector(listen_kwargs),
        listen_is_pool_target=listen_url is None,
    )


def _advisory_driver_from_url(
    options: PostgresOptions,
    *,
    heartbeat: float | None,
    max_sessions: int | None,
    tables: TableNames | None,
    create_tables: bool | None,
) -> Driver:
    """``mode=advisory`` on connections of its own."""
    from ._client import connector
    from ._driver import DEFAULT_MAX_SESSIONS, PostgresAdvisoryDriver

    return PostgresAdvisoryDriver(
        connector(options.connect_kwargs()),
        describe=_describe(options),
        heartbeat=options.heartbeat if heartbeat is None else heartbeat,
        tables=tables or options.tables,
        create_tables=options.create_tables if create_tables is None else create_tables,
        max_sessions=DEFAULT_MAX_SESSIONS if max_sessions is None else max_sessions,
    )


def _advisory_driver_on_pool(
    pool: Any,
    *,
    heartbeat: float | None,
    max_sessions: int | None,
    tables: TableNames | None,
    create_tables: bool | None,
) -> Driver:
    """``mode=advisory`` on connections borrowed from the caller's ``asyncpg.Pool``."""
    from ._driver import DEFAULT_MAX_SESSIONS, PostgresAdvisoryDriver

    if not callable(getattr(pool, "acquire", None)) or not callable(getattr(pool, "release", None)):
        raise TypeError(
            "PostgresBackend takes a postgresql:// URL or an asyncpg.Pool, "
            f"got {type(pool).__name__}"
        )

    async def borrow() -> Any:
        return await pool.acquire()

    async def give_back(conn: Any) -> None:
        await pool.release(conn)

    return PostgresAdvisoryDriver(
        borrow,
        describe="postgresql://(pool)",
        heartbeat=5.0 if heartbeat is None else heartbeat,
        tables=tables,
        create_tables=True if create_tables is None else create_tables,
        max_sessions=DEFAULT_MAX_SESSIONS if max_sessions is None else max_sessions,
        release_connection=give_back,
    )


def from_url(url: str, **options: object) -> PostgresBackend:
    """``postgresql://`` or ``postgres://`` URL (+ keyword options as query options)."""
    if options:
        from urllib.parse import urlencode

        extra = urlencode(
            {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}
        )
        url += ("&" if "?" in url else "?") + extra
    return PostgresBackend(url)
