"""``from_url`` parses and checks everything before any I/O."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

import aiolocks
from aiolocks.redis import RedisBackend, RedlockBackend, from_url

CLUSTER_PUBSUB = hasattr(RedisCluster, "pubsub")  # redis-py 8.0 and later


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis://h:notaport", "port"),
        ("redis://h:70000", "port"),
        ("redis://h/abc", "database"),
        ("redis://h?lease_time=0", "lease_time"),
        ("redis://h?lease_time=abc", "lease_time"),
        ("redis://h?bogus=1", "bogus"),
        ("redis://h?key_prefix=a{b", "key_prefix"),
        ("redis://h?min_replicas=-1", "min_replicas"),
        ("redis://h?connect_timeout=-2", "connect_timeout"),
        ("redis://a,b", "one host"),
        ("redis+sentinel://h", "service"),
        ("redis+sentinel://h/svc/x", "database"),
        ("redis+cluster://h/0", "path"),
        ("redis+cluster://h?min_replicas=1", "min_replicas"),
        ("redlock://h1,h1", "twice"),
        ("redlock://h1,h2,h3?min_replicas=1", "min_replicas"),
        ("redis://", "host"),
        ("redix://h", "scheme"),
    ],
)
def test_bad_urls_name_the_bad_part(url: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        from_url(url)


def test_keyword_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown option 'lease'"):
        from_url("redis://h", lease=3)
    with pytest.raises(ValueError, match="lease_time"):
        from_url("redis://h", lease_time="3")


@pytest.mark.parametrize(
    ("url", "kind", "described"),
    [
        ("redis://127.0.0.1:1/3?lease_time=2", RedisBackend, "redis://127.0.0.1:1/3"),
        ("rediss://u:secret@h", RedisBackend, "rediss://h:6379/0"),
        (
            "redis+sentinel://a,b:26380/svc/2",
            RedisBackend,
            "redis+sentinel://a:26379,b:26380/svc/2",
        ),
        pytest.param(
            "redis+cluster://a:7000,b:7001",
            RedisBackend,
            "redis+cluster://a:7000,b:7001",
            marks=pytest.mark.skipif(not CLUSTER_PUBSUB, reason="redis-py before 8.0"),
        ),
        ("redlock://a:1,b:2,c:3", RedlockBackend, "redlock://a:1,b:2,c:3/0"),
    ],
)
def test_good_urls_build_without_io(url: str, kind: type, described: str) -> None:
    backend = from_url(url)
    assert isinstance(backend, kind)
    assert backend.url == described
    assert "secret" not in backend.url


def test_a_cluster_url_names_the_redis_py_it_needs() -> None:
    if CLUSTER_PUBSUB:
        assert from_url("redis+cluster://a:7000").url == "redis+cluster://a:7000"
    else:
        with pytest.raises(ValueError, match=r"redis-py 8\.0"):
            from_url("redis+cluster://a:7000")


def test_lock_options_are_checked_at_construction() -> None:
    backend = from_url("redis://h")
    with pytest.raises(ValueError, match="fair"):
        backend.semaphore_mutex("a", fair=True)
    with pytest.raises(ValueError, match="lease_time"):
        backend.mutex("a", lease_time=-1)
    with pytest.raises(ValueError, match="watchdog"):
        backend.mutex("a", watchdog="yes")
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        backend.mutex("a", colour="red")
    assert backend.mutex("a", fair=True, lease_time=5, watchdog=False).name == "a"
    redlock = from_url("redlock://a,b,c")
    with pytest.raises(ValueError, match="redlock"):
        redlock.semaphore("s", 2)


@pytest.mark.asyncio
async def test_unreachable_server_fails_within_connect_timeout() -> None:
    # Port 1 on localhost refuses at once; the error must be ours, not redis-py's.
    with pytest.raises(aiolocks.BackendUnavailableError, match=r"127\.0\.0\.1:1"):
        await aiolocks.connect("redis://127.0.0.1:1?connect_timeout=2")
