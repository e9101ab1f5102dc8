"""examples/fastapi_app.py: concurrent payments of one order, one pays, the rest get 409."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from aiolocks.testing import lose
from examples import fastapi_app

from .conftest import run_example


def _order_id() -> int:
    # a fresh order per test, so runs sharing a server never meet on one lock name
    return random.randrange(1000, 1100)


@pytest.mark.asyncio
async def test_concurrent_payments_one_pays_others_409(example_url: str) -> None:
    gateway = fastapi_app.PaymentGateway(latency=0.01)
    app = fastapi_app.create_app(example_url, gateway=gateway)
    order_id = _order_id()
    async with app.router.lifespan_context(app):
        backend = app.state.backend
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://shop"
        ) as client:
            responses = await asyncio.gather(
                *(client.post(f"/orders/{order_id}/pay") for _ in range(8))
            )
            state = await client.get(f"/orders/{order_id}")
        assert not backend._holds, "a request left its lock held"
    codes = sorted(response.status_code for response in responses)
    assert codes == [200] + [409] * 7
    paid = next(response.json() for response in responses if response.status_code == 200)
    assert paid["order"] == order_id
    assert [charge[0] for charge in gateway.charges] == [order_id]
    assert gateway.charges[0][2] == paid["fencing_token"]
    assert state.json() == {"order": order_id, "paid": True}
    assert backend.closed, "the lifespan must close the backend"


@pytest.mark.asyncio
async def test_busy_lock_answers_409_while_payment_is_in_flight(example_url: str) -> None:
    gate = asyncio.Event()
    gateway = fastapi_app.PaymentGateway(latency=0, gate=gate)
    app = fastapi_app.create_app(example_url, gateway=gateway, lock_timeout=0.2)
    order_id = _order_id()
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client,
    ):
        first = asyncio.create_task(client.post(f"/orders/{order_id}/pay"))
        # The first request holds the lock while the gateway is gated.
        lock = app.state.backend.mutex(f"locks/pay/order-{order_id}")
        async with asyncio.timeout(30):
            while not await lock.participants():
                await asyncio.sleep(0.01)
        others = await asyncio.gather(*(client.post(f"/orders/{order_id}/pay") for _ in range(3)))
        assert not first.done()
        gate.set()
        paid = await first
        after = await client.post(f"/orders/{order_id}/pay")
    assert [response.status_code for response in others] == [409, 409, 409]
    for response in others:
        assert response.json()["detail"] == f"order {order_id} is being paid by another request"
        assert response.headers["retry-after"] == "1"
    assert paid.status_code == 200
    assert after.status_code == 409
    assert after.json()["detail"] == f"order {order_id} is already paid"
    assert len(gateway.charges) == 1


@pytest.mark.asyncio
async def test_lock_lost_during_payment_answers_503_and_leaks_nothing(example_url: str) -> None:
    gate = asyncio.Event()  # never set: the payment stays in flight until the loss
    gateway = fastapi_app.PaymentGateway(latency=0, gate=gate)
    app = fastapi_app.create_app(example_url, gateway=gateway)
    order_id = _order_id()
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client,
    ):
        backend = app.state.backend
        paying = asyncio.create_task(client.post(f"/orders/{order_id}/pay"))
        lock = backend.mutex(f"locks/pay/order-{order_id}")
        async with asyncio.timeout(30):
            while not lock.is_acquired_in_this_process():
                await asyncio.sleep(0.01)
        await lose(lock)  # as if the session expired in the middle of the payment
        response = await paying
        state = await client.get(f"/orders/{order_id}")
        assert not backend._holds, "the lost request left its lock held"
        # the order's lock is usable again at once
        gateway.gate = None
        again = await client.post(f"/orders/{order_id}/pay")
    assert response.status_code == 503
    assert response.json()["detail"] == (
        f"lost the lock on order {order_id} while processing the request; "
        "the outcome is unknown: check the order before retrying"
    )
    assert state.json() == {"order": order_id, "paid": False}
    assert again.status_code == 200
    assert [charge[0] for charge in gateway.charges] == [order_id]


@pytest.mark.asyncio
async def test_unknown_order_is_404_and_leaves_nothing_held() -> None:
    app = fastapi_app.create_app("memory://")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client,
    ):
        response = await client.post("/orders/5/pay")
        assert response.status_code == 404
        assert not app.state.backend._holds


def test_script_runs_as_a_user_would(example_url: str) -> None:
    result = run_example("fastapi_app", "--url", example_url, "--requests", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "paid: 1, conflict (409): 3" in result.stdout
