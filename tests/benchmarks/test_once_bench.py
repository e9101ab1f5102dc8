"""``python -m benchmarks once`` runs end to end with a tiny N: one row per backend,
every figure there (timings are never asserted: a smoke run's figures mean nothing;
each period is checked to have run its job exactly once)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.redis
@pytest.mark.zookeeper
@pytest.mark.etcd
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_once_benchmark_reports_every_backend() -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "once", "--rounds", "2", "--firings", "3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [row["backend"] for row in rows] == ["redis", "zookeeper", "etcd", "postgres"]
    redis_row = rows[0]
    assert "skipped" not in redis_row, redis_row
    assert redis_row["once_us"] > 0 and redis_row["setnx_us"] > 0
    low, high = redis_row["ratio_range"]
    assert 0 < low <= redis_row["ratio"] <= high
    for row in rows[1:]:
        if "skipped" in row:  # that server is not installed here
            continue
        assert (row["rounds"], row["firings"], row["replicas"]) == (2, 3, 4)
        low, high = row["once_us_range"]
        assert 0 < low <= row["once_us"] <= high


def test_bad_sizes_are_refused_before_any_connection() -> None:
    from benchmarks.once import compare, once_only

    with pytest.raises(ValueError, match="replicas, rounds and firings must be >= 1"):
        asyncio.run(compare("redis://127.0.0.1:1/0", 2, 0, 10))
    with pytest.raises(ValueError, match="replicas, rounds and firings must be >= 1"):
        asyncio.run(once_only("memory://", 0, 1, 1))


@pytest.mark.asyncio
async def test_a_period_runs_its_job_once_on_memory() -> None:
    """The in-process path of the benchmark, on memory://: a period with two runs raises."""
    from benchmarks.once import once_only

    row = await once_only("memory://", replicas=3, rounds=1, firings=4)
    assert row["once_us"] > 0
