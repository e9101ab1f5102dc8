"""The etcd benchmark's contenders run and really cycle the lock (no timing asserted)."""

from __future__ import annotations

import pytest

from aiolocks.testing import EtcdServer
from benchmarks.etcd_floor import ROWS

pytestmark = pytest.mark.etcd


@pytest.mark.asyncio
@pytest.mark.parametrize("row", list(ROWS))
async def test_each_row_cycles(etcd_server: EtcdServer, row: str) -> None:
    run, _ = ROWS[row]
    samples = await run(etcd_server.endpoints[0], 3)
    assert len(samples) == 3
    assert all(sample > 0 for sample in samples)
