"""``memory://`` records: what the conformance suite cannot see from outside."""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks.memory import MemoryBackend

pytestmark = pytest.mark.asyncio


async def test_an_ephemeral_record_deleted_by_another_client_is_lost() -> None:
    async with MemoryBackend("records-loss") as owner, MemoryBackend("records-loss") as other:
        await owner.open()
        await other.open()
        entry = await owner._driver.records().join("t/members/a", b"x")
        assert entry is not None
        lost: list[str | None] = []
        entry.add_loss_listener(lambda e: lost.append(e.lost_reason))
        assert await other._driver.records().delete("t/members/a")
        assert entry.lost and lost and "deleted by another client" in (lost[0] or "")


async def test_records_of_different_stores_are_apart() -> None:
    async with aiolocks.connect("memory://rec-a") as a, aiolocks.connect("memory://rec-b") as b:
        await a.open()
        await b.open()
        assert await a._driver.records().create("t/x/k", b"1") is not None
        assert await b._driver.records().read("t/x/k") is None
