"""The etcd benchmark's contenders run and really cycle the lock (no timing asserted)."""

from __future__ import annotations

import pytest

from aiolocks.testing import EtcdServer

pytestmark = pytest.mark.etcd


@pytest.mark.asyncio
async def test_side_by_side_run_has_every_figure(etcd_server: EtcdServer) -> None:
    """``python -m benchmarks etcd --smoke``'s run, in process: every row and figure is there
    (the contended rounds raise if two holders ever overlap)."""
    from benchmarks.etcd import PLANS, run, table

    doc = await run(etcd_server.endpoints[0], PLANS["smoke"])
    for name in ("floor", "aiolocks", "aetcd"):
        assert doc["uncontended_ms"][name] > 0
        assert doc["requests_per_cycle"][name] > 0
    assert set(doc["contended_holds_per_s"]) >= {"aiolocks", "aetcd"}
    assert all(value > 0 for value in doc["contended_holds_per_s"].values())
    assert doc["drain"]["aiolocks"]["drain_ms"] > 0
    assert "| aiolocks |" in table(doc)
