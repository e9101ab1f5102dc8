"""The contenders: aiolocks and the libraries users would otherwise pick, behind one tiny interface.

Each contender opens a *session* (one client / connection pool / ZooKeeper
session, as an application would keep one per process) and makes *lock
handles* on it: ``acquire()`` waits as long as it takes, ``release()`` lets
go. Asyncio libraries implement :class:`AsyncSession`; thread-based ones
(kazoo, python-redis-lock) implement :class:`SyncSession` and are driven
from threads, the way they are used.

Every contender is configured as its documentation suggests for a blocking
mutex with a 30 s lease, except where noted in ``note``. Nothing is tuned
for aiolocks that is not tuned for the peers.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "CONTENDERS",
    "AsyncLockHandle",
    "AsyncSession",
    "Contender",
    "SyncLockHandle",
    "SyncSession",
    "lock_name",
    "open_async",
    "open_sync",
]

Service = Literal["redis", "zookeeper"]
Style = Literal["async", "thread"]

#: Lease of every Redis lock in the benchmark (seconds): aiolocks's default,
#: and the same fixed expiry for the peers that take one.
LEASE_S = 30


class AsyncLockHandle(Protocol):
    """One task's handle on one lock."""

    async def acquire(self) -> None:
        """Wait until held."""

    async def release(self) -> None:
        """Let go."""


class AsyncSession(Protocol):
    """A connected asyncio client."""

    def lock(self, name: str) -> AsyncLockHandle:
        """A handle for one task on the lock ``name``."""

    async def close(self) -> None:
        """Disconnect."""


class SyncLockHandle(Protocol):
    """One thread's handle on one lock."""

    def acquire(self) -> None:
        """Block until held."""

    def release(self) -> None:
        """Let go."""


class SyncSession(Protocol):
    """A connected thread-safe client."""

    def lock(self, name: str) -> SyncLockHandle:
        """A handle for one thread on the lock ``name``."""

    def close(self) -> None:
        """Disconnect."""


