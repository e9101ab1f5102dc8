"""A hold found gone at release time is reported as LockLostError."""

from __future__ import annotations

import uuid

import pytest

import aiolocks
from aiolocks.testing import RedisServer

pytestmark = pytest.mark.asyncio


async def test_key_deleted_before_the_first_renewal_raises_at_exit(
    redis_server: RedisServer,
) -> None:
    prefix = f"test-release-loss-{uuid.uuid4().hex[:8]}:"
    async with aiolocks.connect(redis_server.url, key_prefix=prefix) as backend:
        lock = backend.mutex("gone/at-release", lease_time=30)
        with pytest.raises(aiolocks.LockLostError, match="already gone"):
            async with lock:
                keys = redis_server.command("KEYS", prefix + "*")
                assert isinstance(keys, list) and keys
                for key in keys:
                    assert isinstance(key, str)
                    redis_server.command("DEL", key)
        # and the next hold works normally
        async with lock.hold(timeout=5):
            assert not lock.is_lost
    assert redis_server.command("KEYS", prefix + "*") == []
