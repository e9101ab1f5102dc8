"""A 1-second-period job in several OS processes on a real server: one run per period.

Each replica is a process of its own (:mod:`tests.jobs._once_worker`) with
its own backend and its own clock skew (0 to a tenth of the period, in its
schedule and in the clocks aiolocks reads); every replica fires at each
period boundary of its clock and enters ``backend.once(name,
at_most_for=10, at_least_for=0.5)``. The test counts the runs per period.

What is checked, and why it does not depend on the machine's load:

* **never too soon** (every run): a run begins no earlier than
  ``at_least_for`` after the previous run's ``once`` was entered, in real
  time. This is ``once``'s promise (the record expires by the server's
  clock); load only makes runs later.
* **exactly one run per period** (every *on-time* period): a period is on
  time when every replica fired in it and knew its outcome within
  ``TOLERANCE`` of its own boundary, and the run before it did too and left
  its block within ``TOLERANCE``. Then one run is a theorem, not luck: the
  previous record expires by ``(k-1)P + TOLERANCE + L + TOLERANCE`` (0.9 s
  into the previous period; on etcd, whose expiries are coarse, its period
  is 4 s), before the unskewed replica fires at ``kP``,
  so somebody runs; the first run of period ``k`` began at ``kP - 0.1`` or
  later, so its record lasts past ``kP + 0.4``, after every replica of
  period ``k`` knew its outcome (``kP + 0.2`` at the latest), so nobody runs
  twice. A period that is not on time (a process stalled by a loaded
  machine) is counted and reported, not judged; a run needs at least one
  on-time period to pass.

``AIOLOCKS_LONG=1`` runs a minute of periods per backend instead of about 10 s
(10 periods; 4 on etcd, whose period is 4 s).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from aiolocks.testing import EtcdServer, PostgresServer
from aiolocks.testing.servers import RedisServer, ZooKeeperServer

ROOT = Path(__file__).resolve().parents[2]

TOLERANCE = 0.2
REPLICAS = 4


@dataclass(frozen=True)
class Schedule:
    """A job's period and ``at_least_for``, in seconds."""

    period: float
    at_least_for: float

    @property
    def spread(self) -> float:
        """The replicas' clocks are off by 0 to this much (a tenth of the period)."""
        return 0.1 * self.period


#: etcd counts a record's expiry in whole seconds, raised to its minimum lease
#: TTL (2 s by default) and swept every half second: a record meant to last
#: 0.5 s lasts 2 to 2.5 s there, so a 1-second job would skip every other
#: period. Its job runs every 4 s (``docs/jobs.md``, "Backends").
SCHEDULES: dict[str, Schedule] = {
    "redis": Schedule(1.0, 0.5),
    "postgres": Schedule(1.0, 0.5),
    "zookeeper": Schedule(1.0, 0.5),
    "etcd": Schedule(4.0, 1.0),
}


def periods(schedule: Schedule) -> int:
    """About 10 s of periods (at least 4), or a minute's worth with ``AIOLOCKS_LONG=1``."""
    seconds = 60 if os.environ.get("AIOLOCKS_LONG") == "1" else 10
    return max(4, round(seconds / schedule.period))


@dataclass(frozen=True)
class Firing:
    """One replica's firing in one period (a line of the worker)."""

    replica: str
    period: int
    ran: bool
    boundary: float
    t0: float
    t1: float
    t2: float

    @property
    def late(self) -> float:
        """Seconds from the replica's boundary until it knew whether it runs."""
        return self.t1 - self.boundary


@dataclass
class Verdict:
    """What :func:`judge` found."""

    on_time: list[int]
    late: list[int]
    wrong: dict[int, int]
    too_soon: list[tuple[Firing, Firing]]


