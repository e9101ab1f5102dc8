"""``aiolocks run``/``elect`` process handling, run as a user runs it.

The command runs in its own process group; signals reach the whole group;
on loss the group gets TERM then KILL; ``aiolocks run`` returns only when no
process of the group is left. Each test writes the pids of the command and
of its grandchildren to files and checks afterwards, with ``kill(pid, 0)``
and ``killpg(pgid, 0)``, that none of them is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiolocks.testing import RedisServer, ZooKeeperServer

CLI = [sys.executable, "-m", "aiolocks"]

# A grandchild that ignores TERM: only KILL ends it.
# A grandchild that ignores TERM (only KILL ends it) and forks a child of its
# own that ignores TERM too; both write their pids.
IGNORES_TERM = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if os.fork() == 0:\n"
    "    open(sys.argv[1] + '-child', 'w').write(str(os.getpid()))\n"
    "    while True: time.sleep(1)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "while True: time.sleep(1)\n"
)


def wait_for_file(path: Path, proc: subprocess.Popen[str], limit: float = 60) -> str:
    """The content of ``path`` once written (fails if ``proc`` ends first)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"aiolocks exited {proc.returncode} before {path.name} appeared: {err}")
        time.sleep(0.05)
    pytest.fail(f"{path.name} never appeared")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose: it runs no code
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """Pids a test started indirectly; KILLed at the end if a test failed to end them."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def forking_command(tmp_path: Path) -> list[str]:
    """sh (the leader) -> a TERM-ignoring grandchild and a double-forked sleeper."""
    return [
        "sh",
        "-c",
        # $$ is the leader (= the group id); the subshell forks a sleeper and
        # exits at once, so the sleeper is re-parented (a double fork)
        f"echo $$ > {tmp_path}/leader; "
        f'{sys.executable} -c "$1" {tmp_path}/stubborn & '
        f"( sleep 300 & echo $! > {tmp_path}/orphan ); "
        "wait",
        "sh",
        IGNORES_TERM,
    ]


def assert_all_gone(tmp_path: Path) -> None:
    leader = int((tmp_path / "leader").read_text())
    for name in ("stubborn", "stubborn-child", "orphan"):
        path = tmp_path / name
        if path.exists() and path.read_text().strip():
            pid = int(path.read_text())
            assert not pid_alive(pid), f"{name} (pid {pid}) outlived aiolocks run"
    assert not pid_alive(leader)
    assert not group_alive(leader), "a process of the command's group is still running"


def wait_all_started(
    tmp_path: Path,
    proc: subprocess.Popen[str],
    reaper: list[int],
    names: tuple[str, ...] = ("leader", "stubborn", "stubborn-child", "orphan"),
) -> None:
    for name in names:
        reaper.append(int(wait_for_file(tmp_path / name, proc)))


# -- exit statuses and the environment, on memory:// ------------------------------


def test_exit_status_of_a_signalled_command_is_128_plus_n() -> None:
    proc = start("run", "--local", "memory://", "cli/sig", "--", "sh", "-c", "kill -TERM $$")
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    proc = start("run", "--local", "memory://", "cli/sig", "--", "sh", "-c", "kill -KILL $$")
    code, err = finish(proc)
    assert code == 128 + signal.SIGKILL, err


def test_command_status_passes_through() -> None:
    code, err = finish(start("run", "--local", "memory://", "cli/st", "--", "sh", "-c", "exit 42"))
    assert code == 42, err
    code, err = finish(start("run", "--local", "memory://", "cli/st", "--", "true"))
    assert code == 0, err


def test_missing_and_non_executable_commands(tmp_path: Path) -> None:
    code, err = finish(start("run", "--local", "memory://", "cli/x", "--", "/nonexistent/program"))
    assert code == 127
    assert "/nonexistent/program" in err
    script = tmp_path / "noexec.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    code, err = finish(start("run", "--local", "memory://", "cli/x", "--", str(script)))
    assert code == 126, err


def test_child_environment_has_token_name_and_kind() -> None:
    show = 'echo "$AIOLOCKS_LOCK_NAME|$AIOLOCKS_LOCK_KIND|$AIOLOCKS_FENCING_TOKEN"'
    proc = start("run", "--local", "memory://", "/cli/env", "--", "sh", "-c", show)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    name, kind, token = out.strip().split("|")
    assert (name, kind) == ("cli/env", "mutex")
    assert int(token) >= 1
    proc = start("run", "--local", "--limit", "2", "memory://", "cli/env", "--", "sh", "-c", show)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().split("|")[1] == "semaphore"
    assert int(out.strip().split("|")[2]) >= 1


def test_command_exit_waits_for_its_background_children(tmp_path: Path) -> None:
    """The leader exits at once; a background child still works: run waits for it."""
    done = tmp_path / "done"
    script = f"(sleep 1; echo late > {done}) & exit 3"
    code, err = finish(start("run", "--local", "memory://", "cli/bg", "--", "sh", "-c", script))
    assert code == 3, err
    assert done.read_text().strip() == "late", "run returned while the group still ran"


# -- signals ----------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_reach_the_whole_group(tmp_path: Path, reaper: list[int], sig: int) -> None:
    script = (
        f"echo $$ > {tmp_path}/leader; "
        f"sleep 300 & echo $! > {tmp_path}/stubborn; "
        f"( sleep 300 & echo $! > {tmp_path}/orphan ); "
        "wait"
    )
    proc = start("run", "--local", "memory://", "cli/signals", "--", "sh", "-c", script)
    wait_all_started(tmp_path, proc, reaper, ("leader", "stubborn", "orphan"))
    proc.send_signal(sig)
    code, err = finish(proc)
    # sh dies of the signal it got (it was waiting in `wait`)
    assert code == 128 + sig, err
    assert_all_gone(tmp_path)


def test_term_escalates_to_kill_after_kill_after(tmp_path: Path, reaper: list[int]) -> None:
    proc = start(
        "run",
        "--local",
        "--kill-after",
        "1",
        "memory://",
        "cli/escalate",
        "--",
        *forking_command(tmp_path),
    )
    wait_all_started(tmp_path, proc, reaper)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err  # the leader (sh) died of TERM
    assert_all_gone(tmp_path)


@pytest.mark.redis
def test_signal_while_waiting_starts_nothing_and_holds_nothing(
    redis_server: RedisServer, tmp_path: Path, reaper: list[int]
) -> None:
    url = redis_server.url + "?key_prefix=cli-wait:"
    holder = start(
        "run", url, "cli/wait", "--", "sh", "-c", f"echo $$ > {tmp_path}/held; exec sleep 300"
    )
    reaper.append(int(wait_for_file(tmp_path / "held", holder)))
    marker = tmp_path / "started"
    waiter = start("run", "-v", url, "cli/wait", "--", "sh", "-c", f"touch {marker}")
    # the waiter waits once it listens on its process's hand-off channel
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        subs = redis_server.command("PUBSUB", "CHANNELS", "cli-wait:grant:*")
        if isinstance(subs, list) and subs:
            break
        if waiter.poll() is not None:
            pytest.fail(f"the waiter ended early: {waiter.communicate()}")
        time.sleep(0.05)
    waiter.send_signal(signal.SIGTERM)
    code, err = finish(waiter)
    assert code == 128 + signal.SIGTERM, err
    assert not marker.exists(), "the command started although the lock was never held"
    # the holder still holds; after it ends, the lock is free for a try-once run
    holder.send_signal(signal.SIGTERM)
    assert finish(holder)[0] == 128 + signal.SIGTERM
    code, err = finish(start("run", "-n", url, "cli/wait", "--", "true"))
    assert code == 0, err


# -- loss -------------------------------------------------------------------------


@pytest.mark.redis
def test_redis_key_deleted_stops_the_whole_group(
    redis_server: RedisServer, tmp_path: Path, reaper: list[int]
) -> None:
    url = redis_server.url + "?lease_time=3&key_prefix=cli-loss:"
    proc = start("run", "--kill-after", "1", url, "cli/loss", "--", *forking_command(tmp_path))
    wait_all_started(tmp_path, proc, reaper)
    assert redis_server.command("DEL", "cli-loss:{mutex:cli/loss}") == 1
    code, err = finish(proc)
    assert code == 76, err
    # the loss is told once, with its reason (the library's own warning is not repeated)
    lost = [line for line in err.splitlines() if "lost" in line]
    assert len(lost) == 1 and "its Redis field is gone" in lost[0], err
    assert_all_gone(tmp_path)
    # and the lock is free again
    code, err = finish(start("run", "-n", url, "cli/loss", "--", "true"))
    assert code == 0, err


@pytest.mark.redis
def test_redis_key_deleted_stops_the_command_long_before_any_renewal(
    redis_server: RedisServer, tmp_path: Path, reaper: list[int]
) -> None:
    """A long lease: the first renewal is 100 s away and the lease runs 300 s, so
    the command can only stop within the 60 s ``finish`` allows because the
    server's keyspace event reported the deletion."""
    url = redis_server.url + "?lease_time=300&key_prefix=cli-prompt:"
    proc = start("run", "--kill-after", "1", url, "cli/prompt", "--", *forking_command(tmp_path))
    wait_all_started(tmp_path, proc, reaper)
    # the hold listens to its key's keyspace events once it is granted
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        subs = redis_server.command(
            "PUBSUB", "NUMSUB", "__keyspace@0__:cli-prompt:{mutex:cli/prompt}"
        )
        if isinstance(subs, list) and subs[1]:
            break
        time.sleep(0.05)
    assert redis_server.command("DEL", "cli-prompt:{mutex:cli/prompt}") == 1
    code, err = finish(proc)
    assert code == 76, err
    assert "lost" in err
    assert_all_gone(tmp_path)
    redis_server.command("DEL", "cli-prompt:{mutex:cli/prompt}:fence")
    code, err = finish(start("run", "-n", url, "cli/prompt", "--", "true"))
    assert code == 0, err


