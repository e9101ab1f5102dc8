"""A cron job on several hosts: one LeaderLatch, only the leader runs the job.

::

    python examples/leader_cron.py --url zk://127.0.0.1:2181
    python examples/leader_cron.py --url 'redis://127.0.0.1:6379/0?lease_time=5'
    python examples/leader_cron.py                      # memory://, nodes as tasks
    python examples/leader_cron.py --node host-a --url zk://127.0.0.1:2181   # one node

Without ``--node`` the script is a small launcher: it starts ``--nodes``
node processes (``python leader_cron.py --node host-N``), relays what they
print, kills the leader with SIGKILL once it has run the job twice, and
shows another node taking over, then stops the rest with SIGTERM.

A node joins the election with ``backend.leader_latch(name,
participant_id=...)``, and, while it leads, runs the job every
``--interval`` seconds, passing the latch's fencing token along. A node
stopped with SIGTERM or Ctrl-C closes its latch: the next node leads at
once. A node killed with SIGKILL cannot say goodbye: the others take over
when its ZooKeeper session expires (``session_timeout``) or its Redis lease
lapses (``lease_time``), so pick those as "how long may the job stall after
a crash".

``memory://`` lives inside one process, so there the nodes are tasks with
their own connections, and "kill" cancels the leader's task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiolocks

#: what a node prints; the launcher (and the tests) parse these lines
LINE = re.compile(r"^(?P<node>\S+): (?P<what>started|leader now|job run|stopped)\b")


async def node(
    url: str,
    node_id: str,
    *,
    name: str = "leaders/cron/nightly-report",
    interval: float = 0.5,
    emit: Callable[[str], None] = print,
) -> None:
    """Run one node until cancelled: join the election, run the job while leading."""
    async with (
        aiolocks.connect(url) as backend,
        backend.leader_latch(name, participant_id=node_id) as latch,
    ):
        emit(f"{node_id}: started")
        runs = 0
        try:
            while True:
                if not await latch.wait_for_leadership(timeout=60):
                    continue
                token = latch.fencing_token
                emit(f"{node_id}: leader now (fencing token {token})")
                # Check before every run: leadership can be lost between runs
                # (session expired, lease lapsed); the latch then queues again.
                while latch.has_leadership:
                    runs += 1
                    emit(f"{node_id}: job run #{runs} (fencing token {token})")
                    await asyncio.sleep(interval)
        finally:
            emit(f"{node_id}: stopped")


def _node_main(url: str, node_id: str, name: str, interval: float) -> int:
    """One node as a process; SIGTERM and SIGINT stop it cleanly."""

    def emit(line: str) -> None:
        print(line, flush=True)

    async def run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await node(url, node_id, name=name, interval=interval, emit=emit)

    asyncio.run(run())
    return 0


@dataclass
class Summary:
    """What the launcher saw."""

    first_leader: str = ""
    second_leader: str = ""
    handover_seconds: float = 0.0
    runs: Counter[str] = field(default_factory=Counter)
    runs_by_non_leader: int = 0
    """Job runs by a node that was not the current leader (must stay 0)."""


async def launch(
    url: str,
    *,
    nodes: int = 3,
    name: str | None = None,
    interval: float = 0.3,
    runs_before_kill: int = 2,
    runs_after_handover: int = 2,
    timeout: float = 90.0,
) -> Summary:
    """Start ``nodes`` nodes, kill the leader, watch the handover; return a summary."""
    name = name or f"leaders/cron/{os.urandom(4).hex()}/nightly-report"
    lines: asyncio.Queue[str] = asyncio.Queue()
    in_process = url.split("://", 1)[0] == "memory"
    tasks: dict[str, asyncio.Task[None]] = {}
    processes: dict[str, asyncio.subprocess.Process] = {}
    readers: list[asyncio.Task[None]] = []

    async def relay(process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            lines.put_nowait(raw.decode().rstrip())

    node_ids = [f"host-{chr(ord('a') + n)}" for n in range(nodes)]
    for node_id in node_ids:
        if in_process:
            tasks[node_id] = asyncio.create_task(
                node(url, node_id, name=name, interval=interval, emit=lines.put_nowait)
            )
        else:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-u", os.path.abspath(__file__), "--node", node_id,
                "--url", url, "--name", name, "--interval", str(interval),
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            processes[node_id] = process
            readers.append(asyncio.create_task(relay(process)))

    summary = Summary()
    leader = ""
    killed = ""
    killed_at = 0.0
    try:
        async with asyncio.timeout(timeout):
            while True:
                line = await lines.get()
                print(f"  {line}")
                match = LINE.match(line)
                if match is None or match["what"] != "job run":
                    continue
                who = match["node"]
                if not leader or (killed and who != killed and not summary.second_leader):
                    leader = who
                    if killed:
                        summary.second_leader = who
                        summary.handover_seconds = time.monotonic() - killed_at
                        took = summary.handover_seconds
                        print(f"  -> {who} took over {took:.1f} s after the kill")
                    else:
                        summary.first_leader = who
                if who != leader:
                    summary.runs_by_non_leader += 1
                summary.runs[who] += 1
                if not killed and summary.runs[who] >= runs_before_kill:
                    killed, killed_at = who, time.monotonic()
                    if in_process:
                        print(f"  -> cancelling the leader {who}")
                        tasks[who].cancel()
                    else:
                        print(f"  -> killing the leader {who} (SIGKILL)")
                        processes[who].kill()
                elif summary.second_leader and summary.runs[who] >= runs_after_handover:
                    break
    finally:
        # Cleanup path: stop every node, whatever happened above.
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for process in processes.values():
            if process.returncode is None:
                process.terminate()
        for process in processes.values():
            await process.wait()
        await asyncio.gather(*readers, return_exceptions=True)
        while not lines.empty():
            print(f"  {lines.get_nowait()}")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--node", metavar="ID", help="run one node with this participant id")
    parser.add_argument("--name", default=None, help="the latch name (default: a fresh one)")
    parser.add_argument("--nodes", type=int, default=3, help="nodes the launcher starts")
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between job runs")
    args = parser.parse_args(argv)
    if args.node:
        return _node_main(
            args.url, args.node, args.name or "leaders/cron/nightly-report", args.interval
        )
    where = "tasks" if args.url.startswith("memory:") else "processes"
    print(f"leader latch on {args.url}: {args.nodes} nodes as {where}")
    summary = asyncio.run(
        launch(args.url, nodes=args.nodes, name=args.name, interval=args.interval)
    )
    print(
        f"first leader {summary.first_leader}, then {summary.second_leader} "
        f"(handover {summary.handover_seconds:.1f} s); runs per node {dict(summary.runs)}; "
        f"runs by a non-leader: {summary.runs_by_non_leader}"
    )
    ok = bool(summary.second_leader) and summary.runs_by_non_leader == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
