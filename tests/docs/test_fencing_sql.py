"""The fenced SQL write of docs/fencing.md, on every backend, with SQLite from the stdlib.

``UPDATE ... WHERE fence < :token`` must accept the writes of successive
holds, refuse a holder whose token was overtaken (a stall past its lease or
session), and store tokens of every backend without overflow (Redis tokens
are about 1.8e15). The ``(epoch, token)`` variant must accept the first
write after a switch of backend and refuse late writes of the old one.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator

import pytest

import aiolocks

FENCED = "UPDATE orders SET state = ?, fence = ? WHERE id = ? AND fence < ?"
EPOCH_FENCED = """
    UPDATE orders SET state = :state, fence_epoch = :epoch, fence = :token
     WHERE id = :id
       AND (fence_epoch < :epoch OR (fence_epoch = :epoch AND fence < :token))
"""


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:")
    connection.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT NOT NULL, "
        "fence_epoch INTEGER NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT -1)"
    )
    connection.execute("INSERT INTO orders (id, state) VALUES (1001, 'new')")
    yield connection
    connection.close()


@pytest.fixture(params=["memory", "redis", "zookeeper"])
def url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return f"memory://fencing-{uuid.uuid4().hex[:8]}"
    fixture = "redis_server" if request.param == "redis" else "zookeeper_server"
    return str(request.getfixturevalue(fixture).url)


def _write(db: sqlite3.Connection, state: str, token: int) -> bool:
    changed = db.execute(FENCED, (state, token, 1001, token)).rowcount
    db.commit()
    return changed == 1


@pytest.mark.asyncio
async def test_successive_holds_write_and_an_overtaken_holder_is_refused(
    url: str, db: sqlite3.Connection
) -> None:
    name = f"docs/fencing/{uuid.uuid4().hex[:8]}"
    tokens: list[int] = []
    async with aiolocks.connect(url) as backend:
        for state in ("paid", "shipped", "delivered"):
            async with backend.mutex(name).hold(timeout=10) as lock:
                token = lock.fencing_token
                assert token is not None
                assert _write(db, state, token)
                tokens.append(token)
    assert tokens == sorted(set(tokens))
    stored = db.execute("SELECT state, fence FROM orders WHERE id = 1001").fetchone()
    assert stored == ("delivered", tokens[-1])  # full 64-bit value kept
    # every earlier holder, waking up late, is refused and changes nothing
    for stale in tokens:
        assert not _write(db, "paid", stale)
    assert db.execute("SELECT state FROM orders").fetchone() == ("delivered",)


@pytest.mark.asyncio
async def test_concurrent_holders_leave_the_highest_token(
    url: str, db: sqlite3.Connection
) -> None:
    name = f"docs/fencing/{uuid.uuid4().hex[:8]}"
    accepted: list[int] = []

    async def worker(backend: aiolocks.Backend, index: int) -> None:
        for round_ in range(3):
            async with backend.mutex(name).hold(timeout=30) as lock:
                assert lock.fencing_token is not None
                assert _write(db, f"w{index}-{round_}", lock.fencing_token)
                accepted.append(lock.fencing_token)
                await asyncio.sleep(0)

    async with aiolocks.connect(url) as first, aiolocks.connect(url) as second:
        await asyncio.gather(*(worker(b, i) for i, b in enumerate([first, second] * 2)))
    assert len(accepted) == 12
    assert accepted == sorted(accepted), "a write under the lock saw an older token"
    assert db.execute("SELECT fence FROM orders").fetchone() == (accepted[-1],)


def test_epoch_lets_the_first_write_after_a_switch_through(db: sqlite3.Connection) -> None:
    def write(state: str, epoch: int, token: int) -> bool:
        params = {"id": 1001, "state": state, "epoch": epoch, "token": token}
        changed = db.execute(EPOCH_FENCED, params).rowcount
        db.commit()
        return changed == 1

    redis_token, zk_token = 1_796_137_907_134_996, 300_125
    assert not _write(db, "x", -1)  # sanity: equal tokens are refused
    assert write("paid", 1, redis_token)
    # a plain token check would refuse the first write on the new backend...
    assert not _write(db, "shipped", zk_token)
    # ...the epoch lets it through, and then refuses the old era and stale holds
    assert write("shipped", 2, zk_token)
    assert not write("paid", 1, redis_token + 1)
    assert not write("paid", 2, zk_token - 1)
    assert not write("paid", 2, zk_token)
    assert write("delivered", 2, zk_token + 1)
    assert db.execute("SELECT state, fence_epoch, fence FROM orders").fetchone() == (
        "delivered",
        2,
        zk_token + 1,
    )
