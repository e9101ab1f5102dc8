"""The ``aiolocks`` command line.

``aiolocks run [URL] NAME [options] -- CMD ARGS...``
    Like ``flock(1)``, ``consul lock`` or ``etcdctl lock``, on any backend:
    hold a lock while CMD runs in a process group of its own; signals go to
    the whole group; if the lock is lost the group is terminated (TERM, then
    KILL after ``--kill-after``); ``aiolocks run`` returns only when no
    process of the group is left.
``aiolocks elect [URL] NAME [--id ID] -- CMD ARGS...``
    Run CMD only while this process is the leader of NAME.
``aiolocks status [URL] NAME [--json]``
    Holders, waiters, fencing tokens and lease TTLs of every lock kind of NAME.
``aiolocks list [URL] [PREFIX] [--json]``
    Every lock under PREFIX with its holders and waiters.
``aiolocks break [URL] NAME --yes``
    Force-release every hold of NAME (administrative).
``aiolocks demo [--url URL]``
    The flash-sale demo.
``aiolocks doctor [URL] [--json]``
    Settings of the lock service that break lock guarantees, and a live
    self-test; exit 1 when something is critical (see ``aiolocks._doctor_cli``).

``URL`` may be left out when ``AIOLOCKS_URL`` is set. Exit codes are listed
in :data:`EXIT_CODES` and in ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

from . import _connect, _doctor_cli
from ._core.admin import KINDS as ADMIN_KINDS
from ._core.backend import Backend
from ._core.driver import Grant
from ._core.errors import (
    AccessDeniedError,
    BackendUnavailableError,
    LockError,
    LockLostError,
    LockTimeoutError,
)
from ._core.leader import LeaderLatch
from ._core.names import validate_name
from ._core.once import check_periods
from ._core.urls import scrub
from ._procgroup import ProcessGroup, exit_status

__all__ = [
    "EXIT_ACCESS_DENIED",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_CODES",
    "EXIT_COMMAND_NOT_FOUND",
    "EXIT_LOCK_LOST",
    "EXIT_NOT_ACQUIRED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "main",
]

#: ``run``/``elect``: the lock was not acquired in time (sysexits EX_TEMPFAIL); ``-E`` changes it
EXIT_NOT_ACQUIRED = 75
#: ``run``/``elect``: the lock (leadership) was lost while CMD ran; CMD's group was stopped
EXIT_LOCK_LOST = 76
#: the backend could not be reached (sysexits EX_UNAVAILABLE)
EXIT_UNAVAILABLE = 69
#: the server refused the credentials, a permission or the TLS handshake (sysexits EX_NOPERM)
EXIT_ACCESS_DENIED = 77
#: bad arguments or options (sysexits EX_USAGE)
EXIT_USAGE = 64
#: ``run``/``elect``: CMD was found but cannot be executed (as in the shell)
EXIT_CANNOT_EXECUTE = 126
#: ``run``/``elect``: CMD was not found (as in the shell)
EXIT_COMMAND_NOT_FOUND = 127
#: any other lock error
EXIT_LOCK_ERROR = 1

#: every exit status the command line uses, with its meaning
EXIT_CODES: dict[int, str] = {
    0: "success (run/elect: CMD exited 0)",
    EXIT_LOCK_ERROR: "a lock error (status/list/break), or CMD's own status 1",
    EXIT_USAGE: "bad arguments, options or URL",
    EXIT_UNAVAILABLE: "the backend could not be reached",
    EXIT_ACCESS_DENIED: "the backend refused the credentials, a permission or the certificate",
    EXIT_NOT_ACQUIRED: "run/elect: not acquired in time (-n, -w); -E N changes it",
    EXIT_LOCK_LOST: "run/elect: the lock (leadership) was lost; CMD's process group was stopped",
    EXIT_CANNOT_EXECUTE: "run/elect: CMD cannot be executed",
    EXIT_COMMAND_NOT_FOUND: "run/elect: CMD not found",
}

#: ``--kill-after`` default: seconds between TERM and KILL when the lock is lost
DEFAULT_KILL_AFTER = 10.0

#: ``run --at-least-for`` without ``--at-most-for``: how long a crashed host keeps the job
DEFAULT_AT_MOST_FOR = 600.0

URL_ENV = "AIOLOCKS_URL"
"""Environment variable read when the URL argument is left out (never passed to CMD)."""

URL_FILE_ENV = "AIOLOCKS_URL_FILE"
"""Environment variable naming a file that holds the URL (read before ``AIOLOCKS_URL``)."""


class UsageError(Exception):
    """Bad command-line input; exit status 64."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits 64 (EX_USAGE) instead of 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _seconds(text: str) -> float:
    """A ``--timeout``/``--kill-after`` value: seconds >= 0, or ``inf``/``forever``."""
    if text.strip().lower() in ("inf", "forever", "infinity"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected seconds >= 0 or 'forever', got {text!r}"
        ) from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 or 'forever', got {text!r}")
    return value


