"""Redis over TLS with client certificates: every scheme's options, and what is refused.

The server (``secure_redis``) requires a client certificate of its CA; its
own certificate names ``localhost`` only, so dialling ``127.0.0.1`` is a host
name mismatch.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import aiolocks
from aiolocks._connect import backend_from_url
from aiolocks.redis._tls_probe import certificate_refusal
from aiolocks.testing.servers import RedisServer
from aiolocks.testing.tls import TlsFiles

from .conftest import LOCKER_PASSWORD, PREFIX

pytestmark = pytest.mark.redis


def tls_url(
    server: RedisServer,
    tls: TlsFiles,
    *,
    scheme: str = "rediss",
    host: str = "localhost",
    ca: Path | None = None,
    cert: tuple[Path, Path] | None = None,
    extra: str = "",
) -> str:
    """The lock user's URL on the TLS port, with the given CA and client certificate."""
    certfile, keyfile = cert or (tls.client_cert, tls.client_key)
    query = (
        f"key_prefix={PREFIX}&ssl_ca_certs={ca or tls.ca_cert}"
        f"&ssl_certfile={certfile}&ssl_keyfile={keyfile}{extra}"
    )
    return f"{scheme}://locker:{LOCKER_PASSWORD}@{host}:{server.tls_port}/0?{query}"


async def _cycle(url: str) -> None:
    name = f"tls/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as other:
        async with one.mutex(name) as held:
            assert held.fencing_token is not None
            assert await other.mutex(name).acquire(timeout=0) is False
        async with other.mutex(name):
            pass


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("scheme", "extra"),
    [("rediss", ""), ("redis", "&ssl=true"), ("redlock", "&ssl=true")],
)
async def test_tls_with_client_certificate(
    secure_redis: RedisServer, tls_files: TlsFiles, scheme: str, extra: str
) -> None:
    await _cycle(tls_url(secure_redis, tls_files, scheme=scheme, extra=extra))


@pytest.mark.asyncio
async def test_host_name_is_checked(secure_redis: RedisServer, tls_files: TlsFiles) -> None:
    url = tls_url(secure_redis, tls_files, host="127.0.0.1")
    with pytest.raises(aiolocks.AccessDeniedError, match="certificate verify failed"):
        async with aiolocks.connect(url):
            pass
    await _cycle(url + "&ssl_check_hostname=false")


@pytest.mark.asyncio
@pytest.mark.parametrize("on_unavailable", ["raise", "local"])
async def test_untrusted_server_certificate_is_denied(
    secure_redis: RedisServer, tls_files: TlsFiles, on_unavailable: str
) -> None:
    url = tls_url(secure_redis, tls_files, ca=tls_files.other_ca_cert)
    with pytest.raises(aiolocks.AccessDeniedError, match="certificate verify failed"):
        async with aiolocks.connect(url, on_unavailable=on_unavailable):
            pass


@pytest.mark.parametrize("certificate", ["other-ca", "none"])
@pytest.mark.asyncio
async def test_client_certificate_of_another_ca_is_denied(
    secure_redis: RedisServer, tls_files: TlsFiles, certificate: str
) -> None:
    """The server refuses it, always as AccessDeniedError. Under TLS 1.3 the
    server checks the client's certificate after the client's handshake is
    done; its alert races the reset of the connection (about half of the
    connects saw only the reset), so a reset at connect is checked again
    with a handshake that sends nothing after it. Repeated: one connect in
    two lost that race before."""
    url = tls_url(
        secure_redis, tls_files, cert=(tls_files.other_client_cert, tls_files.other_client_key)
    )
    if certificate == "none":
        url = url.split("&ssl_certfile=")[0]
    for _ in range(10):
        with pytest.raises(aiolocks.AccessDeniedError, match="alert"):
            async with aiolocks.connect(url, on_unavailable="local"):
                pytest.fail("connected without a trusted client certificate")


@pytest.mark.asyncio
async def test_certificate_probe_verdicts(secure_redis: RedisServer, tls_files: TlsFiles) -> None:
    """The probe: our CA's certificate is accepted (a session ticket), others refused."""
    good = {"ssl_certfile": str(tls_files.client_cert), "ssl_keyfile": str(tls_files.client_key)}
    other = {
        "ssl_certfile": str(tls_files.other_client_cert),
        "ssl_keyfile": str(tls_files.other_client_key),
    }
    port = secure_redis.tls_port
    assert await certificate_refusal("localhost", port, good, timeout=30) is None
    refused = await certificate_refusal("localhost", port, other, timeout=30)
    assert refused is not None and "unknown ca" in str(refused)
    missing = await certificate_refusal("localhost", port, {}, timeout=30)
    assert missing is not None and "certificate required" in str(missing)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://h/0?ssl_ca_certs={ca}", "ssl_ca_certs needs TLS"),
        ("redis://h/0?ssl_check_hostname=false", "ssl_check_hostname needs TLS"),
        ("rediss://h/0?ssl=false", "contradicts"),
        ("rediss://h/0?ssl_ca_certs=/no/such/file.pem", "no such readable file"),
        ("rediss://h/0?ssl_keyfile={ca}", "ssl_keyfile needs ssl_certfile"),
        ("redis://h/0?sentinel_password=x", "options of redis.sentinel"),
        ("redis+cluster://h:1?ssl=maybe", "true or false"),
        ("redis://h/0?lease_time=10000000000000", "<= 86400"),
    ],
)
def test_tls_option_errors(url: str, message: str, tls_files: TlsFiles) -> None:
    with pytest.raises(ValueError, match=message):
        backend_from_url(url.format(ca=tls_files.ca_cert))


def test_every_scheme_takes_the_tls_options(tls_files: TlsFiles) -> None:
    query = (
        f"ssl=true&ssl_ca_certs={tls_files.ca_cert}&ssl_certfile={tls_files.client_cert}"
        f"&ssl_keyfile={tls_files.client_key}&ssl_check_hostname=false"
    )
    for url in (
        "redis://h:1/0",
        "redis+sentinel://h:1/svc?sentinel_username=s&sentinel_password=p&",
        "redis+cluster://h:1",
        "redlock://h:1,h:2,h:3/0",
    ):
        joiner = "" if url.endswith("&") else "?"
        assert backend_from_url(f"{url}{joiner}{query}") is not None


@pytest.mark.asyncio
async def test_per_lock_lease_time_is_bounded(redis_server: RedisServer) -> None:
    async with aiolocks.connect(redis_server.url) as backend:
        with pytest.raises(ValueError, match="<= 86400"):
            backend.mutex("sec/lease", lease_time=1e13)


@pytest.mark.asyncio
async def test_sentinel_and_cluster_clients_are_built_with_tls(tls_files: TlsFiles) -> None:
    """The redis-py clients of redis+sentinel:// (master and Sentinels) and
    redis+cluster:// carry the TLS settings (and the host name check); the
    connections themselves are tested against TLS-serving servers in
    test_tls_topologies.py."""
    from redis.asyncio.connection import SSLConnection

    query = (
        f"ssl=true&ssl_ca_certs={tls_files.ca_cert}&ssl_certfile={tls_files.client_cert}"
        f"&ssl_keyfile={tls_files.client_key}"
    )
    sentinel = backend_from_url(
        f"redis+sentinel://h:1/svc?{query}&sentinel_username=s&sentinel_password=SentPw"
    )
    client = sentinel._engine.driver.node._make_client()  # type: ignore[attr-defined]
    pool = client.connection_pool
    assert issubclass(pool.connection_class, SSLConnection)
    assert pool.connection_kwargs["ssl_ca_certs"] == str(tls_files.ca_cert)
    assert pool.connection_kwargs["ssl_check_hostname"] is True
    sentinels = pool.sentinel_manager.sentinel_kwargs
    assert sentinels["ssl"] is True and sentinels["ssl_certfile"] == str(tls_files.client_cert)
    assert (sentinels["username"], sentinels["password"]) == ("s", "SentPw")
    await client.aclose()
    cluster = backend_from_url(f"redis+cluster://h:1?{query}&ssl_check_hostname=false")
    client = cluster._engine.driver.node._make_client()  # type: ignore[attr-defined]
    kwargs = client.get_connection_kwargs()
    assert issubclass(kwargs["connection_class"], SSLConnection)
    assert kwargs["ssl_keyfile"] == str(tls_files.client_key)
    assert kwargs["ssl_check_hostname"] is False
    await client.aclose()
