"""examples/aiohttp_app.py in this process (memory:// locks, orders in PostgreSQL): the HTTP
answers one by one. The worker processes on real lock servers are in
test_payments_across_processes.py."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from aiolocks.testing import EtcdServer, PostgresServer, lose
from examples import aiohttp_app, shop

from .conftest import fresh_schema, pause_payment, run_example, wait_for_file

ORDER = 1043


@asynccontextmanager
async def _client(
    settings: shop.Settings,
) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], web.Application]]:
    app = aiohttp_app.create_app(settings)
    async with TestClient(TestServer(app)) as client:
        yield client, app
        assert not app[aiohttp_app.BACKEND]._holds, "a request left its lock held"
    assert app[aiohttp_app.BACKEND].closed, "cleanup_ctx must close the backend"


@pytest.mark.asyncio
async def test_busy_lock_answers_409_while_payment_is_in_flight(
    shop_settings: shop.Settings,
) -> None:
    settings = dataclasses.replace(shop_settings, lock_timeout=0.2)
    held, taken = pause_payment(settings, "before-charge")
    async with _client(settings) as (client, _):
        first = asyncio.create_task(client.post(f"/orders/{ORDER}/pay"))
        await wait_for_file(held)
        others = []
        for _ in range(3):
            async with client.post(f"/orders/{ORDER}/pay") as response:
                others.append(
                    (response.status, await response.text(), response.headers.get("Retry-After"))
                )
        assert not first.done()
        taken.unlink()
        async with await first as paid:
            assert paid.status == 200
            body = await paid.json()
        async with client.post(f"/orders/{ORDER}/pay") as after:
            assert after.status == 409
            assert await after.text() == f"order {ORDER} is already paid"
        async with client.get(f"/orders/{ORDER}") as state:
            assert await state.json() == {
                "order": ORDER,
                "status": "paid",
                "charged_by": body["fencing_token"],
            }
    busy = f"order {ORDER} is being paid by another request"
    assert others == [(409, busy, "1")] * 3


@pytest.mark.asyncio
@pytest.mark.parametrize("phase", ["before-charge", "after-charge"])
async def test_lock_lost_during_payment_answers_503_not_500(
    shop_settings: shop.Settings, phase: str
) -> None:
    held, _ = pause_payment(shop_settings, phase)  # stays paused until the loss
    async with _client(shop_settings) as (client, app):
        paying = asyncio.create_task(client.post(f"/orders/{ORDER}/pay"))
        await wait_for_file(held)
        await lose(app[aiohttp_app.BACKEND].mutex(f"locks/pay/order-{ORDER}"))
        async with await paying as response:
            lost = (response.status, await response.text(), response.headers.get("Retry-After"))
        async with client.post(f"/orders/{ORDER}/pay") as again:
            retry = again.status, await again.text()
    assert lost == (503, aiohttp_app.lost_detail(ORDER), "1")
    async with shop.open_pool(shop_settings) as pool:
        charges = await shop.charges(pool, ORDER)
    assert len(charges) == 1
    if phase == "before-charge":
        assert retry[0] == 200
    else:
        assert retry == (409, f"order {ORDER} is already paid")


@pytest.mark.asyncio
async def test_unknown_order_is_404(shop_settings: shop.Settings) -> None:
    async with _client(shop_settings) as (client, _):
        async with client.post("/orders/5/pay") as paid:
            assert paid.status == 404
        async with client.get("/orders/5") as read:
            assert read.status == 404


# The demo (examples/shop_demo.py) is the same code for both apps: run from aiohttp's script.
def test_script_runs_as_a_user_would(
    etcd_server: EtcdServer, postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fresh_schema(postgres_server) as schema:

        def demo(*options: str) -> subprocess.CompletedProcess[str]:
            return run_example(
                "aiohttp_app", "--url", etcd_server.url, "--database", postgres_server.url,
                "--schema", schema, "--requests", "4", *options, module=True,
            )  # fmt: skip

        result = demo("--order", "31337")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "to 2 aiohttp worker processes" in result.stdout
        assert "paid: 1, conflict (409): 3" in result.stdout
        assert result.stdout.count("charge in the database") == 1
        # Again, breaking the lock while a payment is at the provider (1 s): whatever
        # the timing, one charge, no 500, and the 503s' retries do not charge again.
        monkeypatch.setenv("SHOP_PROVIDER_LATENCY", "1")
        result = demo("--lose-after", "0.5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broke the order's lock after 0.5 s" in result.stdout
    assert result.stdout.count("charge in the database") == 1