def _exit_code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an exit status 0-255, got {text!r}") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"expected an exit status 0-255, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _read_url_file(path: str) -> str:
    """The one URL in the file at ``path`` (blank lines and ``#`` comments skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise UsageError(f"cannot read the URL file {path!r}: {reason}") from None
    lines = [line.strip() for line in text.splitlines()]
    urls = [line for line in lines if line and not line.startswith("#")]
    if len(urls) != 1:
        raise UsageError(f"the URL file {path!r} must hold one URL, found {len(urls)} lines")
    return urls[0]


def _default_url(url_file: str | None) -> str:
    """``--url-file``, else ``AIOLOCKS_URL_FILE``, else ``AIOLOCKS_URL`` ("" when none)."""
    path = url_file or os.environ.get(URL_FILE_ENV, "")
    if path:
        return _read_url_file(path)
    return os.environ.get(URL_ENV, "")


def _url_and(
    command: str,
    positionals: list[str],
    what: str,
    *,
    optional_second: bool = False,
    url_file: str | None = None,
) -> tuple[str, str | None]:
    """Split ``[URL] NAME`` (or ``[URL] [PREFIX]``).

    Left out, the URL comes from ``--url-file``, ``AIOLOCKS_URL_FILE`` or
    ``AIOLOCKS_URL``, in that order.
    """
    given = len(positionals) == 2 or (len(positionals) == 1 and "://" in positionals[0])
    if given and url_file:
        raise UsageError("give the backend URL either as an argument or with --url-file, not both")
    missing = f"give it, use --url-file, or set {URL_FILE_ENV} or {URL_ENV}"
    if len(positionals) == 2:
        return positionals[0], positionals[1]
    if len(positionals) == 1:
        if "://" in positionals[0]:  # never part of a valid lock name
            if optional_second:
                return positionals[0], None
            raise UsageError(f"{what} is missing (after the URL)")
        env_url = _default_url(url_file)
        if not env_url:
            raise UsageError(f"the backend URL is missing before {what}: {missing}")
        return env_url, positionals[0]
    if not positionals:
        if optional_second:
            env_url = _default_url(url_file)
            if env_url:
                return env_url, None
            raise UsageError(f"the backend URL is missing: {missing}")
        raise UsageError(f"{what} is missing")
    raise UsageError(f"too many arguments: {len(positionals)} (commands go after '--')")


_MEMORY_REFUSED = (
    "memory:// locks live inside one Python process, and every 'aiolocks' command is a "
    "process of its own"
)


def _refuse_memory(command: str, url: str, *, local: bool = False) -> None:
    """memory:// cannot coordinate processes: refuse it unless ``--local`` (run/elect) says so.

    Two ``aiolocks run memory:// NAME`` would both run at once, and ``status``,
    ``list`` and ``break`` could never see a hold of another process.
    """
    if url.partition("://")[0].strip().lower() != "memory":
        return
    if command in ("run", "elect"):
        if local:
            return
        raise UsageError(
            f"{_MEMORY_REFUSED}: two 'aiolocks {command} memory://' would not exclude each "
            "other. Give a server's URL (zk://, redis://, etcd://, postgresql://), or "
            "--local to run without excluding any other process."
        )
    raise UsageError(
        f"{_MEMORY_REFUSED}: 'aiolocks {command}' can never see the holds of another process. "
        "Give a server's URL (zk://, redis://, etcd://, postgresql://)."
    )


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


# -- run and elect --------------------------------------------------------------

#: ``--kind`` values of ``run``: the Python factory each one matches
KINDS: dict[str, str] = {
    "mutex": "backend.mutex(NAME)",
    "semaphore-mutex": "backend.semaphore_mutex(NAME)",
    "write": "backend.read_write_lock(NAME).write",
    "read": "backend.read_write_lock(NAME).read",
    "semaphore": "backend.semaphore(NAME, max_leases=N)",
}

#: former spellings of lock kinds, still accepted by ``--kind`` (deprecated: never printed)
KIND_ALIASES: dict[str, str] = {
    "semaphore_mutex": "semaphore-mutex",
    "read_write_lock": "rwlock",
    "leader_latch": "leader",
}


def _kind_choice(choices: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type`` for ``--kind``: one of ``choices``, or a deprecated alias of one."""

    def kind(text: str) -> str:
        canonical = KIND_ALIASES.get(text, text)
        if canonical not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid kind {text!r} (choose from {', '.join(choices)})"
            )
        return canonical

    return kind


_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class _RunOptions:
    url: str
    name: str
    kind: str
    limit: int | None
    timeout: float | None
    conflict_exit_code: int
    kill_after: float
    command: list[str]
    verbose: bool = False
    #: ``--at-most-for``/``--at-least-for``: run CMD once per period (``backend.once``)
    at_most_for: float | None = None
    at_least_for: float = 0.0


