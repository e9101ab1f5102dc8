"""A tiny run of ``python -m benchmarks.postgres``: its shape, and that no lock overlapped.

Never timings (a smoke run's figures mean nothing): the contended rounds
raise when two holders are inside at once, which fails the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiolocks.testing import PostgresServer

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_quick_run_reports_every_contender(postgres_server: PostgresServer) -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.postgres",
            "--quick",
            "--json",
            "--tasks",
            "4",
            "--url",
            postgres_server.url,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    cycle = result["uncontended_cycle_us"]
    for name in (
        "floor",
        "floor+sequence",
        "floor+fencing-row",
        "aiolocks-advisory",
        "aiolocks-lease",
        "for-update",
    ):
        assert cycle[name] > 0
    assert result["uncontended_vs_floor"]["floor"] == 1.0
    assert result["uncontended_vs_floor_per_round"]["floor"] == 1.0
    assert set(result["uncontended_vs_floor_per_round"]) == set(cycle)
    holds = result["contended_holds_per_s"]
    assert set(holds) == {"floor", "aiolocks-advisory", "aiolocks-lease", "for-update"}
    assert all(value > 0 for value in holds.values())
