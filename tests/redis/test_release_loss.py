"""A hold found gone at release time is reported as LockLostError."""

from __future__ import annotations

import uuid

import pytest

import aiolocks
from aiolocks.testing import RedisServer

pytestmark = pytest.mark.asyncio


def _delete_keys(redis_server: RedisServer, prefix: str) -> None:
    """Delete every key of ``prefix`` behind the library's back."""
    keys = redis_server.command("KEYS", prefix + "*")
    assert isinstance(keys, list) and keys
    for key in keys:
        assert isinstance(key, str)
        redis_server.command("DEL", key)


async def test_key_deleted_before_the_first_renewal_raises_at_exit(
    redis_server: RedisServer,
) -> None:
    prefix = f"test-release-loss-{uuid.uuid4().hex[:8]}:"
    async with aiolocks.connect(redis_server.url, key_prefix=prefix) as backend:
        lock = backend.mutex("gone/at-release", lease_time=30)
        with pytest.raises(aiolocks.LockLostError, match="already gone"):
            async with lock:
                _delete_keys(redis_server, prefix)
        # and the next hold works normally
        async with lock.hold(timeout=5):
            assert not lock.is_lost
    assert redis_server.command("KEYS", prefix + "*") == []


@pytest.mark.parametrize("kind", ["mutex", "semaphore_mutex"])
async def test_key_deleted_under_the_explicit_pattern_raises_at_release(
    redis_server: RedisServer, kind: str
) -> None:
    """acquire / try / finally release: the loss surfaces at ``release()``, after cleanup."""
    prefix = f"test-release-loss-{uuid.uuid4().hex[:8]}:"
    async with aiolocks.connect(redis_server.url, key_prefix=prefix) as backend:
        lock = getattr(backend, kind)("gone/explicit", lease_time=30)
        body_ran_to_the_end = False
        with pytest.raises(aiolocks.LockLostError, match="already gone"):
            if await lock.acquire(timeout=5):
                try:
                    _delete_keys(redis_server, prefix)
                    body_ran_to_the_end = True  # nothing cancels a body outside async with
                finally:
                    await lock.release()
        assert body_ran_to_the_end
        assert lock.is_lost and not lock.is_owned_by_current_task()
        assert not backend._holds
        # another process takes it at once, and the next acquire clears is_lost
        async with aiolocks.connect(redis_server.url, key_prefix=prefix) as other:
            rival = getattr(other, kind)("gone/explicit")
            assert await rival.acquire(timeout=0)
            await rival.release()
        assert await lock.acquire(timeout=5)
        assert not lock.is_lost
        await lock.release()
    assert redis_server.command("KEYS", prefix + "*") == []


async def test_a_refused_first_unlock_does_not_hide_the_loss(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A demoted master refuses the unlock script (READONLY, which redis-py's
    Sentinel connection reports as a ConnectionError): it did not run, so
    "nothing to delete" from the next server is still proof of a loss."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ReadOnlyError

    prefix = f"test-release-loss-{uuid.uuid4().hex[:8]}:"
    async with aiolocks.connect(redis_server.url, key_prefix=prefix) as backend:
        node = backend._driver.node
        real_release = node.release
        refusals: list[int] = []

        async def refuse_once(*args: object) -> int:
            if not refusals:
                refusals.append(1)
                try:
                    raise ReadOnlyError("You can't write against a read only replica.")
                except ReadOnlyError:
                    raise RedisConnectionError("The previous master is now a slave") from None
            return int(await real_release(*args))

        lock = backend.mutex("gone/refused", lease_time=30)
        with pytest.raises(aiolocks.LockLostError, match="already gone"):
            async with lock:
                _delete_keys(redis_server, prefix)
                monkeypatch.setattr(node, "release", refuse_once)
        assert refusals == [1]


async def test_only_a_readonly_refusal_counts_as_not_run() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ReadOnlyError

    from aiolocks.redis._driver import refused_unrun

    with pytest.raises(RedisConnectionError) as caught:
        try:
            raise ReadOnlyError("READONLY")
        except ReadOnlyError:
            raise RedisConnectionError("The previous master is now a slave") from None
    assert refused_unrun(caught.value)
    assert refused_unrun(ReadOnlyError("READONLY"))
    assert not refused_unrun(RedisConnectionError("Connection reset by peer"))
    assert not refused_unrun(OSError("broken pipe"))
