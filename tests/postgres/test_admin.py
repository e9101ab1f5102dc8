"""``list_locks()``/``force_release()`` on PostgreSQL, both modes, against the real server.

``mode=advisory`` force-release ends the holder's server session (the only
way to take an advisory lock from its session): the holder sees the session
end at once. ``mode=lease`` deletes the rows: the holder sees it at its next
renewal.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

import aiolocks
from aiolocks import LockLostError
from aiolocks.postgres._admin import parse_fencing_name
from aiolocks.testing import PostgresServer
from tests.admin_helpers import list_and_kinds, standoff, unique

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio]


async def test_advisory_list_and_kinds(postgres_server: PostgresServer) -> None:
    await list_and_kinds(postgres_server.url)


async def test_lease_list_and_kinds(postgres_server: PostgresServer) -> None:
    await list_and_kinds(postgres_server.url + "?mode=lease&lease_time=10")


async def test_advisory_force_release_ends_the_holders_session(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url + "?heartbeat=2"
    async with standoff(url, unique("adm/pg")) as scene:
        pids = {int(str(p.node).removeprefix("pid:")) for p in await scene.lock.participants()}
        other = scene.holder_side.mutex(unique("adm/pg-other"))  # same backend, other lock
        assert await other.acquire(timeout=10)
        (info,) = await scene.admin_side.list_locks(scene.name)
        assert info.participants[0].is_holder
        assert await scene.admin_side.force_release(scene.name) == 1
        with pytest.raises(LockLostError):
            await asyncio.wait_for(scene.holder, 30)
        assert await asyncio.wait_for(scene.waiting, 30)
        (info,) = await scene.admin_side.list_locks(scene.name)
        assert info.participants[0].fencing_token == scene.waiter.fencing_token
        # the whole session went: the holder's other lock too (documented)
        assert other.is_lost
        with contextlib.suppress(LockLostError):
            await other.release()
        # the admin's own session goes next
        await scene.waiter_alone_then_clear()
        # the backends take locks again afterwards
        again = scene.holder_side.mutex(scene.name)
        assert await again.acquire(timeout=10)
        await again.release()
    # nothing of this test is left on the server
    assert not [row for row in postgres_server.advisory_locks() if row[0] in pids]


async def test_lease_force_release_is_noticed_at_the_next_renewal(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url + "?mode=lease&lease_time=1.5"
    async with standoff(url, unique("adm/pgl")) as scene:
        assert await scene.admin_side.force_release(scene.name) == 1
        assert await asyncio.wait_for(scene.waiting, 30)
        with pytest.raises(LockLostError):
            await asyncio.wait_for(scene.holder, 30)
        await scene.waiter_alone_then_clear()
        assert await scene.admin_side.list_locks(scene.name) == []


async def test_names_with_like_wildcards_are_listed_literally(
    postgres_server: PostgresServer,
) -> None:
    top = unique("adm_%")
    async with aiolocks.connect(postgres_server.url) as backend:
        lock = backend.mutex(f"{top}/a")
        decoy = backend.mutex(unique("admX%"))
        assert await lock.acquire(timeout=10)
        assert await decoy.acquire(timeout=10)
        try:
            assert [i.name for i in await backend.list_locks(top)] == [f"{top}/a"]
        finally:
            await lock.release()
            await decoy.release()


async def test_a_lock_held_outside_aiolocks_is_listed_by_its_key(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain session holding the same key is listed; force-release ends it only when it
    carries aiolocks' application_name (another program's session is left alone)."""
    from aiolocks.postgres._sql import advisory_key

    name = unique("adm/raw")
    async with aiolocks.connect(postgres_server.url) as backend:
        lock = backend.mutex(name)
        assert await lock.acquire(timeout=10)  # writes the fencing row
        await lock.release()
        assert await backend.list_locks(name) == []
        stranger = await asyncpg.connect(
            postgres_server.url, server_settings={"application_name": "billing-batch"}
        )
        try:
            await stranger.execute("SELECT pg_advisory_lock($1)", advisory_key("mutex", name))
            (info,) = await backend.list_locks(name)
            assert info.participants[0].id.startswith("pid:")
            assert info.participants[0].fencing_token is None  # not an aiolocks session
            assert await backend.force_release(name) == 0
            assert stranger.get_server_pid() in postgres_server.backend_pids()
            assert "not ending PostgreSQL session" in caplog.text
            assert "billing-batch" in caplog.text
        finally:
            stranger.terminate()
        raw = await asyncpg.connect(
            postgres_server.url, server_settings={"application_name": "aiolocks"}
        )
        try:
            await raw.execute("SELECT pg_advisory_lock($1)", advisory_key("mutex", name))
            assert await backend.force_release(name) == 1
            assert "ending PostgreSQL session pid=" in caplog.text
            # the plain session ended: its lock is free for us
            assert await lock.acquire(timeout=10)
            assert raw.get_server_pid() not in postgres_server.backend_pids()
            await lock.release()
        finally:
            raw.terminate()
        assert await backend.list_locks(name) == []

async def test_fencing_names_parse() -> None:
    assert parse_fencing_name("mutex/a/b") is not None
    assert parse_fencing_name("bogus/a") is None
    assert parse_fencing_name("mutex/") is None
    assert parse_fencing_name("mutex") is None


async def test_another_backends_holder_tells_its_current_token(
    postgres_server: PostgresServer,
) -> None:
    """A grant writes no row; the holder's backend answers with the token of the hold it has."""
    name = unique("adm/token")
    async with (
        aiolocks.connect(postgres_server.url) as one,
        aiolocks.connect(postgres_server.url) as two,
    ):
        lock = one.mutex(name)
        tokens: list[int] = []
        for _ in range(3):  # the first grant records the name, the later ones write nothing
            assert await lock.acquire(timeout=10)
            (info,) = await two.list_locks(name)
            assert [p.is_holder for p in info.participants] == [True]
            assert lock.fencing_token is not None
            tokens.append(lock.fencing_token)
            assert info.participants[0].fencing_token == lock.fencing_token
            await lock.release()
        assert tokens == sorted(set(tokens))
