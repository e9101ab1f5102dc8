"""etcd with user authentication and TLS: the least-privilege role works, refusals
are AccessDeniedError (never an outage, never a local lock), tokens are renewed
when they expire, and no password appears in any message, ``repr`` or log.

One etcd per installed build, started with ``--client-cert-auth`` on a TLS port
(its certificate names ``localhost`` only), ``--auth-token-ttl 2`` and auth
enabled: ``root``, the user ``locker`` whose role may read and write the key
range of :data:`PREFIX` only (the recipe of docs/etcd.md), and ``outsider``
with no role.
"""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aetcd.rpc import rpc_pb2 as pb

import aiolocks
from aiolocks import cli
from aiolocks.etcd import EtcdBackend
from aiolocks.etcd._client import EtcdClient, RangeOp
from aiolocks.testing import EtcdCluster, EtcdFlavor, EtcdServer, ServerNotInstalledError
from aiolocks.testing.tls import TlsFiles, make_tls_files

from ..polling import eventually
from ..refusals import assert_acquire_refused
from .conftest import _params

pytestmark = pytest.mark.etcd

PREFIX = "locks"
#: a password no message, repr or log record may contain
SENTINEL = "S3ntinel-Pa55word-etcd"
ROOT_PASSWORD = "root-Pa55word-etcd"
TOKEN_TTL = 2  # seconds: --auth-token-ttl, so a test can outlive a token


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA, a ``localhost`` server certificate, a client certificate, a foreign CA."""
    return make_tls_files(tmp_path_factory.mktemp("etcd-tls"))


def _enable_auth(ctl: Callable[..., str]) -> None:
    """The least-privilege recipe of docs/etcd.md, then ``auth enable`` (``ctl``: etcdctl)."""
    ctl("user", "add", "root", f"--new-user-password={ROOT_PASSWORD}")
    ctl("role", "add", "aiolocks")
    ctl("role", "grant-permission", "aiolocks", "--prefix=true", "readwrite", f"{PREFIX}/")
    ctl("user", "add", "locker", f"--new-user-password={SENTINEL}")
    ctl("user", "grant-role", "locker", "aiolocks")
    ctl("user", "add", "outsider", "--new-user-password=outsider-pw")
    ctl("auth", "enable")


@pytest.fixture(scope="module", params=[p for p in _params() if p != "external"])
def secure_etcd(request: pytest.FixtureRequest, tls_files: TlsFiles) -> Iterator[EtcdServer]:
    """An etcd with auth enabled, a TLS port and a two-second token TTL."""
    flavor: EtcdFlavor = "wheel" if request.param == "wheel" else "debian"
    server = EtcdServer(
        flavor=flavor, tls=tls_files, extra_args=["--auth-token-ttl", str(TOKEN_TTL)]
    )
    try:
        server.start()
    except ServerNotInstalledError as exc:
        server.close()
        pytest.fail(str(exc), pytrace=False)
    try:
        _enable_auth(server.etcdctl)
        yield server
    finally:
        server.close()


def _url(server: EtcdServer, user: str = "locker", password: str = SENTINEL) -> str:
    return f"etcd://{user}:{password}@{server.endpoint}/{PREFIX}?lease_ttl=5"


def _tls_url(server: EtcdServer, files: TlsFiles, *, host: str = "localhost", **ssl: Path) -> str:
    given = {
        "ssl_ca_certs": files.ca_cert,
        "ssl_certfile": files.client_cert,
        "ssl_keyfile": files.client_key,
        **ssl,
    }
    query = "&".join(f"{key}={value}" for key, value in given.items())
    return f"etcds://locker:{SENTINEL}@{host}:{server.tls_port}/{PREFIX}?{query}"


async def _root_delete(server: EtcdServer, key_part: str) -> None:
    """Delete (as root, behind the library's back) every key under PREFIX holding ``key_part``."""
    async with EtcdClient([server.endpoint], username="root", password=ROOT_PASSWORD) as root:
        found = await root.range(RangeOp.of(f"{PREFIX}/", prefix=True, keys_only=True))
        doomed = [kv.key for kv in found.kvs if key_part.encode() in kv.key]
        assert doomed
        for key in doomed:
            await root.delete(key)


async def _until_lost(lock: aiolocks.Mutex) -> None:
    await eventually(lambda: lock.is_lost, what="the hold reported lost", interval=0.02)


@pytest.mark.asyncio
async def test_least_privilege_user_runs_every_lock_kind(secure_etcd: EtcdServer) -> None:
    name = f"kinds/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(_url(secure_etcd)) as backend:
        async with backend.mutex(name) as held:
            assert held.fencing_token is not None
        async with backend.semaphore(f"{name}/sem", 2).lease():
            pass
        rw = backend.read_write_lock(f"{name}/rw")
        async with rw.read:
            pass
        async with rw.write:
            pass
        async with backend.mutex(name):
            assert [lock.name for lock in await backend.list_locks("kinds/")] == [name]


@pytest.mark.asyncio
async def test_least_privilege_user_keeps_records(secure_etcd: EtcdServer) -> None:
    """The record store (its folder under the prefix, its leases) needs no more than the role."""
    group = f"group-{uuid.uuid4().hex[:8]}"
    async with (
        aiolocks.connect(_url(secure_etcd)) as backend,
        aiolocks.connect(_url(secure_etcd)) as other,
    ):
        await backend.open()
        await other.open()
        store = backend._driver.records()
        version = await store.create(f"{group}/once", b"x", ttl=30)
        assert version is not None
        assert await store.update(f"{group}/once", b"y", version=version, ttl=20)
        entry = await store.join(f"{group}/member", b"m")
        assert entry is not None
        with await store.snapshot(group) as snap:
            assert sorted(snap.records) == ["member", "once"]
            waiter = asyncio.ensure_future(snap.changed(10))
            await asyncio.sleep(0)
            assert not waiter.done()
            await _root_delete(secure_etcd, f"{group}/member")  # behind the backend's back
            await asyncio.wait_for(waiter, 10)
        await eventually(lambda: entry.lost, what="the entry reported lost", interval=0.02)
        assert await store.delete(f"{group}/once")
        theirs = other._driver.records()
        assert await theirs.read(f"{group}/once") is None


@pytest.mark.asyncio
async def test_doctor_runs_with_the_least_privilege_user(
    secure_etcd: EtcdServer, tls_files: TlsFiles
) -> None:
    async with aiolocks.connect(_tls_url(secure_etcd, tls_files)) as backend:
        report = await backend.doctor()
    assert report.ok, report
    assert report.self_test is not None and report.self_test.released
    assert not set(report.codes()) & {"etcd-open", "etcd-no-tls"}, report.findings


@pytest.mark.asyncio
async def test_doctor_with_a_user_over_plain_text_finds_no_tls_only(
    secure_etcd: EtcdServer,
) -> None:
    async with aiolocks.connect(_url(secure_etcd)) as backend:
        report = await backend.doctor(self_test=False)
    codes = set(report.codes())
    assert "etcd-no-tls" in codes and "etcd-open" not in codes, report.findings
    assert SENTINEL not in repr(report.findings)


@pytest.mark.asyncio
async def test_waiter_gets_the_lock_and_loss_is_prompt(secure_etcd: EtcdServer) -> None:
    name = f"handoff/{uuid.uuid4().hex[:8]}"
    async with (
        aiolocks.connect(_url(secure_etcd)) as first,
        aiolocks.connect(_url(secure_etcd)) as second,
    ):
        lock = first.mutex(name)
        assert await lock.acquire(timeout=10)
        waiter = asyncio.create_task(second.mutex(name).acquire(timeout=20))
        await asyncio.sleep(0)
        assert not waiter.done()
        await lock.release()
        assert await waiter
        other = first.mutex(f"{name}-lost")
        assert await other.acquire(timeout=10)
        await _root_delete(secure_etcd, f"{name}-lost")
        await _until_lost(other)


@pytest.mark.asyncio
@pytest.mark.parametrize("on_unavailable", ["raise", "local"])
async def test_wrong_password_is_access_denied(
    secure_etcd: EtcdServer, on_unavailable: str
) -> None:
    url = _url(secure_etcd, password="Wr0ng-" + SENTINEL)
    with pytest.raises(aiolocks.AccessDeniedError, match="authentication failed") as info:
        async with aiolocks.connect(url, on_unavailable=on_unavailable):
            pytest.fail("opened with a wrong password")
    assert not isinstance(info.value, aiolocks.BackendUnavailableError)
    assert isinstance(info.value, PermissionError)
    assert SENTINEL not in str(info.value)


@pytest.mark.asyncio
async def test_credentials_for_a_cluster_without_auth_are_refused(etcd: EtcdServer) -> None:
    """A user in the URL of a cluster that does not authenticate: loud, never ignored."""
    url = f"etcd://locker:{SENTINEL}@{etcd.endpoint}/{PREFIX}"
    with pytest.raises(aiolocks.AccessDeniedError, match="auth enable") as info:
        async with aiolocks.connect(url, on_unavailable="local"):
            pytest.fail("opened with credentials the cluster does not check")
    assert SENTINEL not in str(info.value)


@pytest.mark.asyncio
async def test_missing_credentials_are_access_denied(
    secure_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with aiolocks.connect(
        f"etcd://{secure_etcd.endpoint}/{PREFIX}", on_unavailable="local"
    ) as backend:
        await assert_acquire_refused(backend, "anonymous", caplog, match="user name is empty")


@pytest.mark.asyncio
@pytest.mark.parametrize("on_unavailable", ["raise", "local"])
async def test_user_without_permission_on_the_prefix_is_denied(
    secure_etcd: EtcdServer, on_unavailable: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = _url(secure_etcd, user="outsider", password="outsider-pw")
    async with aiolocks.connect(url, on_unavailable=on_unavailable) as backend:
        # etcd checks a transaction's permissions before applying any of it:
        # nothing to clean up, no warning.
        await assert_acquire_refused(backend, "not-mine", caplog, match="permission denied")


async def _set_password(server: EtcdServer, user: str, password: str) -> None:
    async with EtcdClient([server.endpoint], username="root", password=ROOT_PASSWORD) as root:
        request = pb.AuthUserChangePasswordRequest(name=user, password=password)
        await root._unary("auth", "UserChangePassword", request, timeout=None, retry=False)


@pytest.mark.asyncio
async def test_password_change_under_a_live_backend_is_denied_not_degraded(
    secure_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd drops a user's tokens when the password changes: the next acquire is refused."""
    async with aiolocks.connect(_url(secure_etcd), on_unavailable="local") as backend:
        name = f"rotate/{uuid.uuid4().hex[:8]}"
        async with backend.mutex(name):
            pass
        await _set_password(secure_etcd, "locker", "rotated-password")
        try:
            await assert_acquire_refused(
                backend, name, caplog, match="authentication failed", timeout=5
            )
        finally:
            await _set_password(secure_etcd, "locker", SENTINEL)


@pytest.mark.asyncio
async def test_expired_token_is_renewed_during_a_long_hold(secure_etcd: EtcdServer) -> None:
    """Tokens expire after TOKEN_TTL seconds unused; the holder and a waiter outlive them.

    The waiter's watch stream was opened with a token that has expired when it
    starts a second wait: etcd refuses that watch as if the permission were
    missing, and the client must open the stream again with a new token.
    """
    name = f"expiry/{uuid.uuid4().hex[:8]}"
    async with (
        aiolocks.connect(_url(secure_etcd)) as holder,
        aiolocks.connect(_url(secure_etcd)) as waiter,
    ):
        assert isinstance(holder, EtcdBackend) and isinstance(waiter, EtcdBackend)
        first, second = holder.mutex(f"{name}/a"), holder.mutex(f"{name}/b")
        assert await first.acquire(timeout=10) and await second.acquire(timeout=10)
        wait_a = asyncio.create_task(waiter.mutex(f"{name}/a").acquire(timeout=30))
        await eventually(lambda: waiter.client.watch_streams_opened, what="the watch stream")
        tokens = (holder.client.authentications, waiter.client.authentications)
        # Waiting for the server's token TTL to pass is the point of the test.
        await asyncio.sleep(3 * TOKEN_TTL)
        wait_b = asyncio.create_task(waiter.mutex(f"{name}/b").acquire(timeout=30))
        # its watch refused, the stream opened again
        await eventually(
            lambda: waiter.client.watch_streams_opened >= 2, what="the watch stream reopened"
        )
        assert not wait_b.done()
        await first.release()
        assert await wait_a
        await second.release()
        assert await wait_b
        assert holder.client.authentications > tokens[0]
        assert waiter.client.authentications > tokens[1]
        assert not first.is_lost and not second.is_lost


@pytest.mark.slow
@pytest.mark.asyncio
async def test_failover_to_another_member_authenticates_again() -> None:
    """The member the backend talks to is killed: the next member gets a login of its own."""
    with EtcdCluster() as cluster:
        _enable_auth(cluster.members[0].etcdctl)
        hosts = ",".join(cluster.endpoints)
        url = f"etcd://locker:{SENTINEL}@{hosts}/{PREFIX}?lease_ttl=5&request_timeout=15"
        async with aiolocks.connect(url, on_unavailable="local") as backend:
            assert isinstance(backend, EtcdBackend)
            held = backend.mutex("failover/held")
            assert await held.acquire(timeout=10)
            before = backend.client.authentications
            victim = next(m for m in cluster.members if m.endpoint == backend.client.endpoint)
            victim.kill()
            other = backend.mutex("failover/other")
            async with other.hold(timeout=30):
                assert backend.client.endpoint != victim.endpoint
                assert not other.is_degraded
            assert backend.client.authentications > before
            assert not held.is_lost
            await held.release()


@pytest.mark.asyncio
async def test_tls_with_client_certificate(secure_etcd: EtcdServer, tls_files: TlsFiles) -> None:
    async with aiolocks.connect(_tls_url(secure_etcd, tls_files)) as backend:
        assert repr(backend).count("etcds://") == 1
        async with backend.mutex(f"tls/{uuid.uuid4().hex[:8]}") as held:
            assert held.fencing_token is not None


@pytest.mark.asyncio
@pytest.mark.parametrize("case", ["untrusted-ca", "host-name", "foreign-client-cert"])
async def test_refused_tls_handshake_is_access_denied(
    secure_etcd: EtcdServer, tls_files: TlsFiles, case: str
) -> None:
    if case == "untrusted-ca":
        url = _tls_url(secure_etcd, tls_files, ssl_ca_certs=tls_files.other_ca_cert)
    elif case == "host-name":
        url = _tls_url(secure_etcd, tls_files, host="127.0.0.1")
    else:
        url = _tls_url(
            secure_etcd,
            tls_files,
            ssl_certfile=tls_files.other_client_cert,
            ssl_keyfile=tls_files.other_client_key,
        )
    with pytest.raises(aiolocks.AccessDeniedError, match="TLS") as info:
        async with aiolocks.connect(url, on_unavailable="local"):
            pytest.fail("opened over a refused TLS handshake")
    assert not isinstance(info.value, aiolocks.BackendUnavailableError)


@pytest.mark.asyncio
async def test_tls_port_with_nobody_listening_is_unavailable(
    secure_etcd: EtcdServer, tls_files: TlsFiles
) -> None:
    """The other side of the mapping: a member that is down is an outage, not a refusal."""
    from aiolocks.testing import free_port

    url = _tls_url(secure_etcd, tls_files).replace(
        f":{secure_etcd.tls_port}/", f":{free_port()}/"
    )
    with pytest.raises(aiolocks.BackendUnavailableError) as info:
        async with aiolocks.connect(url + "&connect_timeout=1"):
            pass
    assert not isinstance(info.value, aiolocks.AccessDeniedError)


@pytest.mark.asyncio
async def test_password_is_in_no_message_repr_or_log(
    secure_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with aiolocks.connect(_url(secure_etcd)) as backend:
        assert isinstance(backend, EtcdBackend)
        seen += [repr(backend), str(backend), repr(backend.client), repr(backend._driver)]
        async with backend.mutex("redaction") as held:
            seen.append(repr(held))
    for url in (_url(secure_etcd, password=SENTINEL + "x"), _url(secure_etcd, "outsider")):
        with pytest.raises(aiolocks.AccessDeniedError) as denied:
            async with aiolocks.connect(url) as refused, refused.mutex("redaction"):
                pass
        exc = denied.value
        seen += [str(exc), repr(exc), str(exc.__cause__), repr(exc.__cause__)]
    with pytest.raises(ValueError, match="needs TLS") as info:
        aiolocks.connect(f"etcd://locker:{SENTINEL}@h/{PREFIX}?ssl_ca_certs=/x")
    seen.append(str(info.value))
    seen += [record.getMessage() for record in caplog.records]
    seen += [caplog.text]
    assert len(seen) > 8
    for text in seen:
        assert SENTINEL not in text


def test_cli_exits_77_on_refused_credentials(
    secure_etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    status = cli.main(["status", _url(secure_etcd, password="Wr0ng" + SENTINEL), "jobs/x"])
    assert status == cli.EXIT_ACCESS_DENIED == 77
    assert "authentication failed" in err.getvalue()
    assert SENTINEL not in err.getvalue()
