"""The client layer: ``backend.client`` (ZooKeeperClient), and backends on an aiozk session."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiozk
import pytest
from aiozk import exc, protocol

import aiolocks
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend, ZooKeeperClient
from aiolocks.zookeeper._client import _ignore

from .conftest import SESSION_TIMEOUT, Held, expire_session, lock_nodes, own_session, until

pytestmark = [pytest.mark.zookeeper, pytest.mark.asyncio]


# -- backend.client of a URL-built backend ---------------------------------------------


async def test_url_backend_client_is_our_documented_client(
    backend: ZooKeeperBackend, chroot: str
) -> None:
    client = backend.client
    assert isinstance(client, ZooKeeperClient)
    assert not isinstance(client, aiozk.ZKClient)
    assert client.session_id == backend.session_id is not None
    assert client.chroot == chroot
    assert client.connected
    assert 0 < client.session_timeout <= SESSION_TIMEOUT
    assert f"0x{backend.session_id:x}" in repr(client)


async def test_create_in_every_mode(backend: ZooKeeperBackend, observer: Any) -> None:
    client = backend.client
    base = f"/create-{uuid.uuid4().hex[:8]}"
    assert await client.create(base, b"v") == base
    assert await observer.get_data(base) == b"v"
    seq = await client.create(f"{base}/s-", sequential=True)
    assert seq.startswith(f"{base}/s-") and seq[-10:].isdigit()
    eph = await client.create(f"{base}/e", ephemeral=True)
    stat = await observer.exists(f"{base}/e")
    assert stat is True
    _, stat = await observer.get(eph)
    assert stat.ephemeral_owner == backend.session_id
    with pytest.raises(exc.NodeExists):
        await client.create(base)
    with pytest.raises(exc.NoNode):
        await client.create(f"{base}/missing/child")
    with pytest.raises(ValueError, match="container"):
        await client.create(f"{base}/c", container=True, ephemeral=True)
    # a container goes once its last child went (the test server reaps every 500 ms)
    box = await client.create(f"{base}/box", container=True)
    await client.create(f"{box}/item")
    await client.delete(f"{box}/item")
    await until(lambda: _gone(client, box), what="container reaped")


async def _gone(client: ZooKeeperClient, path: str) -> bool:
    return await client.exists(path) is None


async def test_ensure_path_makes_missing_ancestors(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    client = backend.client
    base = f"/ensure-{uuid.uuid4().hex[:8]}"
    await client.create(base, b"kept")
    await client.ensure_path(f"{base}/a/b/c")
    await client.ensure_path(f"{base}/a/b/c")  # existing: nothing happens
    assert await observer.get_children(f"{base}/a/b") == ["c"]
    assert await observer.get_data(base) == b"kept"


async def test_get_and_set_data(backend: ZooKeeperBackend) -> None:
    client = backend.client
    path = f"/data-{uuid.uuid4().hex[:8]}"
    await client.create(path, b"one")
    data, stat = await client.get_data(path)
    assert (data, stat.version) == (b"one", 0)
    new = await client.set_data(path, b"two", version=0)
    assert new.version == 1
    assert (await client.get_data(path))[0] == b"two"
    with pytest.raises(exc.BadVersion):
        await client.set_data(path, b"three", version=0)
    assert (await client.set_data(path, b"three")).version == 2  # -1: any version
    with pytest.raises(exc.NoNode):
        await client.get_data(f"{path}-missing")
    with pytest.raises(exc.NoNode):
        await client.set_data(f"{path}-missing", b"x")


async def test_exists_get_children_and_delete(backend: ZooKeeperBackend) -> None:
    client = backend.client
    path = f"/tree-{uuid.uuid4().hex[:8]}"
    assert await client.exists(path) is None
    await client.create(path)
    assert (await client.exists(path)).num_children == 0
    for child in ("b", "a"):
        await client.create(f"{path}/{child}")
    assert sorted(await client.get_children(path)) == ["a", "b"]
    with pytest.raises(exc.NotEmpty):
        await client.delete(path)
    with pytest.raises(exc.BadVersion):
        await client.delete(f"{path}/a", version=3)
    await client.delete(f"{path}/a", version=0)
    await client.delete(f"{path}/b")
    await client.delete(path)
    with pytest.raises(exc.NoNode):
        await client.delete(path)
    with pytest.raises(exc.NoNode):
        await client.get_children(path)


async def test_watches_fire_once_with_kind_and_path(
    backend: ZooKeeperBackend, observer: Any
) -> None:
    client = backend.client
    base = f"/watch-{uuid.uuid4().hex[:8]}"
    await client.create(base)
    events: list[tuple[str, str]] = []
    fired = asyncio.Event()

    def record(kind: str, path: str) -> None:
        events.append((kind, path))
        fired.set()

    async def next_event() -> tuple[str, str]:
        await asyncio.wait_for(fired.wait(), 10)
        fired.clear()
        return events[-1]

    await client.get_data(base, watch=record)
    await observer.set_data(base, b"1", force=True)
    assert await next_event() == ("data", base)
    await observer.set_data(base, b"2", force=True)  # fired already: nothing more
    assert await client.exists(f"{base}/later", watch=record) is None
    await observer.create(f"{base}/later")
    assert await next_event() == ("created", f"{base}/later")
    assert await client.get_children(base, watch=record) == ["later"]
    await observer.create(f"{base}/more")
    assert await next_event() == ("children", base)
    await client.get_data(f"{base}/more", watch=record)
    await observer.delete(f"{base}/more")
    assert await next_event() == ("deleted", f"{base}/more")
    assert len(events) == 4
    with pytest.raises(exc.NoNode):
        await client.get_data(f"{base}/missing", watch=record)
    # no callback is left behind: fired ones and the refused one are gone
    left = [key for key in own_session(backend).watch_callbacks if base in key[1]]
    assert left == []


async def test_requests_of_a_closed_backend_are_refused(zk_url: str) -> None:
    backend = await aiolocks.connect(zk_url)
    assert isinstance(backend, ZooKeeperBackend)
    client = backend.client
    assert await client.exists("/nothing-here") is None  # answered while open
    await backend.close()
    with pytest.raises(aiolocks.BackendUnavailableError):
        await client.exists("/")


# -- ZooKeeperBackend(client): the application's aiozk session -----------------------------


async def _started(server: ZooKeeperServer, chroot: str, **kwargs: Any) -> aiozk.ZKClient:
    client = aiozk.ZKClient(server.hosts, chroot=chroot, session_timeout=SESSION_TIMEOUT, **kwargs)
    await client.start()
    return client


async def test_wrapped_backend_runs_in_the_clients_session(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    client = await _started(zookeeper_server, chroot)
    try:
        backend = ZooKeeperBackend(client)
        assert backend.client is client
        async with backend:
            assert backend.session_id == client.session.session_id
            async with backend.mutex(f"wrapped/{uuid.uuid4().hex}"):
                [node] = await lock_nodes(observer)
                _, stat = await observer.get(node)
                # one session per process: the lock node is the client's
                assert stat.ephemeral_owner == client.session.session_id
            assert await lock_nodes(observer) == []
            kept = backend.mutex(f"wrapped/kept-{uuid.uuid4().hex}")
            assert await kept.acquire()
        # closing the backend ended the hold and deleted its node in the client's
        # session, and left the client open and usable
        assert kept.is_lost
        assert await lock_nodes(observer) == []
        assert client.session.state == "connected"
        assert await client.exists("/") is True
    finally:
        await client.close()


async def test_wrapped_backend_applies_the_clients_authentication(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    """Lock nodes made with the client's creator-only ACL: only its authenticated session may."""
    client = await _started(zookeeper_server, chroot)  # its chroot: world-readable
    try:
        await client.send(protocol.AuthRequest(type=0, scheme="digest", auth=b"app:s3cret"))
        client.default_acl = [protocol.AUTHED_UNRESTRICTED]  # from now on: creator only
        async with ZooKeeperBackend(client) as backend:
            lock = backend.mutex(f"authed/{uuid.uuid4().hex}")
            async with lock:
                [node] = await lock_nodes(client)
                with pytest.raises(exc.NoAuth):
                    await observer.get_data(node)  # not the creator
                assert (await client.get(node))[0]  # the participant id
            assert await lock_nodes(client) == []
    finally:
        await client.close()