class _Signals:
    """SIGTERM/SIGINT/SIGHUP for ``run``/``elect``, by phase.

    While waiting for the lock, a signal cancels the wait (nothing is held
    afterwards, nothing was started) and the exit status is 128+N. While
    CMD starts, a signal is kept and sent as soon as the group exists. While
    CMD runs, a signal goes to its whole process group; after TERM or INT,
    a group still alive ``kill_after`` seconds later gets KILL.
    """

    def __init__(self, kill_after: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._kill_after = kill_after
        self.received: int | None = None
        self.group: ProcessGroup | None = None
        self.starting = False
        self._pending: list[int] = []
        self._escalation: asyncio.TimerHandle | None = None

    def install(self) -> None:
        for sig in _FORWARDED:
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def remove(self) -> None:
        for sig in _FORWARDED:
            self._loop.remove_signal_handler(sig)
        if self._escalation is not None:
            self._escalation.cancel()

    def _on_signal(self, sig: int) -> None:
        if self.received is None:
            self.received = sig
        if self.group is not None:
            self._forward(sig)
        elif self.starting:
            self._pending.append(sig)
        elif self._task is not None:
            self._task.cancel(f"aiolocks: signal {signal.Signals(sig).name}")

    def started(self, group: ProcessGroup) -> None:
        self.group = group
        self.starting = False
        pending, self._pending = self._pending, []
        for sig in pending:
            self._forward(sig)

    def _forward(self, sig: int) -> None:
        group = self.group
        assert group is not None
        group.signal(sig)
        if sig != signal.SIGHUP and self._escalation is None and math.isfinite(self._kill_after):
            self._escalation = self._loop.call_later(self._kill_after, group.signal, signal.SIGKILL)


def _child_env(name: str, kind: str, token: int | None) -> dict[str, str]:
    env = dict(os.environ)
    # The URL may hold a password: CMD does not get it (AIOLOCKS_URL_FILE, a
    # path, stays, so an aiolocks call inside CMD still finds the backend).
    env.pop(URL_ENV, None)
    env["AIOLOCKS_LOCK_NAME"] = name
    env["AIOLOCKS_LOCK_KIND"] = kind
    if token is not None:
        env["AIOLOCKS_FENCING_TOKEN"] = str(token)
    else:
        env.pop("AIOLOCKS_FENCING_TOKEN", None)
    return env


async def _start_group(signals: _Signals, command: list[str], env: dict[str, str]) -> ProcessGroup:
    signals.starting = True
    try:
        group = await ProcessGroup.start(command, env)
    except BaseException:
        signals.starting = False
        raise
    signals.started(group)
    return group


def _start_error(command: str, exc: OSError) -> int:
    print(f"aiolocks: cannot execute {command!r}: {exc.strerror or exc}", file=sys.stderr)
    if isinstance(exc, FileNotFoundError):
        return EXIT_COMMAND_NOT_FOUND
    return EXIT_CANNOT_EXECUTE


async def _run_in_group(
    signals: _Signals, command: list[str], env: dict[str, str], kill_after: float
) -> int:
    """Run ``command`` in its own group until the whole group is gone.

    If this task is cancelled (the core cancels an ``async with`` body whose
    hold is lost), the group is stopped (TERM, KILL after ``kill_after``)
    *before* the cancellation goes on, so nothing of it outlives the lock by
    more than ``kill_after`` seconds.
    """
    try:
        group = await _start_group(signals, command, env)
    except OSError as exc:
        return _start_error(command[0], exc)
    try:
        return exit_status(await group.wait())
    except BaseException:
        if group.alive():
            print(
                f"aiolocks: stopping the command (process group {group.pgid}): "
                f"TERM, KILL after {kill_after:g} s",
                file=sys.stderr,
            )
            await group.terminate(kill_after)
        raise


def _primitive_hold(
    backend: Backend, opts: _RunOptions
) -> contextlib.AbstractAsyncContextManager[object]:
    name, timeout = opts.name, opts.timeout
    if opts.kind == "mutex":
        return backend.mutex(name).hold(timeout=timeout)
    if opts.kind == "semaphore-mutex":
        return backend.semaphore_mutex(name).hold(timeout=timeout)
    if opts.kind == "write":
        return backend.read_write_lock(name).write.hold(timeout=timeout)
    if opts.kind == "read":
        return backend.read_write_lock(name).read.hold(timeout=timeout)
    assert opts.kind == "semaphore"
    assert opts.limit is not None
    return backend.semaphore(name, max_leases=opts.limit).lease(timeout=timeout)


async def _run_once(backend: Backend, opts: _RunOptions, signals: _Signals) -> int:
    """``run --at-least-for/--at-most-for``: CMD at most once per period, never waiting."""
    assert opts.at_most_for is not None
    job = backend.once(opts.name, at_most_for=opts.at_most_for, at_least_for=opts.at_least_for)
    try:
        async with job as ran:
            if not ran:
                print(
                    f"aiolocks run: job {opts.name!r} already ran this period or is running",
                    file=sys.stderr,
                )
                return opts.conflict_exit_code
            if opts.verbose:
                print(f"aiolocks run: running job {opts.name!r}", file=sys.stderr)
            env = _child_env(opts.name, "once", None)
            return await _run_in_group(signals, opts.command, env, opts.kill_after)
    except LockLostError as exc:
        print(f"aiolocks run: {exc}", file=sys.stderr)
        return EXIT_LOCK_LOST


async def _run(opts: _RunOptions) -> int:
    signals = _Signals(opts.kill_after)
    signals.install()
    try:
        async with _connect.connect(opts.url) as backend:
            if opts.at_most_for is not None:
                return await _run_once(backend, opts, signals)
            held_cm = _primitive_hold(backend, opts)
            try:
                async with held_cm as held:
                    token = getattr(held, "fencing_token", None)
                    if opts.verbose:
                        print(
                            f"aiolocks run: holding {opts.kind} {opts.name!r} "
                            f"(fencing token {token})",
                            file=sys.stderr,
                        )
                    env = _child_env(opts.name, opts.kind, token)
                    return await _run_in_group(signals, opts.command, env, opts.kill_after)
            except LockTimeoutError:
                print(
                    f"aiolocks run: {opts.kind} {opts.name!r} is busy"
                    + ("" if opts.timeout == 0 else f" (waited {opts.timeout:g} s)"),
                    file=sys.stderr,
                )
                return opts.conflict_exit_code
            except LockLostError as exc:
                print(f"aiolocks run: {exc}", file=sys.stderr)
                return EXIT_LOCK_LOST
    except asyncio.CancelledError:
        if signals.received is not None and signals.group is None:
            return 128 + signals.received
        raise
    finally:
        signals.remove()


async def _leadership(latch: LeaderLatch, timeout: float | None) -> bool:
    """Wait for leadership; with ``timeout=0``, until it is clear who leads.

    A latch queues in the background, so "try once" means: lead, or see
    another participant lead.
    """
    if timeout != 0:
        return await latch.wait_for_leadership(timeout=timeout)
    while True:
        if await latch.wait_for_leadership(timeout=0.1):
            return True
        for participant in await latch.participants():
            if participant.is_holder and participant.id != latch.participant_id:
                return False


async def _elect(opts: _RunOptions, participant_id: str | None) -> int:
    signals = _Signals(opts.kill_after)
    signals.install()
    try:
        async with (
            _connect.connect(opts.url) as backend,
            backend.leader_latch(opts.name, participant_id=participant_id) as latch,
        ):
            if not await _leadership(latch, opts.timeout):
                print(
                    f"aiolocks elect: not leader of {opts.name!r}"
                    + ("" if opts.timeout == 0 else f" within {opts.timeout:g} s"),
                    file=sys.stderr,
                )
                return opts.conflict_exit_code
            hold = latch._hold
            assert hold is not None
            grant = hold.grant
            env = _child_env(opts.name, "leader", latch.fencing_token)
            runner = asyncio.ensure_future(
                _run_in_group(signals, opts.command, env, opts.kill_after)
            )
            lost: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

            def on_lost(lost_grant: Grant) -> None:
                if not lost.done():
                    lost.set_result(lost_grant.lost_reason)

            grant.add_loss_listener(on_lost)
            try:
                either: set[asyncio.Future[Any]] = {runner, lost}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                runner.cancel()
                await asyncio.wait([runner])
                raise
            if runner.done():
                return runner.result()
            print(
                f"aiolocks elect: leadership of {opts.name!r} lost: {lost.result()}",
                file=sys.stderr,
            )
            runner.cancel()  # stops the group: TERM, then KILL after --kill-after
            await asyncio.wait([runner])
            return EXIT_LOCK_LOST
    except asyncio.CancelledError:
        if signals.received is not None and signals.group is None:
            return 128 + signals.received
        raise
    finally:
        signals.remove()


# -- status -------------------------------------------------------------------


async def _status(url: str, name: str, as_json: bool) -> int:
    async with _connect.connect(url) as backend:
        # keyed by the lock kinds of ``list`` and ``break --kind`` (one spelling everywhere)
        families = {
            "mutex": backend.mutex(name),
            "semaphore-mutex": backend.semaphore_mutex(name),
            "rwlock": backend.read_write_lock(name).write,
        }
        report: dict[str, list[dict[str, object]]] = {}
        for label, lock in families.items():
            report[label] = [asdict(p) for p in await lock.participants()]
        report["semaphore"] = [
            asdict(p) for p in await backend.semaphore(name, max_leases=1).participants()
        ]
        report["leader"] = [asdict(p) for p in await backend.leader_latch(name).participants()]
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


# -- list and break -------------------------------------------------------------------


async def _list(url: str, prefix: str, as_json: bool) -> int:
    async with _connect.connect(url) as backend:
        locks = await backend.list_locks(prefix)
    if as_json:
        report = {
            "url": backend.url,
            "prefix": prefix,
            "locks": [
                {
                    "name": info.name,
                    "kind": info.kind,
                    "participants": [asdict(p) for p in info.participants],
                }
                for info in locks
            ],
        }
        print(json.dumps(report, indent=2))
        return 0
    if not locks:
        print(f"no lock in use under {prefix!r} on {backend.url}")
        return 0
    print(f"{'kind':<16} {'holders':>7} {'waiting':>7} {'tokens':<16} name")
    for info in locks:
        holders = [p for p in info.participants if p.is_holder]
        tokens = ",".join(str(p.fencing_token) for p in holders if p.fencing_token is not None)
        waiting = len(info.participants) - len(holders)
        print(f"{info.kind:<16} {len(holders):>7} {waiting:>7} {tokens or '-':<16} {info.name}")
    return 0


async def _break(url: str, name: str, kind: str | None) -> int:
    async with _connect.connect(url) as backend:
        removed = await backend.force_release(name, kind)
    what = "every kind" if kind is None else kind
    print(f"{name!r} ({what}) on {backend.url}: {removed} hold(s) removed")
    return 0


# -- entry point ------------------------------------------------------------------

_MAIN_EPILOG = """\
URL is a backend URL such as zk://127.0.0.1:2181, redis://127.0.0.1:6379/0,
etcd://127.0.0.1:2379 or postgresql://app@db/app (see the README); it may be
left out when --url-file PATH, AIOLOCKS_URL_FILE or AIOLOCKS_URL gives it (in
that order). A file keeps a password out of ps and shell history. CMD of
run/elect does not get AIOLOCKS_URL. memory:// lives inside one process: run
and elect refuse it without --local, status, list and break always.

exit status: 0 success; run/elect: CMD's own status, 128+N if CMD died of
signal N, 75 not acquired in time (-E N to change), 76 lock lost (CMD's
process group stopped), 126 CMD cannot be executed, 127 CMD not found;
64 bad usage, 69 backend unreachable, 77 access denied (credentials,
permission, certificate), 1 other lock errors.
"""

_RUN_DESCRIPTION = """\
Run CMD while holding a lock, like flock(1), consul lock or etcdctl lock.
CMD runs in a process group of its own. SIGTERM, SIGINT and SIGHUP sent to
aiolocks run go to the whole group (after TERM or INT, KILL follows
--kill-after seconds later if the group is still there). If the lock is
lost, the group gets TERM, then KILL after --kill-after seconds, and the
exit status is 76. aiolocks run returns only when no process of the group
is left. A signal that arrives while still waiting for the lock stops the
wait: nothing is held and CMD is not started (exit 128+N).

CMD finds AIOLOCKS_LOCK_NAME, AIOLOCKS_LOCK_KIND and AIOLOCKS_FENCING_TOKEN
in its environment; pass the token on to the storage you protect.

By default run waits for the lock as long as it takes (like flock); in
cron use -n (skip this run when busy) or -w SECONDS.
"""

_RUN_EPILOG = """\
kinds (--kind) and the Python lock each one excludes:
  mutex            backend.mutex(NAME)   (default)
  semaphore-mutex  backend.semaphore_mutex(NAME)
  write            backend.read_write_lock(NAME).write
  read             backend.read_write_lock(NAME).read   (same as -s)
  semaphore        backend.semaphore(NAME, max_leases=N) (same as --limit N)

examples:
  aiolocks run redis://127.0.0.1:6379/0 jobs/backup -- ./backup.sh
  aiolocks run -n zk://127.0.0.1:2181 jobs/nightly -- make report   # skip if busy: exit 75
  aiolocks run -w 30 -E 0 $URL jobs/sync -- rsync -a src/ dst/      # busy is not an error
  aiolocks run -s $URL config/pricing -- ./read-config.sh           # shared (read) hold
  aiolocks run --limit 3 $URL limits/encoder -- ffmpeg -i in out    # one of 3 slots
  AIOLOCKS_URL=redis://127.0.0.1:6379/0 aiolocks run jobs/backup -- ./backup.sh

crontab (every 5 minutes, skipped while the previous run still holds the lock):
  */5 * * * * AIOLOCKS_URL=redis://10.0.0.5:6379/0 aiolocks run -n jobs/report -- /opt/report.sh

once per period on every host's crontab (one host runs it, even with skewed clocks):
  */5 * * * * aiolocks run --at-least-for 240 --at-most-for 1800 -n jobs/report -- ./report.sh
"""

_ELECT_DESCRIPTION = """\
Run CMD only while this process is the leader of NAME (like etcdctl elect).
Waits for leadership (as long as it takes unless -n/-w), then runs CMD in a
process group of its own with the process handling of 'aiolocks run'. If
leadership is lost, the group gets TERM, then KILL after --kill-after
seconds, and the exit status is 76.
"""

_ELECT_EPILOG = """\
examples:
  aiolocks elect zk://127.0.0.1:2181 leaders/scheduler --id host-a -- ./scheduler
  aiolocks elect -n $URL leaders/cron -- ./job.sh      # exit 75 if another one leads
"""


def _add_url_name(parser: argparse.ArgumentParser, second: str, help_second: str) -> None:
    parser.add_argument(
        "positionals",
        nargs="*",
        metavar=f"[URL] {second}",
        help=f"backend URL (or --url-file, {URL_FILE_ENV}, {URL_ENV}), then {help_second}",
    )
    _add_url_file(parser)


def _add_url_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url-file",
        metavar="PATH",
        default=None,
        help=f"read the backend URL from PATH (keeps a password out of ps and shell "
        f"history); also {URL_FILE_ENV}",
    )


