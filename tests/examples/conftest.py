"""Backends for the example tests: every example runs on memory, Redis and ZooKeeper.

ZooKeeper joins by URL with no code change: its parameter runs as soon as
``aiolocks.zookeeper`` imports, and skips (saying why) until then.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: backend label -> fixture giving an object with ``.url`` (None: memory://)
BACKENDS: dict[str, str | None] = {
    "memory": None,
    "redis": "redis_server",
    "zookeeper": "zookeeper_server",
}

#: per backend, the option that makes a crashed holder's lock come back fast
FAST_FAILOVER: dict[str, str] = {
    "redis": "lease_time=4",
    "zookeeper": "session_timeout=4",
}


def zookeeper_missing() -> str | None:
    """Why the ZooKeeper backend cannot be used yet, or None when it can."""
    try:
        importlib.import_module("aiolocks.zookeeper")
    except ImportError as exc:
        return f"aiolocks.zookeeper does not import yet ({exc}); zk:// examples skipped"
    return None


@pytest.fixture(params=list(BACKENDS))
def example_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(label, URL) of one backend to run an example against."""
    label: str = request.param
    if label == "zookeeper":
        reason = zookeeper_missing()
        if reason is not None:
            pytest.skip(reason)
    fixture = BACKENDS[label]
    if fixture is None:
        return label, "memory://"
    server = request.getfixturevalue(fixture)
    url: str = server.url
    return label, url


@pytest.fixture
def example_url(example_backend: tuple[str, str]) -> str:
    """The URL of one backend to run an example against."""
    return example_backend[1]


def with_option(url: str, option: str | None) -> str:
    """``url`` with one more query option."""
    if not option:
        return url
    return url + ("&" if "?" in url else "?") + option


def run_example(script: str, *args: str, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    """Run ``python examples/<script>.py ARGS`` as a user would, from the repository root."""
    env = dict(os.environ)
    env.pop("AIOLOCKS_URL", None)
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{script}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )
