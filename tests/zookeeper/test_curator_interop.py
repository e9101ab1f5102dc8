"""aiolocks and real Apache Curator 5.x on the same ZooKeeper paths, on both layouts.

A small Java driver (``curator/CuratorDriver.java``, compiled here with
``javac`` against Debian's ``libcurator-recipes-java``) runs Curator's
recipes; the tests run each recipe both ways: Java first, Python first, both
waiting behind the other, and a session expiry on each side.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import aiolocks
from aiolocks import Semaphore
from aiolocks._core.driver import Family
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend, lock_path

from .conftest import SESSION_TIMEOUT, expire_session, lock_nodes, until
from .curator import CuratorProcess, compile_driver

pytestmark = [pytest.mark.zookeeper, pytest.mark.asyncio]

LAYOUTS = ("aiolocks", "curator")

#: kind -> (family, Java command that makes the Curator object)
KINDS: dict[str, tuple[Family, str]] = {
    "mutex": (Family.MUTEX, "mutex"),
    "semaphore_mutex": (Family.SEMAPHORE_MUTEX, "semmutex"),
    "semaphore": (Family.SEMAPHORE, "sem"),
    "read": (Family.READ_WRITE, "read"),
    "write": (Family.READ_WRITE, "write"),
}

#: (Python kind, Java kind) pairs that must exclude each other
EXCLUSIVE_PAIRS = [
    ("mutex", "mutex"),
    ("semaphore_mutex", "semaphore_mutex"),
    ("semaphore", "semaphore"),
    ("write", "write"),
    ("read", "write"),
    ("write", "read"),
]

_ids = itertools.count(1)


@pytest.fixture(scope="session")
def curator_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compiled driver (once per test session)."""
    return compile_driver(tmp_path_factory.mktemp("curator-driver"))


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    """The aiolocks layout under test; Java uses the path aiolocks maps the name to."""
    return str(request.param)


@pytest_asyncio.fixture
async def py(zookeeper_server: ZooKeeperServer, chroot: str, layout: str) -> AsyncIterator[Any]:
    """An aiolocks backend in the test's chroot, in ``layout``."""
    url = f"zk://{zookeeper_server.hosts}{chroot}?session_timeout={SESSION_TIMEOUT}&layout={layout}"
    backend = await aiolocks.connect(url)
    try:
        yield backend
    finally:
        await backend.close()


@pytest_asyncio.fixture
async def java(
    curator_classes: Path, zookeeper_server: ZooKeeperServer, chroot: str
) -> AsyncIterator[CuratorProcess]:
    """A JVM with one Curator client ``j`` whose namespace is the test's chroot."""
    proc = await CuratorProcess.start(curator_classes)
    try:
        timeout_ms = int(SESSION_TIMEOUT * 1000)
        await proc.call(f"client j {zookeeper_server.hosts} {chroot[1:]} {timeout_ms}", "client j")
        yield proc
    finally:
        await proc.close()


class PyHolder:
    """One aiolocks hold in a task of its own (mutexes are reentrant per task)."""

    def __init__(self, lock: Any, timeout: float | None = None) -> None:
        self.acquired = asyncio.Event()
        self.held: Any = None
        self.was_lost: bool | None = None
        self._go = asyncio.Event()
        self.task = asyncio.create_task(self._run(lock, timeout))

    async def _run(self, lock: Any, timeout: float | None) -> None:
        if isinstance(lock, Semaphore):
            self.held = await lock.acquire(timeout=timeout)
        elif await lock.acquire(timeout=timeout):
            self.held = lock
        self.acquired.set()
        if self.held is not None:
            await self._go.wait()
            self.was_lost = self.held.is_lost
            try:
                await self.held.release()
            except aiolocks.LockLostError:
                if not self.was_lost:
                    raise  # a loss the hold had not shown before the release

    async def wait(self) -> bool:
        """Until the acquire returned; whether it got the hold."""
        await self.acquired.wait()
        return self.held is not None

    async def release(self) -> None:
        """Release in the owning task and wait for it."""
        self._go.set()
        await self.task


