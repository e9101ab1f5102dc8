"""Sessions: forced expiry, server restarts, partitions, ensemble failover."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

import aiolocks
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import ZooKeeperEnsemble, ZooKeeperServer
from aiolocks.zookeeper import ConnectionState, ZooKeeperBackend, _connection

from .conftest import SESSION_TIMEOUT, Held, expire_session, lock_nodes, own_session, until

pytestmark = pytest.mark.zookeeper


async def _connect(url: str) -> ZooKeeperBackend:
    backend = await aiolocks.connect(url)
    assert isinstance(backend, ZooKeeperBackend)
    return backend


def _session(backend: ZooKeeperBackend) -> tuple[int, bytes]:
    session = own_session(backend)
    assert session.session_id is not None
    return session.session_id, session.password


@pytest.mark.asyncio
async def test_forced_expiry_cancels_body_and_hands_over(
    zookeeper_server: ZooKeeperServer, zk_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"expire/{uuid.uuid4().hex}"
    a = await _connect(zk_url)
    b = await _connect(zk_url)
    states: list[ConnectionState] = []
    a.add_connection_listener(states.append)
    entered = asyncio.Event()
    body_cancelled = False
    lost_in_body = False
    old_token = 0
    lock = a.mutex(name)

    async def holder() -> None:
        nonlocal body_cancelled, lost_in_body, old_token
        async with lock:
            old_token = lock.fencing_token or 0
            entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                body_cancelled = True
                lost_in_body = lock.is_lost
                raise

    try:
        task = asyncio.create_task(holder())
        await entered.wait()
        assert old_token > 0
        waiter = Held(b.mutex(name))
        await until(lambda: _count(b, name, 2), what="waiter queued")
        with caplog.at_level(logging.WARNING, logger="aiolocks"):
            await expire_session(zookeeper_server.hosts, a)
            with pytest.raises(aiolocks.LockLostError):
                await task
        assert body_cancelled and lost_in_body
        assert any(r.levelno >= logging.WARNING for r in caplog.records)
        assert await waiter.wait()  # the next waiter got it
        await waiter.release()
        assert ConnectionState.LOST in states
        await until(lambda: states[-1] is ConnectionState.RECONNECTED, what="new session")
        # the backend works in its new session; tokens keep increasing
        async with a.mutex(name) as again:
            assert again.fencing_token is not None and again.fencing_token > old_token
    finally:
        await a.close()
        await b.close()


async def _hand_over(holder: Held, waiting: Held) -> None:
    """The holder lets go; the waiter gets the lock, never lost, and lets go too."""
    await holder.release()
    assert await waiting.wait()
    await waiting.release()
    assert waiting.was_lost is False


async def _count(backend: aiolocks.Backend, name: str, n: int) -> bool:
    return len(await backend.mutex(name).participants()) >= n


@pytest.mark.asyncio
async def test_waiter_survives_expiry_and_acquires_in_new_session(
    zookeeper_server: ZooKeeperServer, zk_url: str, observer: Any
) -> None:
    name = f"expire-wait/{uuid.uuid4().hex}"
    a = await _connect(zk_url)
    b = await _connect(zk_url)
    try:
        holder = Held(b.mutex(name))
        assert await holder.wait()
        lock = a.mutex(name)
        waiting = Held(lock)
        await until(lambda: _count(b, name, 2), what="waiter queued")
        old_sid = a.session_id
        await expire_session(zookeeper_server.hosts, a)
        await until(lambda: a.session_id not in (None, old_sid), what="new session")
        # the waiter queued again in the new session: one node, not two
        await until(lambda: _count(b, name, 2), what="waiter re-queued")
        assert len(await b.mutex(name).participants()) == 2
        assert not waiting.acquired.is_set()
        await _hand_over(holder, waiting)
        assert await lock_nodes(observer) == []
    finally:
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_a_listing_answered_session_expired_is_sent_again(
    zk_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that reaches the server after its session expired is answered
    SESSION_EXPIRED without running; it goes out again in the next session.
    It used to escape acquire() as an internal SessionChanged (CI, under load:
    the expiry test above then timed out waiting for the waiter)."""
    from aiozk import exc as zk_exc
    from aiozk import protocol

    from aiolocks.zookeeper._connection import Connection

    name = f"expired-reply/{uuid.uuid4().hex}"
    a = await _connect(zk_url)
    b = await _connect(zk_url)
    original = Connection.send
    answered: list[str] = []

    def send(self: Any, request: Any, xid: int | None = None) -> Any:
        fut = original(self, request, xid=xid)
        if isinstance(request, protocol.GetChildrenRequest) and not answered:
            answered.append("SESSION_EXPIRED")
            fut.set_exception(zk_exc.SessionExpired())  # what the server would answer
        return fut

    try:
        holder = Held(b.mutex(name))
        assert await holder.wait()
        waiting = Held(a.mutex(name))
        await until(lambda: _count(b, name, 2), what="waiter queued")
        monkeypatch.setattr(Connection, "send", send)
        a._driver._monitor.wake_all()  # the waiter lists again
        await until(lambda: bool(answered), what="listing answered SESSION_EXPIRED")
        monkeypatch.undo()
        a._driver._monitor.wake_all()  # as a new session would
        await _hand_over(holder, waiting)
    finally:
        monkeypatch.undo()
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_connection_dropped_while_rearming_watches_reconnects(
    zk_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watches are re-armed (SetWatches) first thing on a new connection of
    the same session; a drop right then must not stall reconnection (with
    aiozk's repair loop it did: the backend never reconnected)."""
    from aiozk import protocol

    from aiolocks.zookeeper._connection import Connection

    name = f"rearm/{uuid.uuid4().hex}"
    a = await _connect(zk_url)
    b = await _connect(zk_url)
    states: list[ConnectionState] = []
    a.add_connection_listener(states.append)
    original = Connection.send
    dropped: list[str] = []

    def send(self: Any, request: Any, xid: int | None = None) -> Any:
        fut = original(self, request, xid=xid)
        if isinstance(request, protocol.SetWatchesRequest) and not dropped:
            dropped.append(type(request).__name__)
            self.transport.abort()  # the connection drops before the reply
        return fut

    try:
        holder = Held(b.mutex(name))
        assert await holder.wait()
        waiting = Held(a.mutex(name))  # a watch on the holder's node
        await until(lambda: _count(b, name, 2), what="waiter queued")
        sid = a.session_id
        monkeypatch.setattr(Connection, "send", send)
        own_session(a).conn.transport.abort()
        await until(lambda: bool(dropped), what="SetWatches sent on the new connection")
        # suspended twice (the cut, then the drop), reconnected twice
        await until(
            lambda: states.count(ConnectionState.RECONNECTED) >= 2 and own_session(a).connected,
            what="reconnected after the drop",
        )
        assert a.session_id == sid  # the same session all along: nothing lost
        await _hand_over(holder, waiting)
    finally:
        monkeypatch.undo()
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_server_restart_mid_hold_and_mid_wait(
    zookeeper_restartable: ZooKeeperServer,
) -> None:
    url = f"{zookeeper_restartable.url}?session_timeout=15"
    name = f"restart/{uuid.uuid4().hex}"
    a = await _connect(url)
    b = await _connect(url)
    states: list[ConnectionState] = []
    b.add_connection_listener(states.append)
    try:
        lock = a.mutex(name)
        holder = Held(lock)
        assert await holder.wait()
        waiting_lock = b.mutex(name)
        waiting = Held(waiting_lock)
        await until(lambda: _count(b, name, 2), what="waiter queued")
        await asyncio.to_thread(zookeeper_restartable.stop)
        await asyncio.to_thread(zookeeper_restartable.start)
        # both sessions survive the restart: the hold is kept...
        await until(lambda: states[-1:] == [ConnectionState.RECONNECTED], what="b reconnected")
        await until(lambda: a.connection_state is ConnectionState.RECONNECTED, what="a back")
        parts = await b.mutex(name).participants()
        assert [(p.is_holder, p.fencing_token) for p in parts] == [
            (True, holder.token),
            (False, None),
        ]
        assert not waiting.acquired.is_set()
        # ... and the waiter, whose watch was re-armed, still wakes up
        await holder.release()
        assert holder.was_lost is False
        assert await waiting.wait()
        assert ConnectionState.LOST not in states
        await waiting.release()
    finally:
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_partition_declares_loss_client_side(
    zookeeper_server: ZooKeeperServer, chroot: str, zk_url: str
) -> None:
    """While partitioned, the hold is declared lost after a session timeout, before
    the session could learn of the expiry (Curator's simulated expiry)."""
    name = f"partition/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        a = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout={SESSION_TIMEOUT}")
        other = await _connect(zk_url)
        states: list[ConnectionState] = []
        a.add_connection_listener(states.append)
        try:
            lock = a.mutex(name)
            entered = asyncio.Event()

            async def body() -> None:
                async with lock:
                    entered.set()
                    await asyncio.Event().wait()

            task = asyncio.create_task(body())
            await entered.wait()
            proxy.stall()
            with pytest.raises(aiolocks.LockLostError):
                await task
            # still partitioned: we learnt it from our own timer
            assert states[-2:] == [ConnectionState.SUSPENDED, ConnectionState.LOST]
            # the server expired the session too: someone else gets the lock
            theirs = other.mutex(name)
            assert await theirs.acquire(timeout=3 * SESSION_TIMEOUT)
            await theirs.release()
            # a timed acquire during the outage returns in time
            started = time.monotonic()
            assert await a.mutex(f"{name}-2").acquire(timeout=0.5) is False
            assert time.monotonic() - started < 4  # deadline + reply grace, not "until healed"
            proxy.heal()
            await until(lambda: states[-1] is ConnectionState.RECONNECTED, what="reconnected")
            async with a.mutex(name):
                pass
        finally:
            proxy.heal()
            await a.close()
            await other.close()


@pytest.mark.asyncio
async def test_suspended_is_lost_policy(zookeeper_server: ZooKeeperServer, chroot: str) -> None:
    name = f"suspend/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        a = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10&suspended_is_lost=1")
        try:
            lock = a.mutex(name)
            await lock.acquire()
            proxy.cut()  # connection drops, session survives
            await until(lambda: lock.is_lost, what="hold lost on SUSPENDED")
            with pytest.raises(aiolocks.LockLostError, match="suspended"):
                await lock.release()  # cleans up, then reports the loss
            await until(lambda: a.connection_state is ConnectionState.RECONNECTED, what="back")
            assert await a.mutex(name).acquire(timeout=10)
            await a.mutex(name).release()
        finally:
            await a.close()


