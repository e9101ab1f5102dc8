"""examples/partitioned_workers.py: worker processes split a key space; a killed one's
shards move to the others (only its shards: the survivors keep theirs)."""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks._core.records import SupportsRecords
from examples import partitioned_workers

from .conftest import FAST_FAILOVER, run_example, with_option


def _needs_records(url: str) -> None:
    if not isinstance(aiolocks.connect(url)._backend._driver, SupportsRecords):
        pytest.skip("backend has no record store (groups need one)")


def _split(owned: dict[str, list[str]]) -> bool:
    shards = [shard for worker in owned.values() for shard in worker]
    return sorted(shards) == sorted(partitioned_workers.SHARDS) and all(owned.values())


@pytest.mark.asyncio
async def test_killing_a_worker_moves_only_its_shards(example_backend: tuple[str, str]) -> None:
    label, url = example_backend
    _needs_records(url)
    summary = await partitioned_workers.launch(
        with_option(url, FAST_FAILOVER.get(label)), workers=3
    )
    assert summary.killed == "w-c"
    assert sorted(summary.before) == ["w-a", "w-b", "w-c"] and _split(summary.before)
    assert sorted(summary.after) == ["w-a", "w-b"] and _split(summary.after)
    for survivor in ("w-a", "w-b"):
        assert set(summary.before[survivor]) <= set(summary.after[survivor])
    gained = {s for w in ("w-a", "w-b") for s in summary.after[w]} - {
        s for w in ("w-a", "w-b") for s in summary.before[w]
    }
    assert gained == set(summary.before["w-c"])


def test_the_script_runs_on_memory() -> None:
    done = run_example("partitioned_workers", "--url", "memory://", "--workers", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after killing w-b: {'w-a': 24}" in done.stdout
