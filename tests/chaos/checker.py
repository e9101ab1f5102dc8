"""A Jepsen-style checker for aiolocks: a fencing register, a history, an analysis.

How a run works
---------------
Several worker processes (``tests/chaos/_worker.py``), each with several
asyncio tasks, loop over critical sections under one ``backend.mutex(name)``.
Every critical section (CS) sends two writes to the :class:`Register` that
this (the checker's) process serves on a local socket, both carrying the
hold's fencing token:

* ``begin`` right after the lock was acquired, ``commit`` after some work;
* the register accepts a write when its token is ``>=`` the largest token
  it has accepted so far, and rejects it otherwise (Kleppmann's fencing:
  the protected resource refuses stale tokens).

A CS also records ``start``/``end`` with ``time.monotonic_ns()``, which is
``CLOCK_MONOTONIC`` and so comparable across the processes of one Linux
machine, and how it ended (``ok``, ``lost`` = ``LockLostError``, timeout,
unavailable, other error). A CS whose write was rejected knows that a newer
holder exists; it then waits inside its body, up to a grace period, for the
library to notice the loss and cancel it.

Meanwhile :class:`FaultInjector` breaks things at random, from a seeded RNG:
proxy cut/stall/delay between the workers and the server, server kill and
restart, ZooKeeper session expiry, ensemble leader kill, Sentinel failover,
and event-loop blocks (``time.sleep`` in a worker longer than the lease).

What :func:`analyze` counts (the ``must be 0`` ones fail the test):

``unfenced`` (must be 0)
    pairs of CSs whose *accepted* writes interleave in the register's log
    (``A.begin, B.begin, A.commit`` all accepted): the fencing failed to
    serialize them. Possible only if two holds share a token or a newer hold
    got a smaller token while the older one was still writing.
``duplicate_tokens`` (must be 0)
    two CSs that were given the same fencing token.
``token_regressions`` (must be 0)
    a CS that started after another had ended, with a token that is not larger.
``unreported_losses`` (must be 0)
    a CS that had proof it was superseded (a rejected write) but did not end
    with ``LockLostError`` within the grace period.
``spurious_cancellations`` (must be 0)
    a ``CancelledError`` that escaped ``async with`` in a task nobody cancelled.
``holds_left`` / ``leaked`` (must be 0)
    holds still in ``backend._holds`` when a worker finished, and lock keys or
    znodes left on the server after the run.

``overlaps`` (information)
    pairs of CSs that overlapped in real time: the faults did bite (a lock
    service cannot stop a paused or partitioned holder from running on; only
    fencing can). Split by whether the older side ended with ``LockLostError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_SEED",
    "Fault",
    "FaultInjector",
    "Register",
    "Report",
    "WorkerPool",
    "workers_done",
    "analyze",
    "chaos_scale",
    "chaos_seed",
    "expire_zk_session",
    "rng_for",
    "run_chaos",
]

#: the seed when ``AIOLOCKS_CHAOS_SEED`` is not set
DEFAULT_SEED = 20261130

REPO_ROOT = Path(__file__).resolve().parents[2]


def chaos_seed() -> int:
    """``AIOLOCKS_CHAOS_SEED`` (an integer), or :data:`DEFAULT_SEED`."""
    text = os.environ.get("AIOLOCKS_CHAOS_SEED", "").strip()
    return int(text) if text else DEFAULT_SEED


def chaos_scale() -> float:
    """``AIOLOCKS_CHAOS_SCALE`` (default 1): multiplies run lengths and iteration counts."""
    text = os.environ.get("AIOLOCKS_CHAOS_SCALE", "").strip()
    value = float(text) if text else 1.0
    if not value > 0:
        raise ValueError(f"AIOLOCKS_CHAOS_SCALE must be > 0, got {text!r}")
    return value


def rng_for(label: str) -> tuple[random.Random, int]:
    """A RNG for one test, derived from the chaos seed and the test's label; and its seed."""
    seed = chaos_seed() * 1_000_003 + zlib.crc32(label.encode())
    return random.Random(seed), seed