@pytest.mark.asyncio
async def test_connection_blip_keeps_hold_by_default(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    name = f"blip/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        a = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        states: list[ConnectionState] = []
        a.add_connection_listener(states.append)
        try:
            lock = a.mutex(name)
            await lock.acquire()
            proxy.cut()
            await until(lambda: states[-1:] == [ConnectionState.RECONNECTED], what="reconnected")
            assert ConnectionState.SUSPENDED in states and ConnectionState.LOST not in states
            assert not lock.is_lost
            parts = await lock.participants()
            assert len(parts) == 1 and parts[0].fencing_token == lock.fencing_token
            await lock.release()
        finally:
            await a.close()


@pytest.mark.asyncio
async def test_ensemble_leader_kill_keeps_holds(zookeeper_ensemble: ZooKeeperEnsemble) -> None:
    url = f"zk://{zookeeper_ensemble.hosts}?session_timeout=20"
    name = f"ensemble/{uuid.uuid4().hex}"
    a = await _connect(url)
    b = await _connect(url)
    leader = zookeeper_ensemble.leader()
    try:
        lock = a.mutex(name)
        await lock.acquire()
        token = lock.fencing_token
        waiting_lock = b.mutex(name)
        waiting = Held(waiting_lock)
        await until(lambda: _count(b, name, 2), what="waiter queued")
        await asyncio.to_thread(leader.kill)
        await asyncio.to_thread(zookeeper_ensemble.wait_for_leader)
        # the session survives the failover: the hold is intact and exclusive
        parts = await a.mutex(name).participants()
        assert [p.is_holder for p in parts] == [True, False]
        assert parts[0].fencing_token == token
        assert not lock.is_lost and not waiting.acquired.is_set()
        await lock.release()
        assert await waiting.wait()
        await waiting.release()
    finally:
        await a.close()
        await b.close()
        await asyncio.to_thread(leader.start)
        await asyncio.to_thread(zookeeper_ensemble.wait_for_leader)


@pytest.mark.asyncio
async def test_a_server_closing_the_handshake_is_skipped_and_the_session_kept(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """A server that closes the handshake without an answer (ZooKeeper does so
    while electing a leader, when it is behind our zxid, or when it is
    read-only) is not an expiry: the next server resumes the same session."""
    refused = 0

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal refused
        if await reader.read(4096):  # the ConnectRequest
            refused += 1
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"zk://127.0.0.1:{port},{zookeeper_server.hosts}{chroot}?session_timeout=10"
    a = await _connect(url)
    states: list[ConnectionState] = []
    a.add_connection_listener(states.append)
    try:
        sid = a.session_id
        lock = a.mutex(f"refused/{uuid.uuid4().hex}")
        await lock.acquire()
        drops = 0
        # the server order is random: drop the connection until the refusing
        # server has been tried a few times
        while refused < 3 and drops < 100:
            session = own_session(a)
            conn = session.conn
            conn.abort()
            drops += 1
            await until(functools.partial(_reconnected, session, conn), what="reconnected")
        assert refused >= 3
        assert a.session_id == sid
        assert ConnectionState.LOST not in states
        assert states.count(ConnectionState.RECONNECTED) == drops
        assert not lock.is_lost
        parts = await lock.participants()
        assert [p.fencing_token for p in parts] == [lock.fencing_token]
        await lock.release()
    finally:
        await a.close()
        server.close()
        await server.wait_closed()


def _reconnected(session: Any, old: Any) -> bool:
    return bool(session.connected and session.conn is not old)


@pytest.mark.asyncio
async def test_a_silent_connection_is_dropped_and_the_session_resumed(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """A partition that keeps the socket open sends nothing back: the
    connection is dropped (SUSPENDED) once silent for two thirds of the session
    timeout, not a ping interval later, so a network healed right then still
    finds the session alive: the same session resumes with its holds
    (RECONNECTED, no LOST).

    The last byte comes a little after a ping's answer: a client that checked
    the silence only when it pings would notice it near a whole session timeout
    after that byte, about when the server expires the session.
    """
    name = f"silent/{uuid.uuid4().hex}"
    timeout = 6.0  # the server grants it: its sessions go from 0.4 s to 60 s
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        a = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout={timeout:g}")
        session = own_session(a)
        assert session.timeout == timeout
        states: list[ConnectionState] = []
        silences: list[float] = []
        back: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn = session.conn

        def on_state(state: ConnectionState) -> None:
            states.append(state)
            if state is ConnectionState.SUSPENDED:
                silences.append(time.monotonic() - conn.last_received)
                proxy.heal()  # the network heals the moment the client gives up on it
            elif state is ConnectionState.RECONNECTED and not back.done():
                back.set_result(None)

        a.add_connection_listener(on_state)
        try:
            sid = a.session_id
            lock = a.mutex(name)
            await lock.acquire()
            pinged: list[float] = []
            send_ping = conn.ping

            def ping() -> None:
                pinged.append(time.monotonic())
                send_ping()

            conn.ping = ping
            await until(lambda: pinged and conn.last_received > pinged[-1], what="a ping answered")
            # Not a synchronisation: this places the last byte a twelfth of the
            # timeout after a ping, where a check made only at the pings (a
            # third apart) would notice the silence latest, near the whole
            # timeout. When the silence is checked on its own, this is moot.
            await asyncio.sleep(timeout / 12)
            assert len(await lock.participants()) == 1
            proxy.stall()  # nothing forwarded; no socket closed
            async with asyncio.timeout(timeout * 3):
                await back
            assert states == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED]
            # Dropped at two thirds of the timeout (a sixth more for a late
            # event loop); a check only at the pings drops it at the whole timeout.
            assert silences[0] < timeout * 5 / 6
            assert a.session_id == sid
            assert not lock.is_lost
            parts = await lock.participants()
            assert [p.fencing_token for p in parts] == [lock.fencing_token]
            await lock.release()
        finally:
            proxy.heal()
            await a.close()


@pytest.mark.asyncio
async def test_the_server_just_lost_is_tried_last(
    zookeeper_server: ZooKeeperServer, chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server a connection was lost to is tried last: when it is the one
    cut off, starting the next round with it would spend its share of the
    session timeout waiting for a handshake that never comes, more than is left
    of the session, and the session would expire. Two addresses (two proxies to
    one server), tried in the given order; the first goes silent for good."""
    monkeypatch.setattr(_connection, "random", SimpleNamespace(sample=lambda seq, k: seq[:k]))
    timeout = 6.0
    async with (
        TcpProxy(zookeeper_server.host, zookeeper_server.port) as silent,
        TcpProxy(zookeeper_server.host, zookeeper_server.port) as other,
    ):
        a = await _connect(f"zk://{silent.netloc},{other.netloc}{chroot}?session_timeout=6")
        assert own_session(a).timeout == timeout
        assert (silent.connections_total, other.connections_total) == (1, 0)
        states: list[ConnectionState] = []
        back: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_state(state: ConnectionState) -> None:
            states.append(state)
            if state is ConnectionState.RECONNECTED and not back.done():
                back.set_result(None)

        a.add_connection_listener(on_state)
        try:
            sid = a.session_id
            lock = a.mutex(f"moves-on/{uuid.uuid4().hex}")
            await lock.acquire()
            silent.stall()  # a partition between the client and that address only
            async with asyncio.timeout(timeout * 3):
                await back
            assert states == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED]
            assert a.session_id == sid
            assert not lock.is_lost
            assert silent.connections_total == 1  # no attempt on the silent one first
            await lock.release()
        finally:
            silent.heal()
            await a.close()


@pytest.mark.asyncio
async def test_closing_leaves_no_task_or_socket_behind(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    """Open and close backends, one of them while its server is unreachable
    (its reconnect loop running): no task of ours and no connection stay."""
    before = set(asyncio.all_tasks())
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        url = f"zk://{proxy.netloc}{chroot}?session_timeout=10&connect_timeout=2"
        reachable = await _connect(url)
        async with reachable.mutex(f"leak/{uuid.uuid4().hex}"):
            pass
        await reachable.close()
        cut_off = await _connect(url)
        lock = cut_off.mutex(f"leak/{uuid.uuid4().hex}")
        await lock.acquire()
        proxy.refuse()
        proxy.cut()
        await until(lambda: not own_session(cut_off).connected, what="disconnected")
        await cut_off.close()
        assert lock.is_lost  # closing the backend ends its holds
        await until(lambda: proxy.active_connections == 0, what="sockets closed")
    await asyncio.sleep(0)
    left = [
        t for t in asyncio.all_tasks() - before if t is not asyncio.current_task() and not t.done()
    ]
    assert not [t.get_name() for t in left if t.get_name().startswith("aiolocks")]


@pytest.mark.asyncio
async def test_watches_are_rearmed_and_fire_for_changes_made_while_away(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    """A watch set through the backend's client (no waiter re-lists for it)
    fires for a deletion that happened while the connection was down: the
    reconnection re-arms it with SetWatches from the last zxid seen."""
    path = f"/rearm-{uuid.uuid4().hex}"
    await observer.create(path, b"x")
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        a = await _connect(f"zk://{proxy.netloc}{chroot}?session_timeout=10")
        states: list[ConnectionState] = []
        a.add_connection_listener(states.append)
        try:
            sid = a.session_id
            deleted: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
            assert await a.client.exists(path, watch=lambda *e: deleted.set_result(e)) is not None
            proxy.refuse()
            proxy.cut()
            await until(lambda: ConnectionState.SUSPENDED in states, what="disconnected")
            await observer.delete(path)
            assert not deleted.done()
            proxy.heal()
            assert await asyncio.wait_for(deleted, 20) == ("deleted", path)
            assert a.session_id == sid
            assert ConnectionState.LOST not in states
        finally:
            proxy.heal()
            await a.close()


def test_set_watches_are_split_below_the_packet_limit() -> None:
    from aiozk import protocol

    from aiolocks.zookeeper._connection import _SET_WATCHES_BYTES, Session

    session = Session([("127.0.0.1", 2181)], timeout=10.0, events=None)
    session.last_zxid = 0x1234
    kinds = {
        protocol.WatchEvent.DELETED: "data_watches",
        protocol.WatchEvent.DATA_CHANGED: "data_watches",
        protocol.WatchEvent.CREATED: "exist_watches",
        protocol.WatchEvent.CHILDREN_CHANGED: "child_watches",
    }
    expected: dict[str, set[str]] = {
        "data_watches": set(),
        "exist_watches": set(),
        "child_watches": set(),
    }
    for i in range(12_000):
        event_type = list(kinds)[i % 4]
        path = f"/aiolocks/mutex/name-{i:05d}/_c_{uuid.uuid4()}-lock-{i:010d}"
        session.add_watch_callback(event_type, path, print)
        expected[kinds[event_type]].add(path)
    requests = session.set_watches_requests()
    assert len(requests) > 1
    seen: dict[str, list[str]] = {kind: [] for kind in expected}
    for request in requests:
        assert request.relative_zxid == 0x1234
        paths = request.data_watches + request.exist_watches + request.child_watches
        assert sum(len(p.encode()) + 4 for p in paths) <= _SET_WATCHES_BYTES
        for kind in expected:
            seen[kind] += getattr(request, kind)
    for kind, paths in expected.items():
        assert sorted(seen[kind]) == sorted(paths)  # each path once, in its kind