def _add_wait_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "-n",
        "--nonblock",
        action="store_true",
        help=f"do not wait: if {what} is busy, exit 75 (or -E) at once",
    )
    parser.add_argument(
        "-w",
        "--timeout",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help=f"wait at most SECONDS for {what}, then exit 75 (or -E); "
        "default: wait as long as it takes ('forever')",
    )
    parser.add_argument(
        "-E",
        "--conflict-exit-code",
        type=_exit_code,
        default=EXIT_NOT_ACQUIRED,
        metavar="N",
        help=f"exit status when {what} was not acquired (default {EXIT_NOT_ACQUIRED})",
    )
    parser.add_argument(
        "--kill-after",
        type=_seconds,
        default=DEFAULT_KILL_AFTER,
        metavar="SECONDS",
        help="seconds between TERM and KILL when CMD's group is stopped "
        f"(default {DEFAULT_KILL_AFTER:g})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="say on stderr when the lock is held"
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="allow a memory:// URL, whose locks exclude nothing outside this one "
        "process (without it, memory:// is refused: exit 64)",
    )


def _setup_run(parser: argparse.ArgumentParser) -> None:
    _add_url_name(parser, "NAME", "the lock name, e.g. jobs/backup")
    _add_wait_options(parser, "the lock")
    parser.add_argument(
        "-k",
        "--kind",
        type=_kind_choice(list(KINDS)),
        default=None,
        metavar="{" + ",".join(KINDS) + "}",
        help="which lock to take (default: mutex); see below",
    )
    parser.add_argument(
        "-s", "--shared", action="store_true", help="take the read (shared) half: --kind read"
    )
    parser.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        metavar="N",
        help="take one lease of a semaphore of N: up to N commands run at once",
    )
    parser.add_argument(
        "--at-least-for",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="run CMD at most once per SECONDS across hosts (backend.once): the job stays "
        "taken SECONDS after its start by the server's clock; never waits (exit 75 or -E)",
    )
    parser.add_argument(
        "--at-most-for",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="with --at-least-for: a host that dies while CMD runs frees the job SECONDS "
        f"after its last renewal (default: the larger of {DEFAULT_AT_MOST_FOR:g} and "
        "--at-least-for)",
    )