async def test_wrapped_backend_loses_holds_when_the_session_expires_and_waiters_wait_on(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_url: str, observer: Any
) -> None:
    name = f"wrapped/expiry-{uuid.uuid4().hex}"
    client = await _started(zookeeper_server, chroot)
    other = await aiolocks.connect(zk_url)
    assert isinstance(other, ZooKeeperBackend)
    backend = ZooKeeperBackend(client)
    try:
        async with backend:
            first = Held(other.mutex(name))
            assert await first.wait()
            waiter = Held(backend.mutex(name))  # queued behind `other`'s hold
            held = Held(backend.mutex(f"{name}-held"))
            assert await held.wait()
            await until(lambda: _queued(observer, 3), what="waiter queued")
            old = backend.session_id
            await expire_session(zookeeper_server.hosts, backend)
            assert backend.session_id not in (None, old)
            with pytest.raises(aiolocks.LockLostError):
                await held.release()
            assert held.was_lost  # the hold went with the old session
            assert not waiter.task.done()  # the waiter queued again, still waiting
            await first.release()
            assert await waiter.wait()  # ... and got the lock in the new session
            await waiter.release()
    finally:
        await other.close()
        await client.close()


async def _queued(observer: Any, count: int) -> bool:
    return len(await lock_nodes(observer)) == count


