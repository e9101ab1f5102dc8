"""Event hooks and the Prometheus exporter."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

import aiolocks
from aiolocks.prometheus import PrometheusHook

pytestmark = pytest.mark.asyncio


async def test_events_for_a_lock_lifecycle() -> None:
    events: list[aiolocks.LockEvent] = []
    async with aiolocks.connect("memory://events") as backend:
        backend.add_event_hook(events.append)
        lock = backend.mutex("ev/a")
        async with lock:
            async with lock:  # re-entry: no server hold, no event
                pass
            assert await asyncio.create_task(lock.acquire(timeout=0)) is False
            waiter = asyncio.create_task(lock.acquire())
            await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        kinds = [e.kind for e in events]
        assert kinds == ["acquired", "timeout", "cancelled", "released"]
        acquired, timeout, cancelled, released = events
        assert acquired.lock_kind == "mutex"
        assert acquired.name == "ev/a"
        assert acquired.backend == "memory://events"
        assert acquired.fencing_token == released.fencing_token
        assert acquired.wait_time is not None and acquired.wait_time >= 0
        assert cancelled.wait_time is not None and cancelled.wait_time > 0
        assert released.hold_time is not None and released.hold_time > 0
        assert timeout.fencing_token is None

        events.clear()
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                hold = lock._current_hold()
                assert hold is not None
                hold.grant.mark_lost("test")
                await asyncio.sleep(1)
        assert [e.kind for e in events] == ["acquired", "lost", "released"]
        assert events[1].reason == "test"

        events.clear()

        async def forget() -> None:
            await lock.acquire()

        await asyncio.create_task(forget())
        for _ in range(5):
            await asyncio.sleep(0)
        assert [e.kind for e in events] == ["acquired", "orphaned", "released"]


async def test_broken_hook_does_not_break_locking(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: aiolocks.LockEvent) -> None:
        raise RuntimeError("metrics are down")

    async with aiolocks.connect("memory://events-broken") as backend:
        backend.add_event_hook(broken)
        async with backend.mutex("ev/b") as lock:
            assert lock.is_owned_by_current_task()
        backend.remove_event_hook(broken)
        backend.remove_event_hook(broken)  # not registered any more: ignored
        with pytest.raises(TypeError, match="callable"):
            backend.add_event_hook("nope")  # type: ignore[arg-type]
    assert any("event hook" in r.getMessage() for r in caplog.records)


async def test_prometheus_hook_records_metrics() -> None:
    registry = CollectorRegistry()
    hook = PrometheusHook(registry)
    async with aiolocks.connect("memory://events-prom") as backend:
        backend.add_event_hook(hook)
        lock = backend.mutex("ev/p")
        for _ in range(3):
            async with lock:
                await asyncio.sleep(0.001)
        assert await lock.acquire()
        assert await asyncio.create_task(lock.acquire(timeout=0)) is False
        labels = {"backend": "memory://events-prom", "kind": "mutex"}
        assert registry.get_sample_value("aiolocks_holds", labels) == 1
        await lock.release()
        assert registry.get_sample_value("aiolocks_acquire_wait_seconds_count", labels) == 4
        assert registry.get_sample_value("aiolocks_hold_seconds_count", labels) == 4
        assert registry.get_sample_value("aiolocks_acquire_timeouts_total", labels) == 1
        assert registry.get_sample_value("aiolocks_holds", labels) == 0


async def test_leader_latch_events_follow_its_holds() -> None:
    """A leadership term is a hold: acquired, then lost or released; never only acquired."""
    events: list[aiolocks.LockEvent] = []
    async with aiolocks.connect("memory://events-leader") as backend:
        backend.add_event_hook(events.append)
        first = backend.leader_latch("ev/leader", participant_id="a")
        second = backend.leader_latch("ev/leader", participant_id="b")
        await first.start()
        assert await first.wait_for_leadership(5)
        await second.start()
        term = first.fencing_token
        hold = first._hold
        assert hold is not None
        hold.grant.mark_lost("test: lease lapsed")
        assert await second.wait_for_leadership(5)
        second_term = second.fencing_token
        await second.close()
        assert await first.wait_for_leadership(5)
        third_term = first.fencing_token
        await first.close()
        assert all(e.lock_kind == "leader latch" and e.name == "ev/leader" for e in events)
        by_token: dict[int | None, list[str]] = {}
        for event in events:
            by_token.setdefault(event.fencing_token, []).append(event.kind)
        assert by_token[term] == ["acquired", "lost", "released"]
        assert by_token[second_term] == ["acquired", "released"]
        assert by_token[third_term] == ["acquired", "released"]
        lost = next(e for e in events if e.kind == "lost")
        assert lost.reason == "test: lease lapsed"


async def test_leader_latch_gauge_returns_to_zero() -> None:
    registry = CollectorRegistry()
    hook = PrometheusHook(registry)
    async with aiolocks.connect("memory://events-leader-prom") as backend:
        backend.add_event_hook(hook)
        labels = {"backend": "memory://events-leader-prom", "kind": "leader latch"}
        latches = [backend.leader_latch("ev/leader-g", participant_id=str(i)) for i in range(3)]
        for latch in latches:
            await latch.start()
        assert await latches[0].wait_for_leadership(5)
        assert registry.get_sample_value("aiolocks_holds", labels) == 1
        await latches[0].close()
        assert await latches[1].wait_for_leadership(5)
        assert registry.get_sample_value("aiolocks_holds", labels) == 1
        hold = latches[1]._hold
        assert hold is not None
        hold.grant.mark_lost("test")
        assert await latches[2].wait_for_leadership(5)
        assert registry.get_sample_value("aiolocks_holds", labels) == 1
        assert registry.get_sample_value("aiolocks_holds_lost_total", labels) == 1
        await latches[2].close()
        await latches[1].close()
        assert registry.get_sample_value("aiolocks_holds", labels) == 0
    # still open while the backend closes with a leader: the gauge comes back too
    registry2 = CollectorRegistry()
    hook2 = PrometheusHook(registry2)
    backend = await aiolocks.connect("memory://events-leader-close")
    backend.add_event_hook(hook2)
    latch = backend.leader_latch("ev/leader-c")
    await latch.start()
    assert await latch.wait_for_leadership(5)
    labels = {"backend": "memory://events-leader-close", "kind": "leader latch"}
    assert registry2.get_sample_value("aiolocks_holds", labels) == 1
    await backend.close()
    assert registry2.get_sample_value("aiolocks_holds", labels) == 0