# -- the register --------------------------------------------------------------------------


@dataclass
class CsRecord:
    """One critical section as its worker reported it."""

    cs: str
    worker: int
    token: int | None
    start: int | None
    end: int | None
    outcome: str
    rejected: bool
    detail: str = ""
    lock: str = ""
    """Which of the run's locks (``""`` when the run has one)."""
    reported: int | None = None
    """``monotonic_ns`` when the worker knew the outcome (for a loss: when it was told)."""


@dataclass
class LogEntry:
    """One write the register saw, in arrival order."""

    seq: int
    cs: str
    token: int
    phase: str
    accepted: bool
    lock: str = ""
    """Which of the run's locks (each lock has its own fencing order)."""


@dataclass
class WorkerState:
    """What the register knows about one worker process."""

    pid: int = 0
    ready: bool = False
    done: dict[str, Any] | None = None
    session: tuple[int, bytes] | None = None


class Register:
    """The fencing register: accepts a write iff its token is >= every accepted token.

    Served on ``127.0.0.1`` with one JSON object per line; every message gets
    one JSON reply line. Messages: ``{"op": "hello", "worker": i, "pid": p}``,
    ``{"op": "ready", "worker": i}``, ``{"op": "write", "cs": id, "token": t,
    "phase": "begin"|"commit", "worker": i, "session": [id, pw_hex] | null}``,
    ``{"op": "record", ...CsRecord fields}``, ``{"op": "done", "worker": i, ...}``.
    """

    def __init__(self) -> None:
        self.max_tokens: dict[str, int] = {}
        """The largest accepted token of each lock (a run may contend on several)."""
        self.log: list[LogEntry] = []
        self.records: list[CsRecord] = []
        self.workers: dict[int, WorkerState] = {}
        self._server: asyncio.Server | None = None
        self._port = 0
        self._changed = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>`` for the workers."""
        return f"127.0.0.1:{self._port}"

    async def start(self) -> None:
        """Listen on a free local port."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and end every connection handler."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def worker(self, index: int) -> WorkerState:
        """The state of worker ``index`` (created on first use)."""
        return self.workers.setdefault(index, WorkerState())

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait, event-driven, until ``predicate()`` holds (messages arrive)."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    def _write(self, message: dict[str, Any]) -> bool:
        token = int(message["token"])
        lock = str(message.get("lock", ""))
        best = self.max_tokens.get(lock)
        accepted = best is None or token >= best
        if accepted:
            self.max_tokens[lock] = token
        self.log.append(
            LogEntry(
                len(self.log), str(message["cs"]), token, str(message["phase"]), accepted, lock
            )
        )
        session = message.get("session")
        if session:
            self.worker(int(message["worker"])).session = (
                int(session[0]),
                bytes.fromhex(session[1]),
            )
        return accepted

    def _dispatch(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        if op == "write":
            return {"ok": self._write(message)}
        if op == "record":
            self.records.append(
                CsRecord(
                    cs=str(message["cs"]),
                    worker=int(message["worker"]),
                    token=message.get("token"),
                    start=message.get("start"),
                    end=message.get("end"),
                    outcome=str(message["outcome"]),
                    rejected=bool(message.get("rejected")),
                    detail=str(message.get("detail", "")),
                    lock=str(message.get("lock", "")),
                    reported=message.get("reported"),
                )
            )
        elif op == "hello":
            self.worker(int(message["worker"])).pid = int(message["pid"])
        elif op == "ready":
            self.worker(int(message["worker"])).ready = True
        elif op == "done":
            self.worker(int(message["worker"])).done = message
        else:
            return {"error": f"unknown op {op!r}"}
        return {"ok": True}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while line := await reader.readline():
                reply = self._dispatch(json.loads(line))
                self._changed.set()
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            # Cleanup path: the socket must not outlive its handler.
            writer.close()
            self._handlers.discard(task)


# -- analysis ------------------------------------------------------------------------------


@dataclass
class Report:
    """The figures of one run (see the module docstring for their meaning)."""

    label: str
    seed: int
    duration: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    critical_sections: int = 0
    writes: int = 0
    rejected_writes: int = 0
    overlaps: int = 0
    overlaps_reported: int = 0
    unfenced: int = 0
    duplicate_tokens: int = 0
    token_regressions: int = 0
    unreported_losses: int = 0
    spurious_cancellations: int = 0
    holds_left: int = 0
    leaked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        """Sum of every count that must be 0."""
        return (
            self.unfenced
            + self.duplicate_tokens
            + self.token_regressions
            + self.unreported_losses
            + self.spurious_cancellations
            + self.holds_left
            + self.leaked
        )

    def summary(self) -> str:
        """A few lines that can be pasted into the README."""
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return (
            f"chaos[{self.label}] AIOLOCKS_CHAOS_SEED={chaos_seed()} (run seed {self.seed}) "
            f"{self.duration:.0f}s: "
            f"{self.critical_sections} critical sections ({outcomes}); "
            f"faults injected {sum(self.faults.values())} ({faults}); "
            f"register writes {self.writes}, rejected (stale token) {self.rejected_writes}; "
            f"real-time overlaps {self.overlaps} (older side got LockLostError: "
            f"{self.overlaps_reported}); "
            f"VIOLATIONS unfenced={self.unfenced} duplicate_tokens={self.duplicate_tokens} "
            f"token_regressions={self.token_regressions} "
            f"unreported_losses={self.unreported_losses} "
            f"spurious_cancellations={self.spurious_cancellations}; "
            f"LEAKS holds_left={self.holds_left} server_leftovers={self.leaked}"
        )

    def as_json(self) -> dict[str, Any]:
        """The figures as a JSON-able dict."""
        data = {k: v for k, v in self.__dict__.items() if k not in ("faults", "outcomes")}
        data["faults"] = dict(self.faults)
        data["outcomes"] = dict(self.outcomes)
        data["violations"] = self.violations
        return data


def _interleaved_pairs(log: Sequence[LogEntry]) -> list[tuple[str, str]]:
    """Pairs of CSs whose accepted-write spans overlap in the register's order."""
    spans: dict[str, list[int]] = {}
    for entry in log:
        if entry.accepted:
            span = spans.setdefault(entry.cs, [entry.seq, entry.seq])
            span[1] = entry.seq
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    pairs: list[tuple[str, str]] = []
    active: list[tuple[str, int]] = []  # (cs, last seq) still open
    for cs, (first, last) in ordered:
        active = [(other, end) for other, end in active if end > first]
        pairs.extend((other, cs) for other, _ in active)
        active.append((cs, last))
    return pairs


def analyze(label: str, seed: int, register: Register) -> Report:
    """Count violations and overlaps in the history the register collected."""
    report = Report(label, seed)
    entered = [r for r in register.records if r.start is not None and r.token is not None]
    report.critical_sections = len(entered)
    report.outcomes.update(r.outcome for r in register.records)
    report.writes = len(register.log)
    report.rejected_writes = sum(not e.accepted for e in register.log)
    # Each lock has its own fencing order: check every lock's history on its own.
    for lock in sorted({r.lock for r in entered} | {e.lock for e in register.log}):
        _analyze_lock(
            report,
            [r for r in entered if r.lock == lock],
            [e for e in register.log if e.lock == lock],
        )
    _analyze_outcomes(report, register)
    return report


def _analyze_lock(report: Report, entered: list[CsRecord], log: list[LogEntry]) -> None:
    """Fencing, token and overlap counts of the critical sections of one lock."""
    for first, second in _interleaved_pairs(log):
        report.unfenced += 1
        report.problems.append(f"unfenced: accepted writes of {first} and {second} interleave")

    by_token: dict[int, list[str]] = {}
    for rec in entered:
        assert rec.token is not None
        by_token.setdefault(rec.token, []).append(rec.cs)
    for token, holders in by_token.items():
        if len(holders) > 1:
            report.duplicate_tokens += len(holders) - 1
            report.problems.append(f"token {token} given to {holders}")

    # Token order: a CS that starts after another has ended must have a larger token.
    finished = sorted((r for r in entered if r.end is not None), key=lambda r: r.end or 0)
    best: CsRecord | None = None
    index = 0
    for rec in sorted(entered, key=lambda r: r.start or 0):
        assert rec.start is not None and rec.token is not None
        while index < len(finished) and (finished[index].end or 0) < rec.start:
            done = finished[index]
            if best is None or (done.token or 0) > (best.token or 0):
                best = done
            index += 1
        if best is not None and best.token is not None and rec.token <= best.token:
            report.token_regressions += 1
            report.problems.append(
                f"token regression: {rec.cs} (token {rec.token}) started after "
                f"{best.cs} (token {best.token}) ended"
            )

    # Real-time overlaps (information): sweep by start time.
    active: list[CsRecord] = []
    for rec in sorted(entered, key=lambda r: r.start or 0):
        start = rec.start or 0
        active = [a for a in active if (a.end or sys.maxsize) > start]
        for other in active:
            report.overlaps += 1
            older = other if (other.token or 0) < (rec.token or 0) else rec
            if older.outcome == "lost":
                report.overlaps_reported += 1
        active.append(rec)


def _analyze_outcomes(report: Report, register: Register) -> None:
    """Unreported losses, holds left in workers and spurious cancellations."""
    for rec in register.records:
        if rec.rejected and rec.outcome != "lost":
            report.unreported_losses += 1
            report.problems.append(
                f"unreported loss: {rec.cs} (token {rec.token}) had a write rejected but "
                f"ended {rec.outcome} {rec.detail}".rstrip()
            )

    for index_, state in sorted(register.workers.items()):
        finished_with = state.done or {}
        left = int(finished_with.get("holds_left", 0))
        report.holds_left += left
        if left:
            report.problems.append(f"worker {index_} finished with {left} holds in backend._holds")
        if finished_with.get("close_error"):
            report.problems.append(
                f"worker {index_}: backend.close() raised {finished_with['close_error']}"
            )
    for rec in register.records:
        if rec.outcome == "error:CancelledError":
            report.spurious_cancellations += 1
            report.problems.append(f"spurious cancellation: {rec.cs} {rec.detail}")


# -- worker processes ----------------------------------------------------------------------


class WorkerPool:
    """Start, signal and reap the worker processes of one run."""

    def __init__(self, register: Register, config: dict[str, Any], urls: list[str]) -> None:
        self.register = register
        self.config = config
        self.urls = urls
        self.count = len(urls)
        self.processes: list[asyncio.subprocess.Process] = []
        self.stderr_paths: list[Path] = []

    async def start(self, log_dir: Path) -> None:
        """Spawn ``count`` workers and wait until each has connected to its backend."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        for index in range(self.count):
            config = dict(
                self.config, url=self.urls[index], worker=index, register=self.register.address
            )
            path = log_dir / f"worker-{index}.log"
            self.stderr_paths.append(path)
            with path.open("wb") as log:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "tests.chaos._worker",
                    json.dumps(config),
                    cwd=str(REPO_ROOT),
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            self.processes.append(process)
        await self.register.wait_for(
            lambda: sum(s.ready for s in self.register.workers.values()) >= self.count,
            timeout=60,
            what="workers ready",
        )

    def signal(self, index: int, sig: signal.Signals) -> None:
        """Send ``sig`` to worker ``index`` if it still runs."""
        process = self.processes[index]
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)

    async def wait(self, timeout: float) -> list[int]:
        """Wait for every worker to exit; kill stragglers. Returns the exit codes."""
        codes: list[int] = []
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    codes.append(await process.wait())
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                codes.append(await process.wait())
        return codes

    async def kill_all(self) -> None:
        """Cleanup path: no worker may outlive its test."""
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    def logs(self) -> str:
        """The tail of every worker's output (for failure messages)."""
        parts = []
        for path in self.stderr_paths:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)


