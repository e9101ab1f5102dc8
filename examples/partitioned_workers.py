"""A pool of worker processes splitting a key space with a group and the partitioner.

::

    python examples/partitioned_workers.py --url zk://127.0.0.1:2181
    python examples/partitioned_workers.py --url 'redis://127.0.0.1:6379/0?lease_time=4'
    python examples/partitioned_workers.py                  # memory://, workers as tasks
    python examples/partitioned_workers.py --worker w-a --url zk://127.0.0.1:2181  # one worker

Without ``--worker`` the script is a small launcher: it starts ``--workers``
worker processes, relays what they print, waits until every worker sees the
whole pool and the shards are split among them, kills one worker with
SIGKILL, waits until the others have taken over its shards, then stops the
rest with SIGTERM.

A worker joins the group ``--group`` (``backend.group(name).join(id)``) and
follows ``Partitioner(member).changes()``: on every membership change it
stops the shards it no longer owns, then starts the ones it gained. Each
shard's work runs under a lock on the shard, so that two workers never work
on one shard at once, even while one of them has not heard of a change yet.
A worker killed with SIGKILL cannot leave: its member record goes when its
session ends (ZooKeeper ``session_timeout``, the Redis ``lease_time``, the
etcd lease), and then the others take its shards over.

``memory://`` lives inside one process, so there the workers are tasks with
their own connections, and "kill" cancels a worker's task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import aiolocks

#: what a worker prints on each membership view; the launcher (and the tests) parse it
VIEW = re.compile(
    r"^(?P<worker>\S+): view (?P<version>\S+) members (?P<members>\S*) owns (?P<owns>\S*)$"
)

SHARDS = [f"shard-{i:02d}" for i in range(24)]


async def _work(backend: aiolocks.Backend, group: str, shard: str) -> None:
    """The work of one shard, under the shard's lock, until cancelled."""
    async with backend.mutex(f"{group}/shards/{shard}"):
        await asyncio.Event().wait()  # a real worker would consume the shard's queue here


async def worker(
    url: str,
    worker_id: str,
    *,
    group: str = "pools/partitioned-workers",
    shards: list[str] = SHARDS,
    emit: Callable[[str], None] = print,
) -> None:
    """Run one worker until cancelled: join the pool, run the shards it owns."""
    running: dict[str, asyncio.Task[None]] = {}
    async with aiolocks.connect(url) as backend:
        try:
            async with backend.group(group).join(worker_id) as member:
                async for owned in aiolocks.Partitioner(member).changes():
                    # stop what moved away before starting what arrived
                    for shard in [s for s in running if s not in owned]:
                        running.pop(shard).cancel()
                    for shard in owned.select(shards):
                        if shard not in running:
                            running[shard] = asyncio.create_task(_work(backend, group, shard))
                    emit(
                        f"{worker_id}: view {owned.version} members {','.join(owned.members)} "
                        f"owns {','.join(sorted(running))}"
                    )
        finally:
            # Cleanup path: stop every shard (and release its lock) before leaving.
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)


def _worker_main(url: str, worker_id: str, group: str) -> int:
    """One worker as a process; SIGTERM and SIGINT stop it cleanly."""

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await worker(url, worker_id, group=group, emit=lambda line: print(line, flush=True))

    asyncio.run(run())
    return 0


@dataclass
class Summary:
    """What the launcher saw: the last view of each worker, before and after the kill."""

    killed: str = ""
    before: dict[str, list[str]] = field(default_factory=dict)
    after: dict[str, list[str]] = field(default_factory=dict)


def _split(views: dict[str, tuple[str, list[str], list[str]]], pool: list[str]) -> bool:
    """Every worker of ``pool`` sees exactly ``pool``, one version, and the shards are split."""
    if set(views) < set(pool) or any(sorted(views[w][1]) != sorted(pool) for w in pool):
        return False
    if len({views[w][0] for w in pool}) != 1:
        return False
    owned = [shard for w in pool for shard in views[w][2]]
    return sorted(owned) == sorted(SHARDS)


async def launch(
    url: str, *, workers: int = 3, group: str | None = None, timeout: float = 90.0
) -> Summary:
    """Start ``workers`` workers, kill one, watch its shards move; return a summary."""
    group = group or f"pools/{os.urandom(4).hex()}/workers"
    lines: asyncio.Queue[str] = asyncio.Queue()
    in_process = url.split("://", 1)[0] == "memory"
    tasks: dict[str, asyncio.Task[None]] = {}
    processes: dict[str, asyncio.subprocess.Process] = {}
    readers: list[asyncio.Task[None]] = []

    async def relay(process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            lines.put_nowait(raw.decode().rstrip())

    pool = [f"w-{chr(ord('a') + n)}" for n in range(workers)]
    for worker_id in pool:
        if in_process:
            tasks[worker_id] = asyncio.create_task(
                worker(url, worker_id, group=group, emit=lines.put_nowait)
            )
        else:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-u", os.path.abspath(__file__), "--worker", worker_id,
                "--url", url, "--group", group, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            processes[worker_id] = process
            readers.append(asyncio.create_task(relay(process)))
    summary = Summary()
    try:
        async with asyncio.timeout(timeout):
            await _follow(lines, pool, summary, kill=lambda w: _kill(w, tasks, processes))
    finally:
        # Cleanup path: stop every worker, whatever happened above.
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for process in processes.values():
            if process.returncode is None:
                process.terminate()
        for process in processes.values():
            await process.wait()
        await asyncio.gather(*readers, return_exceptions=True)
    return summary


def _kill(
    worker_id: str,
    tasks: dict[str, asyncio.Task[None]],
    processes: dict[str, asyncio.subprocess.Process],
) -> None:
    if worker_id in tasks:
        print(f"  -> cancelling {worker_id}")
        tasks[worker_id].cancel()
    else:
        print(f"  -> killing {worker_id} (SIGKILL)")
        processes[worker_id].kill()


async def _follow(
    lines: asyncio.Queue[str], pool: list[str], summary: Summary, kill: Callable[[str], None]
) -> None:
    """Read the workers' views: kill one once the pool is split, return once it is again."""
    views: dict[str, tuple[str, list[str], list[str]]] = {}
    while True:
        line = await lines.get()
        print(f"  {line}")
        match = VIEW.match(line)
        if match is None:
            continue
        members = match["members"].split(",") if match["members"] else []
        owns = match["owns"].split(",") if match["owns"] else []
        views[match["worker"]] = (match["version"], members, owns)
        if not summary.killed and _split(views, pool):
            summary.before = {w: views[w][2] for w in pool}
            summary.killed = pool[-1]
            pool = pool[:-1]
            kill(summary.killed)
        elif summary.killed and _split(views, pool):
            summary.after = {w: views[w][2] for w in pool}
            return


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--worker", metavar="ID", help="run one worker with this member id")
    parser.add_argument("--group", default=None, help="the group name (default: a fresh one)")
    parser.add_argument("--workers", type=int, default=3, help="workers the launcher starts")
    args = parser.parse_args(argv)
    if args.worker:
        return _worker_main(args.url, args.worker, args.group or "pools/partitioned-workers")
    where = "tasks" if args.url.startswith("memory:") else "processes"
    print(f"partitioned workers on {args.url}: {args.workers} workers as {where}")
    summary = asyncio.run(launch(args.url, workers=args.workers, group=args.group))
    print(f"before: { {w: len(s) for w, s in summary.before.items()} }")
    print(f"after killing {summary.killed}: { {w: len(s) for w, s in summary.after.items()} }")
    return 0 if summary.after else 1


if __name__ == "__main__":
    raise SystemExit(main())
