"""examples/readwrite_config.py: readers share, writers exclude, no torn config."""

from __future__ import annotations

import asyncio

import pytest

import aiolocks
from examples import readwrite_config

from .conftest import run_example


@pytest.mark.asyncio
async def test_readers_share_writers_exclude_no_torn_reads(example_url: str) -> None:
    stats = await readwrite_config.run(example_url, readers=8, reads_each=10, writes=3)
    assert stats.reads == 80
    assert stats.writes == 3
    assert stats.torn_reads == 0
    assert stats.writer_overlaps == 0
    assert stats.max_readers_inside >= 2, "readers never overlapped: the read lock is not shared"
    async with aiolocks.connect(example_url) as backend:
        fair = backend.capabilities.fair
    if fair:
        # A fair queue lets each writer in between readers; on an unfair
        # backend (Redis) the readers may all pass before the first write.
        assert stats.versions_seen >= 2
    else:
        assert stats.versions_seen >= 1


@pytest.mark.asyncio
async def test_without_the_lock_the_store_does_tear() -> None:
    # The check is meaningful: the store really is torn mid-write without the lock.
    store = readwrite_config.ConfigStore(latency=0.01)

    write = asyncio.create_task(store.write(2))
    await asyncio.sleep(0)
    version, crc = store.version, store.crc
    await write
    assert crc != readwrite_config.checksum(version)


def test_script_runs_as_a_user_would(example_url: str) -> None:
    result = run_example("readwrite_config", "--url", example_url, "--readers", "6")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torn reads: 0, writer overlapped someone: 0" in result.stdout
