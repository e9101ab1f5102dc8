"""Seconds options are checked against one range each, before any I/O, on every backend.

Before, ``?lease_time=1e308`` passed the URL check and the first acquire
raised ``OverflowError``; ``1e20`` failed inside Redis; a huge ZooKeeper
``session_timeout`` did not fit the handshake and the connect timed out.
"""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks._connect import backend_from_url
from aiolocks._core.timeouts import LEASE_TIME_RANGE, SETTING_RANGE, check_seconds
from aiolocks.testing import RedisServer

# hosts nobody listens on: a check that needed I/O would fail differently (or hang)
OUT_OF_RANGE_URLS = [
    ("redis://127.0.0.1:1/0?lease_time=1e308", "lease_time"),
    ("redis://127.0.0.1:1/0?lease_time=1e20", "lease_time"),
    ("redis://127.0.0.1:1/0?lease_time=86401", "lease_time"),
    ("redis://127.0.0.1:1/0?lease_time=0.001", "lease_time"),
    ("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?lease_time=1e308", "lease_time"),
    ("zk://127.0.0.1:1?session_timeout=1e9", "session_timeout"),
    ("zk://127.0.0.1:1?session_timeout=1e308", "session_timeout"),
    ("zk://127.0.0.1:1?connect_timeout=1e20", "connect_timeout"),
    ("etcd://127.0.0.1:1?request_timeout=1e308", "request_timeout"),
    ("etcd://127.0.0.1:1?connect_timeout=3601", "connect_timeout"),
    ("postgresql://u@127.0.0.1:1/db?mode=lease&lease_time=1e308", "lease_time"),
]


@pytest.mark.parametrize(("url", "option"), OUT_OF_RANGE_URLS)
def test_out_of_range_url_options_are_a_value_error(url: str, option: str) -> None:
    scheme = url.partition("://")[0]
    if scheme == "etcd":
        pytest.importorskip("grpc")
    if scheme == "postgresql":
        pytest.importorskip("asyncpg")
    with pytest.raises(ValueError, match=option):
        backend_from_url(url)


@pytest.mark.asyncio
@pytest.mark.parametrize("value", [1e308, 1e20, 86400.5, 0.001, 0, -1, float("nan"), float("inf")])
async def test_per_lock_lease_time_has_one_range_everywhere(value: float) -> None:
    """memory:// ignores lease_time, but refuses what Redis refuses: code moves unchanged."""
    async with aiolocks.connect("memory://") as backend:
        for make in (
            lambda: backend.mutex("ranges", lease_time=value),
            lambda: backend.semaphore("ranges", max_leases=2, lease_time=value),
            lambda: backend.read_write_lock("ranges", lease_time=value),
        ):
            with pytest.raises(ValueError, match="lease_time"):
                make()


@pytest.mark.redis
@pytest.mark.asyncio
async def test_redis_refuses_a_huge_lease_before_any_command(redis_server: RedisServer) -> None:
    async with aiolocks.connect(redis_server.url + "?key_prefix=ranges:") as backend:
        for value in (1e308, 1e20):
            with pytest.raises(ValueError, match="lease_time"):
                await backend.mutex("ranges", lease_time=value).acquire(timeout=1)
        assert not redis_server.command("KEYS", "ranges:*")
    with pytest.raises(ValueError, match="lease_time"):
        aiolocks.connect(redis_server.url, lease_time=1e20)


def test_the_edges_of_each_range_are_accepted() -> None:
    low, high = LEASE_TIME_RANGE
    assert check_seconds(low, "lease_time", LEASE_TIME_RANGE) == low
    assert check_seconds(high, "lease_time", LEASE_TIME_RANGE) == high
    assert check_seconds(SETTING_RANGE[1], "connect_timeout", SETTING_RANGE) == SETTING_RANGE[1]
    with pytest.raises(ValueError, match=r"connect_timeout=0 must be a number of seconds > 0"):
        check_seconds(0, "connect_timeout", SETTING_RANGE)
    with pytest.raises(ValueError, match="got True"):
        check_seconds(True, "lease_time", LEASE_TIME_RANGE)
    backend_from_url(f"redis://127.0.0.1:1/0?lease_time={high:g}")
    backend_from_url(f"zk://127.0.0.1:1?session_timeout={SETTING_RANGE[1]:g}")
