"""``doctor`` for Redis: the server settings that quietly break Redis locks.

Every lock key has a TTL (the lease), and the fencing counter lives in Redis
too, so what matters is: may the server evict keys, does it keep them across
a restart, can a failover promote a replica that never saw a lock, and can
the service be reached at all (every Cluster master, every Redlock master,
the Sentinels). Each server is asked with ``CONFIG GET`` and ``INFO``; a
server that refuses ``CONFIG`` (ACL, managed Redis) gets an info finding
"could not check" instead of an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import RedisError

from .._core.doctor import Diagnosis, Finding, Severity
from .._core.errors import BackendUnavailableError
from ._doctor_security import security_findings

if TYPE_CHECKING:
    from ._driver import RedisDriver
    from ._redlock import RedlockDriver

__all__ = [
    "diagnose_redis",
    "diagnose_redlock",
    "eviction_finding",
    "notification_finding",
    "persistence_findings",
    "sentinel_findings",
]

#: the CONFIG parameters the checks read
CONFIG_KEYS: Final = (
    "maxmemory-policy",
    "maxmemory",
    "appendonly",
    "appendfsync",
    "save",
    "min-replicas-to-write",
    "min-replicas-max-lag",
    "notify-keyspace-events",
)

#: seconds a Sentinel failover takes beyond ``down-after-milliseconds``
#: (leader election, promotion, clients finding the new master): a margin
FAILOVER_MARGIN: Final = 2.0

#: a per-command bound for the checks (a stalled server must not hang doctor)
CHECK_TIMEOUT: Final = 5.0

Call = Callable[..., Awaitable[Any]]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _config_dict(reply: object) -> dict[str, str]:
    """``CONFIG GET`` as ``{name: value}`` (redis-py gives a dict, RESP2 raw a flat list)."""
    if isinstance(reply, Mapping):
        return {_text(k): _text(v) for k, v in reply.items()}
    if isinstance(reply, list | tuple):
        items = list(reply)
        return {_text(items[i]): _text(items[i + 1]) for i in range(0, len(items) - 1, 2)}
    return {}


def _info_dict(reply: object) -> dict[str, str]:
    """``INFO <section>`` as ``{field: text}`` (redis-py parses it; raw text is split here)."""
    if isinstance(reply, Mapping):
        return {_text(k): _text(v) for k, v in reply.items()}
    out: dict[str, str] = {}
    for line in _text(reply).splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip()
    return out


@dataclass(slots=True)
class Server:
    """One Redis server to check: a label for the findings and a way to send it a command."""

    label: str
    call: Call


# -- checks on one server's settings (pure: values in, findings out) --------------------


def eviction_finding(label: str, policy: str, maxmemory: int) -> Finding | None:
    """``allkeys-*`` and ``volatile-*`` policies may evict lock keys (all of them have a TTL)."""
    if not (policy.startswith("allkeys-") or policy.startswith("volatile-")):
        return None
    limit = f"maxmemory {maxmemory} bytes" if maxmemory else "no maxmemory set yet"
    return Finding(
        code="redis-eviction-policy",
        severity=Severity.CRITICAL,
        title=f"{label}: maxmemory-policy is {policy} ({limit})",
        breaks=(
            "under memory pressure Redis evicts keys, held lock keys included (every lock key "
            "has a TTL, so volatile-* policies pick them too): a second client then gets a "
            "lock that is still held"
        ),
        fix=(
            "set maxmemory-policy noeviction on the Redis that holds locks (writes then fail "
            "loudly when memory is full), or give locks a Redis of their own"
        ),
        details={"server": label, "maxmemory_policy": policy, "maxmemory": maxmemory},
    )


def persistence_findings(label: str, appendonly: str, appendfsync: str, save: str) -> list[Finding]:
    """No AOF: a restart empties every lock. AOF without ``always``: the last writes can go."""
    if appendonly != "yes":
        snapshots = f"RDB snapshots '{save}'" if save.strip() else "no RDB snapshots"
        return [
            Finding(
                code="redis-persistence",
                severity=Severity.WARNING,
                title=f"{label}: appendonly is no ({snapshots})",
                breaks=(
                    "a restart or crash loses every lock key and the fencing counters: other "
                    "clients are granted locks whose holders still run until their next "
                    "renewal, and fencing tokens keep increasing only while the server clock "
                    "never steps back"
                ),
                fix=(
                    "set appendonly yes with appendfsync always (or everysec and accept the "
                    "last second), or keep a restarted Redis out of service for longer than "
                    "lease_time before it takes locks"
                ),
                details={"server": label, "appendonly": appendonly, "save": save},
            )
        ]
    if appendfsync != "always":
        return [
            Finding(
                code="redis-aof-fsync",
                severity=Severity.INFO,
                title=f"{label}: appendonly yes with appendfsync {appendfsync}",
                breaks=(
                    "a power loss or kernel crash can drop the last writes (about one "
                    "second with everysec): locks granted just before it are forgotten"
                ),
                fix="set appendfsync always where that window matters",
                details={"server": label, "appendfsync": appendfsync},
            )
        ]
    return []


def replication_finding(
    label: str, replicas: int, min_replicas_to_write: int, client_min_replicas: int
) -> Finding | None:
    """A master with replicas and no write acknowledgement: a failover can forget a lock."""
    if replicas == 0 or min_replicas_to_write > 0 or client_min_replicas > 0:
        return None
    return Finding(
        code="redis-replication-unsafe",
        severity=Severity.WARNING,
        title=(
            f"{label}: {replicas} replica(s), but neither min-replicas-to-write nor the "
            "min_replicas option makes a lock write wait for one"
        ),
        breaks=(
            "replication is asynchronous: a failover can promote a replica that never "
            "received a lock, and a second client is then granted it"
        ),
        fix=(
            "connect with ?min_replicas=1 (aiolocks then WAITs for a replica after each "
            "lock write), and set min-replicas-to-write 1 / min-replicas-max-lag on the master"
        ),
        details={
            "server": label,
            "connected_replicas": replicas,
            "min_replicas_to_write": min_replicas_to_write,
            "client_min_replicas": client_min_replicas,
        },
    )


def missing_notification_flags(flags: str) -> str:
    """The ``notify-keyspace-events`` flags prompt loss detection would need that are off.

    Needed: a class (``K`` keyspace or ``E`` keyevent), ``g`` (DEL, RENAME...),
    ``h`` (HDEL), ``x`` (expired) and ``e`` (evicted). ``A`` stands for
    ``g$lshzxet``.
    """
    expanded = flags.replace("A", "g$lshzxet")
    missing = ""
    if "K" not in expanded and "E" not in expanded:
        missing += "K"
    for flag in "ghxe":
        if flag not in expanded:
            missing += flag
    return missing


def notification_finding(label: str, flags: str) -> Finding | None:
    """Info: without keyspace notifications a deleted lock key is noticed at the next renewal."""
    missing = missing_notification_flags(flags)
    if not missing:
        return None
    return Finding(
        code="redis-keyspace-notifications",
        severity=Severity.INFO,
        title=f"{label}: notify-keyspace-events is '{flags}' (missing '{missing}')",
        breaks=(
            "a lock key deleted, evicted or expired behind the holder's back is noticed only "
            "at the next watchdog renewal (a third of lease_time), not at once"
        ),
        fix="set notify-keyspace-events to include Kghxe (for example 'Kghxe' or 'KA')",
        details={"server": label, "notify_keyspace_events": flags, "missing": missing},
    )


def tracking_finding(label: str, version: str) -> Finding | None:
    """Info: ``CLIENT TRACKING`` needs Redis 6."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    if major >= 6:
        return None
    return Finding(
        code="redis-client-tracking",
        severity=Severity.INFO,
        title=f"{label}: Redis {version} has no CLIENT TRACKING (needs 6.0)",
        breaks="prompt loss detection cannot use server-assisted invalidation on this server",
        fix="upgrade to Redis 6.2 or later",
        details={"server": label, "redis_version": version},
    )


