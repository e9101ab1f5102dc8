"""Backends for the conformance suite.

Every test in ``tests/conformance`` runs once per backend in ``BACKENDS``.
No test names a backend: differences are expressed through
``backend.capabilities`` (fairness, visible queues) and skip with a reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
import pytest_asyncio

import aiolocks
from aiolocks import Participant

from ..polling import eventually, settle

#: backend label -> name of a pytest fixture giving an object with ``.url``
#: (None: no server needed). A backend joins the suite by being listed here.
BACKENDS: dict[str, str | None] = {
    "memory": None,
    "redis": "redis_server",
    "zookeeper": "zookeeper_server",
    "postgres": "postgres_server",
    "postgres-lease": "postgres_server",
    "etcd": "etcd_server",
}

#: The other Redis topologies: Sentinel, a Cluster and Redlock over five
#: independent masters (session-scoped servers, started once). They run by
#: default; ``AIOLOCKS_CONFORMANCE_TOPOLOGIES=0`` leaves them out of a quick
#: local run. Like every backend they skip only by declared capabilities.
TOPOLOGIES: dict[str, str | None] = {
    "redis-sentinel": "redis_sentinel",
    "redis-cluster": "redis_cluster",
    "redlock": "redis_servers5",
}
if os.environ.get("AIOLOCKS_CONFORMANCE_TOPOLOGIES") != "0":
    BACKENDS.update(TOPOLOGIES)

#: Modules of the coordination recipes (groups, the partitioner, leader
#: observation, ``once``, latches, barriers). They are written once in the core
#: over the record store, whose own contract (``test_records.py``) and every
#: lock test run on the Redis topologies too; the recipes run on every backend
#: (memory, Redis, ZooKeeper, etcd, PostgreSQL in both modes) and, to keep the
#: suite within the CI budget, not again on the Sentinel and Cluster
#: topologies unless ``AIOLOCKS_RECIPES_ON_TOPOLOGIES=1``.
RECIPE_MODULES = frozenset(
    {
        "test_group",
        "test_group_anyio",
        "test_partitioner",
        "test_latch_observe",
        "test_once",
        "test_barrier",
        "test_countdown",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the recipe modules out on the Redis topologies (see ``RECIPE_MODULES``)."""
    if os.environ.get("AIOLOCKS_RECIPES_ON_TOPOLOGIES") == "1":
        return
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        label = callspec.params.get("backend_url") if callspec is not None else None
        module = getattr(item, "module", None)
        name = module.__name__.rpartition(".")[2] if module is not None else ""
        if label in TOPOLOGIES and name in RECIPE_MODULES:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


#: query options appended to each backend's URL for the suite
#: (postgres: the test server has no TLS; with the default sslmode=prefer a connect
#: cancelled mid-negotiation leaves an unretrieved future inside asyncpg, which
#: the anyio tests report as an error)
URL_OPTIONS: dict[str, str] = {
    "postgres": "heartbeat=1&sslmode=disable",
    "postgres-lease": "mode=lease&lease_time=5&sslmode=disable",
    "etcd": "lease_ttl=5",
}


@pytest.fixture(params=list(BACKENDS))
def backend_url(request: pytest.FixtureRequest) -> str:
    """The URL of one backend under test."""
    label: str = request.param
    fixture = BACKENDS[label]
    if fixture is None:
        return f"memory://conformance-{uuid.uuid4().hex[:8]}"
    server = request.getfixturevalue(fixture)
    urls = getattr(server, "urls", None)
    if urls is not None:  # independent masters: Redlock over all of them
        url = "redlock://" + ",".join(u.partition("://")[2] for u in urls)
    else:
        url = server.url
    extra = URL_OPTIONS.get(label)
    if extra:
        url += ("&" if "?" in url else "?") + extra
    return url


@pytest.fixture(autouse=True)
def _needs_primitives(request: pytest.FixtureRequest) -> None:
    """Skip a test marked ``@pytest.mark.primitives(...)`` where the backend lacks one.

    Decided from the backend's declared ``Capabilities`` (built without I/O),
    never from its name.
    """
    marker = request.node.get_closest_marker("primitives")
    if marker is None or "backend_url" not in request.fixturenames:
        return
    url: str = request.getfixturevalue("backend_url")
    offered = aiolocks.connect(url)._backend.capabilities.primitives
    missing = sorted(set(marker.args) - offered)
    if missing:
        pytest.skip(f"backend does not offer {', '.join(missing)}")


@pytest_asyncio.fixture
async def backend(backend_url: str) -> AsyncIterator[aiolocks.Backend]:
    """An open backend; at the end of the test it must hold nothing."""
    async with aiolocks.connect(backend_url) as opened:
        yield opened
        await settle(opened)
        leftover = [f"{hold.kind} {hold.name!r}" for hold in opened._holds]
        assert not leftover, f"the test left holds behind: {leftover}"


@pytest_asyncio.fixture
async def other_backend(backend_url: str) -> AsyncIterator[aiolocks.Backend]:
    """A second, independent connection to the same service (another 'process')."""
    async with aiolocks.connect(backend_url) as opened:
        yield opened


@pytest.fixture
def names() -> Callable[[], str]:
    """Factory of fresh lock names, unique per test."""
    prefix = f"conformance/{uuid.uuid4().hex[:10]}"
    counter = iter(range(1_000_000))

    def make() -> str:
        return f"{prefix}/lock-{next(counter)}"

    return make


async def wait_queued(
    lock_participants: Callable[[], Awaitable[Sequence[Participant]]], count: int
) -> None:
    """Wait until the backend's queue shows ``count`` participants."""
    seen: list[Sequence[Participant]] = []

    async def queued() -> bool:
        seen[:] = [await lock_participants()]
        return len(seen[0]) >= count

    try:
        await eventually(queued, what=f"{count} participants in the queue")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {seen}") from None