def py_lock(backend: ZooKeeperBackend, kind: str, name: str) -> Any:
    """The aiolocks object for ``kind``; the semaphore has one lease, as in the issue."""
    if kind == "mutex":
        return backend.mutex(name)
    if kind == "semaphore_mutex":
        return backend.semaphore_mutex(name)
    if kind == "semaphore":
        return backend.semaphore(name, 1)
    rw = backend.read_write_lock(name)
    return rw.read if kind == "read" else rw.write


async def py_try(backend: ZooKeeperBackend, kind: str, name: str) -> bool:
    """One ``timeout=0`` acquire from a fresh task; released at once when it succeeds."""
    holder = PyHolder(py_lock(backend, kind, name), timeout=0)
    got = await holder.wait()
    await holder.release()
    return got


async def java_lock(java: CuratorProcess, kind: str, path: str) -> str:
    """A new Curator object for ``kind`` on ``path``; its handle."""
    handle = f"h{next(_ids)}"
    command = KINDS[kind][1]
    extra = " 1" if kind == "semaphore" else ""
    await java.call(f"{command} {handle} j {path}{extra}", f"{command} {handle} ok")
    return handle


async def java_try(java: CuratorProcess, kind: str, path: str) -> bool:
    """Curator's ``acquire(0, ms)`` on a new object; released at once when it succeeds."""
    handle = await java_lock(java, kind, path)
    reply = await java.call(f"try {handle} 0", f"tried {handle}")
    got = reply.endswith("true")
    if got:
        await java.call(f"release {handle}", f"released {handle}")
    return got


async def contenders(observer: Any, path: str) -> int:
    """How many lock nodes exist under ``path`` (turnstile and leases included)."""
    return len(await lock_nodes(observer, path))


@pytest.mark.parametrize(("py_kind", "java_kind"), EXCLUSIVE_PAIRS)
async def test_exclusion_and_hand_off_both_ways(
    py: ZooKeeperBackend,
    java: CuratorProcess,
    observer: Any,
    layout: str,
    py_kind: str,
    java_kind: str,
) -> None:
    """Java first, then Python waiting and Java waiting behind it; each gets it on release."""
    # Java first: Python cannot take it.
    name, path, first = await _java_holds(java, "interop", layout, py_kind, java_kind)
    assert not await py_try(py, py_kind, name)
    # Both waiting: Python queues, then a second Curator object queues behind it.
    waiter = await _python_waits(py, observer, py_kind, name, path)
    second = await java_lock(java, java_kind, path)
    java.send(f"acquire {second}")
    await until(lambda: _count_is(observer, path, 3), what="the Java waiter's node")
    assert not waiter.acquired.is_set()
    # Java lets go: the Python waiter gets it right away, the Java waiter does not.
    await java.call(f"release {first}", f"released {first}")
    assert await waiter.wait()
    assert not await java_try(java, java_kind, path)
    assert not java.seen(f"acquired {second}")
    # Python lets go: the waiting Curator object gets it.
    await waiter.release()
    assert waiter.was_lost is False
    await java.expect(f"acquired {second}")
    assert not await py_try(py, py_kind, name)
    await java.call(f"release {second}", f"released {second}")
    # Free again for both sides, and nothing is left behind.
    assert await py_try(py, py_kind, name)
    assert await java_try(java, java_kind, path)
    assert await lock_nodes(observer, path) == []


async def _java_holds(
    java: CuratorProcess, label: str, layout: str, py_kind: str, java_kind: str
) -> tuple[str, str, str]:
    """A new lock held by a Curator object: its name, its path and the Java handle."""
    name = f"locks/{label}-{uuid.uuid4().hex[:8]}"
    path = lock_path(KINDS[py_kind][0], name, layout)
    handle = await java_lock(java, java_kind, path)
    await java.call(f"acquire {handle}", f"acquired {handle}")
    return name, path, handle


async def _python_waits(
    py: ZooKeeperBackend, observer: Any, py_kind: str, name: str, path: str
) -> PyHolder:
    """An aiolocks waiter on ``name``, once its node is queued behind the holder's."""
    waiter = PyHolder(py_lock(py, py_kind, name))
    await until(lambda: _count_is(observer, path, 2), what="the Python waiter's node")
    return waiter


async def _count_is(observer: Any, path: str, n: int) -> bool:
    return await contenders(observer, path) == n


async def _count_above(observer: Any, path: str, n: int) -> bool:
    return await contenders(observer, path) > n


