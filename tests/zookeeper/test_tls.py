"""TLS to a ZooKeeper ``secureClientPort`` (Netty), against a real server with test certificates.

The server's certificate names ``localhost`` only, so dialling ``127.0.0.1``
is a host name mismatch; it asks clients for a certificate and refuses one
signed by another authority.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiolocks
from aiolocks import AccessDeniedError
from aiolocks.testing.servers import ServerNotInstalledError, ZooKeeperServer
from aiolocks.testing.tls import TlsFiles, make_tls_files
from aiolocks.zookeeper import ZooKeeperBackend, from_url

pytestmark = pytest.mark.zookeeper

PASSWORD = "Tls/Sec?ret@S3ntinel"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA, server and client certificates (and a foreign CA), made with openssl."""
    try:
        return make_tls_files(tmp_path_factory.mktemp("zk-tls"))
    except ServerNotInstalledError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def tls_zookeeper(tls_files: TlsFiles) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper serving TLS on ``tls_port`` (and plain text on ``port``)."""
    try:
        server = ZooKeeperServer(tls=tls_files)
        server.start()
    except ServerNotInstalledError as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


def tls_url(server: ZooKeeperServer, ca: Path, *, host: str = "localhost", query: str = "") -> str:
    """A zk:// URL to the secureClientPort, trusting ``ca``."""
    chroot = f"/tls-{uuid.uuid4().hex[:8]}"
    return f"zk://{host}:{server.tls_port}{chroot}?tls=true&ssl_ca_certs={ca}{query}"


@pytest.mark.asyncio
async def test_locks_over_tls_with_credentials_and_a_client_certificate(
    tls_zookeeper: ZooKeeperServer, tls_files: TlsFiles
) -> None:
    query = f"&ssl_certfile={tls_files.client_cert}&ssl_keyfile={tls_files.client_key}"
    target = tls_url(tls_zookeeper, tls_files.ca_cert, query=query).replace(
        "zk://", f"zk://locker:{PASSWORD}@"
    )
    async with await aiolocks.connect(target, connect_timeout=10) as backend:
        assert isinstance(backend, ZooKeeperBackend)
        session = backend._zk.session
        assert session is not None and session.conn is not None
        transport = session.conn.transport
        assert transport is not None and transport.get_extra_info("ssl_object") is not None
        async with backend.mutex("tls/a") as lock:
            assert lock.fencing_token
        async with backend.semaphore("tls/b", 2):
            pass


@pytest.mark.asyncio
@pytest.mark.parametrize("case", ["host-name-mismatch", "untrusted-server", "refused-client-cert"])
async def test_a_certificate_problem_is_access_denied(
    tls_zookeeper: ZooKeeperServer, tls_files: TlsFiles, case: str
) -> None:
    if case == "host-name-mismatch":  # the certificate names localhost only
        target = tls_url(tls_zookeeper, tls_files.ca_cert, host="127.0.0.1")
    elif case == "untrusted-server":
        target = tls_url(tls_zookeeper, tls_files.other_ca_cert)
    else:
        query = (
            f"&ssl_certfile={tls_files.other_client_cert}"
            f"&ssl_keyfile={tls_files.other_client_key}"
        )
        target = tls_url(tls_zookeeper, tls_files.ca_cert, query=query)
    with pytest.raises(AccessDeniedError, match="TLS to ZooKeeper") as raised:
        await aiolocks.connect(target, connect_timeout=10, on_unavailable="local")
    assert not isinstance(raised.value, aiolocks.BackendUnavailableError)


def test_tls_options_are_checked_before_any_io(tmp_path: Path, tls_files: TlsFiles) -> None:
    with pytest.raises(ValueError, match="needs tls=true"):
        from_url(f"zk://h:2181?ssl_ca_certs={tls_files.ca_cert}")
    with pytest.raises(ValueError, match="no such readable file"):
        from_url(f"zk://h:2181?tls=true&ssl_ca_certs={tmp_path / 'missing.pem'}")
    with pytest.raises(ValueError, match="ssl_keyfile needs ssl_certfile"):
        from_url(f"zk://h:2181?tls=true&ssl_keyfile={tls_files.client_key}")
    backend = from_url(f"zk://h:2181?tls=true&ssl_ca_certs={tls_files.ca_cert}")
    assert backend.url == "zk://h:2181"


@pytest.mark.asyncio
async def test_doctor_over_tls_with_credentials_finds_nothing_open(
    tls_zookeeper: ZooKeeperServer, tls_files: TlsFiles
) -> None:
    query = f"&ssl_certfile={tls_files.client_cert}&ssl_keyfile={tls_files.client_key}"
    target = tls_url(tls_zookeeper, tls_files.ca_cert, query=query).replace(
        "zk://", f"zk://locker:{PASSWORD}@"
    )
    backend = await aiolocks.connect(target, connect_timeout=10)
    async with backend, backend.mutex("tls/doctor"):
        report = await backend.doctor(self_test=False)
    security = {"zookeeper-open", "zookeeper-no-tls", "zookeeper-world-writable"}
    assert not set(report.codes()) & security, report.findings
