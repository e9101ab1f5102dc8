"""The Jepsen-style checker against a real PostgreSQL, both modes, with faults injected.

Same harness as ``test_checker.py``: each worker reaches the server through
its own :class:`~aiolocks.testing.TcpProxy`; faults are connection cuts,
partitions (stalls), added latency, a SIGKILL and restart of the server,
``pg_terminate_backend`` of a random client session, and event-loop blocks.
Every count that must be 0 is 0, and nothing is left on the server after
(no advisory lock in ``pg_locks``, no live lease row). See ``docs/chaos.md``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import asyncpg
import pytest

from aiolocks.postgres._sql import TableNames, ensure_schema
from aiolocks.testing import PostgresServer

from .checker import Fault, RunSpec, WorkerPool, run_chaos
from .test_checker import (
    WORKERS,
    _check,
    _seconds,
    block_fault,
    proxy_faults,
    restart_fault,
    worker_proxies,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

#: advisory: a hold is declared lost within heartbeat + 1 s of its session's end
HEARTBEAT = 1.0
#: lease: rows live this long without a renewal
LEASE = 2.0


def terminate_fault(server: PostgresServer) -> Fault:
    """``pg_terminate_backend`` of one random client session, as an administrator would."""

    async def terminate(rng: random.Random) -> str:
        pids = await asyncio.to_thread(server.backend_pids)
        if not pids:
            return "no client session to terminate"
        pid = rng.choice(pids)
        done = await asyncio.to_thread(server.terminate_backend, pid)
        return f"pg_terminate_backend({pid}) -> {done}"

    return terminate


async def postgres_leftovers(server: PostgresServer, within: float) -> list[str]:
    """Advisory locks and live lease rows still on the server after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        left = [f"advisory lock {row}" for row in await asyncio.to_thread(server.advisory_locks)]
        rows = await asyncio.to_thread(
            server.query,
            "SELECT name, slot, owner FROM aiolocks_leases WHERE expires_at > clock_timestamp()",
        )
        left += [f"lease row {row}" for row in rows]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.2)


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["advisory", "lease"])
async def test_postgres_under_faults(
    postgres_restartable: PostgresServer, tmp_path: Path, mode: str
) -> None:
    """Cut, stall, delay, kill/restart, pg_terminate_backend and loop blocks."""
    server = postgres_restartable
    # the library's tables exist before the first fault (the leak check reads them)
    conn = await asyncpg.connect(server.url)
    try:
        await ensure_schema(conn, TableNames())
    finally:
        await conn.close()
    timing = f"heartbeat={HEARTBEAT}" if mode == "advisory" else f"mode=lease&lease_time={LEASE}"
    bound = HEARTBEAT + 1 if mode == "advisory" else LEASE
    async with worker_proxies(server.host, server.port) as proxies:
        urls = [
            f"postgresql://{server.user}@{proxy.netloc}/{server.database}?{timing}"
            "&connect_timeout=5"
            for proxy in proxies
        ]
        spec = RunSpec(
            label=f"postgres-{mode}",
            urls=urls[:WORKERS],
            duration=_seconds(12),
            grace=bound * 3 + 4,
            block=bound * 1.5,
        )

        def faults(pool: WorkerPool) -> dict[str, Fault]:
            return {
                **proxy_faults(proxies, max_stall=bound * 2),
                "restart": restart_fault(server.kill, server.start, "postgres", 0.5),
                "terminate": terminate_fault(server),
                "block": block_fault(pool),
            }

        async def heal() -> None:
            for proxy in proxies:
                proxy.heal()
            if not server.running:
                await asyncio.to_thread(server.start)

        async def leaks() -> list[str]:
            return await postgres_leftovers(server, within=bound + 10)

        report, pool, injector = await run_chaos(spec, faults, leaks, heal, tmp_path)
    _check(report, pool, injector.events)
