"""The recipe end to end through the public API: URLs, round trips, queue, families."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any

import aiozk
import pytest

import aiolocks
from aiolocks.testing.servers import ZooKeeperServer, free_port
from aiolocks.zookeeper import ConnectionState, ZooKeeperBackend, from_url, lock_path

from .conftest import Held, count_requests, lock_nodes, own_session, until

pytestmark = pytest.mark.zookeeper


# -- URLs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "names"),
    [
        ("zookeeper://h:2181", {}, "scheme"),
        ("zk://", {}, "no host"),
        ("zk://h:99999", {}, "port"),
        ("zk://h:abc", {}, "port"),
        ("zk://h:2181?sessiontimeout=3", {}, "sessiontimeout"),
        ("zk://h:2181?session_timeout=-1", {}, "session_timeout"),
        ("zk://h:2181?connect_timeout=x", {}, "connect_timeout"),
        ("zk://h:2181?suspended_is_lost=maybe", {}, "suspended_is_lost"),
        ("zk://h:2181", {"lease_time": 3}, "lease_time"),
        ("zk://h:2181", {"session_timeout": "soon"}, "session_timeout"),
        ("zk://u@h:2181", {}, "without a password"),
        ("zk://:p@h:2181", {}, "no user name"),
        ("zk://h:2181?acl=creator", {}, "acl=creator needs credentials"),
        ("zk://u:p@h:2181?acl=mine", {}, "acl must be one of"),
        ("zk://h:2181/a//b", {}, "chroot"),
        ("zk://h:2181/a/", {}, "chroot"),
        ("zk://h1:2181,,h2:2181", {}, "empty host"),
    ],
)
def test_bad_url_names_the_part(url: str, options: dict[str, Any], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        from_url(url, **options)


def test_good_url_parses_without_io() -> None:
    backend = from_url("zk://h1:2181,h2/app/x?session_timeout=3&suspended_is_lost=yes")
    assert backend.url == "zk://h1:2181,h2:2181/app/x"
    assert backend.client is None  # nothing connected yet
    assert backend.capabilities.fair and backend.capabilities.can_lose


def test_per_lock_options_are_portable_and_checked() -> None:
    backend = from_url("zk://h:2181")
    # Redis options are accepted as no-ops, so code moves between backends ...
    assert backend.mutex("a", fair=True, lease_time=3, watchdog=False).name == "a"
    # ... but they are still checked, and anything else is refused by name
    with pytest.raises(ValueError, match="lease_time"):
        backend.mutex("a", lease_time=-3)
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        backend.mutex("a", colour="red")


@pytest.mark.asyncio
async def test_unreachable_server_raises_backend_unavailable_in_time() -> None:
    started = time.monotonic()
    with pytest.raises(aiolocks.BackendUnavailableError, match="connect_timeout"):
        await aiolocks.connect(f"zk://127.0.0.1:{free_port()}?connect_timeout=0.5")
    # bounded by connect_timeout (generous slack: this is not a speed test)
    assert time.monotonic() - started < 5


@pytest.mark.asyncio
async def test_backend_on_existing_client_leaves_it_open(zookeeper_server: ZooKeeperServer) -> None:
    client = aiozk.ZKClient(zookeeper_server.hosts, session_timeout=5)
    await client.start()
    try:
        states: list[ConnectionState] = []
        backend = ZooKeeperBackend(client)
        backend.add_connection_listener(states.append)
        async with backend:
            async with backend.mutex(f"own/{uuid.uuid4().hex}") as lock:
                assert lock.fencing_token is not None
            assert states == [ConnectionState.CONNECTED]
        assert client.session.state == "connected"
        assert await client.exists("/") is True  # still usable
    finally:
        await client.close()


# -- the recipe ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_uncontended_acquire_release_costs_three_requests(
    backend: ZooKeeperBackend,
) -> None:
    name = f"rt/{uuid.uuid4().hex}"
    lock = backend.mutex(name)
    async with lock:  # first use creates the container parents
        pass
    sent = count_requests(backend)
    async with lock:
        pass
    # Curator's algorithm: create (create2 returns czxid), list children, delete.
    assert sent() == ["Create2Request", "GetChildrenRequest", "DeleteRequest"]


@pytest.mark.asyncio
async def test_acquire_lists_in_the_same_round_trip_as_the_create(
    backend: ZooKeeperBackend,
) -> None:
    name = f"rt1/{uuid.uuid4().hex}"
    lock = backend.mutex(name)
    async with lock:
        pass
    conn = own_session(backend).conn
    original = conn.send
    log: list[tuple[str, bool]] = []
    replies: dict[str, Any] = {}

    def send(request: Any, xid: int | None = None) -> Any:
        kind = type(request).__name__
        create = replies.get("Create2Request")
        log.append((kind, create is not None and not create.done()))
        fut = original(request, xid=xid)
        replies[kind] = fut
        return fut

    conn.send = send
    try:
        async with lock:
            pass
    finally:
        del conn.send
    sent = [(k, pending) for k, pending in log if k != "PingRequest"]
    # the listing went out while the create's reply was still on its way
    assert sent == [
        ("Create2Request", False),
        ("GetChildrenRequest", True),
        ("DeleteRequest", False),
    ]


@pytest.mark.asyncio
async def test_parents_are_containers_and_get_reaped(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    name = f"reap/{uuid.uuid4().hex}"
    async with backend.mutex(name):
        assert len(await lock_nodes(observer)) == 1
    assert await lock_nodes(observer) == []
    path = lock_path(aiolocks_family("MUTEX"), name)
    # The server's container manager (every 500 ms here) removes the empty
    # parents; a plain persistent parent would stay forever.
    await until(lambda: _gone(observer, path), what=f"{path} reaped")


def aiolocks_family(name: str) -> Any:
    from aiolocks._core.driver import Family

    return Family[name]


async def _gone(client: Any, path: str) -> bool:
    return not await client.exists(path)


@pytest.mark.asyncio
async def test_fifo_order_tokens_and_participants(backend: ZooKeeperBackend) -> None:
    name = f"fifo/{uuid.uuid4().hex}"
    first = backend.mutex(name)
    await first.acquire()
    order: list[int] = []
    tokens: list[int] = []

    async def waiter(i: int) -> None:
        lock = backend.mutex(name)
        async with lock:
            order.append(i)
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)

    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(waiter(i), name=f"w{i}"))
        # the next waiter queues only once this one's node is visible
        await until(functools.partial(_queued, first, i + 2), what=f"waiter {i} queued")
    parts = await first.participants()
    assert [p.is_holder for p in parts] == [True] + [False] * 8
    assert parts[0].id.endswith("/" + asyncio.current_task().get_name())  # type: ignore[union-attr]
    assert [p.id.rsplit("/", 1)[1] for p in parts[1:]] == [f"w{i}" for i in range(8)]
    first_token = first.fencing_token
    assert first_token is not None
    await first.release()
    await asyncio.gather(*tasks)
    assert order == list(range(8))
    assert tokens == sorted(tokens) and len(set(tokens)) == 8 and tokens[0] > first_token


async def _queued(lock: aiolocks.Mutex, n: int) -> bool:
    return len(await lock.participants()) >= n


@pytest.mark.asyncio
async def test_try_once_and_timeout_leave_nothing(backend: ZooKeeperBackend, observer: Any) -> None:
    name = f"try/{uuid.uuid4().hex}"
    holder = backend.semaphore_mutex(name)
    await holder.acquire()
    other = backend.semaphore_mutex(name)
    # another task (the holder's task may not re-acquire a SemaphoreMutex)
    assert await asyncio.create_task(other.acquire(timeout=0)) is False
    assert await asyncio.create_task(other.acquire(timeout=0.2)) is False
    assert len(await lock_nodes(observer)) == 1  # only the holder's node
    await holder.release()
    assert await asyncio.create_task(other.acquire(timeout=0)) is True
    await other.release()
    assert await lock_nodes(observer) == []


@pytest.mark.asyncio
async def test_mutual_exclusion_under_contention(zk_url: str, observer: Any) -> None:
    name = f"excl/{uuid.uuid4().hex}"
    backends = [await aiolocks.connect(zk_url) for _ in range(3)]
    inside = 0
    max_inside = 0
    done = 0

    async def worker(b: aiolocks.Backend) -> None:
        nonlocal inside, max_inside, done
        for _ in range(5):
            async with b.mutex(name):
                inside += 1
                max_inside = max(max_inside, inside)
                await asyncio.sleep(0)
                inside -= 1
                done += 1

    try:
        await asyncio.gather(*(worker(b) for b in backends for _ in range(4)))
    finally:
        for b in backends:
            await b.close()
    assert max_inside == 1 and done == 60
    assert await lock_nodes(observer) == []


# -- families -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_families_do_not_contend(backend: ZooKeeperBackend) -> None:
    name = f"fam/{uuid.uuid4().hex}"
    rw = backend.read_write_lock(name)
    async with backend.mutex(name), backend.semaphore_mutex(name), rw.write:
        lease = await backend.semaphore(name, 1).acquire(timeout=0)
        assert lease is not None
        await lease.release()


@pytest.mark.asyncio
async def test_readers_share_writers_exclude(backend: ZooKeeperBackend) -> None:
    name = f"rw/{uuid.uuid4().hex}"
    rw1, rw2, rw3 = (backend.read_write_lock(name) for _ in range(3))
    r1 = Held(rw1.read)
    assert await r1.wait()
    r2 = Held(rw2.read, timeout=0)
    assert await r2.wait()  # readers share
    w = Held(rw3.write)
    await until(lambda: _queued(rw1.read, 3), what="writer queued")  # type: ignore[arg-type]
    await r1.release()
    assert not w.acquired.is_set()  # one reader still holds
    parts = await rw1.read.participants()
    assert [(p.mode, p.is_holder) for p in parts] == [("read", True), ("write", False)]
    await r2.release()
    assert await w.wait()
    parts = await rw3.write.participants()
    assert [(p.mode, p.is_holder) for p in parts] == [("write", True)]
    await w.release()


@pytest.mark.asyncio
async def test_downgrade_keeps_a_queued_writer_out(backend: ZooKeeperBackend) -> None:
    """CURATOR-621: write -> read must not let a writer queued meanwhile in."""
    name = f"down/{uuid.uuid4().hex}"
    mine = backend.read_write_lock(name)
    other = backend.read_write_lock(name)
    await mine.write.acquire()
    w = Held(other.write)
    await until(lambda: _queued(mine.write, 2), what="writer queued")  # type: ignore[arg-type]
    await mine.read.acquire()  # downgrade: the read node sorts right after our write node
    await mine.write.release()
    parts = await mine.read.participants()
    assert [(p.mode, p.is_holder) for p in parts] == [("read", True), ("write", False)]
    assert not w.acquired.is_set()
    # a new reader queues behind the waiting writer (writers are not starved)
    late = backend.read_write_lock(name)
    r = Held(late.read, timeout=0.2)
    assert await r.wait() is False
    await mine.read.release()
    assert await w.wait()
    await w.release()


@pytest.mark.asyncio
async def test_semaphore_limits_and_all_or_nothing(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    name = f"sem/{uuid.uuid4().hex}"
    sem = backend.semaphore(name, 3)
    inside = 0
    peak = 0

    async def user() -> None:
        nonlocal inside, peak
        async with sem:
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    await asyncio.gather(*(user() for _ in range(12)))
    assert peak == 3
    one = await sem.acquire()
    assert one is not None
    # 3 leases cannot be had while one is out: nothing partial is left behind
    assert await sem.acquire_many(3, timeout=0.3) is None
    parts = await sem.participants()
    assert [(p.mode, p.is_holder) for p in parts] == [("lease", True)]
    many = await sem.acquire_many(2, timeout=1)
    assert many is not None and len(many) == 2
    tokens = [one.fencing_token, *(lease.fencing_token for lease in many)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    for lease in [one, *many]:
        await lease.release()
    assert await lock_nodes(observer) == []


@pytest.mark.asyncio
async def test_semaphore_waiter_gets_released_lease(backend: ZooKeeperBackend) -> None:
    name = f"semw/{uuid.uuid4().hex}"
    sem = backend.semaphore(name, 2)
    leases = await sem.acquire_many(2)
    assert leases is not None
    waiting = asyncio.create_task(sem.acquire_many(2))
    await until(lambda: _queued(sem, 3), what="semaphore waiter queued")  # type: ignore[arg-type]
    await leases[0].release()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # needs 2
    await leases[1].release()
    got = await waiting
    assert got is not None and len(got) == 2
    for lease in got:
        await lease.release()


@pytest.mark.asyncio
async def test_leader_latch_hands_over(backend: ZooKeeperBackend, zk_url: str) -> None:
    name = f"leader/{uuid.uuid4().hex}"
    other_backend = await aiolocks.connect(zk_url)
    try:
        a = backend.leader_latch(name, participant_id="a")
        b = other_backend.leader_latch(name, participant_id="b")
        await a.start()
        assert await a.wait_for_leadership(timeout=10)
        await b.start()
        assert not b.has_leadership
        leader = await b.leader()
        assert leader is not None and leader.id == "a"
        await a.close()
        assert await b.wait_for_leadership(timeout=10)
        leader = await a.leader()
        assert leader is not None and leader.id == "b"
        await b.close()
    finally:
        await other_backend.close()
