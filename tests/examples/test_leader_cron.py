"""examples/leader_cron.py: several real processes, one leader; killing it hands over."""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from examples import leader_cron

from .conftest import EXAMPLES, FAST_FAILOVER, run_example, with_option


def _fast(example_backend: tuple[str, str]) -> str:
    label, url = example_backend
    return with_option(url, FAST_FAILOVER.get(label))


@pytest.mark.asyncio
async def test_launcher_kills_the_leader_and_another_takes_over(
    example_backend: tuple[str, str],
) -> None:
    summary = await leader_cron.launch(_fast(example_backend), nodes=3, interval=0.2)
    assert summary.first_leader
    assert summary.second_leader
    assert summary.second_leader != summary.first_leader
    assert summary.runs[summary.first_leader] >= 2
    assert summary.runs[summary.second_leader] >= 2
    assert summary.runs_by_non_leader == 0
    assert set(summary.runs) == {summary.first_leader, summary.second_leader}


class _Node:
    """One ``leader_cron.py --node`` process and the lines it printed."""

    def __init__(self, node_id: str, process: asyncio.subprocess.Process) -> None:
        self.id = node_id
        self.process = process
        self.lines: list[str] = []
        self.changed = asyncio.Event()

    async def pump(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode().rstrip())
            self.changed.set()

    def runs(self) -> int:
        return sum(": job run #" in line for line in self.lines)


async def _wait(nodes: list[_Node], predicate: Callable[[], bool], what: str) -> None:
    """Wait (event-driven, on new output) until ``predicate()`` holds."""
    try:
        async with asyncio.timeout(60):
            while not predicate():
                for node in nodes:
                    node.changed.clear()
                waiters = [asyncio.ensure_future(node.changed.wait()) for node in nodes]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
                    await asyncio.gather(*waiters, return_exceptions=True)
    except TimeoutError:
        output = "\n".join(line for node in nodes for line in node.lines)
        raise AssertionError(f"timed out waiting until {what}; output:\n{output}") from None


@asynccontextmanager
async def _nodes(url: str, name: str, count: int) -> AsyncIterator[list[_Node]]:
    nodes: list[_Node] = []
    pumps: list[asyncio.Task[None]] = []
    try:
        for n in range(count):
            node_id = f"node-{n}"
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-u", str(EXAMPLES / "leader_cron.py"), "--node", node_id,
                "--url", url, "--name", name, "--interval", "0.2",
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            nodes.append(_Node(node_id, process))
            pumps.append(asyncio.create_task(nodes[-1].pump()))
        yield nodes
    finally:
        # Cleanup path: no node process outlives the test.
        for node in nodes:
            if node.process.returncode is None:
                node.process.kill()
            await node.process.wait()
        await asyncio.gather(*pumps, return_exceptions=True)


@pytest.mark.asyncio
async def test_killed_leader_process_hands_over_and_sigterm_hands_over_again(
    example_backend: tuple[str, str],
) -> None:
    label, _ = example_backend
    if label == "memory":
        pytest.skip("memory:// lives inside one process; nodes as processes need a server")
    url = _fast(example_backend)
    name = f"leaders/cron/{uuid.uuid4().hex[:8]}"
    async with _nodes(url, name, 3) as nodes:

        def leaders() -> list[_Node]:
            return [node for node in nodes if node.runs() > 0 and node.process.returncode is None]

        await _wait(nodes, lambda: any(node.runs() >= 2 for node in nodes), "a leader runs")
        first = [node for node in nodes if node.runs()]
        assert len(first) == 1, "two nodes ran the job at once"
        leader = first[0]
        leader.process.send_signal(signal.SIGKILL)
        assert await leader.process.wait() == -signal.SIGKILL
        runs_at_kill = {node.id: node.runs() for node in nodes}

        def second_runs() -> bool:
            return any(n.runs() >= 2 for n in nodes if n is not leader)

        await _wait(nodes, second_runs, "another node leads after the kill")
        second = [node for node in nodes if node is not leader and node.runs()]
        assert len(second) == 1, "two nodes ran the job after the kill"
        successor = second[0]
        assert successor.runs() > runs_at_kill[successor.id]
        assert any(line.startswith(f"{successor.id}: leader now") for line in successor.lines)

        # A graceful stop (SIGTERM) closes the latch: the last node takes over.
        successor.process.send_signal(signal.SIGTERM)
        assert await successor.process.wait() == 0
        assert successor.lines[-1] == f"{successor.id}: stopped"
        last = next(node for node in nodes if node not in (leader, successor))
        await _wait(nodes, lambda: last.runs() >= 1, "the last node leads after SIGTERM")
        assert leaders() == [last]


def test_script_runs_as_a_user_would(example_backend: tuple[str, str]) -> None:
    result = run_example("leader_cron", "--url", _fast(example_backend), "--interval", "0.2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "took over" in result.stdout
    assert "runs by a non-leader: 0" in result.stdout