@dataclass(frozen=True)
class Contender:
    """A library (and configuration) in the comparison."""

    key: str
    label: str
    service: Service
    style: Style
    module: str
    distribution: str
    note: str = ""

    @property
    def is_aiolocks(self) -> bool:
        """Whether this is the library under test."""
        return self.key.startswith("aiolocks")

    def unavailable_reason(self) -> str | None:
        """Why this contender cannot run here (not installed, broken import), or ``None``."""
        try:
            importlib.import_module(self.module)
        except Exception as exc:  # any import failure means "cannot run here"
            return f"{self.distribution} cannot be imported: {type(exc).__name__}: {exc}"
        return None

    def version(self) -> str | None:
        """Installed version of the distribution, if known."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None


CONTENDERS: tuple[Contender, ...] = (
    Contender(
        "aiolocks-redis",
        "aiolocks mutex",
        "redis",
        "async",
        "aiolocks.redis",
        "aiolocks",
        "reentrant per task, fencing token, watchdog (lease 30 s), pub/sub wake-up",
    ),
    Contender(
        "redis-py",
        "redis-py Lock (sleep=0.1)",
        "redis",
        "async",
        "redis.asyncio.lock",
        "redis",
        "redis.asyncio Lock, default poll sleep 0.1 s, timeout=30",
    ),
    Contender(
        "redis-py-tuned",
        "redis-py Lock (sleep=0.001)",
        "redis",
        "async",
        "redis.asyncio.lock",
        "redis",
        "redis.asyncio Lock, poll sleep tuned to 1 ms, timeout=30",
    ),
    Contender(
        "python-redis-lock",
        "python-redis-lock",
        "redis",
        "thread",
        "redis_lock",
        "python-redis-lock",
        "threads, sync redis client, expire=30, BLPOP wake-up",
    ),
    Contender(
        "pottery",
        "pottery AIORedlock",
        "redis",
        "async",
        "pottery",
        "pottery",
        "AIORedlock over one master, auto_release_time=30",
    ),
    Contender(
        "aioredlock",
        "aioredlock",
        "redis",
        "async",
        "aioredlock",
        "aioredlock",
        "Aioredlock over one master (aioredis 1.x), lock_timeout=30, retries until granted",
    ),
    Contender(
        "aiolocks-zk",
        "aiolocks mutex",
        "zookeeper",
        "async",
        "aiolocks.zookeeper",
        "aiolocks",
        "reentrant per task, fencing token (czxid), watches predecessor",
    ),
    Contender(
        "kazoo",
        "kazoo Lock (threads)",
        "zookeeper",
        "thread",
        "kazoo.client",
        "kazoo",
        "KazooClient + Lock, one thread per worker",
    ),
    Contender(
        "aiozk",
        "aiozk recipes.Lock",
        "zookeeper",
        "async",
        "aiozk",
        "aiozk",
        "aiozk ZKClient + recipes.Lock",
    ),
)


def by_key(key: str) -> Contender:
    """The contender with this key."""
    for contender in CONTENDERS:
        if contender.key == key:
            return contender
    raise KeyError(key)


def lock_name(contender: Contender, scenario: str, tag: str | None = None) -> str:
    """A fresh lock name (a path for ZooKeeper and aiolocks, a key for the Redis peers)."""
    suffix = tag or uuid.uuid4().hex[:12]
    if contender.service == "zookeeper" and not contender.is_aiolocks:
        return f"/bench/{scenario}/{contender.key}/{suffix}"
    if contender.is_aiolocks:
        return f"bench/{scenario}/{suffix}"
    return f"bench:{scenario}:{contender.key}:{suffix}"


# --------------------------------------------------------------------------- aiolocks


class _AiolocksHandle:
    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def acquire(self) -> None:
        await self._lock.acquire()

    async def release(self) -> None:
        await self._lock.release()


class _AiolocksSession:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def lock(self, name: str) -> AsyncLockHandle:
        return _AiolocksHandle(self.backend.mutex(name))

    async def close(self) -> None:
        await self.backend.close()


# --------------------------------------------------------------------------- redis-py


class _RedisPyHandle:
    def __init__(self, client: Any, name: str, sleep: float) -> None:
        # One Lock object per task: it keeps the token of the current hold.
        self._lock = client.lock(name, timeout=LEASE_S, sleep=sleep, thread_local=False)

    async def acquire(self) -> None:
        if not await self._lock.acquire(blocking=True):
            raise RuntimeError("redis-py Lock.acquire(blocking=True) returned False")

    async def release(self) -> None:
        await self._lock.release()


class _RedisPySession:
    def __init__(self, client: Any, sleep: float) -> None:
        self._client = client
        self._sleep = sleep

    def lock(self, name: str) -> AsyncLockHandle:
        return _RedisPyHandle(self._client, name, self._sleep)

    async def close(self) -> None:
        await self._client.aclose()


# --------------------------------------------------------------------------- pottery


class _PotteryHandle:
    def __init__(self, client: Any, name: str) -> None:
        from pottery import AIORedlock

        self._lock = AIORedlock(key=name, masters={client}, auto_release_time=LEASE_S)

    async def acquire(self) -> None:
        if not await self._lock.acquire():
            raise RuntimeError("AIORedlock.acquire() returned False")

    async def release(self) -> None:
        await self._lock.release()


class _PotterySession:
    def __init__(self, client: Any) -> None:
        self._client = client

    def lock(self, name: str) -> AsyncLockHandle:
        return _PotteryHandle(self._client, name)

    async def close(self) -> None:
        await self._client.aclose()


# --------------------------------------------------------------------------- aioredlock


class _AioredlockHandle:
    def __init__(self, manager: Any, name: str) -> None:
        self._manager = manager
        self._name = name
        self._held: Any = None

    async def acquire(self) -> None:
        # lock() retries retry_count times (random 0.1-0.3 s sleeps) and then
        # raises; the session sets retry_count so that it waits "forever".
        self._held = await self._manager.lock(self._name, lock_timeout=LEASE_S)

    async def release(self) -> None:
        held, self._held = self._held, None
        await self._manager.unlock(held)


class _AioredlockSession:
    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def lock(self, name: str) -> AsyncLockHandle:
        return _AioredlockHandle(self._manager, name)

    async def close(self) -> None:
        await self._manager.destroy()


# --------------------------------------------------------------------------- aiozk


class _AiozkHandle:
    def __init__(self, client: Any, name: str) -> None:
        # aiozk's Lock is one-acquire-at-a-time per object: one per task.
        self._lock = client.recipes.Lock(name)

    async def acquire(self) -> None:
        await self._lock.acquire()

    async def release(self) -> None:
        await self._lock.release()


class _AiozkSession:
    def __init__(self, client: Any) -> None:
        self._client = client

    def lock(self, name: str) -> AsyncLockHandle:
        return _AiozkHandle(self._client, name)

    async def close(self) -> None:
        await self._client.close()


# --------------------------------------------------------------------------- thread-based


class _KazooHandle:
    def __init__(self, client: Any, name: str) -> None:
        self._lock = client.Lock(name, uuid.uuid4().hex)

    def acquire(self) -> None:
        if not self._lock.acquire(blocking=True):
            raise RuntimeError("kazoo Lock.acquire(blocking=True) returned False")

    def release(self) -> None:
        self._lock.release()


class _KazooSession:
    def __init__(self, client: Any) -> None:
        self._client = client

    def lock(self, name: str) -> SyncLockHandle:
        return _KazooHandle(self._client, name)

    def close(self) -> None:
        self._client.stop()
        self._client.close()


class _RedisLockHandle:
    def __init__(self, client: Any, name: str) -> None:
        import redis_lock

        self._lock = redis_lock.Lock(client, name, expire=LEASE_S)

    def acquire(self) -> None:
        if not self._lock.acquire(blocking=True):
            raise RuntimeError("redis_lock.Lock.acquire(blocking=True) returned False")

    def release(self) -> None:
        self._lock.release()


class _RedisLockSession:
    def __init__(self, client: Any) -> None:
        self._client = client

    def lock(self, name: str) -> SyncLockHandle:
        return _RedisLockHandle(self._client, name)

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------- factories


def _zk_hosts(url: str) -> str:
    return url.removeprefix("zk://").split("/", 1)[0]


async def open_async(contender: Contender, url: str) -> AsyncSession:
    """Connect an asyncio contender to ``url`` (``redis://…`` or ``zk://…``)."""
    key = contender.key
    if key in ("aiolocks-redis", "aiolocks-zk"):
        import aiolocks

        return _AiolocksSession(await aiolocks.connect(url))
    if key in ("redis-py", "redis-py-tuned"):
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        await client.ping()
        return _RedisPySession(client, 0.1 if key == "redis-py" else 0.001)
    if key == "pottery":
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)
        await client.ping()
        return _PotterySession(client)
    if key == "aioredlock":
        from urllib.parse import urlsplit

        from aioredlock import Aioredlock

        parts = urlsplit(url)
        manager = Aioredlock(
            [{"host": parts.hostname, "port": parts.port}], retry_count=1_000_000_000
        )
        return _AioredlockSession(manager)
    if key == "aiozk":
        import aiozk

        client = aiozk.ZKClient(_zk_hosts(url))
        await client.start()
        return _AiozkSession(client)
    raise ValueError(f"{key} is not an asyncio contender")


def open_sync(contender: Contender, url: str) -> SyncSession:
    """Connect a thread-based contender to ``url``."""
    if contender.key == "kazoo":
        from kazoo.client import KazooClient

        client = KazooClient(hosts=_zk_hosts(url), timeout=10.0)
        client.start(timeout=30)
        return _KazooSession(client)
    if contender.key == "python-redis-lock":
        import redis

        client = redis.Redis.from_url(url)
        client.ping()
        return _RedisLockSession(client)
    raise ValueError(f"{contender.key} is not a thread-based contender")
