"""A lock node deleted behind our back is reported when the body ends."""

from __future__ import annotations

from typing import Any

import pytest

import aiolocks
from aiolocks.zookeeper import ZooKeeperBackend

from .conftest import lock_nodes

pytestmark = pytest.mark.asyncio


async def test_node_deleted_behind_our_back_raises_lock_lost(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    lock = backend.mutex("behind/back")
    with pytest.raises(aiolocks.LockLostError, match="already gone"):
        async with lock:
            nodes = await lock_nodes(observer)
            assert len(nodes) == 1
            await observer.delete(nodes[0])
    assert await lock_nodes(observer) == []
    # the lock works again afterwards
    async with lock.hold(timeout=5):
        assert lock.is_owned_by_current_task()


@pytest.mark.parametrize("kind", ["mutex", "semaphore_mutex"])
async def test_explicit_release_of_a_vanished_node_raises_lock_lost(
    backend: ZooKeeperBackend, observer: Any, kind: str
) -> None:
    """The cron-job pattern (acquire / try / finally release) does not hide a loss."""
    lock = getattr(backend, kind)(f"behind/manual-{kind}")
    assert await lock.acquire()
    for node in await lock_nodes(observer):
        await observer.delete(node)
    with pytest.raises(aiolocks.LockLostError, match="already gone"):
        await lock.release()
    assert lock.is_lost  # sticky after the hold ended
    assert not lock.is_owned_by_current_task()
    assert await lock_nodes(observer) == []
    assert await lock.acquire(timeout=5)
    assert not lock.is_lost
    await lock.release()
