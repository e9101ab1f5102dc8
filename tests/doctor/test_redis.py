"""``doctor`` on real Redis servers configured badly and well: each finding present and absent."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
import redis.asyncio

from aiolocks import DoctorReport, Severity
from aiolocks._connect import backend_from_url
from aiolocks.cli import main
from aiolocks.redis._doctor import tracking_finding
from aiolocks.testing.servers import RedisCluster, RedisSentinelSet, RedisServer, free_port

pytestmark = pytest.mark.redis

#: every per-server setting wrong: evicting, no persistence, no notifications;
#: and a user that may not run CONFIG (a managed Redis)
BAD_ARGS = (
    "--maxmemory-policy",
    "allkeys-lru",
    "--user",
    "doctor",
    "on",
    ">secret",
    "~*",
    "&*",
    "+@all",
    "-config",
)
#: every per-server setting right
GOOD_ARGS = (
    "--maxmemory-policy",
    "noeviction",
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--notify-keyspace-events",
    "KEA",
)
#: volatile-* evicts lock keys too; AOF on, but not fsynced on every write
VOLATILE_ARGS = (
    "--maxmemory-policy",
    "volatile-lru",
    "--maxmemory",
    "100mb",
    "--appendonly",
    "yes",
    "--appendfsync",
    "everysec",
    "--notify-keyspace-events",
    "Kghxe",
)


@pytest.fixture(scope="module")
def bad_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=BAD_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def good_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=GOOD_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def volatile_redis() -> Iterator[RedisServer]:
    with RedisServer(extra_args=VOLATILE_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def replicated_redis() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master (otherwise well configured) with one replica."""
    master = RedisServer(extra_args=GOOD_ARGS)
    with master:
        replica = RedisServer(extra_args=("--replicaof", master.host, str(master.port)))
        with replica:
            deadline = time.monotonic() + 15
            while master.info("replication").get("connected_slaves", "0") == "0":
                assert time.monotonic() < deadline, "the replica did not connect"
                time.sleep(0.05)
            yield master, replica


async def _doctor(url: str, **options: object) -> DoctorReport:
    prefix = f"doctor-{uuid.uuid4().hex[:8]}:"
    # as `aiolocks doctor` does it: doctor() opens the backend itself
    backend = backend_from_url(url, key_prefix=prefix, **options)
    try:
        report = await backend.doctor()
    finally:
        await backend.close()
    await _assert_no_keys(url, prefix)
    return report


async def _assert_no_keys(url: str, prefix: str) -> None:
    """The self-test's scratch lock left nothing behind."""
    if not url.startswith("redis://"):
        return
    client = redis.asyncio.Redis.from_url(url)
    try:
        assert [key async for key in client.scan_iter(match=f"{prefix}*")] == []
    finally:
        await client.aclose()


def _assert_self_test_ok(report: DoctorReport) -> None:
    test = report.self_test
    assert test is not None and test.ok, test
    assert test.tokens_increasing is True and test.timeout_name == "lease_time"
    assert test.clock_offset is not None and test.clock_uncertainty is not None
    # same machine: the two clocks agree within the measurement's own error
    assert abs(test.clock_offset) <= test.clock_uncertainty + 0.5
    assert "clock-offset" not in report.codes()
    assert "self-test-failed" not in report.codes()


SERVER_CODES = (
    "redis-eviction-policy",
    "redis-persistence",
    "redis-aof-fsync",
    "redis-keyspace-notifications",
    "redis-replication-unsafe",
    "redis-config-unavailable",
)


@pytest.mark.asyncio
async def test_misconfigured_server(bad_redis: RedisServer) -> None:
    report = await _doctor(bad_redis.url)
    eviction = report.get("redis-eviction-policy")
    assert eviction is not None and eviction.severity is Severity.CRITICAL
    assert "allkeys-lru" in eviction.title and "noeviction" in eviction.fix
    persistence = report.get("redis-persistence")
    assert persistence is not None and persistence.severity is Severity.WARNING
    assert "appendonly" in persistence.fix
    notify = report.get("redis-keyspace-notifications")
    assert notify is not None and notify.severity is Severity.INFO
    assert notify.details["missing"] == "Kghxe"
    for absent in ("redis-aof-fsync", "redis-replication-unsafe", "redis-config-unavailable"):
        assert absent not in report.codes()
    assert report.exit_status == 1
    _assert_self_test_ok(report)


