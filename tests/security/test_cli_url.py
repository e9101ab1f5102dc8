"""``--url-file``/``AIOLOCKS_URL_FILE``, and no ``AIOLOCKS_URL`` for the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiolocks.testing.servers import RedisServer

from .conftest import LOCKER_PASSWORD, locker_url

CLI = [sys.executable, "-m", "aiolocks"]
#: prints what the command finds in its environment
SHOW_ENV = 'echo "url=${AIOLOCKS_URL-unset} file=${AIOLOCKS_URL_FILE-unset}"'


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``aiolocks ARGS`` in a subprocess, as a user runs it."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOLOCKS_URL")}
    return {**env, **extra}


@pytest.mark.parametrize("command", ["run", "elect"])
def test_command_does_not_get_the_url(command: str, tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("memory://\n")
    env = _env(AIOLOCKS_URL="memory://", AIOLOCKS_URL_FILE=str(url_file))
    result = run(command, "--local", "-n", "sec/env", "--", "sh", "-c", SHOW_ENV, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"url=unset file={url_file}"


@pytest.mark.redis
def test_url_file_option_and_environment(secure_redis: RedisServer, tmp_path: Path) -> None:
    url_file = tmp_path / "aiolocks.url"
    url_file.write_text(f"# the lock server\n{locker_url(secure_redis)}\n")
    url_file.chmod(0o600)
    result = run("status", "--url-file", str(url_file), "sec/file", env=_env())
    assert result.returncode == 0, result.stderr
    assert LOCKER_PASSWORD not in result.stdout + result.stderr
    result = run("list", "--json", env=_env(AIOLOCKS_URL_FILE=str(url_file)))
    assert result.returncode == 0, result.stderr
    assert LOCKER_PASSWORD not in result.stdout + result.stderr
    # the file wins over AIOLOCKS_URL
    env = _env(AIOLOCKS_URL_FILE=str(url_file), AIOLOCKS_URL="redis://127.0.0.1:1/0")
    assert run("status", "sec/file", env=env).returncode == 0


@pytest.mark.redis
def test_url_file_with_a_wrong_password_exits_77(secure_redis: RedisServer, tmp_path: Path) -> None:
    url_file = tmp_path / "aiolocks.url"
    url_file.write_text(locker_url(secure_redis, password="N0tThePassw0rd") + "\n")
    result = run("status", "--url-file", str(url_file), "sec/file", env=_env())
    assert result.returncode == 77, result.stderr
    assert "N0tThePassw0rd" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, [], "cannot read the URL file"),
        ("", [], "must hold one URL, found 0"),
        ("memory://\nmemory://\n", [], "must hold one URL, found 2"),
        ("memory://\n", ["memory://"], "not both"),
    ],
)
def test_url_file_usage_errors(
    content: str | None, args: list[str], message: str, tmp_path: Path
) -> None:
    url_file = tmp_path / "url"
    if content is not None:
        url_file.write_text(content)
    result = run("status", "--url-file", str(url_file), *args, "sec/x", env=_env())
    assert result.returncode == 64
    assert message in result.stderr, result.stderr