def replica_finding(label: str, role: str, replication: Mapping[str, str]) -> Finding:
    """Critical: the URL points at a replica, which refuses every lock write."""
    upstream = f"{replication.get('master_host', '?')}:{replication.get('master_port', '?')}"
    return Finding(
        code="redis-role-replica",
        severity=Severity.CRITICAL,
        title=f"{label} is a {role} of {upstream}, not a master",
        breaks=(
            "a replica refuses writes (READONLY), so no lock can be taken; one configured "
            "to accept writes would hold locks that its master never sees"
        ),
        fix=(
            "point the URL at the master, or use redis+sentinel:// so the client always "
            "finds the current master"
        ),
        details={"server": label, "role": role, "master": upstream},
    )


def config_refused_finding(label: str, error: str) -> Finding:
    """Info: ``CONFIG GET`` refused (ACL, managed Redis): the settings could not be checked."""
    return Finding(
        code="redis-config-unavailable",
        severity=Severity.INFO,
        title=f"{label}: CONFIG GET refused, settings not checked ({error})",
        breaks=(
            "doctor could not check the eviction policy, persistence, min-replicas-to-write "
            "and keyspace notifications: any of them may be unsafe"
        ),
        fix=(
            "check those settings in your provider's console, or run doctor as a user "
            "allowed +config|get"
        ),
        details={"server": label, "error": error},
    )


