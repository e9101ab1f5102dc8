"""The ``aiolocks`` command line: ``demo``, ``run`` and ``status``.

``aiolocks demo [--url URL]``
    The flash sale: a stock of N items, many concurrent buyers in several
    worker tasks, a read-modify-write with an await in the middle. Without
    a lock it oversells; with a mutex exactly N sales succeed.
``aiolocks run URL NAME [--timeout S] -- CMD ARGS...``
    Like ``flock(1)`` or ``etcdctl lock``, on any backend: hold the lock
    while CMD runs, forward SIGINT/SIGTERM/SIGHUP to it, exit with CMD's
    code; exit 75 when the lock was not acquired in time; if the lock is
    lost, terminate CMD and exit 76.
``aiolocks status URL NAME [--json]``
    Holder, queue, fencing tokens and lease TTL of a lock.
``aiolocks doctor URL [--json]``
    Settings of the lock service that break lock guarantees, and a live
    self-test; exit 1 when something is critical (see ``aiolocks._doctor_cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from . import _connect, _doctor_cli
from ._core.backend import Backend
from ._core.errors import BackendUnavailableError, LockError, LockLostError, LockTimeoutError

__all__ = ["EXIT_LOCK_LOST", "EXIT_NOT_ACQUIRED", "EXIT_UNAVAILABLE", "main"]

#: ``run``: the lock was not acquired within ``--timeout`` (sysexits EX_TEMPFAIL)
EXIT_NOT_ACQUIRED = 75
#: ``run``: the lock was lost while CMD ran; CMD was terminated
EXIT_LOCK_LOST = 76
#: the backend could not be reached (sysexits EX_UNAVAILABLE)
EXIT_UNAVAILABLE = 69
#: bad arguments (sysexits EX_USAGE)
EXIT_USAGE = 64


# -- demo ---------------------------------------------------------------------


async def _flash_sale(
    backend: Backend, *, stock: int, buyers: int, workers: int, use_lock: bool, name: str
) -> dict[str, object]:
    """Sell ``stock`` items to ``buyers`` buyers served by ``workers`` worker tasks."""
    inventory = {"stock": stock}
    sold = rejected = 0
    waits: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for buyer in range(buyers):
        queue.put_nowait(buyer)

    async def buy() -> None:
        nonlocal sold, rejected
        # read, think (a database round trip), write: the race the lock closes
        left = inventory["stock"]
        await asyncio.sleep(0.001)
        if left > 0:
            inventory["stock"] = left - 1
            sold += 1
        else:
            rejected += 1

    async def worker() -> None:
        lock = backend.mutex(name)
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if not use_lock:
                await buy()
                continue
            started = time.perf_counter()
            async with lock.hold(timeout=30):
                waits.append(time.perf_counter() - started)
                await buy()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - started
    return {
        "stock": stock,
        "buyers": buyers,
        "workers": workers,
        "sold": sold,
        "rejected": rejected,
        "oversold": max(0, sold - stock),
        "stock_left": inventory["stock"],
        "elapsed_s": round(elapsed, 3),
        "wait_p50_ms": round(statistics.median(waits) * 1000, 2) if waits else None,
        "wait_max_ms": round(max(waits) * 1000, 2) if waits else None,
    }


async def _demo(url: str, workers: int, stock: int, buyers: int) -> int:
    async with _connect.connect(url) as backend:
        name = f"demo/flash-sale/sku-{os.getpid()}-{time.time_ns()}"
        naive = await _flash_sale(
            backend, stock=stock, buyers=buyers, workers=workers, use_lock=False, name=name
        )
        locked = await _flash_sale(
            backend, stock=stock, buyers=buyers, workers=workers, use_lock=True, name=name
        )
    print(f"aiolocks flash-sale demo on {backend.url}")
    print(f"  {stock} items in stock, {buyers} buyers served by {workers} worker tasks")
    print(
        f"  without a lock : sold {naive['sold']:>4}, rejected {naive['rejected']:>4}, "
        f"oversold {naive['oversold']}"
    )
    print(
        f"  with a mutex   : sold {locked['sold']:>4}, rejected {locked['rejected']:>4}, "
        f"oversold = {locked['oversold']}, stock left {locked['stock_left']}"
    )
    print(
        f"  lock waits     : median {locked['wait_p50_ms']} ms, max {locked['wait_max_ms']} ms, "
        f"total {locked['elapsed_s']} s"
    )
    ok = locked["oversold"] == 0 and locked["sold"] == min(stock, buyers)
    print("  result         : " + ("OK, exactly as many sales as items" if ok else "WRONG"))
    return 0 if ok else 1


# -- run ----------------------------------------------------------------------


async def _run(url: str, name: str, timeout: float | None, command: list[str]) -> int:
    async with _connect.connect(url) as backend:
        lock = backend.mutex(name)
        if not await lock.acquire(timeout=timeout):
            print(f"aiolocks run: lock {name!r} not acquired within {timeout} s", file=sys.stderr)
            return EXIT_NOT_ACQUIRED
        try:
            return await _run_holding(lock, command)
        finally:
            await lock.release()


async def _run_holding(lock: object, command: list[str]) -> int:
    from ._core.locks import Lock

    assert isinstance(lock, Lock)
    try:
        proc = await asyncio.create_subprocess_exec(*command)
    except OSError as exc:
        print(f"aiolocks run: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    loop = asyncio.get_running_loop()
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def forward(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    for sig in forwarded:
        loop.add_signal_handler(sig, forward, sig)
    try:
        try:
            async with lock.hold():  # re-entry: registers the body for loss cancellation
                return await proc.wait()
        except LockLostError as exc:
            print(f"aiolocks run: {exc}; terminating the command", file=sys.stderr)
            await _terminate(proc)
            return EXIT_LOCK_LOST
    finally:
        for sig in forwarded:
            loop.remove_signal_handler(sig)
        if proc.returncode is None:
            await _terminate(proc)


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 5)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


# -- status -------------------------------------------------------------------


async def _status(url: str, name: str, as_json: bool) -> int:
    async with _connect.connect(url) as backend:
        families = {
            "mutex": backend.mutex(name),
            "semaphore_mutex": backend.semaphore_mutex(name),
            "read_write_lock": backend.read_write_lock(name).write,
        }
        report: dict[str, list[dict[str, object]]] = {}
        for label, lock in families.items():
            report[label] = [asdict(p) for p in await lock.participants()]
        report["semaphore"] = [
            asdict(p) for p in await backend.semaphore(name, max_leases=1).participants()
        ]
        report["leader_latch"] = [
            asdict(p) for p in await backend.leader_latch(name).participants()
        ]
    if as_json:
        print(json.dumps({"url": backend.url, "name": name, "locks": report}, indent=2))
        return 0
    print(f"{name!r} on {backend.url}")
    any_rows = False
    for label, rows in report.items():
        if not rows:
            continue
        any_rows = True
        print(f"  {label}:")
        print(f"    {'#':>3}  {'role':<7} {'mode':<9} {'token':>8} {'ttl':>8}  id")
        for i, row in enumerate(rows):
            role = "holder" if row["is_holder"] else "waiting"
            token = "-" if row["fencing_token"] is None else str(row["fencing_token"])
            ttl = "-" if row["ttl"] is None else f"{row['ttl']:.1f}s"
            print(f"    {i:>3}  {role:<7} {row['mode']!s:<9} {token:>8} {ttl:>8}  {row['id']}")
    if not any_rows:
        print("  free: no holder and nobody waiting")
    return 0


# -- entry point --------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiolocks", description="Distributed locks for asyncio: demo, run, status."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the flash-sale demo")
    demo.add_argument("--url", default="memory://", help="backend URL (default: memory://)")
    demo.add_argument("--workers", type=int, default=8, help="worker tasks (default 8)")
    demo.add_argument("--stock", type=int, default=100, help="items in stock (default 100)")
    demo.add_argument("--buyers", type=int, default=300, help="buyers (default 300)")
    run = sub.add_parser("run", help="run a command while holding a lock")
    run.add_argument("url")
    run.add_argument("name")
    run.add_argument("--timeout", type=float, default=None, help="seconds to wait for the lock")
    run.epilog = "Everything after '--' is the command to run."
    status = sub.add_parser("status", help="show holder and queue of a lock")
    status.add_argument("url")
    status.add_argument("name")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    _doctor_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiolocks`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = _parser().parse_args(argv)
    if args.command != "run" and command:
        print(f"aiolocks {args.command}: unexpected arguments after '--'", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "doctor":
        return _doctor_cli.run(args)
    try:
        if args.command == "demo":
            for option in ("workers", "stock", "buyers"):
                if getattr(args, option) < 1:
                    print(f"aiolocks demo: --{option} must be >= 1", file=sys.stderr)
                    return EXIT_USAGE
            return asyncio.run(_demo(args.url, args.workers, args.stock, args.buyers))
        if args.command == "run":
            if not command:
                print("aiolocks run: no command given (URL NAME -- CMD)", file=sys.stderr)
                return EXIT_USAGE
            return asyncio.run(_run(args.url, args.name, args.timeout, command))
        return asyncio.run(_status(args.url, args.name, args.json))
    except ValueError as exc:
        print(f"aiolocks {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BackendUnavailableError as exc:
        print(f"aiolocks {args.command}: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except LockTimeoutError as exc:
        print(f"aiolocks {args.command}: {exc}", file=sys.stderr)
        return EXIT_NOT_ACQUIRED
    except LockError as exc:
        print(f"aiolocks {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
