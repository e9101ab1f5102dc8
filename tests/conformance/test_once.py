"""``backend.once()``: ShedLock's semantics on every backend with a record store.

Never waits; one run per period among many tasks and backends; the job is
kept ``at_least_for`` after the start, freed ``at_most_for`` after a crash,
renewed while a live body runs, cancelled at a hard bound; loss is never
silent; cancellation at every await point leaves nothing behind; clocks
that disagree change nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import Callable

import pytest

import aiolocks
from aiolocks._core.coordination import loads
from aiolocks.testing import skewed_clock

from ..polling import eventually, settle
from .cancelling import store_of, sweep

pytestmark = pytest.mark.asyncio


@pytest.fixture
def job() -> str:
    return f"conformance/once-{uuid.uuid4().hex[:10]}"


def record_key(name: str) -> str:
    return f"once/{name}/lock"


async def try_once(
    backend: aiolocks.Backend, name: str, *, at_most_for: float = 30, at_least_for: float = 0
) -> bool:
    """One attempt that runs an empty body."""
    async with backend.once(name, at_most_for=at_most_for, at_least_for=at_least_for) as ran:
        return ran


async def test_never_waits_and_one_of_many_runs(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, job: str
) -> None:
    store_of(backend)
    release = asyncio.Event()
    entered = asyncio.Event()

    async def replica(on: aiolocks.Backend) -> bool:
        async with on.once(job, at_most_for=30, at_least_for=20) as ran:
            if ran:
                entered.set()
                await release.wait()
            return ran

    tasks = [asyncio.ensure_future(replica(b)) for b in (backend, other_backend) * 10]
    await asyncio.wait_for(entered.wait(), 30)
    # every other replica returns while the one that runs is still inside its body
    await eventually(
        lambda: sum(t.done() for t in tasks) == len(tasks) - 1,
        30,
        what="every replica but the running one to return",
    )
    assert not release.is_set()
    release.set()
    results = await asyncio.gather(*tasks)
    assert results.count(True) == 1, results
    # the period (at_least_for=20) is not over: nobody runs it again
    assert not await try_once(other_backend, job)
    assert not await try_once(backend, job)
    assert await store_of(backend).delete(record_key(job))


async def test_at_least_for_keeps_the_job_after_the_body(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, job: str
) -> None:
    store = store_of(backend)
    started = time.monotonic()
    assert await try_once(backend, job, at_most_for=10, at_least_for=1.5)
    record = await store.read(record_key(job))
    # (a store may round the expiry up, never down: etcd leases count whole seconds)
    assert record is not None and record.ttl is not None and 0 < record.ttl <= 2.5
    assert loads(record.value)["holder"] == backend.client_id
    assert not await try_once(other_backend, job, at_most_for=10, at_least_for=1.5)
    runs: list[float] = []

    async def runs_again() -> bool:
        if await try_once(other_backend, job, at_most_for=10):
            runs.append(time.monotonic())
            return True
        return False

    await eventually(runs_again, 20, what="the job to be free after at_least_for")
    # never earlier than at_least_for after the first start (a lower bound: load only delays)
    assert runs[0] - started >= 1.5 - 0.02
    assert await store.read(record_key(job)) is None, "a run with at_least_for=0 leaves nothing"


async def test_at_most_for_frees_a_crashed_holder(
    backend_url: str, backend: aiolocks.Backend, job: str
) -> None:
    store_of(backend)
    crashed = await aiolocks.connect(backend_url)
    entered = asyncio.Event()

    async def holder() -> None:
        async with crashed.once(job, at_most_for=1.0, at_least_for=0.5):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(holder())
    await asyncio.wait_for(entered.wait(), 30)
    # the process "crashes": its backend goes without the block ever exiting
    await crashed.close()
    with pytest.raises(aiolocks.LockLostError, match="backend was closed"):
        await task
    assert not await try_once(backend, job), "the crashed run's record went at once"
    await eventually(lambda: try_once(backend, job), 20, what="at_most_for to free the job")


async def test_a_live_body_longer_than_at_most_for_keeps_the_job(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, job: str
) -> None:
    store = store_of(backend)
    versions: set[int] = set()

    async def renewed_three_times() -> bool:
        record = await store.read(record_key(job))
        assert record is not None, "the record of a live run expired"
        versions.add(record.version)
        assert not await try_once(other_backend, job), "another replica ran a live job"
        return len(versions) >= 4

    async with backend.once(job, at_most_for=0.6) as ran:
        assert ran
        await eventually(renewed_three_times, 30, what="three renewals", interval=0.05)
    assert await store.read(record_key(job)) is None


async def test_hard_bound_cancels_the_body_with_lock_lost_error(
    backend: aiolocks.Backend, job: str
) -> None:
    store_of(backend)
    with pytest.raises(aiolocks.LockLostError, match="at_most_for"):
        async with backend.once(job, at_most_for=0.3, hard_bound=True) as ran:
            assert ran
            await asyncio.Event().wait()
    await eventually(lambda: try_once(backend, job), 20, what="the job to be free")


class _SilentRenewals:
    """A record store whose updates never answer (a partition), all else passed on."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def update(self, *args: object, **kwargs: object) -> None:
        await asyncio.Event().wait()


