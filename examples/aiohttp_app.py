"""Pay an order at most once, from any number of aiohttp workers.

The aiohttp twin of ``fastapi_app.py``::

    python examples/aiohttp_app.py                      # demo on memory://
    python examples/aiohttp_app.py --url zk://127.0.0.1:2181
    python examples/aiohttp_app.py --serve              # web.run_app on :8080

What it shows:

* the backend lives in a ``cleanup_ctx`` generator: opened at startup,
  closed (releasing everything) at cleanup;
* ``order_lock(request, order_id)`` takes ``locks/pay/order-{id}`` with a
  timeout and turns a busy lock into **409 Conflict**;
* the fencing token goes to the payment gateway, which refuses stale ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

import aiolocks

#: how long a request waits for the order's lock before answering 409
LOCK_TIMEOUT = 2.0

BACKEND = web.AppKey("backend", aiolocks.Backend)


@dataclass
class Shop:
    """Orders, the payment gateway stand-in, and the lock settings."""

    lock_timeout: float = LOCK_TIMEOUT
    latency: float = 0.05
    gate: asyncio.Event | None = None
    """If set, every charge waits for it (tests use it to keep a payment in flight)."""
    due: dict[int, int] = field(
        default_factory=lambda: {order_id: 1000 + order_id for order_id in range(1000, 1100)}
    )
    paid: set[int] = field(default_factory=set)
    charges: list[tuple[int, int, int]] = field(default_factory=list)
    highest_token: dict[int, int] = field(default_factory=dict)

    async def charge(self, order_id: int, cents: int, *, fencing_token: int) -> None:
        """Charge an order at the gateway, which refuses a stale fencing token."""
        if fencing_token <= self.highest_token.get(order_id, -1):
            raise RuntimeError(f"stale fencing token {fencing_token} for order {order_id}")
        self.highest_token[order_id] = fencing_token
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.latency)
        self.charges.append((order_id, cents, fencing_token))


SHOP = web.AppKey("shop", Shop)


@asynccontextmanager
async def order_lock(request: web.Request, order_id: int) -> AsyncIterator[aiolocks.Lock]:
    """Hold ``locks/pay/order-{order_id}`` for the block, or raise 409 when busy.

    >>> async with order_lock(request, 1001) as lock:  # doctest: +SKIP
    ...     await charge(..., fencing_token=lock.fencing_token)
    """
    backend = request.app[BACKEND]
    lock = backend.mutex(f"locks/pay/order-{order_id}")
    acquired = False
    try:
        async with lock.hold(timeout=request.app[SHOP].lock_timeout):
            acquired = True
            yield lock
    except aiolocks.LockTimeoutError:
        if acquired:  # raised by the block itself, not by our wait
            raise
        raise web.HTTPConflict(
            text=f"order {order_id} is being paid by another request",
            headers={"Retry-After": "1"},
        ) from None


async def pay(request: web.Request) -> web.Response:
    """``POST /orders/{order_id}/pay``: pay once; 409 while busy or once paid."""
    shop = request.app[SHOP]
    order_id = int(request.match_info["order_id"])
    if order_id not in shop.due:
        raise web.HTTPNotFound(text=f"no order {order_id}")
    async with order_lock(request, order_id) as lock:
        if order_id in shop.paid:
            raise web.HTTPConflict(text=f"order {order_id} is already paid")
        token = lock.fencing_token
        assert token is not None
        await shop.charge(order_id, shop.due[order_id], fencing_token=token)
        shop.paid.add(order_id)
    return web.json_response({"order": order_id, "status": "paid", "fencing_token": token})


def create_app(url: str = "memory://", *, shop: Shop | None = None) -> web.Application:
    """Build the application; the backend for ``url`` lives in a ``cleanup_ctx``."""

    async def lock_backend(app: web.Application) -> AsyncIterator[None]:
        async with aiolocks.connect(url) as backend:
            app[BACKEND] = backend
            yield
        # the block closed the backend: anything still held is released

    app = web.Application()
    app[SHOP] = shop if shop is not None else Shop()
    app.cleanup_ctx.append(lock_backend)
    app.router.add_post(r"/orders/{order_id:\d+}/pay", pay)
    return app


async def demo(url: str, *, requests: int = 5, order_id: int = 1001) -> list[int]:
    """Serve the app on a free local port and send concurrent payments for one order."""
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(create_app(url))) as client:

        async def post() -> tuple[int, str]:
            async with client.post(f"/orders/{order_id}/pay") as response:
                return response.status, await response.text()

        results = await asyncio.gather(*(post() for _ in range(requests)))
    for status, text in results:
        print(f"  {status} {text}")
    return [status for status, _ in results]


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--requests", type=int, default=5, help="concurrent requests (demo)")
    parser.add_argument("--serve", action="store_true", help="run the app with web.run_app")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    if args.serve:
        web.run_app(create_app(args.url), host="127.0.0.1", port=args.port)
        return 0
    print(f"{args.requests} concurrent POST /orders/1001/pay on {args.url}")
    codes = asyncio.run(demo(args.url, requests=args.requests))
    print(f"paid: {codes.count(200)}, conflict (409): {codes.count(409)}")
    return 0 if codes.count(200) == 1 and codes.count(409) == len(codes) - 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