# -- faults --------------------------------------------------------------------------------

Fault = Callable[[random.Random], Awaitable[str]]


async def workers_done(
    pool: WorkerPool, register: Register, timeout: float, *, stop: bool = False
) -> list[int]:
    """Wait for the workers to exit (``stop``: SIGTERM them first) and for their done messages.

    Returns the exit codes; a done message that never came is left for the
    analysis to report.
    """
    if stop:
        for index in range(pool.count):
            pool.signal(index, signal.SIGTERM)
    codes = await pool.wait(timeout=timeout)
    with contextlib.suppress(TimeoutError):
        await register.wait_for(
            lambda: all(s.done is not None for s in register.workers.values()),
            timeout=5,
            what="done messages",
        )
    return codes


class FaultInjector:
    """Run faults picked at random (seeded) until stopped; count what was injected."""

    def __init__(
        self,
        rng: random.Random,
        faults: dict[str, Fault],
        gap: tuple[float, float],
        weights: dict[str, float] | None = None,
    ) -> None:
        self.rng = rng
        self.faults = faults
        self.gap = gap
        self.weights = weights or {}
        self.counts: Counter[str] = Counter()
        self.events: list[str] = []

    async def run(self, until: float) -> None:
        """Inject faults until ``time.monotonic() >= until`` (each fault heals itself)."""
        names = sorted(self.faults)
        weights = [self.weights.get(name, 1.0) for name in names]
        started = time.monotonic()
        if not names:
            return
        while True:
            await asyncio.sleep(self.rng.uniform(*self.gap))
            if time.monotonic() >= until:
                return
            kind = self.rng.choices(names, weights)[0]
            what = await self.faults[kind](self.rng)
            self.counts[kind] += 1
            self.events.append(f"{time.monotonic() - started:7.2f}s {kind}: {what}")


