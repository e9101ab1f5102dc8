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


async def test_manual_release_of_a_vanished_node_does_not_raise(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    lock = backend.semaphore_mutex("behind/manual")
    assert await lock.acquire()
    for node in await lock_nodes(observer):
        await observer.delete(node)
    await lock.release()  # "release() after loss does not raise"
    assert await lock.acquire(timeout=5)
    await lock.release()
