"""The command line, run as a user runs it: real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "aiolocks"]


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_demo_on_memory_never_oversells() -> None:
    result = run("demo", "--workers", "6", "--stock", "40", "--buyers", "120")
    assert result.returncode == 0, result.stderr
    assert "oversold = 0" in result.stdout
    assert "sold   40" in result.stdout.replace("sold   40,", "sold   40")


def test_demo_rejects_bad_input() -> None:
    result = run("demo", "--url", "nosuch://x")
    assert result.returncode == 64
    assert "unknown URL scheme 'nosuch'" in result.stderr
    result = run("demo", "--workers", "0")
    assert result.returncode == 64
    assert "--workers" in result.stderr


def test_run_passes_exit_code_through() -> None:
    result = run("run", "memory://", "cli/run", "--", sys.executable, "-c", "raise SystemExit(7)")
    assert result.returncode == 7


def test_run_without_command_is_usage_error() -> None:
    result = run("run", "memory://", "cli/run")
    assert result.returncode == 64
    assert "no command given" in result.stderr


def test_run_missing_program() -> None:
    result = run("run", "memory://", "cli/run", "--", "/nonexistent/program")
    assert result.returncode == 127


def test_status_json_on_memory() -> None:
    result = run("status", "memory://", "cli/status", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["name"] == "cli/status"
    assert all(rows == [] for rows in report["locks"].values())


@pytest.mark.redis
def test_run_commands_never_overlap_and_timeout_exits_75(
    redis_server: object, tmp_path: Path
) -> None:
    url: str = redis_server.url  # type: ignore[attr-defined]
    log = tmp_path / "log"
    script = (
        "import sys, time\n"
        f"open({str(log)!r}, 'a').write('start %f\\n' % time.time())\n"
        "time.sleep(0.6)\n"
        f"open({str(log)!r}, 'a').write('end %f\\n' % time.time())\n"
    )
    procs = [
        subprocess.Popen(
            [*CLI, "run", url, "cli/overlap", "--timeout", "30", "--", sys.executable, "-c", script]
        )
        for _ in range(3)
    ]
    time.sleep(0.3)
    busy = run("run", url, "cli/overlap", "--timeout", "0.2", "--", "true")
    assert busy.returncode == 75, busy.stderr
    assert all(p.wait(60) == 0 for p in procs)
    events = [line.split() for line in log.read_text().splitlines()]
    assert len(events) == 6
    kinds = [kind for kind, _ in events]
    assert kinds == ["start", "end"] * 3, f"critical sections overlapped: {events}"


@pytest.mark.redis
def test_run_lost_lock_terminates_command_and_exits_76(redis_server: object) -> None:
    base: str = redis_server.url  # type: ignore[attr-defined]
    url = base + "?lease_time=0.6&key_prefix=cli-lost:"
    proc = subprocess.Popen(
        [*CLI, "run", url, "cli/lost", "--", sys.executable, "-c", "import time; time.sleep(60)"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    deleted = 0
    while time.monotonic() < deadline and not deleted:
        keys = redis_server.command("KEYS", "cli-lost:*")  # type: ignore[attr-defined]
        lock_keys = [k for k in keys if "fence" not in k]
        for key in lock_keys:
            deleted += redis_server.command("DEL", key)  # type: ignore[attr-defined]
        time.sleep(0.05)
    assert deleted, "the lock key never appeared"
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 76, err
    assert "lost" in err


@pytest.mark.redis
def test_status_shows_holder(redis_server: object) -> None:
    url: str = redis_server.url  # type: ignore[attr-defined]
    sleeper = [sys.executable, "-c", "import time; time.sleep(5)"]
    holder = subprocess.Popen([*CLI, "run", url, "cli/status-held", "--", *sleeper])
    try:
        deadline = time.monotonic() + 20
        while True:
            result = run("status", url, "cli/status-held", "--json")
            assert result.returncode == 0, result.stderr
            rows = json.loads(result.stdout)["locks"]["mutex"]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(rows) == 1
        assert rows[0]["is_holder"] is True
        assert isinstance(rows[0]["fencing_token"], int)
        table = run("status", url, "cli/status-held")
        assert "holder" in table.stdout
    finally:
        holder.terminate()
        holder.wait(30)