async def expire_zk_session(host: str, port: int, session_id: int, password: bytes) -> bool:
    """Expire a ZooKeeper session from outside (Curator's KillSession, kazoo's expire_session).

    Opens a second connection that joins the session with its id and
    password, then closes that session, so the server expires it for every
    connection. Speaks the wire protocol directly (a ConnectRequest, then a
    closeSession request) so that the client under test is not involved.
    Returns ``False`` when the server no longer knew the session.
    """
    for attempt in range(5):
        try:
            return await _expire_once(host, port, session_id, password)
        except (OSError, asyncio.IncompleteReadError):
            # The server is restarting, or dropped us while the owner reconnected.
            await asyncio.sleep(0.2 * (attempt + 1))
    return False


async def _expire_once(host: str, port: int, session_id: int, password: bytes) -> bool:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        # ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly
        body = struct.pack(">iqiqi", 0, 0, 10000, session_id, len(password)) + password
        body += b"\x00"
        writer.write(struct.pack(">i", len(body)) + body)
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        reply = await reader.readexactly(size)
        _version, timeout_ms, got_id = struct.unpack(">iiq", reply[:16])
        if timeout_ms <= 0 or got_id != session_id:
            return False
        # RequestHeader(xid=1, type=closeSession(-11))
        request = struct.pack(">ii", 1, -11)
        writer.write(struct.pack(">i", len(request)) + request)
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        await reader.readexactly(size)
        return True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# -- one run -------------------------------------------------------------------------------


