"""Prompt loss through keyspace events: the ``keyspace_events`` option, and Cluster.

A hold whose key is deleted, overwritten or expired server-side is noticed by
the server's keyspace event, not by the renewal: the tests use
``watchdog=False`` and a 60 s lease, so nothing else could end the body
within the test. On a cluster the event is published only on the master that
owns the key's slot, so the hold listens there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as ClusterClient

import aiolocks
from aiolocks.redis import RedisBackend, from_url
from aiolocks.testing import RedisCluster, RedisServer
from aiolocks.testing.servers import ServerCommandError

from .. import test_cli_process as cli
from ..polling import eventually
from ..test_cli_process import assert_all_gone, finish, forking_command, start, wait_all_started

#: kills what a failed ``aiolocks run`` test left (the CLI tests' fixture)
reaper = cli.reaper

pytestmark = pytest.mark.redis

needs_cluster_pubsub = pytest.mark.skipif(
    not hasattr(ClusterClient, "pubsub"),
    reason="redis-py before 8.0 has no pub/sub on its asyncio cluster client",
)


def holders_key(prefix: str, name: str) -> str:
    return f"{prefix}{{mutex:{name}}}"


@pytest.mark.parametrize("value", ["on", "", "OFF", "none"])
def test_bad_keyspace_events_values_fail_before_io(value: str) -> None:
    with pytest.raises(ValueError, match="keyspace_events must be one of auto, listen, off"):
        from_url(f"redis://127.0.0.1:1?keyspace_events={value}")
    with pytest.raises(ValueError, match="keyspace_events"):
        from_url("redis://127.0.0.1:1", keyspace_events=value)
    with pytest.raises(ValueError, match="keyspace_events"):
        RedisBackend(redis.asyncio.Redis(port=1), keyspace_events=value)


async def config_calls(raw: redis.asyncio.Redis) -> int:
    """How many CONFIG GET/SET the server ran since its last CONFIG RESETSTAT."""
    info = await raw.info("commandstats")
    return sum(
        int(value["calls"])
        for key, value in info.items()
        if key in ("cmdstat_config|get", "cmdstat_config|set")
    )


@pytest.mark.asyncio
async def test_keyspace_events_off_makes_no_config_call_and_renewal_notices(
    redis_server: RedisServer, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """``off``: no CONFIG, no keyspace subscription; the renewal still notices a deletion."""
    url = f"{redis_server.url}?key_prefix={prefix}&keyspace_events=off&lease_time=0.6"
    await raw.config_resetstat()
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex("off/x")
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                key = holders_key(prefix, "off/x")
                numsub = await raw.pubsub_numsub(f"__keyspace@0__:{key}")
                assert numsub[0][1] == 0, "off must not subscribe to keyspace events"
                try:
                    await raw.delete(key)
                    await asyncio.sleep(10)  # the renewal is 0.2 s away
                except asyncio.CancelledError:
                    assert lock.is_lost
                    raise
        assert lock.is_lost
    assert await config_calls(raw) == 0
    await raw.delete(holders_key(prefix, "off/x"))  # the fence counter a lost hold leaves


@pytest.mark.asyncio
async def test_keyspace_events_listen_makes_no_config_call_and_notices_at_once(
    redis_server: RedisServer, raw: redis.asyncio.Redis, prefix: str
) -> None:
    """``listen`` on a server configured by its operator: prompt loss without CONFIG."""
    await raw.config_set("notify-keyspace-events", "KEA")
    await raw.config_resetstat()
    url = f"{redis_server.url}?key_prefix={prefix}&keyspace_events=listen"
    key = holders_key(prefix, "listen/x")
    body_cancelled = False
    async with aiolocks.connect(url, lease_time=60) as backend:
        lock = backend.mutex("listen/x", watchdog=False)
        with pytest.raises(aiolocks.LockLostError):
            async with lock:

                async def watching() -> bool:
                    numsub = await raw.pubsub_numsub(f"__keyspace@0__:{key}")
                    return bool(numsub and numsub[0][1] == 1)

                await eventually(watching, what="the keyspace subscription")
                try:
                    await raw.delete(key)
                    await asyncio.sleep(50)  # well inside the 60 s lease
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
    assert body_cancelled and lock.is_lost
    assert await config_calls(raw) == 0
    await raw.delete(key)  # the fence counter a lost hold may leave


# -- Cluster --------------------------------------------------------------------------


def _names_on_every_master(client: ClusterClient, prefix: str) -> list[str]:
    """One lock name per master of the cluster (by the slot map the client knows)."""
    by_node: dict[str, str] = {}
    masters = {node.name for node in client.get_primaries()}
    while set(by_node) != masters:
        name = f"ks/{uuid.uuid4().hex[:8]}"
        owner = client.get_node_from_key(holders_key(prefix, name))
        assert owner is not None
        by_node.setdefault(owner.name, name)
    return list(by_node.values())


@pytest.mark.asyncio
@needs_cluster_pubsub
async def test_cluster_key_tampered_is_noticed_on_the_owning_master(
    redis_cluster: RedisCluster,
) -> None:
    """A hold on every master, each key tampered with in another way: each body is
    cancelled by the event its key's master publishes (one pub/sub connection per
    master), none by the renewal (no watchdog, a 60 s lease)."""
    prefix = f"ks-{uuid.uuid4().hex[:8]}:"
    host, port = redis_cluster.addresses[0]
    raw = ClusterClient(host=host, port=port, decode_responses=True)
    tampers = ["delete", "overwrite", "expire"]
    try:
        await raw.initialize()
        names = _names_on_every_master(raw, prefix)
        assert len(names) == len(tampers)  # the launcher's cluster has three masters
        url = f"{redis_cluster.url}?key_prefix={prefix}&lease_time=60"
        async with aiolocks.connect(url) as backend:
            for name, tamper in zip(names, tampers, strict=True):
                key = holders_key(prefix, name)
                lock = backend.mutex(name, watchdog=False)
                body_cancelled = False
                with pytest.raises(aiolocks.LockLostError):
                    async with lock:
                        owner = raw.get_node_from_key(key)

                        async def watching(owner: object = owner, key: str = key) -> bool:
                            numsub = await raw.pubsub_numsub(
                                f"__keyspace@0__:{key}", target_nodes=owner
                            )
                            return bool(numsub and numsub[0][1] == 1)

                        await eventually(watching, what=f"the keyspace subscription of {key}")
                        try:
                            if tamper == "delete":
                                await raw.delete(key)
                            elif tamper == "overwrite":
                                await raw.set(key, "somebody else", px=2000)
                            else:
                                await raw.pexpire(key, 1)
                            await asyncio.sleep(50)  # well inside the 60 s lease
                        except asyncio.CancelledError:
                            body_cancelled = True
                            raise
                assert body_cancelled, (name, tamper)
                assert lock.is_lost
                await raw.delete(key)  # the fence counter a lost hold may leave
        left = [k async for k in raw.scan_iter(match=f"{prefix}*")]
        assert not left, left
    finally:
        await raw.aclose()


@needs_cluster_pubsub
def test_cli_run_on_a_cluster_stops_the_command_when_the_key_is_deleted(
    redis_cluster: RedisCluster, tmp_path: Path, reaper: list[int]
) -> None:
    """``aiolocks run`` on a cluster URL with a 300 s lease (first renewal 100 s
    away): only the keyspace event at the key's master can stop the command
    within the 60 s ``finish`` allows."""
    prefix = f"cli-ks-{uuid.uuid4().hex[:6]}:"
    key = holders_key(prefix, "cli/cluster")
    owner = _owner_of(redis_cluster, key)
    url = f"{redis_cluster.url}?lease_time=300&key_prefix={prefix}"
    proc = start("run", "--kill-after", "1", url, "cli/cluster", "--", *forking_command(tmp_path))
    wait_all_started(tmp_path, proc, reaper)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        subs = owner.command("PUBSUB", "NUMSUB", f"__keyspace@0__:{key}")
        if isinstance(subs, list) and subs[1]:
            break
        time.sleep(0.05)
    assert owner.command("DEL", key) == 1
    code, err = finish(proc)
    assert code == 76, err
    assert "lost" in err
    assert_all_gone(tmp_path)
    owner.command("DEL", key)  # the fence counter a lost hold may leave


def _owner_of(cluster: RedisCluster, key: str) -> RedisServer:
    """The node of ``cluster`` that serves ``key`` (the others answer MOVED)."""
    for node in cluster.nodes:
        try:
            node.command("EXISTS", key)
        except ServerCommandError:
            continue
        return node
    raise AssertionError(f"no node serves {key!r}")
