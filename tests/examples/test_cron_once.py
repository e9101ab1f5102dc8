"""examples/cron_once.py: replicas in real processes, clocks skewed, one run per period."""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks._core.records import SupportsRecords
from examples import cron_once

from .conftest import run_example


def _needs_store(url: str) -> None:
    if not isinstance(aiolocks.connect(url)._backend._driver, SupportsRecords):
        pytest.skip("backend has no record store")


@pytest.mark.asyncio
async def test_one_run_per_period_across_skewed_replicas(
    example_backend: tuple[str, str],
) -> None:
    _, url = example_backend
    _needs_store(url)
    period = 0.5
    summary = await cron_once.launch(url, replicas=3, period=period, periods=8)
    counts = summary.per_period()
    assert max(counts.values()) == 1, f"a period ran twice: {summary.runs}"
    # the server keeps each run's record at_least_for (0.8 period) after its start
    assert min(summary.gaps()) >= 0.8 * period - 0.01, summary.runs
    # liveness (lenient: a loaded machine may make every replica miss a boundary)
    assert len(summary.runs) >= 4, summary.runs


def test_the_script_runs_and_reports() -> None:
    result = run_example("cron_once", "--periods", "3", "--period", "0.3")
    assert result.returncode == 0, result.stderr
    assert "most in one period: 1" in result.stdout
    assert cron_once.RAN.search(result.stdout.splitlines()[0])