@pytest.mark.asyncio
async def test_well_configured_server(good_redis: RedisServer) -> None:
    report = await _doctor(good_redis.url)
    for code in SERVER_CODES:
        assert code not in report.codes(), report.render()
    # an open, plaintext test server: only the security findings (see tests/security)
    security = {"redis-open", "redis-no-tls", "redis-config-set"}
    assert [f for f in report.findings if f.code not in security] == []
    assert report.exit_status == 0
    _assert_self_test_ok(report)


@pytest.mark.asyncio
async def test_volatile_policy_and_everysec(volatile_redis: RedisServer) -> None:
    report = await _doctor(volatile_redis.url)
    eviction = report.get("redis-eviction-policy")
    assert eviction is not None and eviction.severity is Severity.CRITICAL
    assert eviction.details == {
        "server": eviction.details["server"],
        "maxmemory_policy": "volatile-lru",
        "maxmemory": 100 * 1024 * 1024,
    }
    fsync = report.get("redis-aof-fsync")
    assert fsync is not None and fsync.severity is Severity.INFO
    assert "redis-persistence" not in report.codes()
    assert "redis-keyspace-notifications" not in report.codes()


@pytest.mark.asyncio
async def test_config_refused_is_reported_not_raised(bad_redis: RedisServer) -> None:
    url = f"redis://doctor:secret@{bad_redis.host}:{bad_redis.port}/0"
    report = await _doctor(url)
    refused = report.get("redis-config-unavailable")
    assert refused is not None and refused.severity is Severity.INFO
    # what could not be read is not reported either way
    assert "redis-eviction-policy" not in report.codes()
    assert "redis-persistence" not in report.codes()
    assert report.exit_status == 0
    _assert_self_test_ok(report)


@pytest.mark.asyncio
async def test_replicas_without_write_acknowledgement(
    replicated_redis: tuple[RedisServer, RedisServer],
) -> None:
    master, _ = replicated_redis
    report = await _doctor(master.url)
    unsafe = report.get("redis-replication-unsafe")
    assert unsafe is not None and unsafe.severity is Severity.WARNING
    assert unsafe.details["connected_replicas"] == 1
    assert "min_replicas" in unsafe.fix
    # the client waits for a replica: silent
    report = await _doctor(master.url, min_replicas=1)
    assert "redis-replication-unsafe" not in report.codes()
    _assert_self_test_ok(report)
    # the server refuses writes without a replica: silent too
    master.command("CONFIG", "SET", "min-replicas-to-write", "1")
    try:
        report = await _doctor(master.url)
        assert "redis-replication-unsafe" not in report.codes()
    finally:
        master.command("CONFIG", "SET", "min-replicas-to-write", "0")


