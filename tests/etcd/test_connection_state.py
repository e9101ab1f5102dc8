"""Connection states of an etcd backend (its session lease), on a real server behind a proxy,
and the Prometheus gauge that follows them."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import aiolocks
from aiolocks.etcd import ConnectionState, EtcdBackend
from aiolocks.testing import EtcdServer, TcpProxy

from ..polling import eventually

pytestmark = pytest.mark.etcd

PATIENCE = 30.0


def _state(backend: EtcdBackend) -> ConnectionState | None:
    """``backend.connection_state`` read afresh (not narrowed by an earlier assert)."""
    return backend.connection_state


def _lost(lock: aiolocks.Mutex) -> bool:
    """``lock.is_lost`` read afresh (not narrowed by an earlier assert)."""
    return lock.is_lost


async def _until(states: list[ConnectionState], wanted: ConnectionState, after: int) -> int:
    """Wait until ``wanted`` shows up in ``states`` past index ``after``; return its index."""
    await eventually(lambda: wanted in states[after:], PATIENCE, what=f"state {wanted.name}")
    return states.index(wanted, after) + 1


@pytest.mark.asyncio
async def test_suspended_reconnected_lost_and_a_new_session(etcd_server: EtcdServer) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from aiolocks.prometheus import PrometheusHook

    host, _, port = etcd_server.endpoints[0].rpartition(":")
    async with TcpProxy(host, int(port)) as proxy:
        url = f"etcd://{proxy.netloc}/cs-{uuid.uuid4().hex[:8]}?lease_ttl=2&request_timeout=1"
        backend = EtcdBackend(url)
        seen: list[ConnectionState] = []
        remove = backend.add_connection_listener(seen.append)  # before open(): sees CONNECTED
        before_open = backend.connection_state
        assert before_open is None
        registry = prometheus_client.CollectorRegistry()
        hook = PrometheusHook(registry=registry)
        async with backend:
            detach = hook.attach(backend)
            assert seen == [ConnectionState.CONNECTED]
            assert backend.connection_state is ConnectionState.CONNECTED
            iterated: list[ConnectionState] = []

            async def follow() -> None:
                async for state in backend.connection_states():
                    iterated.append(state)

            follower = asyncio.create_task(follow())
            await asyncio.sleep(0)
            lock = backend.mutex("held")
            assert await lock.acquire(timeout=PATIENCE)

            # A partition shorter than the TTL: suspended, then the same lease again.
            proxy.stall()
            mark = await _until(seen, ConnectionState.SUSPENDED, 1)
            assert not _lost(lock), "suspended is not lost"
            proxy.stall(False)
            mark = await _until(seen, ConnectionState.RECONNECTED, mark)
            assert not _lost(lock) and ConnectionState.LOST not in seen

            # A partition past the TTL: the lease ends client-side, every hold with it.
            proxy.stall()
            mark = await _until(seen, ConnectionState.LOST, mark)
            assert _lost(lock)
            assert _state(backend) is ConnectionState.LOST
            value = registry.get_sample_value(
                "aiolocks_connection_state", {"backend": backend.url, "state": "lost"}
            )
            assert value == 1.0
            proxy.stall(False)
            # A new lease in the background, without any acquire asking for one.
            await _until(seen, ConnectionState.RECONNECTED, mark)
            assert _state(backend) is ConnectionState.RECONNECTED
            with pytest.raises(aiolocks.LockLostError):
                await lock.release()
            async with lock:
                assert not _lost(lock)
            for state in ("reconnected", "lost", "suspended"):
                value = registry.get_sample_value(
                    "aiolocks_connection_state", {"backend": backend.url, "state": state}
                )
                assert value == (1.0 if state == "reconnected" else 0.0)
            detach()
        remove()
        async with asyncio.timeout(PATIENCE):
            await follower  # the iteration ends when the backend closes
        assert iterated == seen[1:]
