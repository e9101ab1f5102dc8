"""Pay an order at most once, from any number of FastAPI worker processes.

Deploy it as a team would: several uvicorn workers (or hosts), one lock
service, the orders in PostgreSQL (``examples/shop.py``)::

    export AIOLOCKS_URL=redis://127.0.0.1:6379/0   # or zk://..., etcd://..., postgresql://...
    export SHOP_DATABASE_URL=postgresql://postgres:aiolocks@127.0.0.1:5432/postgres
    uvicorn --factory examples.fastapi_app:create_app --workers 4 --port 8000
    curl -X POST http://127.0.0.1:8000/orders/1001/pay

or let the demo start two worker processes and send them concurrent
payments for one order (one pays, the others get 409); ``--lose-after S``
breaks the order's lock S seconds in, from outside the workers, and retries
the requests that answered 503::

    python -m examples.fastapi_app --url redis://127.0.0.1:6379/0 \\
        --database postgresql://postgres:aiolocks@127.0.0.1:5432/postgres

What it shows:

* the backend (and the database pool) are opened in the app's *lifespan*
  and closed with it; the tables are created once across all workers,
  under a lock;
* ``OrderLock`` is a reusable dependency: it takes ``locks/pay/order-{id}``
  with a timeout, answers **409 Conflict** when the lock stays busy, and
  releases it when the path operation function returns
  (``Depends(..., scope="function")``: before the response is sent);
* a lock **lost** during the payment (ZooKeeper session expired, Redis or
  etcd lease lapsed, PostgreSQL session ended, lock broken by an operator)
  cancels the path operation and answers **503 Service Unavailable**
  saying so, never a bare 500 (so does a lock service or a database out
  of reach): the client should check the order (``GET /orders/{id}``)
  before paying again, and paying again is safe;
* the charge is written with the lock's **fencing token**
  (``UPDATE ... WHERE last_token < $2``): a holder that lost its lock
  while paused cannot charge after the next holder has started, and the
  charges table's primary key allows one charge per order.

``memory://`` only coordinates the tasks of one process: with several
workers, point ``AIOLOCKS_URL`` at a lock server.
"""

# No "from __future__ import annotations": FastAPI reads the Annotated[...] dependency
# of pay() at runtime, and it refers to a local variable of create_app().
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request

import aiolocks
from examples import shop


def get_backend(request: Request) -> aiolocks.Backend:
    """The backend opened by the lifespan (a dependency)."""
    backend: aiolocks.Backend = request.app.state.backend
    return backend


def lost_detail(order_id: int) -> str:
    """What a 503 says: the lock went away part-way, the outcome is unknown."""
    return (
        f"lost the lock on order {order_id} while processing the request; "
        "the outcome is unknown: check the order before retrying"
    )


def unavailable_detail(order_id: int, what: str) -> str:
    """What a 503 says when the lock service or the database could not be reached."""
    return (
        f"the {what} failed while processing order {order_id}; "
        "the outcome is unknown: check the order before retrying"
    )


def _unavailable(detail: str) -> HTTPException:
    return HTTPException(status_code=503, detail=detail, headers={"Retry-After": "1"})


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
            raise _unavailable(lost_detail(order_id)) from exc
        except aiolocks.BackendUnavailableError as exc:
            # The lock service could not be reached, to acquire or to release.
            detail = unavailable_detail(order_id, "lock service")
            raise _unavailable(detail) from exc


def create_app(settings: shop.Settings | None = None) -> FastAPI:
    """Build the app (``uvicorn --factory`` calls it with no argument: settings from the env)."""
    settings = settings if settings is not None else shop.Settings.from_env()
    # scope="function": release right after the path operation, before the response is sent
    pay_lock = Depends(OrderLock("locks/pay", timeout=settings.lock_timeout), scope="function")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with (
            aiolocks.connect(settings.lock_url) as backend,
            shop.open_pool(settings) as pool,
        ):
            await shop.migrate(pool, backend, settings.schema)
            app.state.backend = backend
            app.state.pool = pool
            yield
        # leaving the block closed the backend and released anything still held

    app = FastAPI(title="aiolocks payment example", lifespan=lifespan)
    app.state.settings = settings

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: int, lock: Annotated[aiolocks.Lock, pay_lock], request: Request
    ) -> dict[str, object]:
        """Pay an order once; 409 while another request pays it or after it was paid."""
        token = lock.fencing_token
        assert token is not None  # held by this task for the whole path operation
        try:
            charge = await shop.pay(
                request.app.state.pool, order_id, fencing_token=token, settings=settings
            )
        except shop.UnknownOrderError:
            raise HTTPException(status_code=404, detail=f"no order {order_id}") from None
        except shop.AlreadyPaidError:
            raise HTTPException(
                status_code=409, detail=f"order {order_id} is already paid"
            ) from None
        except shop.SupersededError:
            # The fence refused this hold: the lock was lost and a newer holder
            # has claimed the order; this process has not heard of the loss yet.
            raise _unavailable(lost_detail(order_id)) from None
        except shop.StoreUnavailableError as exc:
            detail = unavailable_detail(order_id, "database")
            raise _unavailable(detail) from exc
        return {
            "order": order_id,
            "status": "paid",
            "fencing_token": token,
            "worker": charge.worker,
        }

    @app.get("/orders/{order_id}")
    async def order(order_id: int, request: Request) -> dict[str, object]:
        """The order's state and its charge (no lock needed to read it)."""
        try:
            status, charge = await shop.order_state(request.app.state.pool, order_id)
        except shop.UnknownOrderError:
            raise HTTPException(status_code=404, detail=f"no order {order_id}") from None
        return {
            "order": order_id,
            "status": status,
            "charged_by": None if charge is None else charge.fencing_token,
        }

    @app.get("/health")
    async def health() -> dict[str, object]:
        """This worker is up (the demo and the tests wait for it)."""
        return {"worker": shop.WORKER}

    return app


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: the multi-worker demo, or ``--serve`` one worker."""
    from examples import shop_demo

    parser = shop_demo.parser(__doc__, default_port=8000)
    args = parser.parse_args(argv)
    if args.serve:
        import uvicorn

        os.environ.update(shop_demo.settings_from(args).to_env())
        uvicorn.run(
            "examples.fastapi_app:create_app",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers or 1,
        )
        return 0
    return shop_demo.run_demo("fastapi", args)


if __name__ == "__main__":
    sys.exit(main())
