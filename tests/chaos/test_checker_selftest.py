"""The checker must catch what it claims to catch (negative controls).

A checker that never fails proves nothing, so it is run here against
histories with known violations: a hand-made one, and a real run of the
workers on ``memory://``, whose store is per process, so three processes
"share" a lock that does not exclude them at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .checker import (
    CsRecord,
    Fault,
    LogEntry,
    Register,
    RunSpec,
    WorkerPool,
    analyze,
    run_chaos,
)


def test_analyze_counts_each_kind_of_violation() -> None:
    """Duplicate tokens, interleaved accepted writes, regressions, unreported losses."""
    register = Register()
    log = [
        ("a", 5, "begin", True),
        ("b", 5, "begin", True),  # same token as a: both accepted
        ("a", 5, "commit", True),  # a's commit lands after b's begin: unfenced
        ("b", 5, "commit", True),
        ("c", 9, "begin", True),
        ("d", 7, "begin", False),  # stale: rejected
        ("c", 9, "commit", True),
    ]
    register.log = [LogEntry(i, cs, t, phase, ok) for i, (cs, t, phase, ok) in enumerate(log)]
    register.records = [
        CsRecord("a", 0, 5, 100, 200, "ok", False),
        CsRecord("b", 1, 5, 150, 250, "ok", False),
        CsRecord("c", 0, 9, 300, 400, "ok", False),
        CsRecord("d", 1, 7, 500, 600, "ok", True),  # after c ended, smaller token; rejected
    ]
    report = analyze("selftest", 0, register)
    assert report.duplicate_tokens == 1
    assert report.unfenced == 1
    assert report.token_regressions == 1
    assert report.unreported_losses == 1
    assert report.overlaps == 1  # a and b
    assert report.violations == 4
    assert report.rejected_writes == 1


def test_analyze_accepts_a_clean_history() -> None:
    """Serial holds with increasing tokens, one loss reported: no violation."""
    register = Register()
    log = [("a", 1, "begin", True), ("b", 2, "begin", True), ("a", 1, "commit", False)]
    register.log = [LogEntry(i, cs, t, phase, ok) for i, (cs, t, phase, ok) in enumerate(log)]
    register.records = [
        CsRecord("a", 0, 1, 100, 300, "lost", True),
        CsRecord("b", 1, 2, 200, 400, "ok", False),
    ]
    report = analyze("selftest", 0, register)
    assert report.violations == 0
    assert report.overlaps == 1 and report.overlaps_reported == 1


@pytest.mark.asyncio
async def test_checker_catches_a_lock_that_does_not_exclude(tmp_path: Path) -> None:
    """memory:// is per process: three worker processes are not excluded from each other."""
    spec = RunSpec(
        label="selftest-memory",
        urls=["memory://"] * 3,
        duration=3.0,
        grace=0.2,
        work=0.05,
    )

    def no_faults(pool: WorkerPool) -> dict[str, Fault]:
        return {}

    async def nothing() -> None:
        return None

    async def no_leaks() -> list[str]:
        return []

    report, _, _ = await run_chaos(spec, no_faults, no_leaks, nothing, tmp_path)
    assert report.critical_sections > 10
    assert report.overlaps > 0
    # Tokens restart at 1 in every process: duplicates, and rejected writes
    # that the "lock" never reports as lost.
    assert report.duplicate_tokens > 0
    assert report.unreported_losses > 0
    assert report.violations > 0
