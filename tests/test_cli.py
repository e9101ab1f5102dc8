"""The command line, run as a user runs it: real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aiolocks
from aiolocks._core.admin import KINDS as ADMIN_KINDS

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
    result = run(
        "run", "--local", "memory://", "cli/run", "--", sys.executable, "-c", "raise SystemExit(7)"
    )
    assert result.returncode == 7


def test_run_without_command_is_usage_error() -> None:
    result = run("run", "--local", "memory://", "cli/run")
    assert result.returncode == 64
    assert "no command given" in result.stderr


def test_run_missing_program() -> None:
    result = run("run", "--local", "memory://", "cli/run", "--", "/nonexistent/program")
    assert result.returncode == 127


def test_memory_is_refused_where_it_cannot_coordinate_processes(tmp_path: Path) -> None:
    """Two ``aiolocks run memory:// NAME`` would both run at once: refused (64), CMD not run."""
    ran = tmp_path / "ran"
    for command in ("run", "elect"):
        result = run(command, "memory://", "cli/mem", "--", "touch", str(ran))
        assert result.returncode == 64, result.stderr
        assert "one Python process" in result.stderr and "--local" in result.stderr
        assert not ran.exists(), f"{command} ran the command on memory:// without --local"
    for args in (("status", "memory://", "x"), ("list", "memory://"), ("break", "memory://", "x")):
        result = run(*args, "--yes") if args[0] == "break" else run(*args)
        assert result.returncode == 64, result.stderr
        assert "can never see the holds of another process" in result.stderr
    result = run("run", "--local", "memory://", "cli/mem", "--", "touch", str(ran))
    assert result.returncode == 0, result.stderr
    assert ran.exists()


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"aiolocks {aiolocks.__version__}"


def test_unknown_option_shows_the_subcommand_usage() -> None:
    result = run("run", "--local", "memory://", "x", "--bogus", "--", "true")
    assert result.returncode == 64
    assert result.stderr.startswith("usage: aiolocks run "), result.stderr
    assert "aiolocks run: error: unrecognized arguments: --bogus" in result.stderr


@pytest.mark.redis
def test_status_and_list_spell_each_kind_as_break_does(redis_server: object) -> None:
    """One spelling of each lock kind: status keys, list kinds and ``break --kind`` agree."""
    url: str = redis_server.url + "?key_prefix=cli-kinds:"  # type: ignore[attr-defined]
    result = run("status", url, "cli/kinds", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["name"] == "cli/kinds"
    assert sorted(report["locks"]) == sorted(ADMIN_KINDS)
    assert all(rows == [] for rows in report["locks"].values())
    table = run("status", url, "cli/kinds")
    assert "free: no holder and nobody waiting" in table.stdout
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    # a former spelling still works as an input (deprecated), and is printed canonically
    holder = subprocess.Popen(
        [*CLI, "run", "-k", "semaphore_mutex", url, "cli/kinds", "--", *sleeper]
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listing = json.loads(run("list", url, "--json").stdout)["locks"]
            if listing:
                break
            time.sleep(0.05)
        assert [info["kind"] for info in listing] == ["semaphore-mutex"]
        held = json.loads(run("status", url, "cli/kinds", "--json").stdout)["locks"]
        assert len(held["semaphore-mutex"]) == 1
    finally:
        holder.terminate()
        holder.wait(30)


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


@pytest.mark.parametrize(
    ("blocked", "url", "extra"),
    [
        ("asyncpg", "postgresql://app@127.0.0.1:1/db", "postgres"),
        ("grpc", "etcd://127.0.0.1:1", "etcd"),
    ],
)
def test_a_missing_extra_names_the_pip_install_line(blocked: str, url: str, extra: str) -> None:
    """Without asyncpg (grpc), postgresql:// (etcd://) is a usage error naming the extra."""
    script = (
        f"import sys; sys.modules[{blocked!r}] = None\n"  # as if not installed
        "from aiolocks.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for args in (("status", url, "x"), ("run", url, "x", "--", "true")):
        result = subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 64, result.stderr
        assert result.stderr.strip() == (
            f"aiolocks {args[0]}: {url.partition(':')[0]}:// needs {blocked}, "
            f"not installed: pip install 'aiolocks[{extra}]'"
        )
