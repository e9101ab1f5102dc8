"""The payment examples' data, in PostgreSQL: orders, and the one charge each may get.

``fastapi_app.py`` and ``aiohttp_app.py`` keep their state here, so that
every worker process (uvicorn ``--workers``, several aiohttp processes,
several hosts) sees the same orders. Two tables, in a schema of their own::

    orders  (id, cents, status 'due' | 'paid', last_token)
    charges (order_id PRIMARY KEY, cents, fencing_token, worker)

A payment, run while holding ``locks/pay/order-{id}``, does three things
(:func:`pay`):

1. **claim** the order for this hold's fencing token, in SQL:
   ``UPDATE orders SET last_token = $2 WHERE id = $1 AND status = 'due' AND
   last_token < $2``. No row changes: the order is paid already, or a newer
   holder of the lock has claimed it (this hold is stale: it was lost,
   perhaps while this process was paused, and does not know yet);
2. talk to the payment provider (here a short sleep);
3. **record the charge** in one statement that marks the order paid only if
   the last claim is still this token's, and inserts its charge row. The
   charge row's primary key is the order id: there is never a second charge,
   whatever the lock did.

The lock keeps two requests from paying at once (the second gets a clear
409 instead of a database error); the token keeps a holder that lost its
lock from writing after the next holder has started; the primary key is the
last line of defence.

Settings come from the environment (:meth:`Settings.from_env`), so that
``uvicorn --factory examples.fastapi_app:create_app`` and each aiohttp
process read the same ones.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import asyncpg

import aiolocks

#: the orders that :func:`migrate` creates for trying the apps by hand (id -> 1000 + id cents)
DEMO_ORDERS = range(1000, 1100)

#: this worker process, as the charges table records it
WORKER = f"{socket.gethostname()}:{os.getpid()}"

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

_SCHEMA_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.orders (
    id bigint PRIMARY KEY,
    cents bigint NOT NULL CHECK (cents > 0),
    status text NOT NULL DEFAULT 'due' CHECK (status IN ('due', 'paid')),
    last_token bigint NOT NULL DEFAULT -1
);
CREATE TABLE IF NOT EXISTS {schema}.charges (
    order_id bigint PRIMARY KEY REFERENCES {schema}.orders (id),
    cents bigint NOT NULL,
    fencing_token bigint NOT NULL,
    worker text NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {schema}.orders (id, cents)
    SELECT n, 1000 + n FROM generate_series({first}, {last}) AS n
    ON CONFLICT (id) DO NOTHING;
"""

_CLAIM = """
UPDATE orders SET last_token = $2
WHERE id = $1 AND status = 'due' AND last_token < $2
RETURNING cents
"""

_CHARGE = """
WITH paid AS (
    UPDATE orders SET status = 'paid'
    WHERE id = $1 AND status = 'due' AND last_token = $2
    RETURNING id, cents
)
INSERT INTO charges (order_id, cents, fencing_token, worker)
SELECT id, cents, $2, $3 FROM paid
RETURNING order_id, cents, fencing_token, worker
"""


class UnknownOrderError(LookupError):
    """There is no such order."""


class AlreadyPaidError(Exception):
    """The order was paid already."""


class SupersededError(Exception):
    """A newer holder of the order's lock has claimed the order: this hold is stale."""


class StoreUnavailableError(Exception):
    """The database connection failed part-way: the payment's outcome is unknown."""


#: what asyncpg raises when the server or the connection goes away mid-statement
_CONNECTION_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


@dataclass(frozen=True, slots=True)
class Charge:
    """One row of the charges table."""

    order_id: int
    cents: int
    fencing_token: int
    worker: str