@pytest.mark.parametrize(("py_kind", "java_kind"), EXCLUSIVE_PAIRS)
async def test_session_expiry_on_each_side(
    zookeeper_server: ZooKeeperServer,
    py: ZooKeeperBackend,
    java: CuratorProcess,
    observer: Any,
    layout: str,
    py_kind: str,
    java_kind: str,
) -> None:
    """An expired session's hold goes with its nodes; the other side's waiter gets it."""
    # Curator holds, aiolocks waits; Curator's session expires.
    name, path, _ = await _java_holds(java, "expiry", layout, py_kind, java_kind)
    waiter = await _python_waits(py, observer, py_kind, name, path)
    await java.call("expire j", "expired j")
    assert await waiter.wait()
    # aiolocks holds, Curator (in its new session) waits; aiolocks' session expires.
    await java.expect("state j RECONNECTED")
    second = await java_lock(java, java_kind, path)
    java.send(f"acquire {second}")
    # (a Curator semaphore holding the turnstile creates its lease before it waits)
    await until(lambda: _count_above(observer, path, 1), what="the Java waiter's node")
    assert not java.seen(f"acquired {second}")
    await expire_session(zookeeper_server.hosts, py)
    await java.expect(f"acquired {second}")
    await waiter.release()
    assert waiter.was_lost is True
    assert not await py_try(py, py_kind, name)
    await java.call(f"release {second}", f"released {second}")
    assert await py_try(py, py_kind, name)
    assert await lock_nodes(observer, path) == []


async def test_semaphore_counts_the_leases_of_both_sides(
    py: ZooKeeperBackend, java: CuratorProcess, observer: Any, layout: str
) -> None:
    """``InterProcessSemaphoreV2(2)`` and ``semaphore(name, 2)``: one lease each fills it."""
    name = f"pools/{uuid.uuid4().hex[:8]}"
    path = lock_path(Family.SEMAPHORE, name, layout)
    handle = f"h{next(_ids)}"
    await java.call(f"sem {handle} j {path} 2", f"sem {handle} ok")
    await java.call(f"acquire {handle}", f"acquired {handle}")
    semaphore = py.semaphore(name, 2)
    lease = await semaphore.acquire(timeout=0)
    assert lease is not None
    probe = f"h{next(_ids)}"
    await java.call(f"sem {probe} j {path} 2", f"sem {probe} ok")
    assert (await java.call(f"try {probe} 0", f"tried {probe}")).endswith("false")
    assert await semaphore.acquire(timeout=0) is None
    await lease.release()
    assert (await java.call(f"try {probe} 0", f"tried {probe}")).endswith("true")
    assert await semaphore.acquire(timeout=0) is None
    await java.call(f"release {probe}", f"released {probe}")
    await java.call(f"release {handle}", f"released {handle}")
    assert await lock_nodes(observer, path) == []


async def test_readers_share_across_the_languages(
    py: ZooKeeperBackend, java: CuratorProcess, observer: Any, layout: str
) -> None:
    """A Curator reader and an aiolocks reader hold together; a writer of either waits."""
    name = f"rw/share-{uuid.uuid4().hex[:8]}"
    path = lock_path(Family.READ_WRITE, name, layout)
    reader = await java_lock(java, "read", path)
    await java.call(f"acquire {reader}", f"acquired {reader}")
    py_reader = PyHolder(py_lock(py, "read", name), timeout=0)
    assert await py_reader.wait()
    assert not await java_try(java, "write", path)
    assert not await py_try(py, "write", name)
    await py_reader.release()
    await java.call(f"release {reader}", f"released {reader}")
    assert await lock_nodes(observer, path) == []


