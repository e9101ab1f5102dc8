"""``python -m benchmarks.tls`` runs end to end with a tiny N: one row per backend,
every figure there (timings are never asserted: a smoke run's figures mean nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis, pytest.mark.zookeeper, pytest.mark.etcd, pytest.mark.slow]

FIGURES = (
    "cycle_plain_us",
    "cycle_tls_us",
    "cycle_ratio",
    "connect_plain_ms",
    "connect_tls_ms",
    "connect_ratio",
)


@pytest.mark.timeout(240)
def test_tls_benchmark_reports_every_backend() -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.tls", "--rounds", "1", "--cycles", "3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [row["backend"] for row in rows] == ["redis", "zookeeper", "etcd"]
    for row in rows:
        if "skipped" in row:  # that server is not installed here
            continue
        assert (row["rounds"], row["cycles"]) == (1, 3)
        for figure in FIGURES:
            assert row[figure] > 0, (row["backend"], figure)
        low, high = row["cycle_ratio_range"]
        assert low <= row["cycle_ratio"] <= high
    assert any("skipped" not in row for row in rows), "no backend ran"


def test_bad_round_count_is_refused() -> None:
    import asyncio

    from benchmarks.tls import UrlPair, measure

    with pytest.raises(ValueError, match="rounds and cycles must be >= 1"):
        asyncio.run(measure(UrlPair("memory://", "memory://"), 0, 10))