async def test_wrapped_waiters_watch_only_their_predecessor(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    name = f"wrapped/herd-{uuid.uuid4().hex}"
    client = await _started(zookeeper_server, chroot)
    try:
        async with ZooKeeperBackend(client) as backend:
            holds = [Held(backend.mutex(name))]
            assert await holds[0].wait()
            holds += [Held(backend.mutex(name)) for _ in range(3)]
            await until(lambda: _queued(observer, 4), what="three waiters queued")
            nodes = sorted(await lock_nodes(observer), key=lambda p: p[-10:])

            def watched() -> list[str]:
                return sorted(
                    path
                    for (kind, path), callbacks in client.session.watch_callbacks.items()
                    if kind == protocol.WatchEvent.DATA_CHANGED
                    for callback in callbacks
                    if callback is not _ignore
                )

            # each waiter watches the node right ahead of it, and nothing else
            await until(lambda: len(watched()) == 3, what="three watches")
            assert watched() == sorted(client.normalize_path(p) for p in nodes[:3])
            for hold in holds:
                await hold.release()
    finally:
        await client.close()


async def test_wrapped_client_must_be_an_aiozk_client_and_started(
    zookeeper_server: ZooKeeperServer,
) -> None:
    with pytest.raises(TypeError, match=r"aiozk\.ZKClient"):
        ZooKeeperBackend(object())
    client = aiozk.ZKClient(zookeeper_server.hosts)  # never started
    with pytest.raises(aiolocks.BackendUnavailableError, match="not connected"):
        await ZooKeeperBackend(client, connect_timeout=0.3).open()


async def test_a_node_created_twice_is_not_waited_for(
    backend: ZooKeeperBackend, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiozk re-sends a create after a dropped connection, so a backend on an aiozk client
    may find a first node with its own uid ahead of the one it was answered: it deletes
    it instead of waiting behind it forever."""
    from aiolocks._core.driver import Family
    from aiolocks.zookeeper import lock_path

    name = f"twice/{uuid.uuid4().hex}"
    holder = Held(backend.mutex(name))
    assert await holder.wait()
    uid = uuid.uuid4()
    parent = lock_path(Family.MUTEX, name)
    # the "first" create of the waiter, applied but never answered
    twin = await observer.create(f"{parent}/_c_{uid}-lock-", sequential=True, ephemeral=True)
    monkeypatch.setattr(uuid, "uuid4", lambda: uid)  # the waiter's uid is the twin's
    waiter = Held(backend.mutex(name), timeout=30)

    async def settled() -> bool:
        nodes = await lock_nodes(observer)
        return len(nodes) == 2 and twin not in nodes

    await until(settled, what="the twin deleted, the waiter queued")
    assert await observer.exists(twin) is False
    await holder.release()
    assert await waiter.wait()  # behind the holder only
    await waiter.release()
