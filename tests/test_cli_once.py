"""``aiolocks run --at-least-for/--at-most-for``: a command once per period (``backend.once``)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import aiolocks
from aiolocks._core.records import SupportsRecords

CLI = [sys.executable, "-m", "aiolocks"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--at-least-for", "10", "--at-most-for", "5"], "must not exceed"),
        (["--at-least-for", "1", "-w", "3"], "never wait"),
        (["--at-least-for", "1", "--kind", "write"], "no --kind"),
        (["--at-least-for", "1", "--limit", "2"], "no --kind"),
        (["--at-most-for", "0"], "at-most-for"),
    ],
)
def test_bad_periods_are_usage_errors(options: list[str], message: str) -> None:
    result = run("run", "--local", "memory://", "jobs/x", *options, "--", "true")
    assert result.returncode == 64, result.stderr
    assert message in result.stderr


def test_runs_the_command_on_memory() -> None:
    result = run(
        "run", "--local", "-v", "memory://", "jobs/x", "--at-least-for", "30", "-n", "--",
        sys.executable, "-c", "import os; print(os.environ['AIOLOCKS_LOCK_KIND'])",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "once"
    assert "running job 'jobs/x'" in result.stderr


def test_once_per_period_across_processes(redis_server: object, tmp_path: Path) -> None:
    url: str = redis_server.url  # type: ignore[attr-defined]
    if not isinstance(aiolocks.connect(url)._backend._driver, SupportsRecords):
        pytest.skip("backend has no record store")
    name = f"cli-once/{uuid.uuid4().hex[:8]}"
    marks = tmp_path / "runs"
    command = [sys.executable, "-c", f"open({str(marks)!r}, 'a').write('ran\\n')"]
    first = run("run", url, name, "--at-least-for", "60", "--at-most-for", "120", "--", *command)
    assert first.returncode == 0, first.stderr
    second = run("run", url, name, "--at-least-for", "60", "-n", "--", *command)
    assert second.returncode == 75, second.stderr
    assert "already ran this period" in second.stderr
    third = run("run", url, name, "--at-least-for", "60", "-E", "0", "--", *command)
    assert third.returncode == 0, third.stderr
    assert marks.read_text() == "ran\n", "the command ran twice in one period"
