"""Lock names: NFC, no spoofing characters, no collision with a recipe's own nodes."""

from __future__ import annotations

import uuid

import pytest

import aiolocks
from aiolocks import validate_name
from aiolocks.testing.servers import RedisServer, ZooKeeperServer

SPOOFERS = [
    "\u202e",  # RIGHT-TO-LEFT OVERRIDE
    "\u2066",  # LEFT-TO-RIGHT ISOLATE
    "\u2069",  # POP DIRECTIONAL ISOLATE
    "\u200f",  # RIGHT-TO-LEFT MARK
    "\u061c",  # ARABIC LETTER MARK
    "\u200b",  # ZERO WIDTH SPACE
    "\u200d",  # ZERO WIDTH JOINER
    "\ufeff",  # ZERO WIDTH NO-BREAK SPACE (BOM)
    "\u2028",  # LINE SEPARATOR
    "\u2029",  # PARAGRAPH SEPARATOR
    "\x85",  # NEXT LINE (C1)
    "\n",
]


@pytest.mark.parametrize("ch", SPOOFERS)
def test_spoofing_characters_are_refused(ch: str) -> None:
    with pytest.raises(aiolocks.InvalidLockNameError, match=f"U\\+{ord(ch):04X}"):
        validate_name(f"jobs/{ch}backup")


def test_two_spellings_are_one_name() -> None:
    composed, decomposed = "café/\u00e9", "cafe\u0301/e\u0301"
    assert composed != decomposed
    assert validate_name(composed) == validate_name(decomposed) == composed


NODE_SHAPED = [
    f"_c_{uuid.uuid4()}-lock-0000000000",
    f"_c_{uuid.uuid4()}-read@0000000003-0000000004",
    f"_c_{uuid.uuid4()}-__WRIT__0000000001",
    "lock-0000000001",
    "__READ__0000000002",
    "lease-0000000009",
    "latch-0000000000",
]


@pytest.mark.parametrize("segment", NODE_SHAPED)
def test_node_shaped_segments_are_refused(segment: str) -> None:
    with pytest.raises(aiolocks.InvalidLockNameError, match="own node"):
        validate_name(f"orders/{segment}")


@pytest.mark.parametrize("name", ["lock-1", "_c_notauuid-lock-0000000000", "invoice-0000000001"])
def test_ordinary_names_stay_valid(name: str) -> None:
    assert validate_name(f"orders/{name}") == f"orders/{name}"


@pytest.mark.zookeeper
@pytest.mark.asyncio
async def test_zookeeper_node_shaped_name_cannot_block_its_parent(
    zookeeper_server: ZooKeeperServer,
) -> None:
    """The issue's case: a name segment shaped like seq 0 of its parent's queue."""
    parent = f"sec/{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(zookeeper_server.url) as backend:
        with pytest.raises(aiolocks.InvalidLockNameError):
            backend.mutex(f"{parent}/_c_{uuid.uuid4()}-lock-0000000000")
        async with backend.mutex(parent).hold(timeout=5):
            pass


@pytest.mark.redis
@pytest.mark.asyncio
async def test_nfc_spellings_exclude_each_other(redis_server: RedisServer) -> None:
    url = f"{redis_server.url}?key_prefix=sec-{uuid.uuid4().hex[:8]}:"
    async with (
        aiolocks.connect(url) as one,
        aiolocks.connect(url) as other,
        one.mutex("caf\u00e9"),
    ):
        assert await other.mutex("cafe\u0301").acquire(timeout=0) is False


@pytest.mark.redis
@pytest.mark.asyncio
async def test_foreign_keys_under_the_prefix_do_not_break_list(redis_server: RedisServer) -> None:
    """A key that is not UTF-8, or names a lock no aiolocks name could be, is skipped."""
    import redis.asyncio

    prefix = f"sec-{uuid.uuid4().hex[:8]}:"
    raw = redis.asyncio.Redis.from_url(redis_server.url)
    foreign = [f"{prefix}{{mutex:".encode() + b"\xff\xfe}", f"{prefix}{{mutex:a\u202eb}}".encode()]
    try:
        for key in foreign:
            await raw.hset(key, "x", "1")
        url = f"{redis_server.url}?key_prefix={prefix}"
        async with aiolocks.connect(url) as backend, backend.mutex("sec/ok"):
            assert [info.name for info in await backend.list_locks()] == ["sec/ok"]
    finally:
        await raw.delete(*foreign)
        await raw.aclose()
