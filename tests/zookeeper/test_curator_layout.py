"""``layout=curator`` and Curator's node names, checked on the server (no Java needed).

The interop with real Curator processes is in ``test_curator_interop.py``;
here: the URL option, the names a Curator path refuses, where each recipe's
nodes go and how they are named, and that our queue order is the order
Curator computes from the same names.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import aiolocks
from aiolocks import InvalidLockNameError, LockLostError
from aiolocks._core.driver import Family
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend, from_url, lock_path
from aiolocks.zookeeper._internals import sort_nodes
from aiolocks.zookeeper._layout import match_node, node_prefix

from .conftest import SESSION_TIMEOUT, Held, lock_nodes, until

pytestmark = pytest.mark.zookeeper


@pytest_asyncio.fixture
async def curator_backend(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> AsyncIterator[ZooKeeperBackend]:
    """A backend with ``layout=curator`` in the test's chroot."""
    url = f"zk://{zookeeper_server.hosts}{chroot}?session_timeout={SESSION_TIMEOUT}&layout=curator"
    backend = await aiolocks.connect(url)
    assert isinstance(backend, ZooKeeperBackend)
    try:
        yield backend
    finally:
        await backend.close()


# -- the option and the names ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options"),
    [("zk://h:2181?layout=spring", {}), ("zk://h:2181", {"layout": "Curator"})],
)
def test_an_unknown_layout_is_refused_naming_it(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="layout must be one of aiolocks, curator"):
        from_url(url, **options)


def test_layout_as_a_keyword() -> None:
    backend = from_url("zk://h:2181", layout="curator")
    assert backend.mutex("a").name == "a"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("locks/\ue000", "U\\+E000"),  # private use: ZooKeeper refuses it in paths
        ("locks/\U0001f512", "U\\+1F512"),  # a surrogate pair in Java
        ("zookeeper/quota", "/zookeeper"),
    ],
)
def test_curator_layout_refuses_names_zookeeper_cannot_hold(name: str, problem: str) -> None:
    """The name is the path, unescaped: refused before any I/O, naming the problem."""
    backend = from_url("zk://h:2181?layout=curator")
    with pytest.raises(InvalidLockNameError, match=problem):
        backend.mutex(name)
    # The default layout escapes the same names instead.
    assert from_url("zk://h:2181").mutex(name).name == name


def test_lock_path_per_layout() -> None:
    assert lock_path(Family.MUTEX, "locks/orders") == "/aiolocks/mutex/locks/orders"
    assert lock_path(Family.MUTEX, "locks/orders", "curator") == "/locks/orders"
    assert lock_path(Family.SEMAPHORE_MUTEX, "a%b", "curator") == "/a%b"
    assert lock_path(Family.SEMAPHORE_MUTEX, "a%b") == "/aiolocks/semaphore-mutex/a%25b"


# -- node names and order ---------------------------------------------------------------


def test_node_names_round_trip() -> None:
    uid = str(uuid.uuid4())
    for kind in ("lock", "lease", "latch", "read", "write"):
        name = node_prefix(uid, kind) + "0000000042"
        assert match_node(name) == (kind, uid, 42, None)
    downgrade = node_prefix(uid, "read", 7) + "0000000009"
    assert downgrade == f"_c_{uid}-__READ__0000000007-0000000009"
    assert match_node(downgrade) == ("read", uid, 9, 7)
    with pytest.raises(ValueError, match="only a read node"):
        node_prefix(uid, "write", 7)
    assert match_node(f"_c_{uid}-read-0000000001") is None  # aiolocks < this version


def _curator_sort_key(name: str) -> str:
    """Curator's SortingLockInternalsDriver.fixForSorting for InterProcessReadWriteLock."""
    for lock_name in ("__READ__", "__WRIT__"):
        index = name.rfind(lock_name)
        if index >= 0:
            name = name[index + len(lock_name) :]
    return name


def test_our_read_write_order_is_curators_order() -> None:
    """Plain and downgrade nodes, shuffled: we sort them as Curator does (string order)."""
    rng = random.Random(621)
    names = []
    for seq in range(1, 40):
        kind = rng.choice(["read", "write"])
        names.append(node_prefix(str(uuid.uuid4()), kind) + f"{seq:010d}")
        if kind == "write" and rng.random() < 0.3:
            # a downgrade read taken under this write node, created later
            late = seq + 100
            names.append(node_prefix(str(uuid.uuid4()), "read", seq) + f"{late:010d}")
    rng.shuffle(names)
    ours = [n.name for n in sort_nodes("/p", names)]
    assert ours == sorted(names, key=_curator_sort_key)


