"""One replica of a once-per-period job, run as an OS process by ``test_once_processes``.

``python -m tests.jobs._once_worker URL REPLICA --period P --skew S
--at-least-for L --name NAME`` connects, prints ``ready`` and waits for a
line ``start FIRST COUNT`` on stdin. Then, for each period ``k`` in
``FIRST .. FIRST + COUNT - 1``, it fires at ``k * P`` by its own clock (real
time + ``S``, as cron on a host whose clock is off by ``S``), enters
``backend.once(NAME, ...)`` and prints one JSON line::

    {"replica": "r0", "period": k, "ran": true, "boundary": ..., "t0": ..., "t1": ..., "t2": ...}

``boundary`` is the real time of its firing instant, ``t0`` the real time
just before ``once`` was entered, ``t1`` when the body began (or the skip
was known), ``t2`` when the block was left (after the exit write). Times are
``time.time()``: the processes share one machine's clock. The clocks
aiolocks reads are skewed as well (``aiolocks.testing.skewed_clock``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiolocks
from aiolocks.testing import skewed_clock


async def _sleep_until(instant: float) -> None:
    """Sleep until ``time.time() >= instant`` (a sleep may end a hair early)."""
    while (left := instant - time.time()) > 0:
        await asyncio.sleep(left)


async def replica(args: argparse.Namespace) -> None:
    """Connect, say ``ready``, then fire at each period of the ``start`` line."""
    loop = asyncio.get_running_loop()
    with skewed_clock(wall=args.skew, monotonic=args.skew * 3600):
        async with aiolocks.connect(args.url) as backend:
            job = backend.once(
                args.name, at_most_for=args.at_most_for, at_least_for=args.at_least_for
            )
            print("ready", flush=True)
            line = await loop.run_in_executor(None, sys.stdin.readline)
            _, first, count = line.split()
            for period in range(int(first), int(first) + int(count)):
                boundary = period * args.period - args.skew
                await _sleep_until(boundary)
                t0 = time.time()
                async with job as ran:
                    t1 = time.time()
                t2 = time.time()
                row = {"replica": args.replica, "period": period, "ran": ran}
                row.update(boundary=boundary, t0=t0, t1=t1, t2=t2)
                print(json.dumps(row), flush=True)


def main() -> None:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("replica")
    parser.add_argument("--name", required=True)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--skew", type=float, default=0.0)
    parser.add_argument("--at-least-for", type=float, default=0.5)
    parser.add_argument("--at-most-for", type=float, default=10.0)
    asyncio.run(replica(parser.parse_args()))


if __name__ == "__main__":
    main()