def unreachable_finding(label: str, error: str, *, critical: bool, why: str) -> Finding:
    """A server of the deployment did not answer."""
    return Finding(
        code="redis-server-unreachable",
        severity=Severity.CRITICAL if critical else Severity.WARNING,
        title=f"{label} did not answer: {error}",
        breaks=why,
        fix="bring the server back, or remove it from the deployment and the URL",
        details={"server": label, "error": error},
    )


async def check_server(server: Server, client_min_replicas: int) -> list[Finding]:
    """Every per-server check on one Redis; raises ``RedisError``/``OSError`` if unreachable."""
    findings: list[Finding] = []
    label = server.label
    async with asyncio.timeout(CHECK_TIMEOUT):
        info = _info_dict(await server.call("INFO", "server"))
        replication = _info_dict(await server.call("INFO", "replication"))
        try:
            config: dict[str, str] = {}
            for key in CONFIG_KEYS:
                config.update(_config_dict(await server.call("CONFIG", "GET", key)))
        except RedisError as exc:
            if _connection_error(exc):
                raise
            findings.append(config_refused_finding(label, str(exc)))
            config = {}
    role = replication.get("role", "master")
    if role != "master":
        findings.append(replica_finding(label, role, replication))
    version = info.get("redis_version", "")
    tracking = tracking_finding(label, version)
    if tracking is not None:
        findings.append(tracking)
    replicas = int(replication.get("connected_slaves", "0") or 0)
    if not config:
        return findings
    eviction = eviction_finding(
        label, config.get("maxmemory-policy", "noeviction"), int(config.get("maxmemory", "0"))
    )
    if eviction is not None:
        findings.append(eviction)
    findings.extend(
        persistence_findings(
            label,
            config.get("appendonly", "no"),
            config.get("appendfsync", "everysec"),
            config.get("save", ""),
        )
    )
    unsafe = replication_finding(
        label, replicas, int(config.get("min-replicas-to-write", "0")), client_min_replicas
    )
    if unsafe is not None:
        findings.append(unsafe)
    notify = notification_finding(label, config.get("notify-keyspace-events", ""))
    if notify is not None:
        findings.append(notify)
    return findings


def _connection_error(exc: BaseException) -> bool:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return isinstance(exc, RedisConnectionError | RedisTimeoutError)


def _server_time(call: Call) -> Callable[[], Awaitable[float]]:
    async def server_time() -> float:
        async with asyncio.timeout(CHECK_TIMEOUT):
            reply = await call("TIME")
        seconds, micros = reply
        return int(seconds) + int(micros) / 1e6

    return server_time


# -- Sentinel -------------------------------------------------------------------------


def _sentinel_unreachable(service: str, label: str, error: str) -> Finding:
    """One Sentinel of the URL could not be asked about ``service``."""
    return Finding(
        code="sentinel-unreachable",
        severity=Severity.WARNING,
        title=f"Sentinel {label} did not answer for {service!r}: {error}",
        breaks=(
            "fewer Sentinels can vote: a failover may not get the majority it needs, "
            "and the master stays down"
        ),
        fix="bring the Sentinel back or remove it from the URL",
        details={"sentinel": label, "error": error},
    )