def _setup_elect(parser: argparse.ArgumentParser) -> None:
    _add_url_name(parser, "NAME", "the election name, e.g. leaders/cron")
    _add_wait_options(parser, "leadership")
    parser.add_argument(
        "--id", default=None, help="participant id shown by status/list (default: random)"
    )


def _run_options(command_name: str, args: argparse.Namespace, command: list[str]) -> _RunOptions:
    url, name = _url_and(command_name, args.positionals, "NAME", url_file=args.url_file)
    assert name is not None
    name = validate_name(name)  # a bad name is a usage error before any I/O
    _connect.backend_from_url(url)  # so is a bad URL
    _refuse_memory(command_name, url, local=args.local)
    if not command:
        raise UsageError(f"no command given: aiolocks {command_name} [URL] NAME -- CMD [ARGS...]")
    if args.nonblock and args.timeout is not None:
        raise UsageError("-n/--nonblock and -w/--timeout exclude each other")
    timeout: float | None = 0.0 if args.nonblock else args.timeout
    if timeout is not None and math.isinf(timeout):
        timeout = None
    kind = getattr(args, "kind", None)
    limit = getattr(args, "limit", None)
    if getattr(args, "shared", False):
        if kind not in (None, "read"):
            raise UsageError(f"-s/--shared takes the read half; it excludes --kind {kind}")
        kind = "read"
    if limit is not None:
        if kind not in (None, "semaphore"):
            raise UsageError(f"--limit N takes a semaphore lease; it excludes --kind {kind}")
        kind = "semaphore"
    if kind == "semaphore" and limit is None:
        raise UsageError("--kind semaphore needs --limit N (the number of leases)")
    at_most_for, at_least_for = _once_periods(args, kind, timeout)
    return _RunOptions(
        url=url,
        name=name,
        kind=kind or "mutex",
        limit=limit,
        timeout=timeout,
        conflict_exit_code=args.conflict_exit_code,
        kill_after=args.kill_after,
        command=command,
        verbose=args.verbose,
        at_most_for=at_most_for,
        at_least_for=at_least_for,
    )


