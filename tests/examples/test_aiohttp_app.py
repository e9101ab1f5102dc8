"""examples/aiohttp_app.py with aiohttp's test client: one payment wins, the rest get 409."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiohttp.test_utils import TestClient, TestServer

from examples import aiohttp_app

from .conftest import run_example


@pytest.mark.asyncio
async def test_concurrent_payments_one_pays_others_409(example_url: str) -> None:
    shop = aiohttp_app.Shop(latency=0.01)
    app = aiohttp_app.create_app(example_url, shop=shop)
    order_id = random.randrange(1000, 1100)
    async with TestClient(TestServer(app)) as client:
        backend = app[aiohttp_app.BACKEND]

        async def pay() -> tuple[int, str]:
            async with client.post(f"/orders/{order_id}/pay") as response:
                return response.status, await response.text()

        results = await asyncio.gather(*(pay() for _ in range(8)))
        assert not backend._holds, "a request left its lock held"
    assert sorted(status for status, _ in results) == [200] + [409] * 7
    assert shop.paid == {order_id}
    assert len(shop.charges) == 1
    assert backend.closed, "cleanup_ctx must close the backend"


@pytest.mark.asyncio
async def test_busy_lock_answers_409_while_payment_is_in_flight(example_url: str) -> None:
    gate = asyncio.Event()
    shop = aiohttp_app.Shop(latency=0, gate=gate, lock_timeout=0.2)
    app = aiohttp_app.create_app(example_url, shop=shop)
    order_id = random.randrange(1000, 1100)
    async with TestClient(TestServer(app)) as client:
        first = asyncio.create_task(client.post(f"/orders/{order_id}/pay"))
        lock = app[aiohttp_app.BACKEND].mutex(f"locks/pay/order-{order_id}")
        async with asyncio.timeout(30):
            while not await lock.participants():
                await asyncio.sleep(0.01)
        others = []
        for _ in range(3):
            async with client.post(f"/orders/{order_id}/pay") as response:
                others.append(
                    (response.status, await response.text(), response.headers.get("Retry-After"))
                )
        assert not first.done()
        gate.set()
        async with await first as paid:
            assert paid.status == 200
            body = await paid.json()
        async with client.post(f"/orders/{order_id}/pay") as after:
            assert after.status == 409
            assert await after.text() == f"order {order_id} is already paid"
    busy = f"order {order_id} is being paid by another request"
    assert others == [(409, busy, "1")] * 3
    assert body["order"] == order_id
    assert shop.charges == [(order_id, shop.due[order_id], body["fencing_token"])]


def test_script_runs_as_a_user_would(example_url: str) -> None:
    result = run_example("aiohttp_app", "--url", example_url, "--requests", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "paid: 1, conflict (409): 3" in result.stdout
