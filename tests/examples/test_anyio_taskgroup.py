"""examples/anyio_taskgroup.py: shared locks in a task group; cancel scopes release cleanly."""

from __future__ import annotations

import pytest

from examples import anyio_taskgroup

from .conftest import run_example


@pytest.mark.asyncio
async def test_scenes_share_time_out_and_cancel_cleanly(example_url: str) -> None:
    result = await anyio_taskgroup.run(example_url)
    # 1. the critical sections of eight tasks never overlapped
    assert sorted(result.appended) == list(range(8))
    assert result.max_inside == 1
    # 2. fail_after raised TimeoutError and left only the holder in the queue
    assert result.timed_out
    assert result.queue_after_timeout == 1
    # 3. cancelling the group released the holder and withdrew both waiters
    assert result.queue_after_cancel == 0
    assert result.taken_after_cancel


def test_script_runs_as_a_user_would(example_url: str) -> None:
    result = run_example("anyio_taskgroup", "--url", example_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "max inside at once 1" in result.stdout
    assert "taken at once by another connection: True" in result.stdout