def _failover_outlasts_lease(
    service: str, lease_time: float, label: str, down_after: float
) -> Finding:
    """Sentinel declares the master down (``down_after`` seconds) too late for the leases."""
    return Finding(
        code="sentinel-down-after-vs-lease",
        severity=Severity.WARNING,
        title=(
            f"down-after-milliseconds is {down_after * 1000:.0f} ms: a failover takes "
            f"longer than lease_time ({lease_time:g} s)"
        ),
        breaks=(
            "while the master is down no lease can be renewed, so every hold is lost "
            "on each failover, and no lock can be taken until it ends"
        ),
        fix=(
            f"set sentinel down-after-milliseconds {service} to at most a third of "
            f"lease_time ({lease_time / 3 * 1000:.0f} ms here), or raise lease_time"
        ),
        details={
            "sentinel": label,
            "down_after_ms": down_after * 1000,
            "lease_time_s": lease_time,
        },
    )


def sentinel_findings(
    service: str,
    lease_time: float,
    states: Mapping[str, Mapping[str, Any]],
    errors: Mapping[str, str],
) -> list[Finding]:
    """Findings from ``SENTINEL MASTER <service>`` as seen by each Sentinel.

    :param states: sentinel label -> its parsed ``SENTINEL MASTER`` answer
    :param errors: sentinel label -> why it could not be asked
    """
    findings = [_sentinel_unreachable(service, label, error) for label, error in errors.items()]
    if not states:
        return findings
    label, state = next(iter(states.items()))
    down_after = float(state.get("down-after-milliseconds", 30000)) / 1000
    quorum = int(state.get("quorum", 0))
    sentinels = int(state.get("num-other-sentinels", 0)) + 1
    majority = sentinels // 2 + 1
    if down_after + FAILOVER_MARGIN >= lease_time:
        findings.append(_failover_outlasts_lease(service, lease_time, label, down_after))
    if sentinels < 3:
        findings.append(
            Finding(
                code="sentinel-too-few",
                severity=Severity.WARNING,
                title=f"{sentinels} Sentinel(s) watch {service!r}",
                breaks=(
                    "with fewer than three Sentinels, losing one leaves no majority to "
                    "authorize a failover (or one Sentinel decides alone)"
                ),
                fix="run at least three Sentinels, on different hosts",
                details={"sentinels": sentinels},
            )
        )
    if quorum < majority:
        findings.append(
            Finding(
                code="sentinel-quorum",
                severity=Severity.WARNING,
                title=f"quorum {quorum} is below a majority of the {sentinels} Sentinels",
                breaks=(
                    "a minority of Sentinels (one cut off from the master by a partition) can "
                    "declare the master down: more needless failovers, each of which may "
                    "lose holds that were not yet replicated"
                ),
                fix=f"set sentinel monitor {service} ... {majority} (a majority)",
                details={"quorum": quorum, "sentinels": sentinels, "majority": majority},
            )
        )
    return findings


async def _sentinel_checks(client: Any, lease_time: float) -> list[Finding]:
    pool = getattr(client, "connection_pool", None)
    manager = getattr(pool, "sentinel_manager", None)
    service = getattr(pool, "service_name", None)
    if manager is None or service is None:
        return []
    states: dict[str, Mapping[str, Any]] = {}
    errors: dict[str, str] = {}
    for sentinel in manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        label = f"{kwargs.get('host')}:{kwargs.get('port')}"
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                reply = await sentinel.execute_command("SENTINEL MASTER", service)
            states[label] = {_text(k): v for k, v in _config_dict(reply).items()}
        except (RedisError, OSError, TimeoutError) as exc:
            errors[label] = str(exc) or type(exc).__name__
    return sentinel_findings(service, lease_time, states, errors)


# -- Cluster ---------------------------------------------------------------------------


