"""The advisory-lock key: stable, collision-free, the same in Python and in SQL."""

from __future__ import annotations

import hashlib

import pytest

from aiolocks.postgres._sql import KEY_SQL, advisory_key, key_text, slot_keys, split_key
from aiolocks.testing import PostgresServer

from .conftest import Connect


def test_key_is_the_first_8_bytes_of_sha256_as_signed_int64() -> None:
    text = "aiolocks/mutex/locks/pay/order-1001"
    assert key_text("mutex", "locks/pay/order-1001") == text
    digest = hashlib.sha256(text.encode()).digest()
    expected = int.from_bytes(digest[:8], "big", signed=True)
    assert advisory_key("mutex", "locks/pay/order-1001") == expected
    # Pinned: a key must never change between releases (two versions of the
    # library must agree on it during a rolling deploy).
    assert advisory_key("mutex", "a") == int.from_bytes(
        hashlib.sha256(b"aiolocks/mutex/a").digest()[:8], "big", signed=True
    )
    assert advisory_key("mutex", "a") == -8480138065972741446  # sha256 8a507f5bd36d3aba...
    assert advisory_key("mutex", "a") != advisory_key("semaphore-mutex", "a")
    assert advisory_key("rwlock", "a") != advisory_key("mutex", "a")


def test_keys_of_many_names_are_distinct() -> None:
    # 300k names: a 32-bit hash (hashtext, CRC32) collides after ~120k already
    keys = {advisory_key("mutex", f"locks/tenant-{i % 997}/order-{i}") for i in range(300_000)}
    assert len(keys) == 300_000
    assert min(keys) < 0 < max(keys)  # the whole signed range is used


def test_slot_keys_are_distinct_and_unambiguous() -> None:
    keys = slot_keys("pool", 50)
    assert len(set(keys)) == 50
    assert keys[3] == advisory_key("semaphore", "pool#3")
    # "a#1" slot 2 and "a" slot "1#2" cannot meet: a slot is digits only.
    assert set(slot_keys("a#1", 3)).isdisjoint(slot_keys("a", 3))
    with pytest.raises(ValueError, match="at least 1 slot"):
        slot_keys("pool", 0)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown lock family 'mutexes'"):
        advisory_key("mutexes", "a")
    with pytest.raises(ValueError, match="non-empty str"):
        advisory_key("mutex", "")
    with pytest.raises(ValueError, match="signed 64-bit"):
        split_key(1 << 63)


def test_split_key_matches_pg_locks_layout() -> None:
    assert split_key(0) == (0, 0)
    assert split_key(-1) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert split_key((5 << 32) | 7) == (5, 7)


@pytest.mark.postgres
@pytest.mark.asyncio
async def test_server_computes_the_same_key_and_shows_it_in_pg_locks(
    postgres_server: PostgresServer, connect: Connect, unique: str
) -> None:
    conn = await connect()
    names = [f"{unique}/a", f"{unique}/ü/€", "x" * 1024]
    for name in names:
        text = key_text("mutex", name)
        assert await conn.fetchval(f"SELECT {KEY_SQL}", text) == advisory_key("mutex", name)
    keys = [advisory_key("mutex", name) for name in names]
    for key in keys:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
    pid = conn.get_server_pid()
    seen = {(p, k, m) for p, k, m, _granted in postgres_server.advisory_locks() if p == pid}
    assert seen == {(pid, key, "ExclusiveLock") for key in keys}
    await conn.execute("SELECT pg_advisory_unlock_all()")
    assert [lock for lock in postgres_server.advisory_locks() if lock[0] == pid] == []
