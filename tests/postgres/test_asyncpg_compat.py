"""asyncpg's private attributes stay behind one version gate (``_asyncpg_compat``).

Every lock kind runs on a real server twice: with the gate as this asyncpg
release sets it, and with the gate forced off (what an untested asyncpg
release gets: public calls only), in both modes. A source scan keeps every
private attribute of another object inside the compat module.
"""

from __future__ import annotations

import ast
import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import aiolocks
from aiolocks.postgres import _asyncpg_compat as compat
from aiolocks.postgres._driver import PostgresAdvisoryDriver
from aiolocks.postgres._sql import configure_keepalives
from aiolocks.testing import PostgresServer, lose

from ..polling import eventually
from .conftest import Connect

pytestmark = pytest.mark.postgres

_PACKAGE = Path(aiolocks.__file__).parent
_POSTGRES = _PACKAGE / "postgres"


@pytest.fixture(params=["gated", "public"])
def gate(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``gated``: the gate as detected; ``public``: forced off (public API only)."""
    if request.param == "public":
        monkeypatch.setattr(compat, "ENABLED", False)
    param: str = request.param
    return param


@pytest.fixture(params=["advisory", "lease"])
def url(request: pytest.FixtureRequest, postgres_server: PostgresServer) -> str:
    """A backend URL in one mode, with an application name of its own."""
    app = f"aiolocks-compat-{uuid.uuid4().hex[:8]}"
    extra = "&mode=lease&lease_time=5" if request.param == "lease" else "&heartbeat=1"
    return f"{postgres_server.url}?sslmode=disable&application_name={app}{extra}"


@pytest_asyncio.fixture
async def pair(url: str, gate: str) -> AsyncIterator[tuple[aiolocks.Backend, aiolocks.Backend]]:
    """Two backends (two 'processes') on the same server; after the test, the first one's
    lock calls must have taken the path the gate says (:func:`_check_path`)."""
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as two:
        yield one, two
        _check_path(one, gate)


@pytest.fixture
def name() -> str:
    """A lock name of this test's own."""
    return f"compat/{uuid.uuid4().hex[:8]}"


def _check_path(backend: aiolocks.Backend, gate: str) -> None:
    """The advisory cycle went where the gate says (lease mode has no private path)."""
    driver = backend._engine.driver
    if not isinstance(driver, PostgresAdvisoryDriver):
        return
    assert driver._primary is not None
    states = [state for _prepared, state in driver._primary.statements.values()]
    assert states
    if gate == "public" or not compat.ENABLED:
        assert all(state is None for state in states)
    else:
        assert all(state is not None for state in states)


@pytest.mark.asyncio
async def test_mutex_excludes_and_fences(
    pair: tuple[aiolocks.Backend, aiolocks.Backend], name: str
) -> None:
    one, two = pair
    mine, rival = one.mutex(name), two.mutex(name)
    tokens = []
    for _ in range(3):
        assert await mine.acquire(timeout=10)
        try:
            assert not await rival.acquire(timeout=0)
            assert mine.fencing_token is not None
            tokens.append(mine.fencing_token)
        finally:
            await mine.release()
    assert await rival.acquire(timeout=10)
    assert rival.fencing_token is not None
    tokens.append(rival.fencing_token)
    await rival.release()
    assert tokens == sorted(set(tokens))


@pytest.mark.asyncio
async def test_read_write_lock_shares_reads_and_excludes_writes(
    pair: tuple[aiolocks.Backend, aiolocks.Backend], name: str
) -> None:
    one, two = pair
    mine, theirs = one.read_write_lock(name), two.read_write_lock(name)
    async with mine.read:
        assert await theirs.read.acquire(timeout=10)  # readers share
        await theirs.read.release()
        assert not await theirs.write.acquire(timeout=0)
    async with theirs.write:
        assert not await mine.read.acquire(timeout=0)
        assert not await mine.write.acquire(timeout=0)
    async with mine.write:
        assert not await theirs.read.acquire(timeout=0)


@pytest.mark.asyncio
async def test_semaphore_counts_leases(
    pair: tuple[aiolocks.Backend, aiolocks.Backend], name: str
) -> None:
    one, two = pair
    first = await one.semaphore(name, 2).acquire(timeout=10)
    second = await two.semaphore(name, 2).acquire(timeout=10)
    assert first is not None and second is not None
    assert await two.semaphore(name, 2).acquire(timeout=0) is None
    await first.release()
    third = await two.semaphore(name, 2).acquire(timeout=10)
    assert third is not None
    await second.release()
    await third.release()


@pytest.mark.asyncio
async def test_lost_hold_is_reported_and_freed(
    pair: tuple[aiolocks.Backend, aiolocks.Backend], name: str
) -> None:
    one, two = pair
    mine, rival = one.mutex(name), two.mutex(name)
    assert await mine.acquire(timeout=10)
    token = mine.fencing_token
    await lose(mine)
    assert mine.is_lost
    assert await rival.acquire(timeout=10)  # given back on the server
    assert rival.fencing_token is not None and token is not None
    assert rival.fencing_token > token
    await rival.release()
    with pytest.raises(aiolocks.LockLostError):
        await mine.release()


@pytest.mark.asyncio
async def test_ended_session_loses_the_advisory_hold(
    postgres_server: PostgresServer, gate: str
) -> None:
    """A session the server ends takes its locks along; the holder is told."""
    app = f"aiolocks-compat-{uuid.uuid4().hex[:8]}"
    url = f"{postgres_server.url}?sslmode=disable&heartbeat=1&application_name={app}"
    async with aiolocks.connect(url) as backend:
        lock = backend.mutex(f"compat/ended/{app}")
        assert await lock.acquire(timeout=10)
        assert await asyncio.to_thread(postgres_server.terminate_backends, application_name=app)
        await eventually(lambda: lock.is_lost, 30, what="the hold reported lost")
        with pytest.raises(aiolocks.LockLostError):
            await lock.release()
        assert await lock.acquire(timeout=10)  # on a new session
        await lock.release()
        _check_path(backend, gate)


@pytest.mark.asyncio
async def test_keepalives_without_the_gate_set_the_server_side_only(
    connect: Connect, gate: str
) -> None:
    conn = await connect()
    client_side = await configure_keepalives(conn, idle=7, interval=2, count=3)
    assert client_side is (gate == "gated" and compat.ENABLED)
    assert await conn.fetchval("SELECT current_setting('tcp_keepalives_idle')") == "7"


def test_the_gate_admits_only_tested_releases() -> None:
    assert compat.gate("0.32.0") and compat.gate("0.29.0") and compat.gate("0.30.1")
    for version in ("0.31.0", "0.33.0", "0.28.0", "1.0.0", "0", "", "dev"):
        assert not compat.gate(version), version


# -- no private attribute of another object outside the compat module --------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_private_names() -> set[str]:
    """Private names aiolocks defines itself (methods, attributes it assigns, module names)."""
    names: set[str] = set()
    for path in [*_POSTGRES.glob("*.py"), *(_PACKAGE / "_core").glob("*.py")]:
        if path.name == "_asyncpg_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return {name for name in names if _private(name)}


def _foreign_private_reads(path: Path, own: set[str]) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and _private(node.attr):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if not on_self and node.attr not in own:
                found.append(f"{where}: .{node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append(f"{where}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_private_attribute_of_a_dependency_outside_the_compat_module() -> None:
    own = _own_private_names()
    found = [
        hit
        for path in sorted(_POSTGRES.glob("*.py"))
        if path.name != "_asyncpg_compat.py"
        for hit in _foreign_private_reads(path, own)
    ]
    assert found == []


def test_the_scan_finds_what_it_must(tmp_path: Path) -> None:
    """The scan is not blind: the accesses this module replaced are each caught."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(conn, prepared, other):\n"
        "    a = conn._protocol.bind_execute\n"
        "    b = getattr(prepared, '_state', None)\n"
        "    c = other._transport\n"
        "    return a, b, c, conn.__class__, self_like._driver\n"
    )
    found = _foreign_private_reads(sample, {"_driver"})
    assert sorted(hit.split(": ", 1)[1] for hit in found) == [
        "._protocol",
        "._transport",
        "getattr(..., '_state')",
    ]
