"""``doctor`` for ``memory://``: no server, so nothing to misconfigure but the scope."""

from __future__ import annotations

from .._core.doctor import Diagnosis, Finding, Severity

__all__ = ["diagnose"]


def diagnose(url: str) -> Diagnosis:
    """One info finding: these locks coordinate the tasks of this process only."""
    return Diagnosis(
        findings=[
            Finding(
                code="memory-process-local",
                severity=Severity.INFO,
                title=f"{url} keeps its locks in this process",
                breaks=(
                    "other processes and hosts do not see these locks, so they exclude "
                    "only the tasks of this process"
                ),
                fix="use a zk:// or redis:// URL when several processes must exclude each other",
            )
        ],
        timeout=None,
        timeout_name="timeout",
        server_time=None,
    )
