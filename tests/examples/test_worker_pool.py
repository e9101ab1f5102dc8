"""examples/worker_pool.py: per-SKU locks never oversell; the semaphore caps the API at 5,
in one process and across several worker processes (state in PostgreSQL)."""

from __future__ import annotations

import pytest

from aiolocks.testing import PostgresServer, RedisServer
from examples import worker_pool

from .conftest import LOCK_SERVERS, lock_server_url, run_example


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


@pytest.mark.parametrize("label", list(LOCK_SERVERS))
def test_several_processes_never_oversell_and_share_the_cap(
    request: pytest.FixtureRequest, postgres_server: PostgresServer, label: str
) -> None:
    url = lock_server_url(request, label)
    report = worker_pool.run_processes(
        url, postgres_server.url, processes=3, workers=4, orders=90, skus=3, stock=15
    )
    # Every process took its share of the orders, and they raced for the same SKUs.
    assert report.orders_per_process == [30, 30, 30]
    assert not report.oversold
    assert report.consistent
    # About 180 units ordered for 45 in stock: every SKU sells out exactly.
    assert report.final == {"sku-0": 0, "sku-1": 0, "sku-2": 0}
    assert sum(report.sold.values()) == 45
    assert report.rejected > 0
    # The downstream API's meter is in the database: the cap holds across processes.
    assert 1 <= report.max_concurrent_downstream <= worker_pool.DOWNSTREAM_LIMIT


def test_several_processes_need_a_lock_server_and_a_database() -> None:
    with pytest.raises(ValueError, match="memory://"):
        worker_pool.run_processes("memory://", "postgresql://h/db")
    with pytest.raises(ValueError, match="--database"):
        worker_pool.run_processes("redis://127.0.0.1:1", "")


def test_script_runs_as_a_user_would(example_url: str) -> None:
    result = run_example("worker_pool", "--url", example_url, "--orders", "80")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "oversold: no, consistent: True" in result.stdout
    assert "(limit 5)" in result.stdout


def test_script_with_processes_runs_as_a_user_would(
    redis_server: RedisServer, postgres_server: PostgresServer
) -> None:
    result = run_example(
        "worker_pool", "--url", redis_server.url, "--database", postgres_server.url,
        "--processes", "2", "--workers", "3", "--orders", "40",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 processes of 3 workers" in result.stdout
    assert "orders per process (or connection): [20, 20]" in result.stdout
    assert "oversold: no, consistent: True" in result.stdout
