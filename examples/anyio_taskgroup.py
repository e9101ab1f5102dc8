"""Tasks of an anyio task group sharing locks; cancel scopes release cleanly.

::

    python examples/anyio_taskgroup.py                  # memory://
    python examples/anyio_taskgroup.py --url zk://127.0.0.1:2181

Three short scenes, each checked:

1. **Sharing**: eight tasks of one task group append to a report under one
   mutex; the critical sections never overlap.
2. **fail_after around acquisition**: while a task holds the lock, another
   waits at most 0.2 s (``anyio.fail_after``) and gets ``TimeoutError``;
   its place in the queue is gone at once.
3. **Cancel the whole group**: one task holds the lock, two wait; the
   group's cancel scope is cancelled; afterwards nothing is held or queued
   and another connection takes the lock with ``timeout=0``.

anyio is not a dependency of aiolocks (``pip install "aiolocks[anyio]"``).
aiolocks runs on asyncio, so anyio runs here with its asyncio backend (the
default), and anyio's level-triggered cancellation is handled like
``task.cancel()``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

import anyio

import aiolocks


@dataclass
class Result:
    """What each scene observed."""

    appended: list[int] = field(default_factory=list)
    max_inside: int = 0
    timed_out: bool = False
    queue_after_timeout: int = -1
    queue_after_cancel: int = -1
    taken_after_cancel: bool = False


async def run(url: str = "memory://") -> Result:
    """Play the three scenes on ``url``; return what they observed."""
    result = Result()
    run_id = os.urandom(4).hex()
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as other:
        # 1. Sharing a lock inside one task group.
        report = backend.mutex(f"locks/report/{run_id}/daily")
        inside = 0

        async def append(n: int) -> None:
            nonlocal inside
            with anyio.fail_after(30):  # always bound the wait
                await report.acquire()
            try:
                inside += 1
                result.max_inside = max(result.max_inside, inside)
                await anyio.sleep(0.01)  # an await inside the critical section
                result.appended.append(n)
                inside -= 1
            finally:
                await report.release()

        async with anyio.create_task_group() as group:
            for n in range(8):
                group.start_soon(append, n)

        # 2. anyio.fail_after around the acquisition.
        busy = backend.mutex(f"locks/report/{run_id}/busy")
        held = anyio.Event()
        done = anyio.Event()

        async def holder() -> None:
            async with busy:
                held.set()
                await done.wait()

        async def impatient() -> None:
            await held.wait()
            try:
                with anyio.fail_after(0.2):
                    await other.mutex(busy.name).acquire()
            except TimeoutError:
                result.timed_out = True
                # The cancelled wait left no queue entry: only the holder is listed.
                result.queue_after_timeout = len(await busy.participants())
            finally:
                done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(holder)
            group.start_soon(impatient)

        # 3. Cancelling the whole group while one task holds and two wait.
        job = backend.mutex(f"locks/report/{run_id}/job")
        started = anyio.Event()

        async def hold_forever() -> None:
            async with job:
                started.set()
                await anyio.sleep_forever()

        async def wait_for_it() -> None:
            await started.wait()
            async with job:  # never acquired: the group is cancelled first
                raise AssertionError("unreachable")

        async with anyio.create_task_group() as group:
            group.start_soon(hold_forever)
            group.start_soon(wait_for_it)
            group.start_soon(wait_for_it)
            await started.wait()
            await anyio.sleep(0.1)  # let the waiters queue up
            group.cancel_scope.cancel()

        result.queue_after_cancel = len(await job.participants())
        probe = other.mutex(job.name)
        result.taken_after_cancel = await probe.acquire(timeout=0)
        if result.taken_after_cancel:
            await probe.release()
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    args = parser.parse_args(argv)
    result = anyio.run(run, args.url)
    print(f"anyio task group on {args.url}")
    print(
        f"  1. 8 tasks shared one mutex: appended {len(result.appended)}, "
        f"max inside at once {result.max_inside}"
    )
    print(
        f"  2. fail_after(0.2) while busy: TimeoutError={result.timed_out}, "
        f"queue afterwards {result.queue_after_timeout} (the holder)"
    )
    print(
        f"  3. group cancelled (1 holding, 2 waiting): queue afterwards "
        f"{result.queue_after_cancel}, taken at once by another connection: "
        f"{result.taken_after_cancel}"
    )
    ok = (
        len(result.appended) == 8
        and result.max_inside == 1
        and result.timed_out
        and result.queue_after_timeout == 1
        and result.queue_after_cancel == 0
        and result.taken_after_cancel
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