def _once_periods(
    args: argparse.Namespace, kind: str | None, timeout: float | None
) -> tuple[float | None, float]:
    """``--at-most-for``/``--at-least-for`` checked: ``(None, 0.0)`` when neither is given."""
    most = getattr(args, "at_most_for", None)
    least = getattr(args, "at_least_for", None)
    if most is None and least is None:
        return None, 0.0
    if kind is not None:
        raise UsageError("--at-least-for/--at-most-for run a job once per period: no --kind")
    if timeout not in (None, 0.0):
        raise UsageError("--at-least-for/--at-most-for never wait: -w does not apply (use -n)")
    least = 0.0 if least is None else least
    if most is None:
        most = max(DEFAULT_AT_MOST_FOR, least)
    try:
        return check_periods(most, least)
    except ValueError as exc:
        raise UsageError(str(exc).replace("_", "-")) from None


def _cmd_run(args: argparse.Namespace, command: list[str]) -> int:
    return asyncio.run(_run(_run_options("run", args, command)))


def _cmd_elect(args: argparse.Namespace, command: list[str]) -> int:
    return asyncio.run(_elect(_run_options("elect", args, command), args.id))


def _setup_status(parser: argparse.ArgumentParser) -> None:
    _add_url_name(parser, "NAME", "the lock name")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _cmd_status(args: argparse.Namespace, command: list[str]) -> int:
    url, name = _url_and("status", args.positionals, "NAME", url_file=args.url_file)
    assert name is not None
    _refuse_memory("status", url)
    return asyncio.run(_status(url, name, args.json))


