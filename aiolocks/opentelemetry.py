"""OpenTelemetry tracing for aiolocks (``pip install aiolocks[otel]``).

>>> from aiolocks.opentelemetry import OpenTelemetryHook  # doctest: +SKIP
>>> backend.add_event_hook(OpenTelemetryHook())  # doctest: +SKIP

Two spans per hold, built from the backend's events (so they cost nothing
when no hook is registered):

- ``aiolocks.acquire``: from the call to ``acquire`` to its outcome, a child of
  the span active in the acquiring task; status ERROR when it timed out or
  raised (``aiolocks.outcome`` = ``acquired``, ``timeout``, ``cancelled``,
  ``failed``; ``aiolocks.error`` = the error class).
- ``aiolocks.hold``: from grant to release; status ERROR when the hold was
  lost (``aiolocks.lost_reason``) or orphaned.

Attributes on both: ``aiolocks.lock.name``, ``aiolocks.lock.kind``,
``aiolocks.backend`` and, once granted, ``aiolocks.fencing_token``; and
``aiolocks.degraded = True`` on the spans of a hold taken from the
process-local fallback (``on_unavailable="local"``, server unreachable). Lock
names can be many (one per order): use a sampler if that is a concern.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, final

from ._core.events import LockEvent

if TYPE_CHECKING:
    from ._core.backend import Backend

__all__ = ["OpenTelemetryHook"]

_ACQUIRE_OUTCOMES = frozenset({"acquired", "timeout", "cancelled", "failed"})


@final
class OpenTelemetryHook:
    """An event hook that records acquires and holds as OpenTelemetry spans.

    :param tracer_provider: the provider to get the tracer from; the global
        one (``opentelemetry.trace.get_tracer_provider()``) by default
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "aiolocks.opentelemetry needs opentelemetry-api: pip install 'aiolocks[otel]'"
            ) from exc
        self._trace = trace
        self._tracer = trace.get_tracer("aiolocks", tracer_provider=tracer_provider)
        # (backend, kind, name, token) -> why the hold ended badly, until its "released"
        self._troubled: dict[tuple[str, str, str, int | None], str] = {}

    def attach(self, backend: Backend) -> None:
        """Register this hook on ``backend`` (same as ``backend.add_event_hook(hook)``)."""
        backend.add_event_hook(self)

    def _attributes(self, event: LockEvent) -> dict[str, str | int]:
        attributes: dict[str, str | int] = {
            "aiolocks.lock.name": event.name,
            "aiolocks.lock.kind": event.lock_kind,
            "aiolocks.backend": event.backend,
        }
        if event.fencing_token is not None:
            attributes["aiolocks.fencing_token"] = event.fencing_token
        if event.degraded:
            attributes["aiolocks.degraded"] = True
        return attributes

    def _span(
        self, name: str, seconds: float | None, attributes: dict[str, str | int], error: str | None
    ) -> None:
        now = time.time_ns()
        start = now - int((seconds or 0.0) * 1e9)
        span = self._tracer.start_span(name, start_time=start, attributes=attributes)
        if error is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
        span.end(end_time=now)

    def __call__(self, event: LockEvent) -> None:
        """Record one event."""
        kind = event.kind
        if kind in _ACQUIRE_OUTCOMES:
            attributes = self._attributes(event)
            attributes["aiolocks.outcome"] = kind
            error = None
            if kind == "timeout":
                error = "not acquired within the timeout"
            elif kind == "failed":
                error = event.reason or "failed"
                attributes["aiolocks.error"] = error
            self._span("aiolocks.acquire", event.wait_time, attributes, error)
            return
        key = (event.backend, event.lock_kind, event.name, event.fencing_token)
        if kind == "lost":
            self._troubled[key] = f"lost: {event.reason}"
        elif kind == "orphaned":
            self._troubled[key] = "orphaned: its task ended while holding"
        elif kind == "released":
            trouble = self._troubled.pop(key, None)
            attributes = self._attributes(event)
            if trouble is not None and trouble.startswith("lost: "):
                attributes["aiolocks.lost_reason"] = trouble[len("lost: ") :]
            self._span("aiolocks.hold", event.hold_time, attributes, trouble)
