"""Acquire errors by kind, connection-state gauge, and OpenTelemetry spans."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

import aiolocks
from aiolocks.opentelemetry import OpenTelemetryHook
from aiolocks.prometheus import PrometheusHook
from aiolocks.testing import RedisServer, ZooKeeperServer
from aiolocks.zookeeper import ConnectionState, ZooKeeperBackend


def tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.mark.asyncio
async def test_otel_spans_for_acquire_and_hold() -> None:
    provider, exporter = tracing()
    tracer = provider.get_tracer("test")
    async with aiolocks.connect("memory://otel") as backend:
        backend.add_event_hook(OpenTelemetryHook(tracer_provider=provider))
        lock = backend.mutex("otel/a")
        with tracer.start_as_current_span("request") as request_span:
            async with lock:
                token = lock.fencing_token
                assert await asyncio.create_task(lock.acquire(timeout=0)) is False
        with pytest.raises(aiolocks.LockLostError):
            async with lock:
                hold = lock._current_hold()
                assert hold is not None
                hold.grant.mark_lost("test loss")
                await asyncio.sleep(1)
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert names == [
        "aiolocks.acquire",
        "aiolocks.acquire",
        "aiolocks.hold",
        "request",
        "aiolocks.acquire",
        "aiolocks.hold",
    ]
    acquired, timed_out, held, request, _, lost = spans
    assert acquired.attributes is not None
    assert dict(acquired.attributes) == {
        "aiolocks.lock.name": "otel/a",
        "aiolocks.lock.kind": "mutex",
        "aiolocks.backend": "memory://otel",
        "aiolocks.fencing_token": token,
        "aiolocks.outcome": "acquired",
    }
    assert acquired.parent is not None
    assert acquired.parent.span_id == request_span.get_span_context().span_id
    assert acquired.status.status_code is StatusCode.UNSET
    assert timed_out.status.status_code is StatusCode.ERROR
    assert held.status.status_code is StatusCode.UNSET
    assert held.start_time is not None and held.end_time is not None
    assert held.start_time <= held.end_time
    assert lost.status.status_code is StatusCode.ERROR
    assert lost.attributes is not None
    assert lost.attributes["aiolocks.lost_reason"] == "test loss"
    assert request.name == "request"


@pytest.mark.asyncio
@pytest.mark.redis
async def test_acquire_errors_are_counted_by_kind(redis_restartable: RedisServer) -> None:
    registry = CollectorRegistry()
    prom = PrometheusHook(registry)
    provider, exporter = tracing()
    # a short lease: the failed attempt's clean-up retries until the lease
    # would have lapsed (30 s by default) before the error reaches the caller
    url = redis_restartable.url + "?connect_timeout=1&lease_time=2"
    async with aiolocks.connect(url) as backend:
        prom.attach(backend)
        backend.add_event_hook(OpenTelemetryHook(tracer_provider=provider))
        redis_restartable.stop()
        with pytest.raises(aiolocks.BackendUnavailableError):
            await backend.mutex("obs/down").acquire(timeout=1)
    labels = {"backend": backend.url, "kind": "mutex", "error": "BackendUnavailableError"}
    assert registry.get_sample_value("aiolocks_acquire_errors_total", labels) == 1
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["aiolocks.error"] == "BackendUnavailableError"


@pytest.mark.asyncio
@pytest.mark.zookeeper
async def test_connection_state_gauge(zookeeper_restartable: ZooKeeperServer) -> None:
    registry = CollectorRegistry()
    prom = PrometheusHook(registry)
    backend = await aiolocks.connect(zookeeper_restartable.url + "?session_timeout=30")
    assert isinstance(backend, ZooKeeperBackend)
    try:
        detach = prom.attach(backend)

        def value(state: ConnectionState) -> float | None:
            return registry.get_sample_value(
                "aiolocks_connection_state", {"backend": backend.url, "state": state.value}
            )

        assert value(ConnectionState.CONNECTED) == 1
        states: asyncio.Queue[ConnectionState] = asyncio.Queue()
        backend.add_connection_listener(states.put_nowait)
        await asyncio.to_thread(zookeeper_restartable.stop)
        assert await asyncio.wait_for(states.get(), 60) is ConnectionState.SUSPENDED
        assert value(ConnectionState.SUSPENDED) == 1
        assert value(ConnectionState.CONNECTED) == 0
        await asyncio.to_thread(zookeeper_restartable.start)
        assert await asyncio.wait_for(states.get(), 60) is ConnectionState.RECONNECTED
        assert value(ConnectionState.RECONNECTED) == 1
        assert value(ConnectionState.SUSPENDED) == 0
        detach()
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_attach_on_a_backend_without_connection_states() -> None:
    registry = CollectorRegistry()
    prom = PrometheusHook(registry)
    async with aiolocks.connect("memory://obs") as backend:
        detach = prom.attach(backend)
        async with backend.mutex("obs/a"):
            pass
        detach()
        async with backend.mutex("obs/a"):  # not recorded any more
            pass
    labels = {"backend": "memory://obs", "kind": "mutex"}
    assert registry.get_sample_value("aiolocks_acquire_wait_seconds_count", labels) == 1
    states = [m for m in registry.collect() if m.name == "aiolocks_connection_state"]
    assert [m.samples for m in states] == [[]]
