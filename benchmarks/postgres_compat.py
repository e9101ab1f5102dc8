"""The advisory cycle with and without asyncpg's private protocol call.

``python -m benchmarks.postgres_compat [ROUNDS] [CYCLES]`` (default 5 x 500):
two backends on one throwaway server, one cycling with the version gate of
``aiolocks.postgres._asyncpg_compat`` as detected, one with it forced off
(public ``PreparedStatement.fetch``). Blocks of 50 cycles alternate between
the two, so both see the same load; reported per round and as medians: wall
time and this process's CPU time per cycle (the server's work is the same on
both paths; the CPU figure is the steadier one on a loaded machine).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiolocks
from aiolocks.postgres import _asyncpg_compat as compat
from aiolocks.testing import PostgresServer

_BLOCK = 50


async def _cycles(lock: aiolocks.Mutex, count: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        await lock.acquire()
        await lock.release()
    return time.perf_counter() - wall, time.process_time() - cpu


async def _run(url: str, rounds: int, cycles: int) -> None:
    detected = compat.ENABLED
    async with aiolocks.connect(url) as gated, aiolocks.connect(url) as public:
        locks = {True: gated.mutex("bench/gated"), False: public.mutex("bench/public")}
        wall: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for index in range(rounds + 1):  # round 0 warms up
            spent = {key: [0.0, 0.0] for key in locks}
            for block in range(max(1, cycles // _BLOCK)):
                for key in (True, False) if block % 2 == 0 else (False, True):
                    compat.ENABLED = detected and key
                    w, c = await _cycles(locks[key], _BLOCK)
                    spent[key][0] += w
                    spent[key][1] += c
            if index == 0:
                continue
            done = max(1, cycles // _BLOCK) * _BLOCK
            for key in locks:
                wall[key].append(spent[key][0] / done * 1e6)
                cpu[key].append(spent[key][1] / done * 1e6)
            print(
                f"round {index}: wall {wall[True][-1]:.0f} / {wall[False][-1]:.0f} us, "
                f"cpu {cpu[True][-1]:.1f} / {cpu[False][-1]:.1f} us (gated / public)"
            )
        compat.ENABLED = detected
    med = statistics.median
    print(f"asyncpg gate {'on' if detected else 'OFF (both runs are public)'}")
    print(f"public / gated, median wall: {med(wall[False]) / med(wall[True]):.3f}")
    print(f"public / gated, median cpu:  {med(cpu[False]) / med(cpu[True]):.3f}")


def main() -> None:
    """Run the comparison on a throwaway server."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    with PostgresServer() as server:
        asyncio.run(_run(f"{server.url}?sslmode=disable", rounds, cycles))


if __name__ == "__main__":
    main()