async def test_a_renewal_without_an_answer_tells_the_body_before_another_runs(
    backend: aiolocks.Backend,
    other_backend: aiolocks.Backend,
    job: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal stuck in a partition is given up before the record can expire."""
    inner = store_of(backend)
    monkeypatch.setattr(backend._driver, "records", lambda: _SilentRenewals(inner))
    entered = asyncio.Event()

    async def holder() -> None:
        async with backend.once(job, at_most_for=0.6) as ran:
            assert ran
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(holder())
    await asyncio.wait_for(entered.wait(), 30)

    async def ran_elsewhere() -> bool:
        ran = await try_once(other_backend, job, at_most_for=0.6)
        assert not ran or task.done() or task.cancelling(), "ran while the holder believed"
        return ran

    try:
        await eventually(ran_elsewhere, 30, what="the job to be free", interval=0.02)
        with pytest.raises(aiolocks.LockLostError, match="renewed in time"):
            await task
    finally:
        task.cancel()


async def test_a_record_deleted_behind_its_back_is_a_loss(
    backend: aiolocks.Backend, job: str
) -> None:
    store = store_of(backend)
    with pytest.raises(aiolocks.LockLostError, match="behind our back"):
        async with backend.once(job, at_most_for=0.5) as ran:
            assert ran
            assert await store.delete(record_key(job))
            await asyncio.Event().wait()


async def test_a_user_cancellation_wins_over_a_loss(backend: aiolocks.Backend, job: str) -> None:
    store_of(backend)
    entered = asyncio.Event()

    async def body() -> None:
        async with backend.once(job, at_most_for=30) as ran:
            assert ran
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(entered.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store_of(backend).read(record_key(job)) is None


async def test_cancellation_at_every_await_leaves_nothing(
    backend: aiolocks.Backend, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_of(backend)

    async def scenario(run: int) -> None:
        async with backend.once(f"{job}/{run}", at_most_for=30) as ran:
            assert ran
            await asyncio.sleep(0)

    async def check(run: int) -> None:
        await settle(backend)
        assert await store.read(record_key(f"{job}/{run}")) is None, f"run {run} left its record"

    calls = await sweep(backend, monkeypatch, scenario, check)
    assert calls >= 2  # create and the exit write


async def test_one_run_per_period_with_skewed_clocks(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, job: str
) -> None:
    """Two "processes" whose wall and monotonic clocks disagree by minutes, each firing
    on its own clock's period boundaries: never two runs within ``at_least_for``."""
    store = store_of(backend)
    period, periods = 0.4, 8
    at_least_for = period * 0.9
    runs: list[tuple[float, str]] = []
    seen_started_at: dict[str, float] = {}

    async def replica(on: aiolocks.Backend, label: str) -> None:
        from aiolocks._core.clock import wall

        end = time.monotonic() + period * periods
        while time.monotonic() < end:
            now = wall()
            await asyncio.sleep(math.ceil(now / period) * period - now)  # the next "cron" tick
            async with on.once(job, at_most_for=5, at_least_for=at_least_for) as ran:
                if ran:
                    runs.append((time.monotonic(), label))
                    record = await store.read(record_key(job))
                    assert record is not None
                    seen_started_at[label] = loads(record.value)["started_at"] - time.time()

    skews: dict[str, tuple[float, float]] = {"a": (-95.13, 3600.0), "b": (61.07, -1800.0)}
    tasks = []
    for label, on in (("a", backend), ("b", other_backend)):
        wall_offset, monotonic_offset = skews[label]
        with skewed_clock(wall=wall_offset, monotonic=monotonic_offset):
            tasks.append(asyncio.ensure_future(replica(on, label)))
    await asyncio.gather(*tasks)
    assert len(runs) >= 2, runs
    starts = [at for at, _ in runs]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert min(gaps) >= at_least_for - 0.05, (gaps, runs)
    # the skew reached the code under test: the wall clock it wrote is off by the offset
    for label, seen in seen_started_at.items():
        assert abs(seen - skews[label][0]) < 5, (label, seen)
    await eventually(lambda: try_once(backend, job), 20, what="the last period to end")


async def test_bad_arguments_fail_before_any_io(backend: aiolocks.Backend) -> None:
    store_of(backend)
    bad: list[tuple[Callable[[], object], str]] = [
        (lambda: backend.once("jobs/x", at_most_for=0), "at_most_for"),
        (lambda: backend.once("jobs/x", at_most_for=-1), "at_most_for"),
        (lambda: backend.once("jobs/x", at_most_for=float("nan")), "at_most_for"),
        (lambda: backend.once("jobs/x", at_most_for=5, at_least_for=6), "must not exceed"),
        (lambda: backend.once("jobs/x", at_most_for=5, at_least_for=-1), "at_least_for"),
        (lambda: backend.once("jobs/x", at_most_for=True), "at_most_for"),
    ]
    for make, message in bad:
        with pytest.raises(ValueError, match=message):
            make()
    with pytest.raises(aiolocks.InvalidLockNameError):
        backend.once("", at_most_for=5)
    with pytest.raises(TypeError):
        backend.once("jobs/x", at_most_for=5, hard_bound="yes")  # type: ignore[arg-type]


async def test_the_decorator(backend: aiolocks.Backend, backend_url: str, job: str) -> None:
    store_of(backend)
    calls: list[int] = []

    @aiolocks.once(backend, job, at_most_for=30, at_least_for=20)
    async def report(n: int) -> int:
        calls.append(n)
        return n * 2

    assert await report(21) == 42
    assert await report(1) is None, "the second call within the period ran"
    assert calls == [21]

    @aiolocks.once(backend_url, job, at_most_for=30)
    async def by_url() -> str:
        return "ran"

    assert await by_url() is None, "another process (a URL's own backend) ran it"
    assert await store_of(backend).delete(record_key(job))
    assert await by_url() == "ran"
    with pytest.raises(TypeError, match="coroutine function"):
        aiolocks.once(backend, job, at_most_for=30)(lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="must not exceed"):
        aiolocks.once(backend, job, at_most_for=1, at_least_for=2)


async def test_one_object_in_several_tasks_keeps_their_runs_apart(
    backend: aiolocks.Backend, other_backend: aiolocks.Backend, job: str
) -> None:
    """A task whose block did not run must not end another task's run of the same object."""
    store = store_of(backend)
    shared = backend.once(job, at_most_for=30)
    skipped_in, running_in, leave_skipped, leave_running = (asyncio.Event() for _ in range(4))

    async def skipped() -> None:
        async with shared as ran:
            assert not ran
            skipped_in.set()
            await leave_skipped.wait()

    async def running() -> None:
        async with shared as ran:
            assert ran
            running_in.set()
            await leave_running.wait()

    async with other_backend.once(job, at_most_for=30) as ran:
        assert ran
        first = asyncio.ensure_future(skipped())
        await asyncio.wait_for(skipped_in.wait(), 30)
    second = asyncio.ensure_future(running())
    await asyncio.wait_for(running_in.wait(), 30)
    leave_skipped.set()
    await first
    assert await store.read(record_key(job)) is not None, "the skipped block ended the run"
    leave_running.set()
    await second
    assert await store.read(record_key(job)) is None, "the run's record outlived its block"


async def test_closing_the_backend_under_a_hard_bound_body_is_a_loss(
    backend_url: str, backend: aiolocks.Backend, job: str
) -> None:
    store_of(backend)
    closing = await aiolocks.connect(backend_url)
    entered = asyncio.Event()

    async def body() -> None:
        async with closing.once(job, at_most_for=60, hard_bound=True) as ran:
            assert ran
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(entered.wait(), 30)
    await closing.close()
    with pytest.raises(aiolocks.LockLostError, match="backend was closed"):
        await asyncio.wait_for(task, 30)
    assert await store_of(backend).delete(record_key(job))