@pytest.mark.zookeeper
def test_zookeeper_session_lost_stops_the_whole_group(
    zookeeper_restartable: ZooKeeperServer, tmp_path: Path, reaper: list[int]
) -> None:
    url = zookeeper_restartable.url + "?session_timeout=4"
    proc = start("run", "--kill-after", "1", url, "cli/zkloss", "--", *forking_command(tmp_path))
    wait_all_started(tmp_path, proc, reaper)
    zookeeper_restartable.stop()
    code, err = finish(proc)
    assert code == 76, err
    assert_all_gone(tmp_path)


@pytest.mark.zookeeper
def test_zookeeper_signal_reaches_group(
    zookeeper_server: ZooKeeperServer, tmp_path: Path, reaper: list[int]
) -> None:
    proc = start(
        "run",
        "--kill-after",
        "1",
        zookeeper_server.url,
        "cli/zksig",
        "--",
        *forking_command(tmp_path),
    )
    wait_all_started(tmp_path, proc, reaper)
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert_all_gone(tmp_path)
    code, err = finish(start("run", "-n", zookeeper_server.url, "cli/zksig", "--", "true"))
    assert code == 0, err


@pytest.mark.redis
def test_elect_leadership_lost_stops_the_group(
    redis_server: RedisServer, tmp_path: Path, reaper: list[int]
) -> None:
    url = redis_server.url + "?lease_time=3&key_prefix=cli-elect:"
    proc = start("elect", "--kill-after", "1", url, "cli/leader", "--", *forking_command(tmp_path))
    wait_all_started(tmp_path, proc, reaper)
    leader = int((tmp_path / "leader").read_text())
    found = redis_server.command("KEYS", "cli-elect:*")
    assert isinstance(found, list)
    keys = [k for k in found if isinstance(k, str) and "fence" not in k]
    assert keys
    for key in keys:
        redis_server.command("DEL", key)
    code, err = finish(proc)
    assert code == 76, err
    # one line for the loss, then what is done about it (the command ignores TERM: KILL)
    assert err.splitlines()[:2] == [
        "aiolocks elect: leadership of 'cli/leader' lost: its Redis field is gone "
        "(deleted, overwritten or expired)",
        f"aiolocks: stopping the command (process group {leader}): TERM, KILL after 1 s",
    ], err
    assert_all_gone(tmp_path)


@pytest.mark.zookeeper
def test_elect_zookeeper_session_lost_stops_the_group(
    zookeeper_restartable: ZooKeeperServer, tmp_path: Path, reaper: list[int]
) -> None:
    url = zookeeper_restartable.url + "?session_timeout=4"
    proc = start(
        "elect", "--kill-after", "1", url, "cli/zkleader", "--", *forking_command(tmp_path)
    )
    wait_all_started(tmp_path, proc, reaper)
    zookeeper_restartable.stop()
    code, err = finish(proc)
    assert code == 76, err
    assert "leadership" in err
    assert_all_gone(tmp_path)