def _setup_list(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "positionals",
        nargs="*",
        metavar="[URL] [PREFIX]",
        help=f"backend URL (or --url-file, {URL_FILE_ENV}, {URL_ENV}), then a name prefix "
        "such as jobs/ (default: all)",
    )
    _add_url_file(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _cmd_list(args: argparse.Namespace, command: list[str]) -> int:
    url, prefix = _url_and(
        "list", args.positionals, "PREFIX", optional_second=True, url_file=args.url_file
    )
    _refuse_memory("list", url)
    return asyncio.run(_list(url, prefix or "", args.json))


def _setup_break(parser: argparse.ArgumentParser) -> None:
    _add_url_name(parser, "NAME", "the lock name")
    parser.add_argument(
        "--yes", action="store_true", help="really remove the holds (required: no undo)"
    )
    parser.add_argument(
        "-k",
        "--kind",
        type=_kind_choice(list(ADMIN_KINDS)),
        default=None,
        metavar="{" + ",".join(ADMIN_KINDS) + "}",
        help="only this kind of lock (default: every kind of NAME)",
    )


def _cmd_break(args: argparse.Namespace, command: list[str]) -> int:
    url, name = _url_and("break", args.positionals, "NAME", url_file=args.url_file)
    assert name is not None
    name = validate_name(name)
    _refuse_memory("break", url)
    if not args.yes:
        raise UsageError(
            f"this removes every hold of {name!r}; the holders lose the lock. Add --yes to do it."
        )
    return asyncio.run(_break(url, name, args.kind))


def _setup_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="memory://", help="backend URL (default: memory://)")
    parser.add_argument("--workers", type=_positive_int, default=8, help="worker tasks (default 8)")
    parser.add_argument("--stock", type=_positive_int, default=100, help="items (default 100)")
    parser.add_argument("--buyers", type=_positive_int, default=300, help="buyers (default 300)")


def _cmd_demo(args: argparse.Namespace, command: list[str]) -> int:
    return asyncio.run(_demo(args.url, args.workers, args.stock, args.buyers))


@dataclass(frozen=True)
class Subcommand:
    """One ``aiolocks`` subcommand: its parser setup and its handler."""

    name: str
    help: str
    setup: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace, list[str]], int]
    description: str | None = None
    epilog: str | None = None
    #: takes ``-- CMD ARGS...``
    takes_command: bool = False
    #: builds its own parser on the subparsers (instead of ``setup``)
    register: Callable[[Any], argparse.ArgumentParser] | None = None


