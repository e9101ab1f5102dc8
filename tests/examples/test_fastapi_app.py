"""examples/fastapi_app.py in this process (memory:// locks, orders in PostgreSQL): the HTTP
answers one by one. The worker processes on real lock servers are in
test_payments_across_processes.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.datastructures import State

from aiolocks.testing import lose
from examples import fastapi_app, shop

from .conftest import pause_payment, wait_for_file

ORDER = 1042


@asynccontextmanager
async def _client(settings: shop.Settings) -> AsyncIterator[tuple[httpx.AsyncClient, State]]:
    app = fastapi_app.create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client,
    ):
        yield client, app.state
        assert not app.state.backend._holds, "a request left its lock held"


@pytest.mark.asyncio
async def test_busy_lock_answers_409_while_payment_is_in_flight(
    shop_settings: shop.Settings,
) -> None:
    settings = dataclasses.replace(shop_settings, lock_timeout=0.2)
    held, taken = pause_payment(settings, "before-charge")
    async with _client(settings) as (client, _):
        first = asyncio.create_task(client.post(f"/orders/{ORDER}/pay"))
        await wait_for_file(held)  # the first request holds the lock, paused
        others = await asyncio.gather(*(client.post(f"/orders/{ORDER}/pay") for _ in range(3)))
        assert not first.done()
        taken.unlink()  # let it go on
        paid = await first
        after = await client.post(f"/orders/{ORDER}/pay")
        state = await client.get(f"/orders/{ORDER}")
    assert [response.status_code for response in others] == [409, 409, 409]
    for response in others:
        assert response.json()["detail"] == f"order {ORDER} is being paid by another request"
        assert response.headers["retry-after"] == "1"
    assert paid.status_code == 200
    assert after.status_code == 409
    assert after.json()["detail"] == f"order {ORDER} is already paid"
    token = paid.json()["fencing_token"]
    assert state.json() == {"order": ORDER, "status": "paid", "charged_by": token}


@pytest.mark.asyncio
async def test_lock_lost_during_payment_answers_503_and_leaks_nothing(
    shop_settings: shop.Settings,
) -> None:
    held, _ = pause_payment(shop_settings, "before-charge")  # stays paused until the loss
    async with _client(shop_settings) as (client, state):
        paying = asyncio.create_task(client.post(f"/orders/{ORDER}/pay"))
        await wait_for_file(held)
        await lose(state.backend.mutex(f"locks/pay/order-{ORDER}"))
        response = await paying
        before = await client.get(f"/orders/{ORDER}")
        again = await client.post(f"/orders/{ORDER}/pay")  # the lock is usable again at once
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["detail"] == fastapi_app.lost_detail(ORDER)
    assert before.json() == {"order": ORDER, "status": "due", "charged_by": None}
    assert again.status_code == 200
    async with shop.open_pool(shop_settings) as pool:
        charges = await shop.charges(pool, ORDER)
    assert [charge.fencing_token for charge in charges] == [again.json()["fencing_token"]]


@pytest.mark.asyncio
async def test_unknown_order_is_404_and_leaves_nothing_held(shop_settings: shop.Settings) -> None:
    async with _client(shop_settings) as (client, _):
        paid = await client.post("/orders/5/pay")
        read = await client.get("/orders/5")
    assert paid.status_code == 404
    assert read.status_code == 404


def test_demo_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The demo itself (worker processes, concurrent payments) runs in test_aiohttp_app.py:
    # both apps share examples/shop_demo.py.
    monkeypatch.delenv("SHOP_DATABASE_URL", raising=False)
    assert fastapi_app.main(["--url", "memory://"]) == 2
    assert "memory:// locks only the tasks of one process" in capsys.readouterr().out
    assert fastapi_app.main(["--url", "redis://127.0.0.1:6379/0"]) == 2
    assert "no database: set SHOP_DATABASE_URL (or --database)" in capsys.readouterr().out
