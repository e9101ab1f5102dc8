"""ZooKeeper digest authentication and creator-only ACLs, against a real server.

``zk://user:password@...`` sends ``addauth digest`` on every connection and
writes lock nodes and folders that only that identity may change (anyone may
read). A wrong password is another identity: the server refuses it with
``NoAuth`` where the right one's nodes are, and that is AccessDeniedError.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiozk
import pytest
import pytest_asyncio
from aiozk import exc

import aiolocks
from aiolocks import AccessDeniedError, LockLostError
from aiolocks.testing.proxy import TcpProxy
from aiolocks.testing.servers import ZooKeeperServer
from aiolocks.zookeeper import ZooKeeperBackend, from_url
from aiolocks.zookeeper._auth import digest_id
from aiolocks.zookeeper._connection import Credential, Session, parse_hosts

from .conftest import SESSION_TIMEOUT, Held, lock_nodes, own_session, until

pytestmark = pytest.mark.zookeeper

USER = "locker"
#: a sentinel: it must never show in a message, a repr or a log line
PASSWORD = "Zk/Sec?ret@#S3ntinel"
WRONG = "N0t-the-Passw0rd"


def url(hosts: str, chroot: str, password: str = PASSWORD, query: str = "") -> str:
    """A zk:// URL with credentials (the password unencoded: / ? @ # are allowed)."""
    return f"zk://{USER}:{password}@{hosts}{chroot}?session_timeout={SESSION_TIMEOUT}{query}"


async def _connect(target: str, **options: Any) -> ZooKeeperBackend:
    backend = await aiolocks.connect(target, **options)
    assert isinstance(backend, ZooKeeperBackend)
    return backend


@pytest_asyncio.fixture
async def authed(zookeeper_server: ZooKeeperServer, chroot: str) -> AsyncIterator[ZooKeeperBackend]:
    """A backend with the right credentials, in the test's chroot."""
    backend = await _connect(url(zookeeper_server.hosts, chroot))
    try:
        yield backend
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_every_recipe_works_with_credentials(authed: ZooKeeperBackend) -> None:
    name = f"sec/{uuid.uuid4().hex}"
    async with authed.mutex(name) as lock:
        assert lock.fencing_token
    async with authed.semaphore(name, 2), authed.semaphore(name, 2):
        pass
    rw = authed.read_write_lock(name)
    async with rw.read:
        pass
    async with rw.write:
        pass
    latch = authed.leader_latch(name, participant_id="a")
    await latch.start()
    assert await latch.wait_for_leadership(timeout=10)
    await latch.close()
    assert authed.url.startswith(f"zk://{USER}@")  # the user, never the password


@pytest.mark.asyncio
async def test_lock_nodes_carry_the_creator_acl(authed: ZooKeeperBackend, observer: Any) -> None:
    name = f"sec/{uuid.uuid4().hex}"
    every = aiozk.ACL.make("digest", "", True, True, True, True, True).perms
    # ZooKeeper shows a digest's hash only to those who may administer the
    # node; to others it prints "user:x" (the holder's release proves the hash)
    ids = {digest_id(USER, PASSWORD), f"{USER}:x"}
    async with authed.mutex(name):
        [node] = await lock_nodes(observer)
        folder = node.rsplit("/", 1)[0]
        for path in (node, folder, "/aiolocks"):
            acl = await observer.get_acl(path)
            owner, world = sorted(acl, key=lambda a: a.id.scheme)
            assert (owner.id.scheme, owner.perms) == ("digest", every), path
            assert owner.id.id in ids, path
            assert (world.id.scheme, world.id.id, world.perms) == ("world", "anyone", 1), path


