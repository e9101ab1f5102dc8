"""Cancelling ``backend.doctor()`` while it holds its scratch lock leaves nothing behind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from aiolocks import Backend, LockEvent
from aiolocks._connect import backend_from_url
from aiolocks._core.doctor import SCRATCH_PREFIX
from aiolocks.testing.servers import RedisServer, ZooKeeperServer


@pytest_asyncio.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("zookeeper", marks=pytest.mark.zookeeper),
    ]
)
async def url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    if request.param == "memory":
        yield f"memory://doctor-cancel-{uuid.uuid4().hex[:6]}"
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        yield f"{server.url}/0?key_prefix=doctor-cancel-{uuid.uuid4().hex[:8]}:"
    else:
        zk: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
        yield f"{zk.url}/doctor-cancel-{uuid.uuid4().hex[:8]}"


async def _cancel_on(backend: Backend, kind: str, which: int) -> str:
    """Run doctor(); cancel it at the ``which``-th ``kind`` event of its scratch lock."""
    task: asyncio.Task[object] | None = None
    seen: list[str] = []

    def hook(event: LockEvent) -> None:
        if event.name.startswith(SCRATCH_PREFIX) and event.kind == kind:
            seen.append(event.name)
            if len(seen) == which and task is not None:
                task.cancel()

    backend.add_event_hook(hook)
    task = asyncio.ensure_future(backend.doctor())
    with pytest.raises(asyncio.CancelledError):
        await task
    backend.remove_event_hook(hook)
    assert len(seen) >= which
    return seen[0]


@pytest.mark.asyncio
@pytest.mark.parametrize(("kind", "which"), [("acquired", 1), ("acquired", 2), ("released", 1)])
async def test_cancelled_doctor_leaks_no_scratch_lock(url: str, kind: str, which: int) -> None:
    backend = backend_from_url(url)
    other = backend_from_url(url)
    try:
        name = await _cancel_on(backend, kind, which)
        # the scratch lock is free: another client takes it without waiting
        async with other.mutex(name).hold(timeout=0) as lock:
            assert lock.fencing_token is not None
        # and doctor still runs to the end on the same backend afterwards
        report = await backend.doctor()
        assert report.self_test is not None and report.self_test.ok
    finally:
        await other.close()
        await backend.close()
    if url.startswith("redis://"):
        await _assert_no_keys(url)


async def _assert_no_keys(url: str) -> None:
    import redis.asyncio

    prefix = url.partition("key_prefix=")[2]
    client = redis.asyncio.Redis.from_url(url.partition("?")[0])
    try:
        assert [key async for key in client.scan_iter(match=f"{prefix}*")] == []
    finally:
        await client.aclose()
