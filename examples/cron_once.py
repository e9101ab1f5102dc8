"""A job scheduled on every replica and run once per period: ``backend.once()``.

::

    python examples/cron_once.py --url redis://127.0.0.1:6379/0            # 3 processes
    python examples/cron_once.py --url zk://127.0.0.1:2181 --replicas 5 --periods 60
    python examples/cron_once.py                        # memory://, replicas as tasks
    python examples/cron_once.py --replica r1 --skew 0.1 --url redis://127.0.0.1:6379/0

Every replica fires at each ``--period`` boundary of *its own* clock (as
cron in every pod does) and runs the job inside ``backend.once(name,
at_most_for=..., at_least_for=0.8 * period)``: the first replica to fire in a
period runs it, the others find it taken and skip. Each replica's clock is
off by ``--skew`` seconds (its schedule, and through
``aiolocks.testing.skewed_clock`` the clocks aiolocks reads, the monotonic
one by an hour per second of skew): the job's record expires by the
server's clock, so the skew changes nothing.

Without ``--replica`` the script is a launcher: it starts ``--replicas``
processes with skews spread over a tenth of the period, relays what they
print (``r1: ran period 1733238000 at 1733238000.012``), and prints how
many runs each period had. ``memory://`` lives inside one process, so there
the replicas are tasks with connections of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiolocks
from aiolocks.testing import skewed_clock

#: what a replica prints when it ran the job; the launcher (and the tests) parse it
RAN = re.compile(r"^(?P<replica>\S+): ran period (?P<period>\d+) at (?P<at>[\d.]+)$")


async def replica(
    url: str,
    replica_id: str,
    *,
    name: str = "jobs/cron-once/report",
    period: float = 1.0,
    periods: int = 10,
    skew: float = 0.0,
    emit: Callable[[str], None] = print,
) -> None:
    """Fire at ``periods`` boundaries of this replica's clock (real time + ``skew``)."""
    with skewed_clock(wall=skew, monotonic=skew * 3600):
        async with aiolocks.connect(url) as backend:
            job = backend.once(name, at_most_for=max(10 * period, 1.0), at_least_for=0.8 * period)
            for _ in range(periods):
                now = time.time() + skew
                index = math.floor(now / period) + 1
                await asyncio.sleep(index * period - now)  # this replica's next boundary
                async with job as ran:
                    if ran:
                        emit(f"{replica_id}: ran period {index} at {time.time():.3f}")


@dataclass
class Summary:
    """What the launcher saw: the runs, by period and by replica."""

    runs: list[tuple[str, int, float]] = field(default_factory=list)

    def per_period(self) -> Counter[int]:
        """How many runs each period had (the job's promise: never more than one)."""
        return Counter(period for _, period, _ in self.runs)

    def gaps(self) -> list[float]:
        """Seconds between consecutive runs, in real time."""
        starts = sorted(at for _, _, at in self.runs)
        return [later - earlier for earlier, later in itertools.pairwise(starts)]


def _record(summary: Summary, line: str) -> None:
    match = RAN.match(line)
    if match:
        summary.runs.append((match["replica"], int(match["period"]), float(match["at"])))


async def launch(url: str, *, replicas: int = 3, period: float = 1.0, periods: int = 10) -> Summary:
    """Run ``replicas`` replicas (processes, or tasks on ``memory://``); what they ran."""
    summary = Summary()
    skews = [period * 0.1 * i / max(1, replicas - 1) for i in range(replicas)]

    def emit(line: str) -> None:
        print(line, flush=True)
        _record(summary, line)

    if url.startswith("memory:"):
        await asyncio.gather(
            *(
                replica(url, f"r{i}", period=period, periods=periods, skew=skew, emit=emit)
                for i, skew in enumerate(skews)
            )
        )
        return summary
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--replica",
            f"r{i}",
            "--url",
            url,
            "--period",
            str(period),
            "--periods",
            str(periods),
            "--skew",
            str(skew),
            stdout=asyncio.subprocess.PIPE,
        )
        for i, skew in enumerate(skews)
    ]

    async def pump(process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            emit(raw.decode().rstrip())
        if await process.wait() != 0:
            raise RuntimeError(f"a replica exited with status {process.returncode}")

    await asyncio.gather(*(pump(process) for process in processes))
    return summary


def main(argv: list[str] | None = None) -> int:
    """The command line: a launcher, or one replica (``--replica``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="memory://")
    parser.add_argument("--replica", default=None, help="run one replica with this id")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--periods", type=int, default=10)
    parser.add_argument("--skew", type=float, default=0.0, help="this replica's clock offset")
    args = parser.parse_args(argv)
    if args.replica is not None:
        asyncio.run(
            replica(
                args.url, args.replica, period=args.period, periods=args.periods, skew=args.skew
            )
        )
        return 0
    summary = asyncio.run(
        launch(args.url, replicas=args.replicas, period=args.period, periods=args.periods)
    )
    counts = summary.per_period()
    print(
        f"{len(summary.runs)} runs in {len(counts)} periods; most in one period: "
        f"{max(counts.values(), default=0)}"
    )
    return 0 if max(counts.values(), default=0) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