# -- where the nodes go -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_curator_layout_puts_nodes_at_the_named_path(
    curator_backend: ZooKeeperBackend, observer: Any
) -> None:
    name = f"locks/{uuid.uuid4().hex[:8]}"
    held = []
    async with curator_backend.mutex(f"{name}/m"):
        held += await lock_nodes(observer, f"/{name}/m")
    async with curator_backend.semaphore_mutex(f"{name}/sm"):
        held += await lock_nodes(observer, f"/{name}/sm")
    async with curator_backend.read_write_lock(f"{name}/rw").write:
        held += await lock_nodes(observer, f"/{name}/rw")
    async with curator_backend.read_write_lock(f"{name}/rw").read:
        held += await lock_nodes(observer, f"/{name}/rw")
    async with curator_backend.leader_latch(f"{name}/l", participant_id="p") as latch:
        assert await latch.wait_for_leadership(timeout=20)
        held += await lock_nodes(observer, f"/{name}/l")
    shapes = [_shape(path) for path in held]
    assert shapes == [
        f"/{name}/m/_c_<uuid>-lock-<seq>",
        f"/{name}/sm/leases/_c_<uuid>-lease-<seq>",
        f"/{name}/rw/_c_<uuid>-__WRIT__<seq>",
        f"/{name}/rw/_c_<uuid>-__READ__<seq>",
        f"/{name}/l/_c_<uuid>-latch-<seq>",
    ]
    # no /aiolocks/<family> folder: at most the record store (the latch's
    # leader record, read by observe()), which both layouts keep there
    if await observer.exists("/aiolocks"):
        assert set(await observer.get_children("/aiolocks")) <= {"records"}
    assert await lock_nodes(observer, f"/{name}") == []


@pytest.mark.asyncio
async def test_default_layout_uses_curators_node_names(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    """Read/write and downgrade nodes, and the semaphore mutex's lease, on the default layout."""
    name = f"rw/{uuid.uuid4().hex[:8]}"
    rw = backend.read_write_lock(name)
    path = lock_path(Family.READ_WRITE, name)
    async with rw.write, rw.read:  # downgrade
        nodes = await lock_nodes(observer, path)
    write, read = sorted(nodes, key=lambda p: "__WRIT__" not in p)
    write_seq = write.rsplit("__WRIT__", 1)[1]
    assert read.rsplit("/", 1)[1].startswith("_c_")
    assert f"-__READ__{write_seq}-" in read
    async with backend.semaphore_mutex(name) as lock:
        parts = await lock.participants()
        assert [(p.mode, p.is_holder) for p in parts] == [("exclusive", True)]
        assert "/leases/" in (parts[0].node or "")
    assert await lock_nodes(observer) == []


def _shape(path: str) -> str:
    found = match_node(path.rsplit("/", 1)[1])
    assert found is not None, path
    _kind, uid, seq, _ = found
    return path.replace(uid, "<uuid>").replace(f"{seq:010d}", "<seq>")


@pytest.mark.asyncio
async def test_list_and_force_release_on_the_curator_layout(
    curator_backend: ZooKeeperBackend, zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """``list_locks`` walks from the root there and tells the kind from the node names."""
    base = f"svc-{uuid.uuid4().hex[:8]}"
    url = f"zk://{zookeeper_server.hosts}{chroot}?layout=curator"
    async with aiolocks.connect(url) as other:
        rw = curator_backend.read_write_lock(f"{base}/rw")
        sem = curator_backend.semaphore(f"{base}/sem", 2)
        mutex = curator_backend.mutex(f"{base}/m")
        waiter = other.mutex(f"{base}/m")
        async with rw.read, sem.lease():
            holder = Held(mutex)
            assert await holder.wait()
            infos = await other.list_locks(base)
            assert [(i.name, i.kind) for i in infos] == [
                (f"{base}/m", "mutex"),
                (f"{base}/rw", "rwlock"),
                (f"{base}/sem", "semaphore"),
            ]
            waiting = Held(waiter)
            await until(lambda: _queued(other, f"{base}/m", 2), what="the waiter's node")
            # Only the holder goes, though every family maps to that folder:
            # the waiter it makes the holder stays.
            assert await other.force_release(f"{base}/m") == 1
            assert await waiting.wait()
            with pytest.raises(LockLostError):
                await holder.release()
            assert holder.was_lost
            await waiting.release()


async def _queued(backend: aiolocks.Backend, name: str, n: int) -> bool:
    return len(await backend.mutex(name).participants()) == n


@pytest.mark.asyncio
async def test_wrapped_backend_takes_the_curator_layout(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """``ZooKeeperBackend(client, layout="curator")`` puts a mutex at Curator's path."""
    import aiozk

    client = aiozk.ZKClient(zookeeper_server.hosts, chroot=chroot, session_timeout=10)
    await client.start()
    try:
        name = f"wrapped/{uuid.uuid4().hex}"
        backend = ZooKeeperBackend(client, layout="curator")
        async with backend, backend.mutex(name):
            children = await client.get_children(f"/{name}")
            assert len(children) == 1
            assert "lock-" in children[0]
        with pytest.raises(ValueError, match="layout"):
            ZooKeeperBackend(client, layout="kazoo")
    finally:
        await client.close()