async def _cluster_checks(client: Any) -> tuple[list[Finding], list[Server]]:
    """Ping every master the client knows; read ``cluster_state`` from one that answers."""
    findings: list[Finding] = []
    reachable: list[Server] = []
    primaries = client.get_primaries()
    state: str | None = None
    for node in primaries:
        label = f"cluster master {node.host}:{node.port}"

        async def call(*args: Any, node: Any = node) -> Any:
            return await client.execute_command(*args, target_nodes=node)

        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                await call("PING")
                if state is None:
                    state = _info_dict(await call("CLUSTER INFO")).get("cluster_state")
        except (RedisError, OSError, TimeoutError) as exc:
            findings.append(
                unreachable_finding(
                    label,
                    str(exc) or type(exc).__name__,
                    critical=True,
                    why=(
                        "the slots this master serves accept no lock until it is back or "
                        "replaced: every lock whose name hashes there is unavailable, and "
                        "holds on it cannot be renewed"
                    ),
                )
            )
            continue
        reachable.append(Server(label, call))
    if state is not None and state != "ok":
        findings.append(
            Finding(
                code="cluster-state",
                severity=Severity.CRITICAL,
                title=f"the cluster reports cluster_state:{state}",
                breaks="a failed cluster refuses commands: no lock can be taken or renewed",
                fix="cover every slot with a reachable master (CLUSTER INFO, CLUSTER NODES)",
                details={"cluster_state": state},
            )
        )
    return findings, reachable


# -- entry points ----------------------------------------------------------------------


async def diagnose_redis(driver: RedisDriver) -> Diagnosis:
    """The findings of a single-endpoint Redis driver (plain, Sentinel or Cluster)."""
    node = driver.node
    # the doctor sends what redis-py documents (INFO, CONFIG GET, ...), not only the recipe's calls
    client: Any = node.client
    findings: list[Finding] = []
    servers: list[Server]
    if node.cluster:
        cluster_findings, servers = await _cluster_checks(client)
        findings.extend(cluster_findings)
    else:
        servers = [Server(node.describe, client.execute_command)]
        findings.extend(await _sentinel_checks(client, driver.lease_time))
    for server in servers:
        try:
            findings.extend(await check_server(server, node.min_replicas))
            findings.extend(await security_findings(server, node))
        except (RedisError, OSError, TimeoutError) as exc:
            if not node.cluster:
                # the one server is the whole backend: doctor reports it as unreachable
                raise BackendUnavailableError(f"{server.label} did not answer: {exc}") from exc
            findings.append(
                unreachable_finding(
                    server.label,
                    str(exc) or type(exc).__name__,
                    critical=True,
                    why="no lock can be taken or renewed while the server does not answer",
                )
            )
    return Diagnosis(
        findings=findings,
        timeout=driver.lease_time,
        timeout_name="lease_time",
        server_time=_server_time(servers[0].call) if servers else None,
    )


async def diagnose_redlock(driver: RedlockDriver) -> Diagnosis:
    """Every Redlock master's settings, and how many of them answer against the quorum."""
    findings: list[Finding] = []
    answered: list[Server] = []
    failed: list[tuple[Server, str]] = []
    for node in driver.nodes:
        client: Any = node.client
        server = Server(f"Redlock master {node.describe}", client.execute_command)
        try:
            findings.extend(await check_server(server, 0))
            findings.extend(await security_findings(server, node))
        except (RedisError, OSError, TimeoutError) as exc:
            failed.append((server, str(exc) or type(exc).__name__))
            continue
        answered.append(server)
    total = len(driver.nodes)
    below_quorum = len(answered) < driver.quorum
    for server, error in failed:
        findings.append(
            unreachable_finding(
                server.label,
                error,
                critical=below_quorum,
                why=(
                    f"{len(answered)} of {total} masters answer and a lock needs "
                    f"{driver.quorum}: "
                    + (
                        "no lock can be taken"
                        if below_quorum
                        else "one more failure and no lock can be taken"
                    )
                ),
            )
        )
    return Diagnosis(
        findings=findings,
        timeout=driver.lease_time,
        timeout_name="lease_time",
        server_time=_server_time(answered[0].call) if answered else None,
    )
