"""Prometheus metrics for aiolocks (``pip install aiolocks[prometheus]``).

>>> from aiolocks.prometheus import PrometheusHook  # doctest: +SKIP
>>> backend.add_event_hook(PrometheusHook())  # doctest: +SKIP

Metrics (labels ``backend`` and ``kind``; add ``name`` with
``name_label=True``, but mind the cardinality of per-order lock names):

- ``aiolocks_acquire_wait_seconds`` (histogram): time from ``acquire`` to grant
- ``aiolocks_hold_seconds`` (histogram): time from grant to release
- ``aiolocks_acquire_timeouts_total``, ``aiolocks_acquire_cancelled_total``
- ``aiolocks_holds_lost_total``, ``aiolocks_holds_orphaned_total``
- ``aiolocks_lease_renewals_total``
- ``aiolocks_degraded_total``: acquires that took a process-local lock because
  the server was unreachable (``on_unavailable="local"``)
- ``aiolocks_holds`` (gauge): holds granted and not yet released
- ``aiolocks_acquire_errors_total`` (labels ``backend``, ``kind``, ``error``): acquires
  that raised, by error class (``BackendUnavailableError``...)
- ``aiolocks_connection_state`` (gauge, labels ``backend``, ``state``): 1 for the
  backend's current connection state, 0 for the others; for backends that
  report connection states (ZooKeeper, etcd, PostgreSQL), once
  :meth:`PrometheusHook.attach`
  or :meth:`PrometheusHook.watch_connection` was called

>>> hook = PrometheusHook()  # doctest: +SKIP
>>> hook.attach(backend)  # event hook + connection state  # doctest: +SKIP
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, final

from ._core.events import LockEvent
from ._core.states import ReportsConnectionState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from ._core.backend import Backend

__all__ = ["PrometheusHook"]


#: the default histogram buckets, in seconds: 0.5 ms to 60 s
_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class _Metrics:
    """Builds the hook's metrics, all in one registry and namespace."""

    def __init__(self, registry: CollectorRegistry | None, namespace: str) -> None:
        try:
            import prometheus_client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "aiolocks.prometheus needs prometheus_client: pip install 'aiolocks[prometheus]'"
            ) from exc
        self._client = prometheus_client
        self._registry = prometheus_client.REGISTRY if registry is None else registry
        self._namespace = namespace

    def histogram(
        self, name: str, doc: str, labels: list[str], buckets: tuple[float, ...]
    ) -> Histogram:
        return self._client.Histogram(
            name,
            doc,
            labels,
            namespace=self._namespace,
            registry=self._registry,
            buckets=buckets,
        )

    def counter(self, name: str, doc: str, labels: list[str]) -> Counter:
        return self._client.Counter(
            name, doc, labels, namespace=self._namespace, registry=self._registry
        )

    def gauge(self, name: str, doc: str, labels: list[str]) -> Gauge:
        return self._client.Gauge(
            name, doc, labels, namespace=self._namespace, registry=self._registry
        )


@final
class PrometheusHook:
    """An event hook that records aiolocks events as Prometheus metrics."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "aiolocks",
        name_label: bool = False,
        buckets: tuple[float, ...] = _BUCKETS,
    ) -> None:
        metrics = _Metrics(registry, namespace)
        labels = ["backend", "kind", "name"] if name_label else ["backend", "kind"]
        self._name_label = name_label
        self.wait = metrics.histogram(
            "acquire_wait_seconds", "Time from acquire to grant.", labels, buckets
        )
        self.hold = metrics.histogram("hold_seconds", "Time a hold was kept.", labels, buckets)
        self.timeouts = metrics.counter(
            "acquire_timeouts", "Acquires that gave up at their timeout.", labels
        )
        self.cancelled = metrics.counter(
            "acquire_cancelled", "Acquires cancelled while waiting.", labels
        )
        self.lost = metrics.counter(
            "holds_lost", "Holds lost (session expired, lease lapsed, key taken).", labels
        )
        self.orphaned = metrics.counter(
            "holds_orphaned", "Holds whose owner task ended without releasing.", labels
        )
        self.renewals = metrics.counter(
            "lease_renewals", "Successful lease renewals by the watchdog.", labels
        )
        self.degraded = metrics.counter(
            "degraded",
            "Acquires that fell back to a process-local lock (server unreachable).",
            labels,
        )
        self.holds = metrics.gauge("holds", "Holds granted and not yet ended.", labels)
        self.errors = metrics.counter(
            "acquire_errors", "Acquires that raised, by error class.", [*labels, "error"]
        )
        self.connection_state = metrics.gauge(
            "connection_state",
            "1 for the current connection state of a backend, 0 for the others.",
            ["backend", "state"],
        )

    def attach(self, backend: Backend) -> Callable[[], None]:
        """Record ``backend``'s events and connection state; returns a function that stops both."""
        backend.add_event_hook(self)
        stop_watching = self.watch_connection(backend)

        def detach() -> None:
            backend.remove_event_hook(self)
            stop_watching()

        return detach

    def watch_connection(self, backend: Backend) -> Callable[[], None]:
        """Keep ``aiolocks_connection_state`` current for ``backend``; returns a remover.

        Backends without connection states (``memory://``, Redis, whose
        client reconnects per command) are ignored: the remover does nothing.
        """
        if not isinstance(backend, ReportsConnectionState):
            return lambda: None
        url = backend.url
        current = backend.connection_state

        def record(state: object) -> None:
            states = type(state) if isinstance(state, enum.Enum) else None
            if states is not None:
                for member in states:
                    self.connection_state.labels(url, str(member.value)).set(0)
            value = state.value if isinstance(state, enum.Enum) else state
            self.connection_state.labels(url, str(value)).set(1)

        if current is not None:
            record(current)
        return backend.add_connection_listener(record)

    def __call__(self, event: LockEvent) -> None:
        """Record one event."""
        values = [event.backend, event.lock_kind]
        if self._name_label:
            values.append(event.name)
        kind = event.kind
        if kind == "acquired":
            self.wait.labels(*values).observe(event.wait_time or 0.0)
            self.holds.labels(*values).inc()
        elif kind == "timeout":
            self.timeouts.labels(*values).inc()
        elif kind == "cancelled":
            self.cancelled.labels(*values).inc()
        elif kind == "failed":
            self.errors.labels(*values, event.reason or "unknown").inc()
        elif kind == "degraded":
            self.degraded.labels(*values).inc()
        elif kind == "renewed":
            self.renewals.labels(*values).inc()
        elif kind == "lost":
            self.lost.labels(*values).inc()
        elif kind == "orphaned":
            self.orphaned.labels(*values).inc()
        elif kind == "released":  # every hold ends with one, lost or orphaned ones too
            self.hold.labels(*values).observe(event.hold_time or 0.0)
            self.holds.labels(*values).dec()
