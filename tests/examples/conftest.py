"""Backends for the example tests: every example runs on memory, Redis and ZooKeeper;
the multi-process payment tests run on the four lock servers (ZooKeeper, Redis,
etcd, PostgreSQL), with their data in PostgreSQL.

ZooKeeper joins by URL with no code change: its parameter runs as soon as
``aiolocks.zookeeper`` imports, and skips (saying why) until then.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aiolocks.testing import PostgresServer
from examples import shop

from ..polling import eventually

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


#: lock server label -> (fixture, URL option): a lock broken by force_release is seen
#: lost at once (ZooKeeper, etcd: a watch; PostgreSQL: the session ends) or at the
#: next renewal (Redis: every lease_time / 3)
LOCK_SERVERS: dict[str, tuple[str, str | None]] = {
    "zookeeper": ("zookeeper_server", None),
    "redis": ("redis_server", "lease_time=3"),
    "etcd": ("etcd_server", None),
    "postgres": ("postgres_server", None),
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


def run_example(
    script: str, *args: str, timeout: float = 100, module: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``python examples/<script>.py ARGS`` (``module``: ``python -m examples.<script>``)
    as a user would, from the repository root."""
    env = dict(os.environ)
    env.pop("AIOLOCKS_URL", None)
    command = ["-m", f"examples.{script}"] if module else [str(EXAMPLES / f"{script}.py")]
    return subprocess.run(
        [sys.executable, *command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
        check=False,
    )


def lock_server_url(request: pytest.FixtureRequest, label: str) -> str:
    """The URL of the lock server ``label`` (a key of LOCK_SERVERS), started if need be."""
    if label == "zookeeper":
        reason = zookeeper_missing()
        if reason is not None:
            pytest.skip(reason)
    fixture, option = LOCK_SERVERS[label]
    server = request.getfixturevalue(fixture)
    url: str = server.url
    return with_option(url, option)


@contextmanager
def fresh_schema(postgres: PostgresServer) -> Iterator[str]:
    """A schema name of our own for the shop's tables; dropped at the end."""
    schema = f"shop_{uuid.uuid4().hex[:12]}"
    try:
        yield schema
    finally:
        postgres.query(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def shop_settings(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[shop.Settings]:
    """Settings of a payment app in this process: memory:// locks, data in a fresh schema."""
    with fresh_schema(postgres_server) as schema:
        yield shop.Settings(
            database_url=postgres_server.url,
            schema=schema,
            provider_latency=0.01,
            pause_file=str(tmp_path / "pause"),
        )


async def wait_for_file(path: Path) -> str:
    """The text of ``path`` once it exists (the pause hook writes it atomically)."""
    await eventually(path.exists, 60, what=f"{path} to exist", interval=0.02)
    return path.read_text()


def pause_payment(settings: shop.Settings, phase: str) -> tuple[Path, Path]:
    """Ask the next payment of a payment app to pause at ``phase``.

    Returns its ``.held`` file (written once the payment holds the lock and
    pauses) and its ``.taken`` file (delete it to let the payment go on).
    """
    assert settings.pause_file is not None
    pause = Path(settings.pause_file)
    pause.write_text(phase)
    return pause.with_name("pause.held"), pause.with_name("pause.taken")
