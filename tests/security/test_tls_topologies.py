"""Redis Sentinel and Redis Cluster serving TLS, with client certificates.

One sentinel set and one cluster per module (``tls=`` of the launchers):
the data servers, the replica, the sentinels and the cluster bus all talk
TLS to each other, and the addresses the clients learn (from the sentinels,
from ``CLUSTER SLOTS``) are TLS ports. The test certificates name
``localhost`` only while everything listens on and announces ``127.0.0.1``,
so these URLs say ``ssl_check_hostname=false``; host name checking itself
is covered on a plain Redis in ``test_tls.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiolocks
from aiolocks.testing import free_port
from aiolocks.testing.servers import RedisCluster, RedisSentinelSet
from aiolocks.testing.tls import TlsFiles

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def tls_sentinel_set(tls_files: TlsFiles) -> Iterator[RedisSentinelSet]:
    """A master, a replica and three sentinels, all serving TLS."""
    with RedisSentinelSet(tls=tls_files) as sentinel_set:
        yield sentinel_set


@pytest.fixture(scope="module")
def tls_cluster(tls_files: TlsFiles) -> Iterator[RedisCluster]:
    """A three-master cluster serving TLS (and TLS on its bus)."""
    with RedisCluster(tls=tls_files) as cluster:
        yield cluster


def with_tls(url: str, tls: TlsFiles, *, ca: Path | None = None) -> str:
    """``url`` with the TLS options: a CA (the right one unless ``ca``), the client certificate."""
    return (
        f"{url}?ssl=true&ssl_ca_certs={ca or tls.ca_cert}&ssl_certfile={tls.client_cert}"
        f"&ssl_keyfile={tls.client_key}&ssl_check_hostname=false"
    )


async def _cycle_with_waiter(url: str) -> None:
    name = f"tls/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as other:

        async def wait_then_hold() -> int | None:
            waiter = other.mutex(name)  # a hold belongs to its task: all of it in this one
            assert await waiter.acquire(timeout=30)
            try:
                return waiter.fencing_token
            finally:
                await waiter.release()

        async with one.mutex(name) as held:
            token = held.fencing_token
            assert token is not None
            assert await other.mutex(name).acquire(timeout=0) is False
            waiting = asyncio.create_task(wait_then_hold())
        next_token = await waiting
        assert next_token is not None and next_token > token


@pytest.mark.asyncio
async def test_sentinel_over_tls(tls_sentinel_set: RedisSentinelSet, tls_files: TlsFiles) -> None:
    await _cycle_with_waiter(with_tls(tls_sentinel_set.url, tls_files))


@pytest.mark.asyncio
async def test_cluster_over_tls(tls_cluster: RedisCluster, tls_files: TlsFiles) -> None:
    await _cycle_with_waiter(with_tls(tls_cluster.url, tls_files))


@pytest.mark.asyncio
@pytest.mark.parametrize("topology", ["sentinel", "cluster"])
async def test_untrusted_server_certificate_is_denied(
    request: pytest.FixtureRequest, tls_files: TlsFiles, topology: str
) -> None:
    fixture = "tls_sentinel_set" if topology == "sentinel" else "tls_cluster"
    launcher: RedisSentinelSet | RedisCluster = request.getfixturevalue(fixture)
    url = with_tls(launcher.url, tls_files, ca=tls_files.other_ca_cert)
    with pytest.raises(aiolocks.AccessDeniedError, match="certificate verify failed"):
        async with aiolocks.connect(url):
            pytest.fail("connected to a server whose certificate no trusted CA signed")


@pytest.mark.asyncio
async def test_unreachable_cluster_is_unavailable() -> None:
    """redis-py's "no node answered" (a RedisClusterException, no RedisError)
    used to escape raw instead of as BackendUnavailableError."""
    url = f"redis+cluster://127.0.0.1:{free_port()}?connect_timeout=2"
    with pytest.raises(aiolocks.BackendUnavailableError, match="cannot reach Redis"):
        async with aiolocks.connect(url):
            pytest.fail("connected to a cluster that is not there")
