"""The optional parts of the driver contract are protocols, and every driver's methods fit them.

Also the one backend-level protocol, :class:`ReportsConnectionState`.

The core finds ``check_name``, ``admin`` and ``diagnose`` with
``isinstance(driver, SupportsX)``; these tests pin which driver offers which
part, and the typed assignments below make ``mypy --strict`` check each
method's signature against its protocol.
"""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks._core.driver import (
    Driver,
    SupportsAdmin,
    SupportsCheckName,
    SupportsDiagnose,
)
from aiolocks._core.localstore import LocalDriver
from aiolocks._core.states import ReportsConnectionState
from aiolocks.etcd import EtcdBackend
from aiolocks.etcd._driver import EtcdDriver
from aiolocks.memory import MemoryBackend
from aiolocks.memory._driver import MemoryDriver
from aiolocks.postgres import PostgresBackend
from aiolocks.postgres._driver import PostgresAdvisoryDriver
from aiolocks.postgres._lease import PostgresLeaseDriver
from aiolocks.redis import RedisBackend
from aiolocks.redis._driver import RedisDriver
from aiolocks.redis._redlock import RedlockDriver
from aiolocks.zookeeper import ZooKeeperBackend
from aiolocks.zookeeper._driver import ZooKeeperDriver

DRIVERS = (
    EtcdDriver,
    MemoryDriver,
    PostgresAdvisoryDriver,
    PostgresLeaseDriver,
    RedisDriver,
    RedlockDriver,
    ZooKeeperDriver,
)


def _typed_fits(
    etcd: EtcdDriver,
    memory: MemoryDriver,
    advisory: PostgresAdvisoryDriver,
    lease: PostgresLeaseDriver,
    redis: RedisDriver,
    redlock: RedlockDriver,
    zookeeper: ZooKeeperDriver,
) -> None:
    """Never called: mypy checks that each driver's methods match the protocols."""
    admins: list[SupportsAdmin] = [etcd, memory, advisory, lease, redis, redlock, zookeeper]
    diagnoses: list[SupportsDiagnose] = [etcd, memory, advisory, lease, redis, redlock, zookeeper]
    names: list[SupportsCheckName] = [zookeeper]
    drivers: list[Driver] = [etcd, memory, advisory, lease, redis, redlock, zookeeper]
    del admins, diagnoses, names, drivers


def _typed_states(zookeeper: ZooKeeperBackend, etcd: EtcdBackend, pg: PostgresBackend) -> None:
    """Never called: mypy checks that these backends fit :class:`ReportsConnectionState`."""
    reporting: list[ReportsConnectionState] = [zookeeper, etcd, pg]
    del reporting


@pytest.mark.parametrize(
    ("url", "reports"),
    [
        ("memory://", False),
        ("redis://127.0.0.1:1/0", False),
        ("zk://127.0.0.1:1/protocols", True),
        ("etcd://127.0.0.1:1/protocols", True),
        ("postgresql://app@127.0.0.1:1/db", True),
        ("postgresql://app@127.0.0.1:1/db?mode=lease", True),
    ],
)
def test_which_backends_report_connection_states(url: str, reports: bool) -> None:
    """Built, not opened (no I/O): the protocol check reads no state that needs a session."""
    backend = aiolocks.connect(url)._backend
    if isinstance(backend, ReportsConnectionState):
        assert reports
        assert backend.connection_state is None  # nothing reported before open()
    else:
        assert not reports
    assert isinstance(backend, MemoryBackend | RedisBackend) is not reports


@pytest.mark.parametrize("driver", DRIVERS, ids=lambda cls: cls.__name__)
def test_every_backend_driver_offers_admin_and_diagnose(driver: type) -> None:
    assert issubclass(driver, SupportsAdmin)
    assert issubclass(driver, SupportsDiagnose)


def test_only_zookeeper_refuses_names_of_its_own() -> None:
    assert [d.__name__ for d in DRIVERS if issubclass(d, SupportsCheckName)] == [
        "ZooKeeperDriver"
    ]


def test_the_degraded_store_offers_no_optional_part() -> None:
    """The engine's process-local fallback store is a bare driver (no admin, no doctor)."""
    store = LocalDriver("protocols")
    assert not isinstance(store, SupportsAdmin | SupportsDiagnose | SupportsCheckName)


@pytest.mark.asyncio
async def test_a_driver_without_admin_says_so() -> None:
    """The call site asks the protocol: NotImplementedError, not AttributeError."""
    backend = aiolocks.Backend(LocalDriver("protocols-no-admin"))
    async with backend:
        with pytest.raises(NotImplementedError, match="listing or force-release"):
            await backend.list_locks()
        report = await backend.doctor()
        assert report.self_test is not None
