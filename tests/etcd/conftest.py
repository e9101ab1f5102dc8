"""Fixtures for the etcd tests: real servers (both etcd builds when installed)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from aiolocks.etcd._client import EtcdClient
from aiolocks.testing import EtcdFlavor, EtcdServer, ServerNotInstalledError, etcd_flavors

pytestmark = pytest.mark.etcd


def _params() -> list[str]:
    if os.environ.get("AIOLOCKS_ETCD_ENDPOINTS", "").strip():
        return ["external"]
    # Both builds when both are installed: etcd 3.4 (Debian) and 3.5 (wheel)
    # differ in details the lock recipes meet.
    return list(etcd_flavors()) or ["default"]


@pytest.fixture(scope="session", params=_params())
def etcd(request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """One etcd server per installed build, shared by the session (or the external one)."""
    param = str(request.param)
    external = os.environ.get("AIOLOCKS_ETCD_ENDPOINTS", "").strip()
    if param == "external":
        yield EtcdServer.external(external)
        return
    flavor: EtcdFlavor | None = None
    if param == "debian":
        flavor = "debian"
    elif param == "wheel":
        flavor = "wheel"
    server = EtcdServer(flavor=flavor)
    try:
        server.start()
    except ServerNotInstalledError as exc:
        server.close()
        pytest.fail(f"{exc}; install the servers with scripts/install-servers.sh", pytrace=False)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def prefix() -> str:
    """A private key prefix per test, so that tests never see each other's keys."""
    return f"t-{uuid.uuid4().hex[:12]}/"


@pytest_asyncio.fixture
async def client(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    """A connected client on the shared server."""
    async with EtcdClient(list(etcd.endpoints), request_timeout=5.0) as c:
        yield c


@pytest_asyncio.fixture
async def url(etcd: EtcdServer) -> str:
    """An ``etcd://`` URL of the ``etcd`` server under a fresh prefix, with a short lease."""
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    return f"etcd://{','.join(etcd.endpoints)}/{prefix}?lease_ttl=5&request_timeout=2"
