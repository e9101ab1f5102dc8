"""examples/worker_pool.py: per-SKU locks never oversell; the semaphore caps the API at 5."""

from __future__ import annotations

import pytest

from examples import worker_pool

from .conftest import run_example


@pytest.mark.asyncio
async def test_stock_is_never_oversold_and_downstream_stays_capped(example_url: str) -> None:
    report = await worker_pool.run(example_url, workers=12, orders=120, skus=3, stock=20)
    assert not report.oversold
    assert report.consistent
    assert 1 <= report.max_concurrent_downstream <= worker_pool.DOWNSTREAM_LIMIT
    # About 240 units ordered for 60 in stock: every SKU sells out exactly.
    assert report.final == {"sku-0": 0, "sku-1": 0, "sku-2": 0}
    assert sum(report.sold.values()) == 60
    assert report.rejected > 0


@pytest.mark.asyncio
async def test_without_enough_orders_nothing_is_rejected() -> None:
    report = await worker_pool.run("memory://", workers=4, orders=10, skus=2, stock=100)
    assert report.rejected == 0
    assert report.shipped == sum(report.sold.values()) > 0
    assert report.consistent


def test_script_runs_as_a_user_would(example_url: str) -> None:
    result = run_example("worker_pool", "--url", example_url, "--orders", "80")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "oversold: no, consistent: True" in result.stdout
    assert "(limit 5)" in result.stdout
