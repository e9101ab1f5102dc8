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
- ``aiolocks_holds`` (gauge): holds granted and not yet released
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from ._core.events import LockEvent

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["PrometheusHook"]


@final
class PrometheusHook:
    """An event hook that records aiolocks events as Prometheus metrics."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "aiolocks",
        name_label: bool = False,
        buckets: tuple[float, ...] = (
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
        ),
    ) -> None:
        try:
            import prometheus_client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "aiolocks.prometheus needs prometheus_client: pip install 'aiolocks[prometheus]'"
            ) from exc
        reg = prometheus_client.REGISTRY if registry is None else registry
        labels = ["backend", "kind", "name"] if name_label else ["backend", "kind"]
        self._name_label = name_label
        self.wait = prometheus_client.Histogram(
            "acquire_wait_seconds",
            "Time from acquire to grant.",
            labels,
            namespace=namespace,
            registry=reg,
            buckets=buckets,
        )
        self.hold = prometheus_client.Histogram(
            "hold_seconds",
            "Time a hold was kept.",
            labels,
            namespace=namespace,
            registry=reg,
            buckets=buckets,
        )
        self.timeouts = prometheus_client.Counter(
            "acquire_timeouts",
            "Acquires that gave up at their timeout.",
            labels,
            namespace=namespace,
            registry=reg,
        )
        self.cancelled = prometheus_client.Counter(
            "acquire_cancelled",
            "Acquires cancelled while waiting.",
            labels,
            namespace=namespace,
            registry=reg,
        )
        self.lost = prometheus_client.Counter(
            "holds_lost",
            "Holds lost (session expired, lease lapsed, key taken).",
            labels,
            namespace=namespace,
            registry=reg,
        )
        self.orphaned = prometheus_client.Counter(
            "holds_orphaned",
            "Holds whose owner task ended without releasing.",
            labels,
            namespace=namespace,
            registry=reg,
        )
        self.renewals = prometheus_client.Counter(
            "lease_renewals",
            "Successful lease renewals by the watchdog.",
            labels,
            namespace=namespace,
            registry=reg,
        )
        self.holds = prometheus_client.Gauge(
            "holds",
            "Holds granted and not yet ended.",
            labels,
            namespace=namespace,
            registry=reg,
        )

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
        elif kind == "renewed":
            self.renewals.labels(*values).inc()
        elif kind == "lost":
            self.lost.labels(*values).inc()
        elif kind == "orphaned":
            self.orphaned.labels(*values).inc()
        elif kind == "released":  # every hold ends with one, lost or orphaned ones too
            self.hold.labels(*values).observe(event.hold_time or 0.0)
            self.holds.labels(*values).dec()