@pytest.mark.asyncio
async def test_a_stranger_reads_but_cannot_delete_or_queue(
    authed: ZooKeeperBackend, observer: Any, zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    name = f"sec/{uuid.uuid4().hex}"
    plain = await _connect(f"zk://{zookeeper_server.hosts}{chroot}?session_timeout=4")
    try:
        async with authed.mutex(name):
            [node] = await lock_nodes(observer)
            assert (await observer.get_data(node)) is not None  # readable
            with pytest.raises(exc.NoAuth):
                await observer.delete(node)
            assert await lock_nodes(observer) == [node]  # still held
            # a credential-less backend sees the lock ...
            [info] = await plain.list_locks("sec/")
            assert info.name == name and len(info.participants) == 1
            assert len(await plain.mutex(name).participants()) == 1  # `aiolocks status`
            # ... but may neither break it nor queue for it
            with pytest.raises(AccessDeniedError):
                await plain.force_release(name)
            with pytest.raises(AccessDeniedError):
                await plain.mutex(name).acquire(timeout=5)
            assert await lock_nodes(observer) == [node]
    finally:
        await plain.close()


@pytest.mark.parametrize("on_unavailable", [None, "local"])
@pytest.mark.asyncio
async def test_a_wrong_password_is_access_denied_never_a_local_hold(
    authed: ZooKeeperBackend,
    observer: Any,
    zookeeper_server: ZooKeeperServer,
    chroot: str,
    on_unavailable: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    name = f"sec/{uuid.uuid4().hex}"
    options = {"on_unavailable": on_unavailable} if on_unavailable else {}
    wrong = await _connect(url(zookeeper_server.hosts, chroot, password=WRONG), **options)
    holder = Held(authed.mutex(name))  # in a task of its own
    try:
        assert await holder.wait()
        lock = wrong.mutex(name)
        with pytest.raises(AccessDeniedError) as raised:
            await lock.acquire(timeout=5)
        assert not isinstance(raised.value, aiolocks.BackendUnavailableError)
        assert not lock.is_owned_by_current_task() and not lock.is_acquired_in_this_process()
        assert len(await lock_nodes(observer)) == 1  # only the right holder's node
        for text in (str(raised.value), repr(raised.value), caplog.text, repr(wrong)):
            assert WRONG not in text and PASSWORD not in text
        await holder.release()
        assert holder.was_lost is False
    finally:
        await wrong.close()


@pytest.mark.asyncio
async def test_prompt_loss_when_the_owner_breaks_a_hold(
    authed: ZooKeeperBackend, zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    name = f"sec/{uuid.uuid4().hex}"
    admin = await _connect(url(zookeeper_server.hosts, chroot))
    try:
        lock = authed.mutex(name)
        with pytest.raises(LockLostError):
            async with lock:
                assert await admin.force_release(name) == 1
                await asyncio.sleep(30)  # cancelled by the loss, long before this ends
    finally:
        await admin.close()


@pytest.mark.asyncio
async def test_reconnection_sends_the_credentials_again(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    name = f"sec/{uuid.uuid4().hex}"
    async with TcpProxy(zookeeper_server.host, zookeeper_server.port) as proxy:
        backend = await _connect(url(proxy.netloc, chroot))
        try:
            session = own_session(backend)
            held = Held(backend.mutex(name))
            assert await held.wait()
            first = session.conn
            proxy.cut()  # the session lives on; the connection is new
            await until(lambda: session.connected and session.conn is not first, what="reconnect")
            # creating under the creator-only folder needs the identity again
            async with backend.semaphore_mutex(f"{name}-after"):
                pass
            await held.release()
            assert held.was_lost is False
            assert await lock_nodes(observer) == []
        finally:
            await backend.close()


@pytest.mark.asyncio
async def test_a_refused_credential_ends_the_session(zookeeper_server: ZooKeeperServer) -> None:
    """AUTH_FAILED (here: a scheme the server has no provider for) is AccessDeniedError at once."""
    session = Session(
        parse_hosts(zookeeper_server.hosts),
        timeout=SESSION_TIMEOUT,
        events=None,
        credentials=[Credential("no-such-scheme", b"x:" + PASSWORD.encode(), identity="x")],
    )
    with pytest.raises(AccessDeniedError, match="AUTH_FAILED") as raised:
        await session.start(10)
    assert PASSWORD not in str(raised.value)
    assert PASSWORD not in repr(session.credentials)
    assert session.refused is not None and session.closing  # no reconnect loop
    assert not session.connected


def test_the_password_never_shows_in_reprs_or_url_errors() -> None:
    backend = from_url(url("h:2181", "/app"))
    for text in (repr(backend), str(backend.url), repr(backend._driver)):
        assert PASSWORD not in text
    with pytest.raises(ValueError, match="acl") as raised:
        from_url(url("h:2181", "/app", query="&acl=everyone"))
    assert PASSWORD not in str(raised.value)
    with pytest.raises(ValueError, match="chroot") as raised:
        from_url(f"zk://{USER}:{PASSWORD}@h:2181/app/")
    assert PASSWORD not in str(raised.value)


@pytest.mark.asyncio
async def test_acl_open_keeps_nodes_world_writable(
    zookeeper_server: ZooKeeperServer, chroot: str, observer: Any
) -> None:
    backend = await _connect(url(zookeeper_server.hosts, chroot, query="&acl=open"))
    try:
        async with backend.mutex(f"sec/{uuid.uuid4().hex}"):
            [node] = await lock_nodes(observer)
            [entry] = await observer.get_acl(node)
            assert (entry.id.scheme, entry.id.id) == ("world", "anyone")
    finally:
        await backend.close()


# -- doctor: how open the deployment is ----------------------------------------------------

_SECURITY = {"zookeeper-open", "zookeeper-no-tls", "zookeeper-world-writable"}


@pytest.mark.asyncio
async def test_doctor_finds_an_open_deployment(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    target = f"zk://{zookeeper_server.hosts}{chroot}?session_timeout={SESSION_TIMEOUT}"
    async with await _connect(target) as backend, backend.mutex(f"doc/{uuid.uuid4().hex}"):
        report = await backend.doctor(self_test=False)
    found = {f.code: f for f in report.findings if f.code in _SECURITY}
    assert set(found) == {"zookeeper-open", "zookeeper-no-tls"}, report.findings
    assert found["zookeeper-open"].severity is aiolocks.Severity.WARNING
    assert found["zookeeper-no-tls"].severity is aiolocks.Severity.INFO  # loopback


@pytest.mark.asyncio
async def test_doctor_with_credentials_finds_no_open_nodes(authed: ZooKeeperBackend) -> None:
    async with authed.mutex(f"doc/{uuid.uuid4().hex}"):
        report = await authed.doctor(self_test=False)
    codes = {f.code for f in report.findings} & _SECURITY
    assert codes == {"zookeeper-no-tls"}, report.findings
    assert PASSWORD not in repr(report.findings)


@pytest.mark.asyncio
async def test_doctor_finds_acl_open_with_credentials(
    zookeeper_server: ZooKeeperServer, chroot: str
) -> None:
    async with await _connect(url(zookeeper_server.hosts, chroot, query="&acl=open")) as backend:
        report = await backend.doctor(self_test=False)
    (finding,) = [f for f in report.findings if f.code == "zookeeper-world-writable"]
    assert finding.details["acl_open"] is True
    assert "zookeeper-open" not in report.codes()


@pytest.mark.asyncio
async def test_doctor_finds_a_lock_folder_left_world_writable(
    zookeeper_server: ZooKeeperServer, chroot: str, authed: ZooKeeperBackend
) -> None:
    """A folder an open client created keeps its open ACL under an authenticated backend."""
    name = f"doc/{uuid.uuid4().hex}"
    plain = f"zk://{zookeeper_server.hosts}{chroot}?session_timeout={SESSION_TIMEOUT}"
    async with await _connect(plain) as opener:
        opened = opener.mutex(name)
        assert await opened.acquire(timeout=10)
        async with authed.semaphore_mutex(f"doc/{uuid.uuid4().hex}"):
            report = await authed.doctor(self_test=False)
        await opened.release()
    (finding,) = [f for f in report.findings if f.code == "zookeeper-world-writable"]
    assert finding.details["acl_open"] is False
    # the lock root too: the client without credentials created it
    assert finding.details["paths"] == ["/aiolocks", f"/aiolocks/mutex/{name}"], finding


@pytest.mark.asyncio
async def test_doctor_on_an_application_client_reads_the_acls(observer: Any) -> None:
    """Over an ``aiozk`` client doctor cannot see the credentials: the ACLs tell."""
    async with ZooKeeperBackend(observer, connect_timeout=5) as backend:
        name = f"doc/{uuid.uuid4().hex}"
        async with backend.mutex(name):
            report = await backend.doctor(self_test=False)
    codes = set(report.codes())
    assert "zookeeper-open" not in codes and "zookeeper-no-tls" in codes, report.findings
    (finding,) = [f for f in report.findings if f.code == "zookeeper-world-writable"]
    assert finding.details["acl_open"] is False
    assert f"/aiolocks/mutex/{name}" in finding.details["paths"], finding