def judge(
    firings: list[Firing], replicas: int, first: int, count: int, at_least_for: float = 0.5
) -> Verdict:
    """Runs per on-time period, and runs that began too soon after the previous one."""
    by_period: dict[int, list[Firing]] = defaultdict(list)
    for firing in firings:
        by_period[firing.period].append(firing)
    runs = sorted((f for f in firings if f.ran), key=lambda f: f.t0)
    # 1 ms: Redis counts an expiry in whole milliseconds (rounded)
    too_soon = [(a, b) for a, b in itertools.pairwise(runs) if b.t1 - a.t0 < at_least_for - 0.001]
    verdict = Verdict([], [], {}, too_soon)
    for period in range(first, first + count):
        fired = by_period[period]
        earliest = min((f.t0 for f in fired), default=math.inf)
        before = [r for r in runs if r.t0 < earliest]
        previous_ok = not before or (
            before[-1].late <= TOLERANCE and before[-1].t2 - before[-1].t1 <= TOLERANCE
        )
        timely = len(fired) == replicas and all(f.late <= TOLERANCE for f in fired)
        if not (timely and previous_ok):
            verdict.late.append(period)
            continue
        verdict.on_time.append(period)
        ran = sum(f.ran for f in fired)
        if ran != 1:
            verdict.wrong[period] = ran
    return verdict


async def _start(
    url: str, name: str, replica: int, schedule: Schedule
) -> asyncio.subprocess.Process:
    skew = schedule.spread * replica / max(1, REPLICAS - 1)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.jobs._once_worker",
        url,
        f"r{replica}",
        "--name",
        name,
        "--period",
        str(schedule.period),
        "--skew",
        str(skew),
        "--at-least-for",
        str(schedule.at_least_for),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


async def _collect(process: asyncio.subprocess.Process) -> list[Firing]:
    assert process.stdout is not None
    firings = [Firing(**json.loads(line)) async for line in process.stdout if line.strip()]
    assert await process.wait() == 0, f"a replica exited with status {process.returncode}"
    return firings


async def run_replicas(url: str, count: int, schedule: Schedule) -> tuple[list[Firing], int]:
    """Start the replicas, let them fire ``count`` periods together; their firings."""
    name = f"jobs/processes/{uuid.uuid4().hex[:8]}"
    processes = [await _start(url, name, i, schedule) for i in range(REPLICAS)]
    try:
        for process in processes:
            assert process.stdout is not None
            ready = await asyncio.wait_for(process.stdout.readline(), 120)
            assert ready.strip() == b"ready", ready
        first = math.floor(time.time() / schedule.period) + 2
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(f"start {first} {count}\n".encode())
            await process.stdin.drain()
        results = await asyncio.gather(*(_collect(p) for p in processes))
    except BaseException:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
        raise
    return [firing for result in results for firing in result], first


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("label", list(SCHEDULES))
@pytest.mark.asyncio
async def test_one_run_per_period_across_processes(
    label: str, request: pytest.FixtureRequest
) -> None:
    server: RedisServer | PostgresServer | EtcdServer | ZooKeeperServer = request.getfixturevalue(
        f"{label}_server"
    )
    schedule = SCHEDULES[label]
    count = periods(schedule)
    firings, first = await run_replicas(server.url, count, schedule)
    verdict = judge(firings, REPLICAS, first, count, schedule.at_least_for)
    assert not verdict.too_soon, f"a run began too soon after the previous: {verdict.too_soon}"
    assert not verdict.wrong, f"on-time periods with other than one run: {verdict.wrong}"
    assert verdict.on_time, f"no period was on time (machine too loaded): late {verdict.late}"
    print(f"{label}: {len(verdict.on_time)} of {count} periods on time, each one run")


def _firing(replica: str, period: int, ran: bool, late: float = 0.01) -> Firing:
    boundary = float(period)
    return Firing(replica, period, ran, boundary, boundary, boundary + late, boundary + late)


def test_the_judge_flags_a_double_run_and_a_skipped_period() -> None:
    """The checker itself: two runs in one period, none in another, a run too soon."""
    good = [_firing("a", 1, True), _firing("b", 1, False)]
    assert judge(good, 2, 1, 1) == Verdict([1], [], {}, [])
    double = [_firing("a", 1, True), _firing("b", 1, True, late=0.02)]
    verdict = judge(double, 2, 1, 1)
    assert verdict.wrong == {1: 2} and len(verdict.too_soon) == 1
    skipped = [*good, _firing("a", 2, False), _firing("b", 2, False)]
    assert judge(skipped, 2, 1, 2).wrong == {2: 0}
    stalled = [*good, _firing("a", 2, False, late=0.5), _firing("b", 2, False)]
    assert judge(stalled, 2, 1, 2).late == [2]
