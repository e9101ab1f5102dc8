"""Watchdog renewals reach the event hooks."""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks.testing import RedisServer

from ..polling import eventually

pytestmark = pytest.mark.asyncio


async def test_watchdog_renewals_are_events(redis_server: RedisServer) -> None:
    events: list[aiolocks.LockEvent] = []
    async with aiolocks.connect(redis_server.url, key_prefix="test-events:") as backend:
        backend.add_event_hook(events.append)
        lock = backend.mutex("ev/renew", lease_time=0.3)
        async with lock:
            # held past its 0.3 s lease: renewed (twice) by the watchdog
            await eventually(
                lambda: sum(e.kind == "renewed" for e in events) >= 2, what="two renewals"
            )
        renewals = [e for e in events if e.kind == "renewed"]
        assert len(renewals) >= 2
        assert all(e.fencing_token == events[0].fencing_token for e in renewals)
        assert events[0].kind == "acquired" and events[-1].kind == "released"
