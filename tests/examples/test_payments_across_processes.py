"""The payment apps as deployed: several worker processes, one lock server, one database.

For each app (FastAPI under uvicorn, aiohttp under ``web.run_app``) and each
lock server (ZooKeeper, Redis, etcd, PostgreSQL), two worker processes
serve on ports of their own, with the orders in PostgreSQL. Several
clients send payments of one order to both at once: exactly one charge,
409 for the others. Then a lock is broken from outside the workers
(``force_release``: a real loss on the server) while its holder is inside
the payment, before or after the charge: that request answers 503, never
500, its retry does not charge again, and the database holds one charge.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import aiolocks
from aiolocks.testing import PostgresServer
from examples import fastapi_app, shop
from examples.shop_demo import App, Reply, Workers, pay_concurrently, pay_once

from ..polling import eventually
from .conftest import LOCK_SERVERS, fresh_schema, lock_server_url

#: worker processes per app, clients, concurrent payments per order
WORKERS = 2
CLIENTS = 3
REQUESTS = 6

#: a request waits this long for the order's lock before 409 (long: the lock is
#: broken while the others wait, and one of them should then get it)
LOCK_TIMEOUT = 15.0

_orders = itertools.count(4200)


@dataclass
class Stack:
    """Worker processes of one app on one lock server, and how to reach their data."""

    app: App
    settings: shop.Settings
    urls: list[str]
    pause: Path

    @asynccontextmanager
    async def pool(self) -> AsyncIterator[object]:
        """A pool on the shop's tables."""
        async with shop.open_pool(self.settings) as pool:
            yield pool

    async def new_order(self) -> int:
        """A fresh due order."""
        order_id = next(_orders)
        async with self.pool() as pool:
            await shop.reset_order(pool, order_id)
        return order_id

    async def charges(self, order_id: int) -> list[shop.Charge]:
        """The order's charge rows."""
        async with self.pool() as pool:
            return await shop.charges(pool, order_id)


@pytest.fixture(
    scope="module",
    params=[(app, label) for app in ("fastapi", "aiohttp") for label in LOCK_SERVERS],
    ids=lambda param: f"{param[0]}-{param[1]}",
)
def stack(
    request: pytest.FixtureRequest,
    postgres_server: PostgresServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Two worker processes of one app, locks on one server, orders in a fresh schema."""
    app, label = request.param
    lock_url = lock_server_url(request, label)
    pause = tmp_path_factory.mktemp("pause") / "pause"
    with fresh_schema(postgres_server) as schema:
        settings = shop.Settings(
            lock_url=lock_url,
            database_url=postgres_server.url,
            schema=schema,
            lock_timeout=LOCK_TIMEOUT,
            provider_latency=0.01,
            pause_file=str(pause),
        )
        with Workers(app, settings, WORKERS) as urls:
            yield Stack(app, settings, urls, pause)


def _already_paid(reply: Reply, order_id: int) -> bool:
    return reply.status == 409 and reply.body["detail"] == f"order {order_id} is already paid"


def _conflict(reply: Reply, order_id: int) -> bool:
    busy = f"order {order_id} is being paid by another request"
    return _already_paid(reply, order_id) or (reply.status == 409 and reply.body["detail"] == busy)


@pytest.mark.asyncio
async def test_one_payment_across_worker_processes_the_rest_409(stack: Stack) -> None:
    order_id = await stack.new_order()
    replies = await pay_concurrently(stack.urls, order_id, requests=REQUESTS, clients=CLIENTS)
    assert {reply.worker for reply in replies} == set(stack.urls), "one worker got no request"
    paid = [reply for reply in replies if reply.status == 200]
    assert len(paid) == 1, replies
    assert all(_conflict(reply, order_id) for reply in replies if reply.status != 200), replies
    charges = await stack.charges(order_id)
    assert len(charges) == 1
    assert charges[0].fencing_token == paid[0].body["fencing_token"]
    assert charges[0].worker == paid[0].body["worker"]
    # The workers are distinct processes, and the one that paid says which it is.
    async with httpx.AsyncClient() as client:
        workers = {(await client.get(f"{url}/health")).json()["worker"] for url in stack.urls}
    assert len(workers) == WORKERS
    assert paid[0].body["worker"] in workers


async def _wait_for(path: Path, batch: asyncio.Task[list[Reply]]) -> tuple[int, int]:
    """``(pid, fencing token)`` of the paused request, once it has written them."""

    def paused() -> bool:
        if batch.done():
            raise AssertionError(f"no request paused: {batch.result()}")
        return path.exists()

    await eventually(paused, 60, what=f"{path} to exist", interval=0.02)
    pid, token = path.read_text().split()
    return int(pid), int(token)


@pytest.mark.asyncio
@pytest.mark.parametrize("phase", ["before-charge", "after-charge"])
async def test_lock_broken_mid_payment_answers_503_and_charges_once(
    stack: Stack, phase: str
) -> None:
    order_id = await stack.new_order()
    held = stack.pause.with_name("pause.held")
    taken = stack.pause.with_name("pause.taken")
    stack.pause.write_text(phase)
    batch = asyncio.create_task(
        pay_concurrently(stack.urls, order_id, requests=REQUESTS, clients=CLIENTS)
    )
    try:
        _, stale_token = await _wait_for(held, batch)
        # An operator breaks the lock from another process: a real loss on the server.
        async with aiolocks.connect(stack.settings.lock_url) as admin:
            assert await admin.force_release(f"locks/pay/order-{order_id}") >= 1
        async with asyncio.timeout(90):
            replies = await batch
    finally:
        batch.cancel()
        for path in (stack.pause, held, taken):
            path.unlink(missing_ok=True)
    codes = [reply.status for reply in replies]
    assert set(codes) <= {200, 409, 503}, replies  # never a 500
    lost = [reply for reply in replies if reply.status == 503]
    assert len(lost) == 1, replies
    assert lost[0].body["detail"] == fastapi_app.lost_detail(order_id)
    # The client whose payment ended in 503 checks the order and pays again: no second charge.
    async with httpx.AsyncClient(base_url=lost[0].worker, timeout=60) as client:
        retry = await pay_once(client, order_id)
        state = (await client.get(f"/orders/{order_id}")).json()
    assert retry.status in (200, 409), retry
    paid = [reply for reply in [*replies, retry] if reply.status == 200]
    assert all(_conflict(r, order_id) for r in [*replies, retry] if r.status == 409)
    charges = await stack.charges(order_id)
    assert len(charges) == 1, charges
    assert state == {"order": order_id, "status": "paid", "charged_by": charges[0].fencing_token}
    if phase == "after-charge":
        # Charged before the loss: the 503 is "outcome unknown", and nobody pays again.
        assert charges[0].fencing_token == stale_token
        assert paid == []
        assert _already_paid(retry, order_id)
    else:
        # Lost before the charge: a later holder (newer token) paid, exactly once.
        assert charges[0].fencing_token > stale_token
        assert len(paid) == 1, [*replies, retry]
        assert paid[0].body["fencing_token"] == charges[0].fencing_token
