"""What other processes read after a hold changes hands inside one process.

A backend may pass a hold from one task (or latch) of a process to another
without the usual round trip through its server. Whatever it does inside
the process, what anybody else reads (``leader()``, ``participants()``,
``list_locks()``) must name the true holder, with its fencing token, as
soon as the new holder has it. Two backends of this process stand for two
processes; every check reads from both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

import aiolocks

from ..polling import eventually

pytestmark = pytest.mark.asyncio


async def _listed(on: aiolocks.Backend, name: str, kind: str) -> list[aiolocks.Participant]:
    """The lock ``name`` of ``kind`` as ``list_locks`` (``aiolocks list``) reports it."""
    found = [info for info in await on.list_locks(name) if info.name == name]
    mine = [info for info in found if info.kind == kind]
    assert len(mine) == 1, f"list_locks does not show the held {kind} {name}: {found}"
    return list(mine[0].participants)


def _check_view(
    everyone: Sequence[aiolocks.Participant],
    holder_id: str,
    token: int | None,
    gone: Sequence[str],
    where: str,
    rivals: Sequence[str] | None = None,
) -> None:
    """``everyone`` (a ``participants()`` answer) names ``holder_id`` as the one holder.

    ``rivals`` (the other contenders' ids) given: a holder in another
    process may also show under an id of the backend's own (a server
    session), as long as it names none of them.
    """
    shown = [(p.id, p.is_holder, p.fencing_token) for p in everyone]
    holders = [p for p in everyone if p.is_holder]
    assert len(holders) == 1, f"{where}: not one holder: {shown}"
    seen = holders[0].id
    if rivals is None or seen in rivals:
        assert seen == holder_id, f"{where}: holder is not {holder_id}: {shown}"
    assert everyone[0].is_holder, f"{where}: the holder is not listed first: {shown}"
    if holders[0].fencing_token is not None:
        assert holders[0].fencing_token == token, f"{where}: not the token {token}: {shown}"
    ids = [p.id for p in everyone]
    assert len(ids) == len(set(ids)), f"{where}: a participant is listed twice: {shown}"
    assert not set(ids) & set(gone), f"{where}: lists participants that left: {shown}"


async def _names_the_leader(
    observers: Sequence[tuple[aiolocks.Backend, aiolocks.LeaderLatch]],
    leader: aiolocks.LeaderLatch,
    gone: Sequence[str],
) -> None:
    """Each observer's ``leader()``, ``participants()`` and its backend's
    ``list_locks()`` name ``leader``, with its fencing token."""
    me, token = leader.participant_id, leader.fencing_token
    for on, observer in observers:
        where = f"observer {observer.participant_id}"
        found = await observer.leader()
        assert found is not None, f"{where}: no leader while {me} leads"
        assert found.id == me, f"{where}: leader() names {found.id}, but {me} leads"
        _check_view(await observer.participants(), me, token, gone, where)
        listed = await _listed(on, observer.name, "leader")
        _check_view(listed, me, token, gone, where + " (list)")


@pytest.mark.parametrize(("size", "together"), [(3, False), (3, True), (6, False)])
async def test_election_observer_names_the_true_leader(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
    size: int,
    together: bool,
) -> None:
    """kazoo's ``test_election``: contenders over two backends of one
    process (the first and third on one, the second on the other, and so
    on); an observer latch on each backend that never starts. Each leader in
    turn leaves; the observers name the one that leads now.

    ``together``: every contender starts at once (else the first leads
    before the others start)."""
    name = names()
    observers = [
        (backend, backend.leader_latch(name, participant_id="observer-a")),
        (other_backend, other_backend.leader_latch(name, participant_id="observer-b")),
    ]
    contenders = [
        (other_backend if i % 3 == 1 else backend).leader_latch(
            name, participant_id=f"contender-{i}"
        )
        for i in range(size)
    ]
    gone: list[str] = []
    try:
        if together:
            await asyncio.gather(*(latch.start() for latch in contenders))
        else:
            await contenders[0].start()
            assert await contenders[0].wait_for_leadership(timeout=10)
            for latch in contenders[1:]:
                await latch.start()
            await _names_the_leader(observers, contenders[0], gone)
        remaining = list(contenders)
        while remaining:
            await eventually(
                lambda: sum(latch.has_leadership for latch in remaining) == 1,
                what="one leader among the remaining contenders",
            )
            (leader,) = [latch for latch in remaining if latch.has_leadership]
            await _names_the_leader(observers, leader, gone)
            await leader.close()
            remaining.remove(leader)
            gone.append(leader.participant_id)
        for _, observer in observers:
            assert await observer.leader() is None
            assert await observer.participants() == []
    finally:
        for latch in contenders:
            await latch.close()


@pytest.mark.parametrize(("here", "there"), [(3, 1), (4, 3)])
async def test_mutex_holder_seen_from_another_backend(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    names: Callable[[], str],
    here: int,
    there: int,
) -> None:
    """Tasks of one backend (``here`` of them) and of another (``there``)
    take turns on a mutex; each holder checks, from both backends, that
    ``participants()`` and ``list_locks()`` name it with its fencing token."""
    name = names()
    rounds = 3
    tokens: list[int] = []

    spread = [(backend, f"here-{i}") for i in range(here)]
    spread += [(other_backend, f"there-{i}") for i in range(there)]
    everyone = [f"{on.client_id}/{label}" for on, label in spread]

    async def worker(on: aiolocks.Backend, label: str) -> None:
        me = f"{on.client_id}/{label}"  # (the task is named after its label)
        rivals = [other for other in everyone if other != me]
        lock = on.mutex(name)
        for _ in range(rounds):
            async with lock:
                token = lock.fencing_token
                assert token is not None
                tokens.append(token)
                for reader in (backend, other_backend):
                    where = f"{label} read from {reader.client_id}"
                    seen = await reader.mutex(name).participants()
                    _check_view(seen, me, token, (), where, rivals)
                    listed = await _listed(reader, name, "mutex")
                    _check_view(listed, me, token, (), where + " (list)", rivals)

    await asyncio.wait_for(
        asyncio.gather(
            *(asyncio.create_task(worker(on, label), name=label) for on, label in spread)
        ),
        60,
    )
    assert len(tokens) == rounds * len(spread)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