#: The subcommands, in ``--help`` order. Add a row to add one.
SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        "run",
        "run a command while holding a lock",
        _setup_run,
        _cmd_run,
        _RUN_DESCRIPTION,
        _RUN_EPILOG,
        takes_command=True,
    ),
    Subcommand(
        "elect",
        "run a command only while leader",
        _setup_elect,
        _cmd_elect,
        _ELECT_DESCRIPTION,
        _ELECT_EPILOG,
        takes_command=True,
    ),
    Subcommand(
        "status",
        "holders and waiters of a lock",
        _setup_status,
        _cmd_status,
        "Holders, waiters, fencing tokens and lease TTLs of every lock kind of NAME.",
        "example:\n  aiolocks status --json redis://127.0.0.1:6379/0 jobs/backup\n",
    ),
    Subcommand(
        "list",
        "every lock in use under a prefix",
        _setup_list,
        _cmd_list,
        "Every lock under PREFIX that has holders or waiters, with its kind.",
        "examples:\n  aiolocks list redis://127.0.0.1:6379/0 jobs/\n"
        "  aiolocks list --json zk://127.0.0.1:2181\n",
    ),
    Subcommand(
        "break",
        "force-release a lock (administrative)",
        _setup_break,
        _cmd_break,
        "Remove every hold of NAME (Redisson's forceUnlock). The former holders see\n"
        "LockLostError at once: on Redis by the key's keyspace events (at the next\n"
        "lease renewal, within a third of lease_time, only where keyspace events\n"
        "are off or refused, and on Redlock), on ZooKeeper by a watch on the node.\n"
        "An 'aiolocks run' holding it then has its command stopped and exits 76.",
        "example:\n  aiolocks break redis://127.0.0.1:6379/0 jobs/backup --yes\n",
    ),
    Subcommand(
        "demo",
        "the flash-sale demo",
        _setup_demo,
        _cmd_demo,
        "The flash sale: without a lock it oversells, with a mutex it never does.",
    ),
    Subcommand(
        "doctor",
        "check the lock service's settings",
        lambda parser: None,
        lambda args, command: _doctor_cli.run(args),
        register=_doctor_cli.add_parser,
    ),
]


def _not_a_loss(record: logging.LogRecord) -> bool:
    """False for the library's warnings about a lost hold or leadership.

    ``run`` and ``elect`` report the loss themselves, in one line with the
    reason, followed by what they do about it (stopping the command).
    """
    if getattr(record, "aiolocks_event", None) == "lost":
        return False
    return not (record.name == "aiolocks" and "lost leadership" in str(record.msg))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="aiolocks",
        description="Distributed locks for asyncio, from the command line.",
        epilog=_MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"aiolocks {__version__}")
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    for spec in SUBCOMMANDS:
        if spec.register is not None:  # a command that builds its own parser
            child = spec.register(sub)
        else:
            usage = None
            if spec.takes_command:
                usage = f"aiolocks {spec.name} [options] [URL] NAME -- CMD [ARGS...]"
            child = sub.add_parser(
                spec.name,
                help=spec.help,
                description=spec.description,
                epilog=spec.epilog,
                usage=usage,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            spec.setup(child)
        child.set_defaults(_spec=spec, _parser=child)
    return parser


def _failed(command: str, exc: BaseException, urls: list[str], status: int) -> int:
    """Print ``exc`` for ``command`` with every URL's password redacted; return ``status``."""
    print(f"aiolocks {command}: {scrub(str(exc), *urls)}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiolocks`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    parser = _parser()
    try:
        args, extras = parser.parse_known_args(argv)
        # options may come between URL and NAME: argparse leaves what follows them over
        if extras and all(not e.startswith("-") for e in extras) and "positionals" in args:
            args.positionals = [*args.positionals, *extras]
        elif extras:  # the subcommand's usage, not the top-level one
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extras)}")
    except SystemExit as exc:  # --help (0) or a usage error (64)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    spec: Subcommand = args._spec
    if not logging.getLogger().handlers:  # the library's warnings, e.g. a server unreachable
        logging.basicConfig(format=f"aiolocks {spec.name}: %(message)s", level=logging.WARNING)
        if spec.takes_command:  # run/elect print the loss once, themselves
            for handler in logging.getLogger().handlers:
                handler.addFilter(_not_a_loss)
    if command and not spec.takes_command:
        print(f"aiolocks {spec.name}: unexpected arguments after '--'", file=sys.stderr)
        return EXIT_USAGE
    urls = [a for a in argv if "://" in a] + [os.environ.get(URL_ENV, "")]
    with contextlib.suppress(UsageError):  # so a URL read from a file is redacted too
        urls.append(_default_url(getattr(args, "url_file", None)))
    try:
        return spec.handler(args, command)
    except (UsageError, ValueError, ImportError) as exc:  # ImportError: a missing extra
        return _failed(spec.name, exc, urls, EXIT_USAGE)
    except AccessDeniedError as exc:
        return _failed(spec.name, exc, urls, EXIT_ACCESS_DENIED)
    except BackendUnavailableError as exc:
        return _failed(spec.name, exc, urls, EXIT_UNAVAILABLE)
    except LockTimeoutError as exc:
        return _failed(spec.name, exc, urls, EXIT_NOT_ACQUIRED)
    except LockError as exc:
        return _failed(spec.name, exc, urls, EXIT_LOCK_ERROR)
    except NotImplementedError as exc:  # list/break on a backend without admin support
        return _failed(spec.name, exc, urls, EXIT_LOCK_ERROR)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
