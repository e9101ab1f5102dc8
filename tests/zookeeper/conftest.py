"""Fixtures for the ZooKeeper backend tests (real servers from aiolocks.testing)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiozk
import pytest
import pytest_asyncio
from aiozk import protocol

import aiolocks
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend

from ..polling import eventually

pytestmark = pytest.mark.zookeeper

#: short enough that expiry tests are quick, long enough for loaded CI machines
SESSION_TIMEOUT = 4.0


def own_session(backend: ZooKeeperBackend) -> Any:
    """The backend's own ``Session`` (a URL-built backend, opened); typed loosely,
    as tests patch its connection."""
    session = backend._zk.session
    assert session is not None, "not open, or built on an aiozk client"
    return session


@pytest.fixture
def chroot() -> str:
    """A private chroot per test, so that leftovers are easy to find."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def zk_url(zookeeper_server: ZooKeeperServer, chroot: str) -> str:
    """URL of the shared server, in this test's chroot."""
    return f"zk://{zookeeper_server.hosts}{chroot}?session_timeout={SESSION_TIMEOUT}"


@pytest_asyncio.fixture
async def backend(zk_url: str) -> AsyncIterator[ZooKeeperBackend]:
    """An open backend on the shared server."""
    b = await aiolocks.connect(zk_url)
    assert isinstance(b, ZooKeeperBackend)
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture
async def observer(zookeeper_server: ZooKeeperServer, chroot: str) -> AsyncIterator[Any]:
    """A plain aiozk client in the test's chroot: looks at the server behind aiolocks' back."""
    client = aiozk.ZKClient(zookeeper_server.hosts, chroot=chroot, session_timeout=10)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def lock_nodes(client: Any, path: str = "/aiolocks") -> list[str]:
    """Every non-container (lock/lease) node under ``path``, recursively."""
    found: list[str] = []

    async def walk(p: str) -> None:
        try:
            children = await client.get_children(p)
        except aiozk.exc.NoNode:
            return
        for child in children:
            full = f"{p}/{child}"
            if child.startswith("_c_"):
                found.append(full)
            else:
                await walk(full)

    await walk(path)
    return found


async def expire_session(hosts: str, backend: ZooKeeperBackend) -> None:
    """Expire the backend's session from outside: join it from a second connection, close it.

    The standard ZooKeeper test trick (Curator's ``KillSession``, kazoo's
    ``expire_session``). The backend may win the session back in between
    (it reconnects at once when the server drops its socket), so repeat
    until the server has really closed that session.
    """
    from aiolocks.zookeeper._connection import Session, parse_hosts

    session_id, password = session_credentials(backend)
    for _ in range(20):
        if backend.session_id != session_id:
            break
        intruder = Session(parse_hosts(hosts), timeout=SESSION_TIMEOUT, events=None)
        intruder.session_id = session_id
        intruder.password = password
        try:
            await intruder.start(5)
        except TimeoutError:
            continue  # the backend won the session back first; again
        try:
            if intruder.session_id != session_id:
                break  # the server no longer knows it: expired
        finally:
            # Closes the joined session (or the new one the server gave us);
            # if the backend took the session back first, the next round sees it.
            await intruder.close(2)
    else:
        raise AssertionError(f"could not expire session 0x{session_id:x}")
    await until(lambda: backend.session_id not in (None, session_id), what="new session")


def session_credentials(backend: ZooKeeperBackend) -> tuple[int, bytes]:
    """The id and password of the session the backend's locks live in (own or aiozk's)."""
    session: Any = backend._zk.session
    if session is None:
        session = backend.client.session  # an aiozk client's session
    assert session.session_id is not None
    return int(session.session_id), bytes(session.password)


def count_requests(backend: ZooKeeperBackend) -> Callable[[], list[str]]:
    """Record the request classes the backend's connection sends (pings excluded)."""
    conn = own_session(backend).conn
    sent: list[str] = []
    original = conn.send

    def send(request: Any, xid: int | None = None) -> Any:
        if not isinstance(request, protocol.PingRequest):
            sent.append(type(request).__name__)
        return original(request, xid=xid)

    conn.send = send
    return lambda: list(sent)


async def until(predicate: Callable[[], Any], *, timeout: float = 20.0, what: str = "") -> None:
    """Wait for a condition that only a server-side process (reaper, expiry) makes true.

    The suite's one poll (``tests/polling.py``), with the longer default
    timeout a ZooKeeper reaper or session expiry needs.
    """
    await eventually(predicate, timeout, what=what, interval=0.05)


class Held:
    """Acquire a lock in a task of its own (reentrancy is per task); release on demand.

    Records the fencing token after acquiring and ``is_lost`` just before
    releasing, both as seen by the owning task.
    """

    def __init__(self, lock: Any, timeout: float | None = None) -> None:
        self.acquired = asyncio.Event()
        self.result: bool | None = None
        self.token: int | None = None
        self.was_lost: bool | None = None
        self._go = asyncio.Event()
        self.task = asyncio.create_task(self._run(lock, timeout))

    async def _run(self, lock: Any, timeout: float | None) -> None:
        self.result = await lock.acquire(timeout=timeout)
        self.token = lock.fencing_token
        self.acquired.set()
        if self.result:
            await self._go.wait()
            self.was_lost = lock.is_lost
            await lock.release()

    async def wait(self) -> bool:
        """Until acquire returned; its result."""
        await self.acquired.wait()
        assert self.result is not None
        return self.result

    async def release(self) -> None:
        """Release in the owning task and wait for it."""
        self._go.set()
        await self.task
