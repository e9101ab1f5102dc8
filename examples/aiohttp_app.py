"""Pay an order at most once, from any number of aiohttp worker processes.

The aiohttp twin of ``fastapi_app.py``, on the same tables
(``examples/shop.py``). Run several processes, one per port behind your
load balancer, or on one port with ``--reuse-port``::

    export AIOLOCKS_URL=zk://127.0.0.1:2181        # or redis://, etcd://, postgresql://
    export SHOP_DATABASE_URL=postgresql://postgres:aiolocks@127.0.0.1:5432/postgres
    python -m examples.aiohttp_app --serve --port 8080 --reuse-port &
    python -m examples.aiohttp_app --serve --port 8080 --reuse-port &

or let the demo start two worker processes and send them concurrent
payments for one order (one pays, the others get 409)::

    python -m examples.aiohttp_app --url zk://127.0.0.1:2181 \\
        --database postgresql://postgres:aiolocks@127.0.0.1:5432/postgres

What it shows:

* the backend and the database pool live in a ``cleanup_ctx`` generator:
  opened at startup, closed (releasing everything) at cleanup;
* ``order_lock(request, order_id)`` takes ``locks/pay/order-{id}`` with a
  timeout and turns a busy lock into **409 Conflict**, and a lock lost
  part-way (the handler is cancelled) into **503 Service Unavailable**,
  never a bare 500 (so does a lock service or a database out of reach);
* the charge is written with the lock's fencing token, so a stale holder
  cannot charge, and the charges table allows one charge per order.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

import aiolocks
from examples import shop

BACKEND = web.AppKey("backend", aiolocks.Backend)
POOL = web.AppKey("pool", Any)
SETTINGS = web.AppKey("settings", shop.Settings)


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


def _unavailable(detail: str) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(text=detail, headers={"Retry-After": "1"})


@asynccontextmanager
async def order_lock(request: web.Request, order_id: int) -> AsyncIterator[aiolocks.Lock]:
    """Hold ``locks/pay/order-{order_id}`` for the block; 409 when busy, 503 when lost.

    >>> async with order_lock(request, 1001) as lock:  # doctest: +SKIP
    ...     await charge(..., fencing_token=lock.fencing_token)
    """
    backend = request.app[BACKEND]
    lock = backend.mutex(f"locks/pay/order-{order_id}")
    acquired = False
    try:
        async with lock.hold(timeout=request.app[SETTINGS].lock_timeout):
            acquired = True
            yield lock
    except aiolocks.LockTimeoutError:
        if acquired:  # raised by the block itself, not by our wait
            raise
        raise web.HTTPConflict(
            text=f"order {order_id} is being paid by another request",
            headers={"Retry-After": "1"},
        ) from None
    except aiolocks.LockLostError as exc:
        # The block was cancelled part-way: whatever it had sent may or may
        # not have taken effect. Say so instead of a bare 500.
        raise _unavailable(lost_detail(order_id)) from exc
    except aiolocks.BackendUnavailableError as exc:
        # The lock service could not be reached, to acquire or to release.
        raise _unavailable(unavailable_detail(order_id, "lock service")) from exc


async def pay(request: web.Request) -> web.Response:
    """``POST /orders/{order_id}/pay``: pay once; 409 while busy or once paid."""
    order_id = int(request.match_info["order_id"])
    async with order_lock(request, order_id) as lock:
        token = lock.fencing_token
        assert token is not None
        try:
            charge = await shop.pay(
                request.app[POOL], order_id, fencing_token=token, settings=request.app[SETTINGS]
            )
        except shop.UnknownOrderError:
            raise web.HTTPNotFound(text=f"no order {order_id}") from None
        except shop.AlreadyPaidError:
            raise web.HTTPConflict(text=f"order {order_id} is already paid") from None
        except shop.SupersededError:
            # The fence refused this hold: a newer holder has claimed the order.
            raise _unavailable(lost_detail(order_id)) from None
        except shop.StoreUnavailableError as exc:
            raise _unavailable(unavailable_detail(order_id, "database")) from exc
    return web.json_response(
        {"order": order_id, "status": "paid", "fencing_token": token, "worker": charge.worker}
    )


async def order(request: web.Request) -> web.Response:
    """``GET /orders/{order_id}``: the order's state and its charge (no lock needed)."""
    order_id = int(request.match_info["order_id"])
    try:
        status, charge = await shop.order_state(request.app[POOL], order_id)
    except shop.UnknownOrderError:
        raise web.HTTPNotFound(text=f"no order {order_id}") from None
    charged_by = None if charge is None else charge.fencing_token
    return web.json_response({"order": order_id, "status": status, "charged_by": charged_by})


async def health(request: web.Request) -> web.Response:
    """``GET /health``: this worker is up (the demo and the tests wait for it)."""
    return web.json_response({"worker": shop.WORKER})


def create_app(settings: shop.Settings | None = None) -> web.Application:
    """Build the application (settings from the environment when not given)."""
    settings = settings if settings is not None else shop.Settings.from_env()

    async def resources(app: web.Application) -> AsyncIterator[None]:
        async with (
            aiolocks.connect(settings.lock_url) as backend,
            shop.open_pool(settings) as pool,
        ):
            await shop.migrate(pool, backend, settings.schema)
            app[BACKEND] = backend
            app[POOL] = pool
            yield
        # the block closed the backend: anything still held is released

    app = web.Application()
    app[SETTINGS] = settings
    app.cleanup_ctx.append(resources)
    app.router.add_post(r"/orders/{order_id:\d+}/pay", pay)
    app.router.add_get(r"/orders/{order_id:\d+}", order)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: the multi-worker demo, or ``--serve`` one worker."""
    from examples import shop_demo

    parser = shop_demo.parser(__doc__, default_port=8080)
    parser.add_argument(
        "--reuse-port", action="store_true", help="share --port with other processes (Linux)"
    )
    args = parser.parse_args(argv)
    if args.serve:
        if args.workers not in (None, 1):
            parser.error("--serve runs one process: start several with --reuse-port instead")
        app = create_app(shop_demo.settings_from(args))
        web.run_app(app, host=args.host, port=args.port, reuse_port=args.reuse_port or None)
        return 0
    return shop_demo.run_demo("aiohttp", args)


if __name__ == "__main__":
    sys.exit(main())
