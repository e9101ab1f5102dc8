"""Start several worker processes of a payment app and pay one order from several clients.

The demo of ``fastapi_app.py`` and ``aiohttp_app.py`` (``python -m
examples.fastapi_app --url ... --database ...`` runs it), and the harness of
their tests::

    python -m examples.shop_demo --app aiohttp --workers 3 --requests 9 \\
        --url etcd://127.0.0.1:2379 \\
        --database postgresql://postgres:aiolocks@127.0.0.1:5432/postgres

Each worker is a process of its own on a port of its own (uvicorn for
FastAPI, ``web.run_app`` for aiohttp), all on one lock service and one
database. The clients send their payments for one order to the workers in
turn, all at once; the demo prints who answered what, and the charges the
database holds for the order: one. With ``--lose-after S`` it breaks the
order's lock S seconds in (``force_release`` from another connection, as an
operator would; set ``SHOP_PROVIDER_LATENCY`` so that a payment is in flight
then) and retries the requests that answered 503: still one charge.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

import aiolocks
from aiolocks.testing import free_port
from examples import shop

ROOT = Path(__file__).resolve().parents[1]

App = Literal["fastapi", "aiohttp"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer: HTTP status, the JSON body (or ``{"detail": text}``), the worker's URL."""

    status: int
    body: dict[str, object]
    worker: str


