"""examples/latch_fanout.py: a coordinator and worker processes joined by a latch on a server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import aiolocks
from examples import latch_fanout

from ..polling import eventually
from .conftest import run_example

#: the servers the example runs on: memory (workers as tasks), then processes
SERVERS = {"memory": None, "redis": "redis_server", "postgres": "postgres_server"}


def _url(request: pytest.FixtureRequest, label: str) -> str:
    fixture = SERVERS[label]
    if fixture is None:
        return "memory://"
    url: str = request.getfixturevalue(fixture).url
    return url


@pytest.mark.parametrize("label", list(SERVERS))
@pytest.mark.asyncio
async def test_the_coordinator_adds_up_every_part(
    label: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = _url(request, label)
    result = await latch_fanout.coordinate(url, tmp_path, workers=3, items=50)
    assert sorted(result.parts) == [0, 1, 2]
    assert result.parts[1] == latch_fanout.share(50, 3, 1)
    assert result.total == result.expected == sum(i * i for i in range(50))
    async with aiolocks.connect(url) as backend:  # an open latch leaves nothing behind
        assert await backend.count_down_latch(result.batch).get_count() == 0


@pytest.mark.parametrize("label", ["redis", "postgres"])
@pytest.mark.asyncio
async def test_the_coordinator_waits_for_the_last_worker(
    label: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Worker 1 is held back: the count stays at 1 and the coordinator waits until it goes on."""
    url = _url(request, label)
    batch = f"batches/test-{tmp_path.name}"
    hold = tmp_path / "hold-1"
    hold.write_text("")
    coordinator = asyncio.ensure_future(
        latch_fanout.coordinate(url, tmp_path, workers=3, items=30, batch=batch)
    )
    try:
        async with aiolocks.connect(url) as backend:
            latch = backend.count_down_latch(batch)

            async def one_left() -> bool:
                return await latch.get_count() == 1

            await eventually(one_left, 120, what="workers 0 and 2 to count down")
            assert not coordinator.done()  # the count is 1: the latch is shut
            assert not (tmp_path / "part-1.json").exists()
            hold.unlink()  # worker 1 goes on
            result = await asyncio.wait_for(coordinator, 120)
            assert await latch.get_count() == 0
    finally:
        if hold.exists():
            hold.unlink()
        if not coordinator.done():
            coordinator.cancel()
    assert result.total == result.expected


def test_the_script_runs_and_reports() -> None:
    result = run_example("latch_fanout", "--workers", "3", "--items", "20")
    assert result.returncode == 0, result.stderr
    assert f"3 parts, total {sum(i * i for i in range(20))}" in result.stdout
