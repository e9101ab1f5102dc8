"""``doctor`` on real ZooKeeper servers set up badly and well: each finding present and absent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import aiozk
import pytest

from aiolocks import DoctorReport, Severity
from aiolocks._connect import backend_from_url
from aiolocks.testing.servers import ZooKeeperEnsemble, ZooKeeperServer, free_port
from aiolocks.zookeeper._doctor import (
    ensemble_findings,
    parse_dynamic_config,
    parse_version,
    version_finding,
)

pytestmark = pytest.mark.zookeeper


@pytest.fixture(scope="module")
def strict_zookeeper() -> Iterator[ZooKeeperServer]:
    """Sessions of at most 5 s, and only ``srvr`` among the four-letter words."""
    server = ZooKeeperServer(
        max_session_timeout=5000, extra_config={"4lw.commands.whitelist": "srvr"}
    )
    with server:
        yield server


async def _doctor(url: str) -> DoctorReport:
    backend = backend_from_url(url)
    try:
        return await backend.doctor()
    finally:
        await backend.close()


def _assert_self_test_ok(report: DoctorReport) -> None:
    test = report.self_test
    assert test is not None and test.ok, test
    assert test.tokens_increasing is True
    assert test.timeout_name == "session timeout"
    assert "self-test-failed" not in report.codes()


@pytest.mark.asyncio
async def test_clamped_session_timeout_and_4lw_refused(strict_zookeeper: ZooKeeperServer) -> None:
    report = await _doctor(f"{strict_zookeeper.url}?session_timeout=30")
    clamped = report.get("zk-session-timeout-clamped")
    assert clamped is not None and clamped.severity is Severity.WARNING
    assert clamped.details["requested_s"] == 30 and clamped.details["negotiated_s"] == 5
    assert "maxSessionTimeout" in clamped.fix
    refused = report.get("zk-4lw-unavailable")
    assert refused is not None and refused.severity is Severity.INFO
    assert refused.details == {"refused": ["conf"]}
    single = report.get("zk-single-server")
    assert single is not None and single.severity is Severity.WARNING
    _assert_self_test_ok(report)
    assert report.self_test is not None and report.self_test.timeout == 5
    # inside the server's range: nothing clamped
    report = await _doctor(f"{strict_zookeeper.url}?session_timeout=4")
    assert "zk-session-timeout-clamped" not in report.codes()


@pytest.mark.asyncio
async def test_defaults_on_a_standalone_server(zookeeper_server: ZooKeeperServer) -> None:
    report = await _doctor(f"{zookeeper_server.url}?session_timeout=10")
    assert "zk-session-timeout-clamped" not in report.codes()
    assert "zk-4lw-unavailable" not in report.codes()
    assert "zk-old-version" not in report.codes()
    assert "zk-single-server" in report.codes()
    assert report.exit_status == 0
    _assert_self_test_ok(report)


@pytest.mark.asyncio
async def test_a_session_timeout_raised_by_the_server(zookeeper_server: ZooKeeperServer) -> None:
    # the test server's minSessionTimeout is 400 ms
    report = await _doctor(f"{zookeeper_server.url}?session_timeout=0.1")
    clamped = report.get("zk-session-timeout-clamped")
    assert clamped is not None and "minSessionTimeout" in clamped.fix
    assert clamped.details["server_min_s"] == 0.4


@pytest.mark.asyncio
async def test_ensemble(zookeeper_ensemble: ZooKeeperEnsemble) -> None:
    zookeeper_ensemble.wait_for_leader()
    report = await _doctor(zookeeper_ensemble.url)
    for code in ("zk-single-server", "zk-even-ensemble", "zk-connect-string-partial"):
        assert code not in report.codes(), report.render()
    assert "zk-server-unreachable" not in report.codes()
    _assert_self_test_ok(report)
    # a URL naming one member of three
    first = zookeeper_ensemble.hosts.split(",")[0]
    report = await _doctor(f"zk://{first}")
    partial = report.get("zk-connect-string-partial")
    assert partial is not None and partial.details == {"members": 3, "listed": 1}
    assert "zk-single-server" not in report.codes()


@pytest.mark.asyncio
async def test_leftovers_under_the_lock_root(zookeeper_server: ZooKeeperServer) -> None:
    chroot = f"/doctor-{uuid.uuid4().hex[:8]}"
    url = f"{zookeeper_server.url}{chroot}"
    report = await _doctor(url)
    assert "zk-stale-lock-nodes" not in report.codes()
    assert "zk-empty-lock-parents" not in report.codes()
    # behind the library's back: a persistent lock node and a persistent empty parent
    client = aiozk.ZKClient(zookeeper_server.hosts, chroot=chroot)
    await client.start()
    try:
        await client.ensure_path("/aiolocks/mutex/orders/42")
        await client.create("/aiolocks/mutex/orders/42/_c_0123456789abcdef-lock-0000000007")
        await client.ensure_path("/aiolocks/mutex/old-name")
        report = await _doctor(url)
        stale = report.get("zk-stale-lock-nodes")
        assert stale is not None and stale.severity is Severity.CRITICAL
        assert stale.details["paths"] == [
            "/aiolocks/mutex/orders/42/_c_0123456789abcdef-lock-0000000007"
        ]
        empty = report.get("zk-empty-lock-parents")
        assert empty is not None and empty.severity is Severity.WARNING
        assert empty.details["paths"] == ["/aiolocks/mutex/old-name"]
        assert report.exit_status == 1
        # a live ephemeral lock node of a running holder is not stale
        await client.delete("/aiolocks/mutex/orders/42/_c_0123456789abcdef-lock-0000000007")
        await client.delete("/aiolocks/mutex/old-name")
        backend = backend_from_url(url)
        async with backend, backend.mutex("orders/42"):
            report = await _doctor(url)
        assert "zk-stale-lock-nodes" not in report.codes()
        assert "zk-empty-lock-parents" not in report.codes(), report.render()
    finally:
        await client.close()


def test_version_parsing_and_threshold() -> None:
    text = "Zookeeper version: 3.4.14-4c25d480e66aadd371de8bd2fd8da255ac140bcf, built on 03/06/2019"
    assert parse_version(text) == (3, 4, 14)
    old = version_finding("h:2181", (3, 4, 14))
    assert old is not None and old.severity is Severity.CRITICAL and old.code == "zk-old-version"
    assert version_finding("h:2181", (3, 5, 0)) is None
    assert version_finding("h:2181", (3, 9, 2)) is None


def test_dynamic_config_counts_voters_only() -> None:
    config = (
        "server.1=10.0.0.1:2888:3888:participant;0.0.0.0:2181\n"
        "server.2=10.0.0.2:2888:3888:participant;0.0.0.0:2181\n"
        "server.3=10.0.0.3:2888:3888:observer;0.0.0.0:2181\n"
        "version=100000000\n"
    )
    assert parse_dynamic_config(config) == ["server.1", "server.2"]
    assert parse_dynamic_config("") == []


@pytest.mark.asyncio
async def test_a_listed_server_that_does_not_answer(zookeeper_server: ZooKeeperServer) -> None:
    report = await _doctor(zookeeper_server.url)
    assert "zk-server-unreachable" not in report.codes()
    dead = f"127.0.0.1:{free_port()}"
    report = await _doctor(f"zk://{zookeeper_server.hosts},{dead}")
    down = report.get("zk-server-unreachable")
    assert down is not None and down.severity is Severity.WARNING
    assert down.details["server"] == dead
    _assert_self_test_ok(report)


def test_ensemble_size_rules() -> None:
    assert [f.code for f in ensemble_findings(1, 1)] == ["zk-single-server"]
    assert ensemble_findings(3, 3) == [] and ensemble_findings(5, 5) == []
    assert [f.code for f in ensemble_findings(4, 4)] == ["zk-even-ensemble"]
    assert [f.code for f in ensemble_findings(2, 1)] == [
        "zk-even-ensemble",
        "zk-connect-string-partial",
    ]
