"""``backend.barrier()`` on every backend with a record store.

Distinct indexes per generation, reuse, a timeout breaks it (as
``threading.Barrier``), a party whose backend closes breaks it, a broken
barrier heals once its parties left, and cancellation at every await point
leaves nothing on the server.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

import aiolocks
from aiolocks._core.coordination import loads

from ..polling import eventually, settle
from .cancelling import store_of, sweep

pytestmark = pytest.mark.asyncio


@pytest.fixture
def name() -> str:
    return f"conformance/barrier-{uuid.uuid4().hex[:10]}"


async def nothing_left(backend: aiolocks.Backend, name: str) -> bool:
    with await store_of(backend).snapshot(f"barrier/{name}") as snap:
        return not snap.records


async def arrived(backend: aiolocks.Backend, name: str) -> int:
    record = await store_of(backend).read(f"barrier/{name}/state")
    return 0 if record is None else int(loads(record.value).get("arrived", 0))


async def test_distinct_indexes_across_backends_and_generations(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, name: str
) -> None:
    store_of(backend)
    barriers = [b.barrier(name, 4) for b in (backend, other_backend)]
    for _ in range(3):
        indexes = await asyncio.wait_for(
            asyncio.gather(*(barriers[i % 2].wait() for i in range(4))), 60
        )
        assert sorted(indexes) == [0, 1, 2, 3]
    await eventually(lambda: nothing_left(backend, name), 10, what="the tripped barrier to go")
    assert await backend.barrier(name, 1).wait() == 0


async def test_a_timeout_breaks_the_barrier_for_everyone(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, name: str
) -> None:
    store_of(backend)
    patient = asyncio.ensure_future(other_backend.barrier(name, 3).wait())
    await eventually(lambda: _arrived_at_least(backend, name, 1), 30, what="the first arrival")
    with pytest.raises(aiolocks.BrokenBarrierError, match="timed out"):
        await backend.barrier(name, 3).wait(timeout=0.2)
    with pytest.raises(aiolocks.BrokenBarrierError):
        await asyncio.wait_for(patient, 30)
    await eventually(lambda: nothing_left(backend, name), 10, what="the broken barrier to heal")
    # healed: a full round works again
    indexes = await asyncio.gather(*(b.barrier(name, 3).wait() for b in (backend,) * 3))
    assert sorted(indexes) == [0, 1, 2]


async def _arrived_at_least(backend: aiolocks.Backend, name: str, count: int) -> bool:
    return await arrived(backend, name) >= count


async def test_a_party_whose_backend_closes_breaks_the_barrier(
    backend_url: str, backend: aiolocks.Backend, name: str
) -> None:
    store_of(backend)
    leaving = await aiolocks.connect(backend_url)
    doomed = asyncio.ensure_future(leaving.barrier(name, 3).wait())
    staying = asyncio.ensure_future(backend.barrier(name, 3).wait())
    await eventually(lambda: _arrived_at_least(backend, name, 2), 30, what="two arrivals")
    await leaving.close()  # its session ends, and its arrival record with it
    with pytest.raises(aiolocks.BrokenBarrierError):
        await asyncio.wait_for(staying, 30)
    with pytest.raises((aiolocks.BrokenBarrierError, aiolocks.BackendUnavailableError)):
        await asyncio.wait_for(doomed, 30)
    await eventually(lambda: nothing_left(backend, name), 20, what="the broken barrier to heal")


async def test_cancellation_at_every_await_leaves_nothing(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store_of(backend)

    async def scenario(run: int) -> None:
        first = asyncio.ensure_future(other_backend.barrier(f"{name}/{run}", 2).wait())
        try:
            await eventually(
                lambda: _arrived_at_least(other_backend, f"{name}/{run}", 1), 30, what="arrival"
            )
            assert await backend.barrier(f"{name}/{run}", 2).wait() == 1
            assert await first == 0
        finally:
            if not first.done():
                first.cancel()
            await asyncio.wait([first])
            if not first.cancelled() and first.exception() is not None:
                assert isinstance(first.exception(), aiolocks.BrokenBarrierError)

    async def check(run: int) -> None:
        await settle(backend, other_backend)
        assert await nothing_left(backend, f"{name}/{run}"), f"run {run} left records"

    calls = await sweep(backend, monkeypatch, scenario, check)
    assert calls >= 3


async def test_arguments_and_error_classes(backend: aiolocks.Backend, name: str) -> None:
    store_of(backend)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="parties"):
            backend.barrier(name, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        await backend.barrier(name, 2).wait(timeout=-1)
    waiting = asyncio.ensure_future(backend.barrier(name, 2).wait(timeout=30))
    await eventually(lambda: _arrived_at_least(backend, name, 1), 30, what="the first arrival")
    with pytest.raises(ValueError, match="parties=2"):
        await backend.barrier(name, 3).wait()
    assert await backend.barrier(name, 2).wait() in (0, 1)
    assert await waiting in (0, 1)
    assert issubclass(aiolocks.BrokenBarrierError, asyncio.BrokenBarrierError)
    assert issubclass(aiolocks.BrokenBarrierError, aiolocks.LockError)


async def test_a_party_cancelled_after_arriving_breaks_it_for_the_others(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, name: str
) -> None:
    store_of(backend)
    patient = asyncio.ensure_future(other_backend.barrier(name, 3).wait())
    cancelled = asyncio.ensure_future(backend.barrier(name, 3).wait())
    await eventually(lambda: _arrived_at_least(backend, name, 2), 30, what="two arrivals")
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    with pytest.raises(aiolocks.BrokenBarrierError):
        await asyncio.wait_for(patient, 30)
    await eventually(lambda: nothing_left(backend, name), 10, what="the broken barrier to heal")


async def test_a_broken_generation_refuses_arrivals_until_its_parties_left(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, name: str
) -> None:
    store = store_of(backend)
    state = b'{"arrived":1,"broken":true,"gen":"aaaaaaaaaaaa","parties":2}'
    assert await store.create(f"barrier/{name}/state", state) is not None
    straggler = await store_of(other_backend).join(f"barrier/{name}/aaaaaaaaaaaa.p", b"{}")
    assert straggler is not None
    with pytest.raises(aiolocks.BrokenBarrierError, match="still there"):
        await backend.barrier(name, 2).wait(timeout=30)
    assert await store_of(other_backend).delete(straggler.key)
    # every party of the broken generation left: the next round starts clean
    indexes = await asyncio.gather(*(b.barrier(name, 2).wait() for b in (backend, other_backend)))
    assert sorted(indexes) == [0, 1]
    await eventually(lambda: nothing_left(backend, name), 10, what="the tripped barrier to go")
