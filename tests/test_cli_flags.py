"""``aiolocks run``/``elect`` flags against real servers, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aiolocks
from aiolocks.testing import RedisServer, ZooKeeperServer

CLI = [sys.executable, "-m", "aiolocks"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str]) -> int:
    """Wait for ``proc`` (reading its pipes); its exit status."""
    proc.communicate(timeout=120)
    return proc.returncode


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {path.name}: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def rendezvous(me: Path, other: Path) -> list[str]:
    """A command that finishes only once ``other`` exists too: proof of overlap."""
    return ["sh", "-c", f"touch {me}; while [ ! -e {other} ]; do sleep 0.05; done"]


def hold_until(flag: Path, started: Path) -> list[str]:
    """A command that signals it runs, then waits for ``flag``."""
    return ["sh", "-c", f"touch {started}; while [ ! -e {flag} ]; do sleep 0.05; done"]


@pytest.fixture(params=["redis", "zookeeper"])
def url(request: pytest.FixtureRequest) -> str:
    """A real server of each kind (a fresh prefix per test on Redis)."""
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return f"{server.url}?key_prefix=cli-{os.getpid()}-{time.monotonic_ns()}:"
    zk: ZooKeeperServer = request.getfixturevalue("zookeeper_server")
    return zk.url


def test_nonblock_and_conflict_exit_code(url: str, tmp_path: Path) -> None:
    name = f"cli/nonblock-{time.monotonic_ns()}"
    flag, started = tmp_path / "flag", tmp_path / "started"
    holder = start("run", url, name, "--", *hold_until(flag, started))
    try:
        wait_for(started, holder)
        busy = run("run", "-n", url, name, "--", "touch", str(tmp_path / "never"))
        assert busy.returncode == 75, busy.stderr
        assert "busy" in busy.stderr
        busy = run("run", "-n", "-E", "0", url, name, "--", "touch", str(tmp_path / "never"))
        assert busy.returncode == 0, busy.stderr
        busy = run("run", "-w", "0.3", "-E", "9", url, name, "--", "true")
        assert busy.returncode == 9, busy.stderr
        assert not (tmp_path / "never").exists()
        # the semaphore_mutex of the same name is another lock: it is free
        other = run("run", "-n", "--kind", "semaphore-mutex", url, name, "--", "true")
        assert other.returncode == 0, other.stderr
    finally:
        flag.touch()
        assert finish(holder) == 0


def test_shared_holds_overlap_and_exclude_writers(url: str, tmp_path: Path) -> None:
    name = f"cli/shared-{time.monotonic_ns()}"
    a, b = tmp_path / "a", tmp_path / "b"
    readers = [
        start("run", "-s", "-w", "60", url, name, "--", *rendezvous(a, b)),
        start("run", "--shared", "-w", "60", url, name, "--", *rendezvous(b, a)),
    ]
    # each reader finishes only once the other one runs too: both held at once
    finished = [finish(r) for r in readers]
    assert finished == [0, 0], [r.communicate() for r in readers]
    flag, started = tmp_path / "flag", tmp_path / "started"
    reader = start("run", "-s", url, name, "--", *hold_until(flag, started))
    try:
        wait_for(started, reader)
        writer = run("run", "-n", "-k", "write", url, name, "--", "true")
        assert writer.returncode == 75, writer.stderr
        another_reader = run("run", "-n", "-s", url, name, "--", "true")
        assert another_reader.returncode == 0, another_reader.stderr
    finally:
        flag.touch()
        assert finish(reader) == 0


def test_limit_gives_n_slots(url: str, tmp_path: Path) -> None:
    name = f"cli/limit-{time.monotonic_ns()}"
    flag = tmp_path / "flag"
    holders = [
        start("run", "--limit", "2", url, name, "--", *hold_until(flag, tmp_path / f"s{i}"))
        for i in range(2)
    ]
    try:
        for i, holder in enumerate(holders):
            wait_for(tmp_path / f"s{i}", holder)
        third = run("run", "-n", "--limit", "2", url, name, "--", "true")
        assert third.returncode == 75, third.stderr
    finally:
        flag.touch()
        assert [finish(h) for h in holders] == [0, 0]
    third = run("run", "-n", "--limit", "2", url, name, "--", "true")
    assert third.returncode == 0, third.stderr


def test_cli_and_python_exclude_each_other(url: str) -> None:
    """The default kind is the Python ``backend.mutex(NAME)``."""
    name = f"cli/python-{time.monotonic_ns()}"

    async def main() -> tuple[int, int]:
        async with aiolocks.connect(url) as backend, backend.mutex(name):
            busy = await _run_async("run", "-n", url, name, "--", "true")
            free = await _run_async("run", "-n", "-k", "semaphore-mutex", url, name, "--", "true")
            return busy, free

    import asyncio

    busy, free = asyncio.run(main())
    assert (busy, free) == (75, 0)


async def _run_async(*args: str) -> int:
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return await proc.wait()


def test_elect_one_leader_at_a_time(url: str, tmp_path: Path) -> None:
    name = f"cli/elect-{time.monotonic_ns()}"
    flag, started = tmp_path / "flag", tmp_path / "started"
    leader = start("elect", "--id", "host-a", url, name, "--", *hold_until(flag, started))
    try:
        wait_for(started, leader)
        follower = run("elect", "-n", url, name, "--", "true")
        assert follower.returncode == 75, follower.stderr
        status = run("status", "--json", url, name)
        assert '"host-a"' in status.stdout, status.stdout
    finally:
        flag.touch()
        assert finish(leader) == 0
    assert run("elect", "-n", url, name, "--", "true").returncode == 0


@pytest.mark.redis
def test_url_from_environment(redis_server: RedisServer) -> None:
    env = {**os.environ, "AIOLOCKS_URL": redis_server.url}
    result = run("run", "cli/env-url", "--", "sh", "-c", "exit 5", env=env)
    assert result.returncode == 5, result.stderr
    result = run("status", "--json", "cli/env-url", env=env)
    assert result.returncode == 0, result.stderr
    env.pop("AIOLOCKS_URL")
    result = run("run", "cli/env-url", "--", "true", env=env)
    assert result.returncode == 64
    assert "AIOLOCKS_URL" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--local", "memory://", "x", "--bogus", "--", "true"], "unrecognized arguments"),
        (["run", "--local", "memory://", "x", "-E", "300", "--", "true"], "exit status 0-255"),
        (["run", "--local", "memory://", "x", "-w", "-1", "--", "true"], "seconds >= 0"),
        (["run", "--local", "memory://", "x", "-n", "-w", "3", "--", "true"], "exclude each other"),
        (["run", "--local", "memory://", "x", "--limit", "0", "--", "true"], "integer >= 1"),
        (
            ["run", "--local", "memory://", "x", "-s", "--limit", "2", "--", "true"],
            "excludes --kind",
        ),
        (["run", "--local", "memory://", "x", "-k", "semaphore", "--", "true"], "--limit"),
        (["run", "--local", "memory://", "a//b", "--", "true"], "a//b"),
        (["run", "nosuch://h", "x", "--", "true"], "unknown URL scheme"),
        (["run", "--local", "memory://", "x"], "no command given"),
        (["status", "memory://", "x", "--", "true"], "unexpected arguments"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_exit_64(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 64, (result.returncode, result.stderr)
    assert message in result.stderr


def test_help_describes_every_argument() -> None:
    for command in ("run", "elect", "status", "demo"):
        result = run(command, "--help")
        assert result.returncode == 0
        assert "examples:" in result.stdout or "example:" in result.stdout or command == "demo"
    top = run("--help")
    assert "exit status" in top.stdout and "AIOLOCKS_URL" in top.stdout


@pytest.mark.redis
def test_options_may_come_between_url_and_name(redis_server: RedisServer) -> None:
    result = run(
        "run", "--local", "memory://", "-n", "cli/mixed", "-E", "9", "--", "sh", "-c", "exit 4"
    )
    assert result.returncode == 4, result.stderr
    result = run("list", redis_server.url, "--json", "cli/")
    assert result.returncode == 0, result.stderr
    assert '"prefix": "cli/"' in result.stdout