@dataclass
class RunSpec:
    """What one checker run does."""

    label: str
    urls: list[str]
    """Backend URL of each worker (``workers`` of them; e.g. each through its own proxy)."""
    tasks: int = 4
    duration: float = 15.0
    work: float = 0.15
    """Upper bound of the random time spent between ``begin`` and ``commit``."""
    grace: float = 10.0
    """How long a CS with a rejected write waits for ``LockLostError``."""
    acquire_timeout: float = 30.0
    block: float = 3.0
    """How long a blocked worker's event loop stands still (``time.sleep``)."""
    gap: tuple[float, float] = (0.3, 1.2)
    weights: dict[str, float] = field(default_factory=lambda: {"block": 2.0})
    """Relative odds of each fault (default 1); blocks are what make holders overlap."""


LeakCheck = Callable[[], Awaitable[list[str]]]


FaultFactory = Callable[[WorkerPool], dict[str, Fault]]


async def run_chaos(
    spec: RunSpec,
    faults: FaultFactory,
    leak_check: LeakCheck,
    heal: Callable[[], Awaitable[None]],
    log_dir: Path,
) -> tuple[Report, WorkerPool, FaultInjector]:
    """Run workers under ``faults`` for ``spec.duration`` s, heal, then analyze and check leaks."""
    rng, seed = rng_for(spec.label)
    register = Register()
    await register.start()
    config = {
        "name": f"chaos/{spec.label}/{seed}",
        "tasks": spec.tasks,
        "duration": spec.duration,
        "work": spec.work,
        "grace": spec.grace,
        "acquire_timeout": spec.acquire_timeout,
        "block": spec.block,
        "seed": seed,
    }
    pool = WorkerPool(register, config, spec.urls)
    injector = FaultInjector(rng, faults(pool), spec.gap, spec.weights)
    started = time.monotonic()
    try:
        await pool.start(log_dir)
        # Faults stop a little before the workers do, so the last holds can
        # be released on a healthy network.
        try:
            await injector.run(until=time.monotonic() + max(1.0, spec.duration - 2.0))
        finally:
            await heal()
        codes = await workers_done(pool, register, timeout=spec.duration + spec.grace + 60)
    except BaseException:
        await pool.kill_all()
        raise
    finally:
        await register.stop()
    report = analyze(spec.label, seed, register)
    report.duration = time.monotonic() - started
    report.faults = injector.counts
    for index, code in enumerate(codes):
        if code or register.worker(index).done is None:
            # A worker that crashed (an exception escaped its tasks, e.g. a
            # CancelledError leaking out of `async with`) is a failure too.
            report.problems.append(f"worker {index} did not finish cleanly (exit code {code})")
    leftovers = await leak_check()
    report.leaked = len(leftovers)
    report.problems.extend(f"left on the server: {item}" for item in leftovers[:20])
    return report, pool, injector