async def test_downgrade_keeps_a_queued_curator_writer_out(
    py: ZooKeeperBackend, java: CuratorProcess, observer: Any, layout: str
) -> None:
    """Write -> read in aiolocks: a Curator writer queued meanwhile stays behind the read.

    Curator sorts the downgrade read node ``__READ__<write seq>-<seq>`` right
    after the write node it was taken under (CURATOR-621, fixed on our side in
    a form Curator orders the same way).
    """
    name = f"rw/downgrade-{uuid.uuid4().hex[:8]}"
    path = lock_path(Family.READ_WRITE, name, layout)
    rw = py.read_write_lock(name)
    await rw.write.acquire()
    writer = await java_lock(java, "write", path)
    java.send(f"acquire {writer}")
    await until(lambda: _count_is(observer, path, 2), what="the Curator writer's node")
    await rw.read.acquire()  # downgrade: granted while we hold the write lock
    await rw.write.release()
    # Curator's writer is still behind our read node, and a new one cannot get in.
    assert not await java_try(java, "write", path)
    assert not java.seen(f"acquired {writer}")
    await rw.read.release()
    await java.expect(f"acquired {writer}")
    await java.call(f"release {writer}", f"released {writer}")
    assert await lock_nodes(observer, path) == []


async def test_curator_downgrade_lets_a_queued_writer_in(
    py: ZooKeeperBackend, java: CuratorProcess, observer: Any, layout: str
) -> None:
    """What a mixed deployment gives up: Curator's own write -> read (CURATOR-621 there).

    A Curator thread that holds the write lock takes the read lock at once,
    with a plain read node that sorts by its own sequence; a writer that
    queued in between (ours here) gets the write lock as soon as Curator lets
    go of the write lock, while that Curator thread still reads. Measured
    against Curator 5.4; documented in docs/zookeeper.md.
    """
    name = f"rw/curator-downgrade-{uuid.uuid4().hex[:8]}"
    path = lock_path(Family.READ_WRITE, name, layout)
    await java.call(f"rwpair p j {path}", "rwpair p ok")
    await java.call("acquire p.w", "acquired p.w")
    writer = PyHolder(py_lock(py, "write", name))
    await until(lambda: _count_is(observer, path, 2), what="the aiolocks writer's node")
    await java.call("acquire p.r", "acquired p.r")
    await java.call("release p.w", "released p.w")
    assert await writer.wait()  # while Curator's thread still holds the read lock
    await writer.release()
    await java.call("release p.r", "released p.r")
    assert await lock_nodes(observer, path) == []


async def test_leader_latch_one_leader_between_them(
    zookeeper_server: ZooKeeperServer,
    py: ZooKeeperBackend,
    java: CuratorProcess,
    observer: Any,
    layout: str,
) -> None:
    """One leader among Curator's and aiolocks' latches; each side names the other's id."""
    name = f"leaders/interop-{uuid.uuid4().hex[:8]}"
    path = lock_path(Family.LEADER, name, layout)
    await java.call(f"latch jl j {path} java-1", "latch jl ok")
    await java.call("acquire jl", "acquired jl")
    await java.expect("leader jl true")
    latch = py.leader_latch(name, participant_id="py-1")
    await latch.start()
    try:
        await until(lambda: _count_is(observer, path, 2), what="the Python latch's node")
        assert not latch.has_leadership
        # Curator's getParticipants() names the Python participant from its node data.
        parts = await java.call("participants jl", "participants jl")
        assert parts.split(" ", 2)[2] == "java-1=true,py-1=false"
        assert [(p.id, p.is_holder) for p in await latch.participants()] == [
            ("java-1", True),
            ("py-1", False),
        ]
        # Curator's leader closes: ours takes over; a new Curator latch queues behind it.
        await java.call("release jl", "released jl")
        assert await latch.wait_for_leadership(timeout=30)
        await java.call(f"latch jl2 j {path} java-2", "latch jl2 ok")
        await java.call("acquire jl2", "acquired jl2")
        await until(lambda: _count_is(observer, path, 2), what="the second Curator latch's node")
        parts = await java.call("participants jl2", "participants jl2")
        assert parts.split(" ", 2)[2] == "py-1=true,java-2=false"
        # Our session expires: Curator's latch leads; ours queues again behind it.
        await expire_session(zookeeper_server.hosts, py)
        await java.expect("leader jl2 true")
        await until(lambda: not latch.has_leadership, what="the Python latch to step down")
        await until(lambda: _count_is(observer, path, 2), what="the Python latch to queue again")
        # Curator's session expires: ours leads again.
        await java.call("expire j", "expired j")
        assert await latch.wait_for_leadership(timeout=30)
        await java.expect("leader jl2 false")
    finally:
        await latch.close()
    await java.call("release jl2", "released jl2")
    await until(lambda: _count_is(observer, path, 0), what="every latch node gone")
