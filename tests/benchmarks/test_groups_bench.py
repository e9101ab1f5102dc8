"""``python -m benchmarks groups`` runs end to end with tiny sizes: one row per backend and
measurement, every figure there (timings are never asserted: a smoke run's figures mean nothing)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis, pytest.mark.zookeeper]

SMALL = ("--members", "5", "--rounds", "1", "--idle", "0.1")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_groups_benchmark_reports_every_measurement() -> None:
    if importlib.util.find_spec("tooz") is None:
        pytest.skip("tooz (the bench extra) is not installed")
    from benchmarks.groups import BACKENDS, MEASUREMENTS

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "groups", *SMALL],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout}\n{proc.stderr}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    ran = [row for row in rows if "skipped" not in row]
    assert ran, "no backend ran"
    expected = [
        (backend, measurement)
        for backend in BACKENDS
        if any(row["backend"] == backend for row in ran)
        for measurement in MEASUREMENTS
    ]
    assert [(row["backend"], row["measurement"]) for row in ran] == expected
    for row in ran:
        assert (row["members"], row["rounds"], row["poll_ms"]) == (5, 1, 10.0)
        for side in ("aiolocks", "tooz"):
            # one round: the median is the p90; a latency is from the call, never negative
            assert row[f"{side}_median"] == row[f"{side}_p90"] >= 0, (row, side)
        if "ratio" in row:
            low, high = row["ratio_range"]
            assert low <= row["ratio"] <= high


@pytest.mark.parametrize(
    ("members", "rounds", "poll", "idle"), [(0, 1, 0.01, 1.0), (5, 0, 0.01, 1.0), (5, 1, 0, 1.0)]
)
def test_bad_sizes_are_refused(members: int, rounds: int, poll: float, idle: float) -> None:
    from benchmarks.groups import Urls, measure

    with pytest.raises(ValueError, match="members and rounds must be >= 1"):
        asyncio.run(measure(Urls("memory://", "memory://"), members, rounds, poll, idle))