@pytest.mark.asyncio
async def test_url_pointing_at_a_replica(
    replicated_redis: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = replicated_redis
    report = await _doctor(replica.url)
    wrong = report.get("redis-role-replica")
    assert wrong is not None and wrong.severity is Severity.CRITICAL
    assert wrong.details["master"] == f"{master.host}:{master.port}"
    assert report.exit_status == 1
    assert "redis-role-replica" not in (await _doctor(master.url)).codes()


def test_cli_on_a_misconfigured_server(
    bad_redis: RedisServer, good_redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", bad_redis.url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"][0]["code"] == "redis-eviction-policy"
    assert doc["self_test"]["ok"] is True
    assert main(["doctor", good_redis.url]) == 0
    out = capsys.readouterr().out  # an open test server: the security findings only
    assert "redis-eviction-policy" not in out and "redis-open" in out


@pytest.mark.asyncio
async def test_sentinel_settings_against_lease(redis_sentinel: RedisSentinelSet) -> None:
    # 3 sentinels, quorum 2, down-after 1 s: fine for the default 30 s lease
    report = await _doctor(redis_sentinel.url)
    sentinel_codes = [c for c in report.codes() if c.startswith("sentinel-")]
    assert sentinel_codes == [], report.render()
    _assert_self_test_ok(report)
    # a 2 s lease cannot outlast a failover that starts after 1 s of silence
    report = await _doctor(redis_sentinel.url, lease_time=2)
    slow = report.get("sentinel-down-after-vs-lease")
    assert slow is not None and slow.severity is Severity.WARNING
    assert slow.details["down_after_ms"] == 1000
    assert "sentinel-quorum" not in report.codes()
    assert "sentinel-too-few" not in report.codes()
    assert "sentinel-unreachable" not in report.codes()
    # a Sentinel in the URL that does not answer
    dead = f"127.0.0.1:{free_port()}"
    scheme, _, rest = redis_sentinel.url.partition("://")
    hosts, _, path = rest.partition("/")
    report = await _doctor(f"{scheme}://{hosts},{dead}/{path}")
    silent = report.get("sentinel-unreachable")
    assert silent is not None and silent.details["sentinel"] == dead
    _assert_self_test_ok(report)


@pytest.mark.asyncio
async def test_sentinel_quorum_and_count() -> None:
    with RedisSentinelSet(sentinels=2, quorum=1) as weak:
        report = await _doctor(weak.url)
    quorum = report.get("sentinel-quorum")
    assert quorum is not None and quorum.details == {"quorum": 1, "sentinels": 2, "majority": 2}
    assert report.get("sentinel-too-few") is not None
    assert "sentinel-down-after-vs-lease" not in report.codes()


@pytest.mark.asyncio
async def test_cluster_master_down() -> None:
    with RedisCluster() as cluster:
        report = await _doctor(cluster.url)
        assert "redis-server-unreachable" not in report.codes(), report.render()
        assert "cluster-state" not in report.codes()
        # every master is checked: the default test settings, three times
        persistence = [f for f in report.findings if f.code == "redis-persistence"]
        assert len(persistence) == 3
        _assert_self_test_ok(report)
        cluster.nodes[2].kill()
        report = await _doctor(cluster.url)
        down = report.get("redis-server-unreachable")
        assert down is not None and down.severity is Severity.CRITICAL
        # once the others have marked it failed, the cluster refuses commands
        deadline = time.monotonic() + 30
        while "cluster_state:fail" not in str(cluster.nodes[0].command("CLUSTER", "INFO")):
            assert time.monotonic() < deadline, "the cluster never noticed the dead master"
            time.sleep(0.1)
        report = await _doctor(cluster.url)
        state = report.get("cluster-state")
        assert state is not None and state.details == {"cluster_state": "fail"}
    down = report.get("redis-server-unreachable")
    assert down is not None and down.severity is Severity.CRITICAL
    assert str(cluster.nodes[2].port) in down.title
    assert report.exit_status == 1
    # the masters that answer were still checked
    assert len([f for f in report.findings if f.code == "redis-persistence"]) == 2


@pytest.mark.asyncio
async def test_redlock_master_down() -> None:
    with RedisServer() as a, RedisServer() as b, RedisServer() as c:
        url = f"redlock://{a.host}:{a.port},{b.host}:{b.port},{c.host}:{c.port}"
        report = await _doctor(url)
        assert "redis-server-unreachable" not in report.codes()
        assert len([f for f in report.findings if f.code == "redis-persistence"]) == 3
        _assert_self_test_ok(report)
        c.kill()
        # a short lease: with a master down each cycle currently waits for
        # the lease of the attempt left on that master
        report = await _doctor(url, lease_time=2)
        down = report.get("redis-server-unreachable")
        # two of three still make a quorum: a warning, and the self-test passes
        assert down is not None and down.severity is Severity.WARNING
        assert str(c.port) in down.title
        _assert_self_test_ok(report)
        b.kill()
        report = await _doctor(url, lease_time=2)
        assert report.codes(Severity.CRITICAL)[0] == "backend-unreachable"
        both_down = [f for f in report.findings if f.code == "redis-server-unreachable"]
        assert sorted(f.details["server"] for f in both_down) == sorted(
            f"Redlock master redis://{s.host}:{s.port}/0" for s in (b, c)
        )
        assert all(f.severity is Severity.CRITICAL for f in both_down)
        assert report.exit_status == 1


def test_client_tracking_needs_redis_6() -> None:
    old = tracking_finding("r", "5.0.14")
    assert old is not None and old.code == "redis-client-tracking"
    assert old.severity is Severity.INFO
    assert tracking_finding("r", "6.2.0") is None and tracking_finding("r", "7.0.15") is None