@dataclass(frozen=True, slots=True)
class Settings:
    """Where the app keeps its locks and its data, and how long a request waits.

    :ivar lock_url: the aiolocks backend (``AIOLOCKS_URL``)
    :ivar database_url: the PostgreSQL database with the orders (``SHOP_DATABASE_URL``)
    :ivar schema: the schema of the two tables (``SHOP_SCHEMA``, default ``shop``)
    :ivar lock_timeout: seconds a request waits for the order's lock before 409
        (``SHOP_LOCK_TIMEOUT``)
    :ivar provider_latency: seconds the payment provider takes (``SHOP_PROVIDER_LATENCY``)
    :ivar pause_file: test hook, see :func:`pause_point` (``SHOP_PAUSE_FILE``)
    """

    lock_url: str = "memory://"
    database_url: str = ""
    schema: str = "shop"
    lock_timeout: float = 2.0
    provider_latency: float = 0.05
    pause_file: str | None = None

    def __post_init__(self) -> None:
        if not self.database_url:
            raise ValueError(
                "no database: set SHOP_DATABASE_URL (or --database) to a PostgreSQL URL"
            )
        if not _IDENTIFIER.match(self.schema):
            raise ValueError(
                f"SHOP_SCHEMA {self.schema!r} is not a plain lower-case SQL identifier"
            )
        if not self.lock_timeout > 0:
            raise ValueError(f"SHOP_LOCK_TIMEOUT must be > 0, got {self.lock_timeout}")
        if not self.provider_latency >= 0:
            raise ValueError(f"SHOP_PROVIDER_LATENCY must be >= 0, got {self.provider_latency}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings named by the environment variables (see the class docstring)."""
        env = os.environ if env is None else env
        return cls(
            lock_url=env.get("AIOLOCKS_URL", "memory://"),
            database_url=env.get("SHOP_DATABASE_URL", ""),
            schema=env.get("SHOP_SCHEMA", "shop"),
            lock_timeout=_seconds(env, "SHOP_LOCK_TIMEOUT", "2"),
            provider_latency=_seconds(env, "SHOP_PROVIDER_LATENCY", "0.05"),
            pause_file=env.get("SHOP_PAUSE_FILE") or None,
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that give these settings to a worker process."""
        env = {
            "AIOLOCKS_URL": self.lock_url,
            "SHOP_DATABASE_URL": self.database_url,
            "SHOP_SCHEMA": self.schema,
            "SHOP_LOCK_TIMEOUT": str(self.lock_timeout),
            "SHOP_PROVIDER_LATENCY": str(self.provider_latency),
        }
        if self.pause_file:
            env["SHOP_PAUSE_FILE"] = self.pause_file
        return env


def _seconds(env: Mapping[str, str], name: str, default: str) -> float:
    text = env.get(name, default)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None


@asynccontextmanager
async def open_pool(settings: Settings) -> AsyncIterator[Any]:
    """An asyncpg pool whose connections find the two tables in ``settings.schema``."""
    pool = await asyncpg.create_pool(
        settings.database_url,
        min_size=1,
        max_size=10,
        server_settings={"search_path": settings.schema, "application_name": "aiolocks-shop"},
    )
    try:
        yield pool
    finally:
        await pool.close()


async def migrate(pool: Any, backend: aiolocks.Backend, schema: str) -> None:
    """Create the schema, the tables and the demo orders, once across every worker.

    Every worker runs this at startup; ``CREATE ... IF NOT EXISTS`` from
    several sessions at once can still fail on PostgreSQL, so the workers
    take turns under a lock (the usual "run migrations once" use of a
    distributed lock).
    """
    ddl = _SCHEMA_DDL.format(schema=schema, first=DEMO_ORDERS[0], last=DEMO_ORDERS[-1])
    async with backend.mutex(f"locks/shop/migrate/{schema}").hold(timeout=60):
        await pool.execute(ddl)


async def reset_order(pool: Any, order_id: int, cents: int | None = None) -> None:
    """Make an order due again, with no charge (the demo pays the same order every run)."""
    async with pool.acquire() as db, db.transaction():
        await db.execute("DELETE FROM charges WHERE order_id = $1", order_id)
        await db.execute(
            "INSERT INTO orders (id, cents) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE "
            "SET cents = excluded.cents, status = 'due', last_token = -1",
            order_id,
            cents if cents is not None else 1000 + order_id,
        )


async def order_state(pool: Any, order_id: int) -> tuple[str, Charge | None]:
    """``(status, charge or None)`` of an order; :class:`UnknownOrderError` if none."""
    status = await pool.fetchval("SELECT status FROM orders WHERE id = $1", order_id)
    if status is None:
        raise UnknownOrderError(order_id)
    found = await charges(pool, order_id)
    return status, found[0] if found else None


async def charges(pool: Any, order_id: int) -> list[Charge]:
    """Every charge row of an order (never more than one: the primary key)."""
    rows = await pool.fetch(
        "SELECT order_id, cents, fencing_token, worker FROM charges WHERE order_id = $1",
        order_id,
    )
    return [Charge(**dict(row)) for row in rows]


async def pay(pool: Any, order_id: int, *, fencing_token: int, settings: Settings) -> Charge:
    """Charge an order once, fenced by ``fencing_token``; call it holding the order's lock.

    :raises UnknownOrderError: no such order
    :raises AlreadyPaidError: it was paid already
    :raises SupersededError: a newer holder of the lock claimed the order (this hold is stale)
    :raises StoreUnavailableError: the database went away part-way (outcome unknown)
    """
    try:
        if await pool.fetchval(_CLAIM, order_id, fencing_token) is None:
            await _refused(pool, order_id)
        await pause_point(settings, "before-charge", fencing_token)
        await asyncio.sleep(settings.provider_latency)  # the payment provider's round trip
        row = await pool.fetchrow(_CHARGE, order_id, fencing_token, WORKER)
        if row is None:
            await _refused(pool, order_id)
        await pause_point(settings, "after-charge", fencing_token)  # e.g. sending the receipt
    except _CONNECTION_ERRORS as exc:
        raise StoreUnavailableError(order_id) from exc
    return Charge(**dict(row))


async def _refused(pool: Any, order_id: int) -> NoReturn:
    """Say why a fenced statement changed no row."""
    status = await pool.fetchval("SELECT status FROM orders WHERE id = $1", order_id)
    if status is None:
        raise UnknownOrderError(order_id)
    if status == "paid":
        raise AlreadyPaidError(order_id)
    raise SupersededError(order_id)


async def pause_point(settings: Settings, phase: str, fencing_token: int) -> None:
    """Test hook: hold one request at ``phase`` until its lock is lost.

    Inert unless ``SHOP_PAUSE_FILE`` names a file. When that file exists and
    holds ``phase``, the first request of any worker to get here renames it
    to ``<file>.taken`` (so only one request pauses), writes ``<pid>
    <fencing token>`` to ``<file>.held`` and waits while ``<file>.taken``
    exists. A test then breaks the lock from outside the process and checks
    that the request answers 503.
    """
    if not settings.pause_file:
        return
    path = Path(settings.pause_file)
    try:
        if path.read_text().strip() != phase:
            return
        taken = path.with_name(path.name + ".taken")
        path.rename(taken)
    except FileNotFoundError:
        return  # no pause asked for, or another request took it
    held = path.with_name(path.name + ".held")
    scratch = path.with_name(f"{path.name}.{os.getpid()}")
    scratch.write_text(f"{os.getpid()} {fencing_token}\n")
    scratch.replace(held)
    while taken.exists():
        await asyncio.sleep(0.05)
