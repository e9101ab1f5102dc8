"""Connection states of the PostgreSQL backend (both modes) and the Prometheus gauge."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from prometheus_client import CollectorRegistry

import aiolocks
from aiolocks.postgres import ConnectionState, PostgresBackend
from aiolocks.prometheus import PrometheusHook
from aiolocks.testing import PostgresServer, TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def _next(states: asyncio.Queue[ConnectionState]) -> ConnectionState:
    return await asyncio.wait_for(states.get(), 60)


def _state(backend: PostgresBackend) -> ConnectionState | None:
    return backend.connection_state  # (a call: mypy does not narrow it between awaits)


def _proxied(server: PostgresServer, proxy: TcpProxy, query: str) -> str:
    return f"postgresql://{server.user}@{proxy.netloc}/{server.database}?sslmode=disable&{query}"


async def test_advisory_terminated_session_is_lost_then_reconnected(
    postgres_server: PostgresServer,
) -> None:
    app = f"aiolocks-state-{uuid.uuid4().hex[:8]}"
    registry = CollectorRegistry()
    prom = PrometheusHook(registry)
    backend = PostgresBackend(f"{postgres_server.url}?heartbeat=1&application_name={app}")
    states: asyncio.Queue[ConnectionState] = asyncio.Queue()
    backend.add_connection_listener(states.put_nowait)  # before open: sees CONNECTED
    assert _state(backend) is None
    async with backend:
        detach = prom.attach(backend)

        def value(state: ConnectionState) -> float | None:
            return registry.get_sample_value(
                "aiolocks_connection_state", {"backend": backend.url, "state": state.value}
            )

        assert await _next(states) is ConnectionState.CONNECTED
        assert value(ConnectionState.CONNECTED) == 1
        lock = backend.mutex(f"states/{app}")
        assert await lock.acquire(timeout=10)
        assert await asyncio.to_thread(postgres_server.terminate_backends, application_name=app)
        assert await _next(states) is ConnectionState.LOST
        assert await _next(states) is ConnectionState.RECONNECTED  # in the background
        assert _state(backend) is ConnectionState.RECONNECTED
        assert value(ConnectionState.RECONNECTED) == 1 and value(ConnectionState.LOST) == 0
        assert lock.is_lost
        with pytest.raises(aiolocks.LockLostError):
            await lock.release()
        async with lock:  # the new session takes locks
            assert lock.fencing_token is not None
        detach()


async def test_advisory_cut_link_is_lost_suspended_while_unreachable_then_reconnected(
    postgres_server: PostgresServer,
) -> None:
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        backend = PostgresBackend(_proxied(postgres_server, proxy, "heartbeat=1"))
        async with backend:
            seen: list[ConnectionState] = []
            iterator = backend.connection_states()

            async def collect() -> None:
                async for state in iterator:
                    seen.append(state)
                    if state is ConnectionState.RECONNECTED:
                        return

            collector = asyncio.create_task(collect())
            await asyncio.sleep(0)  # the iterator is registered
            assert _state(backend) is ConnectionState.CONNECTED
            lock = backend.mutex(f"states/cut/{uuid.uuid4().hex[:8]}")
            assert await lock.acquire(timeout=10)
            proxy.refuse()
            proxy.cut()
            async with asyncio.timeout(60):
                while ConnectionState.SUSPENDED not in seen:
                    await asyncio.sleep(0.01)
            assert seen[:2] == [ConnectionState.LOST, ConnectionState.SUSPENDED]
            proxy.refuse(False)
            await asyncio.wait_for(collector, 60)
            assert seen[-1] is ConnectionState.RECONNECTED
            assert lock.is_lost


async def test_lease_renewals_that_fail_suspend_and_recover(
    postgres_server: PostgresServer,
) -> None:
    async with TcpProxy(postgres_server.host, postgres_server.port) as proxy:
        url = _proxied(postgres_server, proxy, "mode=lease&lease_time=30&connect_timeout=2")
        backend = PostgresBackend(url)
        async with backend:
            assert _state(backend) is ConnectionState.CONNECTED
            states: asyncio.Queue[ConnectionState] = asyncio.Queue()
            backend.add_connection_listener(states.put_nowait)
            lock = backend.mutex(f"states/lease/{uuid.uuid4().hex[:8]}", lease_time=1.5)
            assert await lock.acquire(timeout=10)
            proxy.refuse()
            proxy.cut()  # the pool's connections go; renewals cannot reconnect
            assert await _next(states) is ConnectionState.SUSPENDED
            proxy.refuse(False)
            # the row outlived the outage or not: either way the next statement gets through
            nxt = await _next(states)
            if nxt is ConnectionState.LOST:  # the lease ran out meanwhile (loaded machine)
                nxt = await _next(states)
            assert nxt is ConnectionState.RECONNECTED
            assert _state(backend) is ConnectionState.RECONNECTED
            if not lock.is_lost:
                await lock.release()
