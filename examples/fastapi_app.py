"""Pay an order at most once, from any number of FastAPI workers.

Run the built-in demo (five concurrent requests for one order: one pays, the
others get 409)::

    python examples/fastapi_app.py                      # memory://
    python examples/fastapi_app.py --url redis://127.0.0.1:6379/0
    python examples/fastapi_app.py --serve              # uvicorn on :8000

What it shows:

* the backend is opened in the app's *lifespan* and closed with it;
* ``OrderLock`` is a reusable dependency: it takes ``locks/pay/order-{id}``
  with a timeout, answers **409 Conflict** when the lock stays busy, and
  releases it when the path operation function returns
  (``Depends(..., scope="function")``: before the response is sent);
* a lock **lost** during the payment (ZooKeeper session expired, Redis
  lease lapsed) cancels the path operation and answers **503 Service
  Unavailable** saying so, instead of a bare 500: the client should check
  the order before paying again;
* the payment gateway receives the lock's **fencing token** and refuses a
  token older than one it has already seen, so a holder that lost its lock
  while paused cannot charge twice.

With several uvicorn workers or hosts, point ``--url`` at ZooKeeper or Redis:
``memory://`` only coordinates the tasks of one process.
"""

# No "from __future__ import annotations": FastAPI reads the Annotated[...] dependency
# of pay() at runtime, and it refers to a local variable of create_app().
import argparse
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request

import aiolocks

#: how long a request waits for the order's lock before answering 409
LOCK_TIMEOUT = 2.0


@dataclass
class PaymentGateway:
    """A stand-in for the payment provider; it checks fencing tokens.

    A real resource would store the highest token per order next to the
    order (a column, a ``WHERE token < :new`` guard) so the check survives
    restarts.
    """

    latency: float = 0.05
    gate: asyncio.Event | None = None
    """If set, every charge waits for it (tests use it to keep a payment in flight)."""
    charges: list[tuple[int, int, int]] = field(default_factory=list)
    """(order id, amount in cents, fencing token) of every accepted charge."""
    _highest_token: dict[int, int] = field(default_factory=dict)

    async def charge(self, order_id: int, cents: int, *, fencing_token: int) -> None:
        """Charge ``cents`` for ``order_id``; refuse a stale fencing token."""
        if fencing_token <= self._highest_token.get(order_id, -1):
            raise RuntimeError(f"stale fencing token {fencing_token} for order {order_id}")
        self._highest_token[order_id] = fencing_token
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.latency)  # the provider's round trip
        self.charges.append((order_id, cents, fencing_token))


@dataclass
class Orders:
    """The orders "table": amount due and whether it was paid."""

    due: dict[int, int] = field(default_factory=dict)
    paid: set[int] = field(default_factory=set)


def get_backend(request: Request) -> aiolocks.Backend:
    """The backend opened by the lifespan (a dependency)."""
    backend: aiolocks.Backend = request.app.state.backend
    return backend


class OrderLock:
    """A dependency that holds ``<prefix>/order-{order_id}`` around the path operation.

    >>> pay_lock = Depends(OrderLock("locks/pay", timeout=2), scope="function")  # doctest: +SKIP
    >>> @app.post("/orders/{order_id}/pay")  # doctest: +SKIP
    ... async def pay(order_id: int, lock: Annotated[aiolocks.Lock, pay_lock]): ...

    Busy for longer than ``timeout`` seconds: ``409 Conflict`` with a
    ``Retry-After`` header. Lost while the path operation ran (it is then
    cancelled): ``503 Service Unavailable`` saying the outcome is unknown.
    The lock is released when the path operation returns or raises, before
    the response is sent.
    """

    def __init__(self, prefix: str, *, timeout: float) -> None:
        self.prefix = prefix
        self.timeout = timeout

    async def __call__(
        self, order_id: int, backend: Annotated[aiolocks.Backend, Depends(get_backend)]
    ) -> AsyncIterator[aiolocks.Lock]:
        lock = backend.mutex(f"{self.prefix}/order-{order_id}")
        acquired = False
        try:
            async with lock.hold(timeout=self.timeout):
                acquired = True
                yield lock
        except aiolocks.LockTimeoutError:
            if acquired:  # raised by the path operation itself, not by our wait
                raise
            raise HTTPException(
                status_code=409,
                detail=f"order {order_id} is being paid by another request",
                headers={"Retry-After": "1"},
            ) from None
        except aiolocks.LockLostError as exc:
            # The path operation was cancelled part-way: whatever it had sent
            # may or may not have taken effect. Say so instead of a bare 500.
            raise HTTPException(
                status_code=503,
                detail=(
                    f"lost the lock on order {order_id} while processing the request; "
                    "the outcome is unknown: check the order before retrying"
                ),
                headers={"Retry-After": "1"},
            ) from exc


def create_app(
    url: str = "memory://",
    *,
    gateway: PaymentGateway | None = None,
    lock_timeout: float = LOCK_TIMEOUT,
) -> FastAPI:
    """Build the app; the backend for ``url`` is opened by the lifespan."""
    # scope="function": release right after the path operation, before the response is sent
    pay_lock = Depends(OrderLock("locks/pay", timeout=lock_timeout), scope="function")
    orders = Orders(due={order_id: 1000 + order_id for order_id in range(1000, 1100)})
    gateway = gateway if gateway is not None else PaymentGateway()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiolocks.connect(url) as backend:
            app.state.backend = backend
            yield
        # leaving the block closed the backend and released anything still held

    app = FastAPI(title="aiolocks payment example", lifespan=lifespan)
    app.state.orders = orders
    app.state.gateway = gateway

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: int, lock: Annotated[aiolocks.Lock, pay_lock]) -> dict[str, object]:
        """Pay an order once; 409 while another request pays it or after it was paid."""
        if order_id not in orders.due:
            raise HTTPException(status_code=404, detail=f"no order {order_id}")
        # Check and act under the lock: the check cannot go stale before the charge.
        if order_id in orders.paid:
            raise HTTPException(status_code=409, detail=f"order {order_id} is already paid")
        token = lock.fencing_token
        assert token is not None  # held by this task for the whole path operation
        await gateway.charge(order_id, orders.due[order_id], fencing_token=token)
        orders.paid.add(order_id)
        return {"order": order_id, "status": "paid", "fencing_token": token}

    @app.get("/orders/{order_id}")
    async def order(order_id: int) -> dict[str, object]:
        """The order's state (no lock needed to read it)."""
        if order_id not in orders.due:
            raise HTTPException(status_code=404, detail=f"no order {order_id}")
        return {"order": order_id, "paid": order_id in orders.paid}

    return app


async def demo(url: str, *, requests: int = 5, order_id: int = 1001) -> list[int]:
    """Send ``requests`` concurrent payments for one order; return the status codes."""
    import httpx

    app = create_app(url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
            responses = await asyncio.gather(
                *(client.post(f"/orders/{order_id}/pay") for _ in range(requests))
            )
    for response in responses:
        print(f"  {response.status_code} {response.json()}")
    return [response.status_code for response in responses]


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument("--requests", type=int, default=5, help="concurrent requests (demo)")
    parser.add_argument("--serve", action="store_true", help="run the app with uvicorn")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.serve:
        import uvicorn

        uvicorn.run(create_app(args.url), host="127.0.0.1", port=args.port)
        return 0
    print(f"{args.requests} concurrent POST /orders/1001/pay on {args.url}")
    codes = asyncio.run(demo(args.url, requests=args.requests))
    print(f"paid: {codes.count(200)}, conflict (409): {codes.count(409)}")
    return 0 if codes.count(200) == 1 and codes.count(409) == len(codes) - 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