def worker_command(app: App, port: int) -> list[str]:
    """The command that serves ``app`` as one process on ``port``."""
    if app == "fastapi":
        return [
            sys.executable, "-m", "uvicorn", "--factory", "examples.fastapi_app:create_app",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
    return [sys.executable, "-m", "examples.aiohttp_app", "--serve", "--port", str(port)]


class Workers:
    """``count`` worker processes of ``app``, each on a free port of its own.

    >>> with Workers("fastapi", settings, 2) as urls:  # doctest: +SKIP
    ...     httpx.post(f"{urls[0]}/orders/1001/pay")

    Entering starts them and waits until every one answers ``/health``
    (their output goes to a temporary log, shown if one exits early);
    leaving stops them (SIGTERM, then SIGKILL).
    """

    def __init__(
        self, app: App, settings: shop.Settings, count: int, *, ready_timeout: float = 90.0
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.app = app
        self.settings = settings
        self.count = count
        self.ready_timeout = ready_timeout
        self.processes: list[subprocess.Popen[bytes]] = []
        self.urls: list[str] = []
        self._logs = tempfile.TemporaryDirectory(prefix="aiolocks-shop-")

    def __enter__(self) -> list[str]:
        try:
            self._start()
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self.urls

    def __exit__(self, *exc_info: object) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._logs.cleanup()

    def _start(self) -> None:
        env = {**os.environ, **self.settings.to_env()}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        for n in range(self.count):
            port = free_port()
            command = worker_command(self.app, port)
            with open(Path(self._logs.name) / f"worker-{n}.log", "wb") as log:
                process = subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
                )
            self.processes.append(process)
            self.urls.append(f"http://127.0.0.1:{port}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        with httpx.Client(timeout=5) as client:
            for url, process in zip(self.urls, self.processes, strict=True):
                while True:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"worker {url} did not start:\n{self.output()}")
                    with contextlib.suppress(httpx.TransportError):
                        if client.get(f"{url}/health").status_code == 200:
                            break
                    time.sleep(0.1)

    def output(self) -> str:
        """What the workers printed so far."""
        logs = sorted(Path(self._logs.name).iterdir())
        return "\n".join(f"--- {path.name}\n{path.read_text()}" for path in logs)


async def pay_concurrently(
    workers: Sequence[str], order_id: int, *, requests: int, clients: int = 3
) -> list[Reply]:
    """Send ``requests`` payments of ``order_id`` at once from ``clients`` clients.

    Client ``c`` talks to worker ``c % len(workers)``; request ``r`` goes
    through client ``r % clients``. The replies come back in request order.
    """
    if requests < 1 or clients < 1:
        raise ValueError(f"requests and clients must be >= 1, got {requests}, {clients}")
    pool = [
        httpx.AsyncClient(base_url=workers[c % len(workers)], timeout=60) for c in range(clients)
    ]
    try:
        return list(
            await asyncio.gather(*(pay_once(pool[r % clients], order_id) for r in range(requests)))
        )
    finally:
        for client in pool:
            await client.aclose()


async def pay_once(client: httpx.AsyncClient, order_id: int) -> Reply:
    """``POST /orders/{order_id}/pay`` through ``client``."""
    response = await client.post(f"/orders/{order_id}/pay")
    try:
        body = response.json()
    except ValueError:  # aiohttp's errors are plain text
        body = {"detail": response.text}
    if not isinstance(body, dict):
        body = {"detail": body}
    return Reply(response.status_code, body, str(client.base_url).rstrip("/"))


@dataclass
class Outcome:
    """What the demo saw: the replies, the retries of the 503s, the holds it broke, the
    order's charges."""

    replies: list[Reply]
    retries: list[Reply]
    broken: int
    charges: list[shop.Charge]

    @property
    def ok(self) -> bool:
        """One charge; no 500; at most one 200, and exactly one when no lock was broken."""
        answers = [*self.replies, *self.retries]
        codes = [reply.status for reply in answers]
        if not set(codes) <= {200, 409, 503} or len(self.charges) != 1:
            return False
        if any(reply.status == 503 for reply in self.retries):
            return False
        paid = [reply for reply in answers if reply.status == 200]
        if not self.broken and len(paid) != 1:
            return False
        return len(paid) <= 1 and all(
            reply.body["fencing_token"] == self.charges[0].fencing_token for reply in paid
        )


def demo(
    app: App,
    settings: shop.Settings,
    *,
    workers: int,
    requests: int,
    order_id: int,
    lose_after: float | None = None,
) -> Outcome:
    """Start the workers and pay ``order_id`` concurrently; with ``lose_after``, break the
    order's lock that many seconds after sending (as an operator would, from outside the
    workers), then retry every request that answered 503."""
    with Workers(app, settings, workers) as urls:
        return asyncio.run(_pay_and_count(settings, urls, order_id, requests, lose_after))


async def _pay_and_count(
    settings: shop.Settings,
    urls: list[str],
    order_id: int,
    requests: int,
    lose_after: float | None,
) -> Outcome:
    async with shop.open_pool(settings) as pool:
        await shop.reset_order(pool, order_id)
        batch = asyncio.create_task(pay_concurrently(urls, order_id, requests=requests))
        broken = 0
        try:
            if lose_after is not None:
                await asyncio.sleep(lose_after)
                async with aiolocks.connect(settings.lock_url) as admin:
                    broken = await admin.force_release(f"locks/pay/order-{order_id}")
            replies = await batch
        finally:
            batch.cancel()
        retries = []
        for reply in replies:
            if reply.status == 503:  # outcome unknown: the client pays again
                async with httpx.AsyncClient(base_url=reply.worker, timeout=60) as client:
                    retries.append(await pay_once(client, order_id))
        return Outcome(replies, retries, broken, await shop.charges(pool, order_id))


def parser(doc: str | None, *, default_port: int) -> argparse.ArgumentParser:
    """The command line shared by the two apps and this demo."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("AIOLOCKS_URL", "memory://"))
    parser.add_argument(
        "--database",
        default=os.environ.get("SHOP_DATABASE_URL", ""),
        help="PostgreSQL URL of the orders (default: SHOP_DATABASE_URL)",
    )
    parser.add_argument("--schema", default=os.environ.get("SHOP_SCHEMA", "shop"))
    parser.add_argument(
        "--workers", type=int, default=None, help="worker processes (demo: 2, --serve: 1)"
    )
    parser.add_argument("--requests", type=int, default=6, help="concurrent payments (demo)")
    parser.add_argument("--order", type=int, default=shop.DEMO_ORDERS[1], help="order (demo)")
    parser.add_argument("--serve", action="store_true", help="serve the app instead of the demo")
    parser.add_argument(
        "--lose-after",
        type=float,
        metavar="S",
        help="break the order's lock S seconds after sending (demo; see SHOP_PROVIDER_LATENCY)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    return parser


def settings_from(args: argparse.Namespace) -> shop.Settings:
    """The settings named by the command line (and the environment for the rest)."""
    overrides = {"AIOLOCKS_URL": args.url, "SHOP_DATABASE_URL": args.database}
    return shop.Settings.from_env({**os.environ, **overrides, "SHOP_SCHEMA": args.schema})


def run_demo(app: App, args: argparse.Namespace) -> int:
    """Run the demo for the parsed command line; 0 when exactly one request paid."""
    workers = args.workers or 2
    if args.url.startswith("memory:") and workers > 1:
        print("memory:// locks only the tasks of one process: give --url of a lock server")
        return 2
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(exc)
        return 2
    print(
        f"{args.requests} concurrent POST /orders/{args.order}/pay to {workers} "
        f"{app} worker processes, locks on {args.url}"
    )
    outcome = demo(
        app,
        settings,
        workers=workers,
        requests=args.requests,
        order_id=args.order,
        lose_after=args.lose_after,
    )
    for reply in outcome.replies:
        print(f"  {reply.worker} -> {reply.status} {reply.body}")
    if args.lose_after is not None:
        print(f"broke the order's lock after {args.lose_after} s: {outcome.broken} hold(s)")
    for reply in outcome.retries:
        print(f"  retry of a 503: {reply.worker} -> {reply.status} {reply.body}")
    codes = [reply.status for reply in outcome.replies]
    summary = f"paid: {codes.count(200)}, conflict (409): {codes.count(409)}"
    if args.lose_after is not None or 503 in codes:
        summary += f", lost (503): {codes.count(503)}"
    if others := len(codes) - sum(codes.count(code) for code in (200, 409, 503)):
        summary += f", other: {others}"
    print(summary)
    for charge in outcome.charges:
        print(f"charge in the database: {charge.cents} cents, fencing token {charge.fencing_token}")
    return 0 if outcome.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    cli = parser(__doc__, default_port=0)
    cli.add_argument("--app", choices=["fastapi", "aiohttp"], default="fastapi")
    args = cli.parse_args(argv)
    app: App = args.app
    return run_demo(app, args)


if __name__ == "__main__":
    sys.exit(main())
