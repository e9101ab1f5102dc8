"""The PostgreSQL client layer (``aiolocks/postgres/_client.py``) against asyncpg's real objects.

The recipes call asyncpg only through the protocols of ``_client``:
:class:`Statements`, :class:`Connection` and :class:`Pool`. These tests
check that a connection asyncpg opens, a connection borrowed from a pool
and the pool itself have every member, taking the arguments the recipes
pass, so an asyncpg that renamed or reshaped one fails here rather than in
a lock. They also open connections and pools the way a URL asks for.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from aiolocks.postgres._client import Connection, Pool, Statements, connector, pool_maker
from aiolocks.postgres._lease import pool_options
from aiolocks.postgres._url import parse_postgres_url
from aiolocks.testing import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


def _callback(*args: object) -> None:
    """A listener that is never called (nothing is sent)."""


#: every member of each protocol, with the arguments the recipes pass it
RECIPE_CALLS: dict[type, dict[str, tuple[tuple[Any, ...], dict[str, Any]]]] = {
    Statements: {
        "fetch": (("SELECT 1",), {"timeout": 1.0}),
        "fetchrow": (("SELECT $1::int", 1), {"timeout": 1.0}),
        "fetchval": (("SELECT $1::int", 1), {"column": 0, "timeout": 1.0}),
        "execute": (("SELECT 1",), {"timeout": 1.0}),
    },
    Connection: {
        "get_server_pid": ((), {}),
        "is_closed": ((), {}),
        "is_in_transaction": ((), {}),
        "terminate": ((), {}),
        "add_listener": (("aiolocks_channel", _callback), {}),
        "add_termination_listener": ((_callback,), {}),
        "transaction": ((), {}),
        "prepare": (("SELECT 1",), {"timeout": 1.0}),
    },
    Pool: {
        "acquire": ((), {}),
        "release": ((object(),), {}),
        "terminate": ((), {}),
    },
}

#: members that close or change the session: their signature is checked, they are not called
NOT_CALLED = {"terminate", "add_termination_listener", "transaction", "acquire"}


def _own_members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


async def test_the_table_names_every_member_of_every_protocol() -> None:
    """A member added to a protocol must be added to the table (the recipes may call it)."""
    for protocol, calls in RECIPE_CALLS.items():
        assert set(calls) == _own_members(protocol), protocol.__name__
        for name, (args, kwargs) in calls.items():
            inspect.signature(vars(protocol)[name]).bind(protocol, *args, **kwargs)


def _check(obj: Any, *protocols: type) -> None:
    """``obj`` has each member of ``protocols`` and takes the recipes' calls; members the
    protocol declares ``async`` return an awaitable (closed unsent: no I/O)."""
    for protocol in protocols:
        for name, (args, kwargs) in RECIPE_CALLS[protocol].items():
            what = f"{type(obj).__name__}.{name}"
            method = getattr(obj, name, None)
            assert callable(method), f"asyncpg has no {what}"
            try:
                inspect.signature(method).bind(*args, **kwargs)
            except TypeError as exc:
                raise AssertionError(f"{what} does not take {args}, {kwargs}: {exc}") from None
            if name in NOT_CALLED:
                continue
            result = method(*args, **kwargs)
            if inspect.iscoroutinefunction(vars(protocol)[name]):
                assert inspect.isawaitable(result), f"{what} returned {result!r}"
                if inspect.iscoroutine(result):
                    result.close()


async def test_asyncpg_connections_and_pools_have_the_recipes_interface(
    postgres_server: PostgresServer,
) -> None:
    kwargs = parse_postgres_url(postgres_server.url).connect_kwargs()
    conn = await connector(kwargs)()
    try:
        _check(conn, Statements, Connection)
        assert await conn.fetchval("SELECT $1::int", 7) == 7
    finally:
        await conn.close()
    pool = await pool_maker(kwargs, max_size=2, **pool_options())(True)
    try:
        _check(pool, Statements, Pool)
        borrowed = await pool.acquire()
        try:
            _check(borrowed, Statements, Connection)  # asyncpg's pool proxy
            assert borrowed.get_server_pid() > 0
        finally:
            await pool.release(borrowed)
    finally:
        await pool.close()