async def redis_leftovers(url: str, prefix: str, within: float) -> list[str]:
    """Keys with ``prefix`` still on the server after ``within`` s (lapsing leases)."""
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url, decode_responses=True)
    try:
        deadline = time.monotonic() + within
        while True:
            left = sorted(str(key) for key in await client.keys(f"{prefix}*"))
            if not left or time.monotonic() > deadline:
                return left
            await asyncio.sleep(0.1)
    finally:
        await client.aclose()


async def _walk(client: Any, path: str, found: list[str]) -> None:
    """Collect every ``_c_*`` (lock, lease, latch) node below ``path``."""
    import aiozk

    try:
        children = await client.get_children(path)
    except aiozk.exc.NoNode:
        return
    for child in children:
        full = f"{path.rstrip('/')}/{child}"
        if child.startswith("_c_"):
            found.append(full)
        else:
            await _walk(client, full, found)


async def zk_leftovers(hosts: str, chroot: str, within: float) -> list[str]:
    """Lock/lease znodes (``_c_*``) left under ``chroot`` after ``within`` s."""
    import aiozk

    client = aiozk.ZKClient(hosts, chroot=chroot, session_timeout=10)
    await client.start()
    try:
        deadline = time.monotonic() + within
        while True:
            found: list[str] = []
            await _walk(client, "/", found)
            if not found or time.monotonic() > deadline:
                return sorted(found)
            await asyncio.sleep(0.2)
    finally:
        await client.close()
