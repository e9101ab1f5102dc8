"""One worker process of the chaos checker (``python -m tests.chaos._worker CONFIG_JSON``).

Connects to ``config["url"]`` with :func:`aiolocks.connect` (any backend, by
URL), then runs ``config["tasks"]`` tasks that loop over critical sections
under ``backend.mutex(config["name"])`` for ``config["duration"]`` seconds,
writing their fencing token to the checker's register (``begin`` and
``commit``) and reporting every critical section (see
:mod:`tests.chaos.checker`).

Signals block the event loop with ``time.sleep`` for ``config["block"]``
seconds (longer than the lease or session timeout, so the watchdog and the
heartbeats starve): ``SIGUSR1`` inside the next critical section, between
its ``begin`` and ``commit`` writes (a holder that stalls); ``SIGUSR2`` at
once, wherever the tasks are.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from typing import Any

import aiolocks


class RegisterClient:
    """One connection to the checker's register (one per task: replies stay in order)."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._writer is None:
            host, _, port = self._address.rpartition(":")
            self._reader, self._writer = await asyncio.open_connection(host, int(port))
        assert self._reader is not None
        self._writer.write(json.dumps(message).encode() + b"\n")
        await self._writer.drain()
        line = await self._reader.readline()
        if not line:
            raise ConnectionError("the register closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass


def clip(text: str, size: int = 400) -> str:
    """``text`` cut to about ``size`` characters, keeping both ends.

    An unexpected error names the backend (a cluster URL alone can take 150
    characters) before its reason: the end must survive the cut.
    """
    if len(text) <= size:
        return text
    return f"{text[: size // 4]} ... {text[-(size - size // 4) :]}"


def session_of(backend: aiolocks.Backend) -> list[object] | None:
    """``[session id, password hex]`` of a ZooKeeper backend; ``None`` for other backends."""
    driver = getattr(backend, "_zk", None)  # a URL-built ZooKeeper backend's own session
    session = getattr(driver, "session", None)
    session_id = getattr(session, "session_id", None)
    password = getattr(session, "password", None)
    if not session_id or not isinstance(password, bytes):
        return None
    return [int(session_id), password.hex()]


async def connect(url: str, deadline: float) -> aiolocks.Backend:
    """Connect, retrying while the server is (briefly) unreachable."""
    while True:
        try:
            return await aiolocks.connect(url)
        except aiolocks.BackendUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def run(config: dict[str, Any]) -> None:
    worker = int(config["worker"])
    rng = random.Random(int(config["seed"]) * 1000 + worker)
    control = RegisterClient(config["register"])
    await control.call({"op": "hello", "worker": worker, "pid": os.getpid()})
    backend = await connect(config["url"], time.monotonic() + 60)
    trace_dir = os.environ.get("AIOLOCKS_CHAOS_TRACE")
    trace = None
    if trace_dir:
        # Debugging aid: every lock event of this worker, one line each.
        trace = open(os.path.join(trace_dir, f"worker-{worker}.log"), "a")  # noqa: SIM115

        def log_event(event: aiolocks.LockEvent) -> None:
            task = asyncio.current_task()
            trace.write(
                f"{time.monotonic():.3f} {event.kind} token={event.fencing_token} "
                f"task={task.get_name() if task else None} reason={event.reason}\n"
            )
            trace.flush()

        backend.add_event_hook(log_event)
        pool = getattr(getattr(getattr(backend, "_driver", None), "node", None), "client", None)
        pool = getattr(pool, "connection_pool", None)
        if pool is not None:
            original_get = pool.get_connection

            async def traced_get(*args: Any, **kwargs: Any) -> Any:
                conn = await original_get(*args, **kwargs)
                task = asyncio.current_task()
                trace.write(
                    f"{time.monotonic():.3f} conn port={getattr(conn, 'port', None)} "
                    f"id={id(conn):x} task={task.get_name() if task else None}\n"
                )
                return conn

            pool.get_connection = traced_get
    # ``locks`` > 1: the tasks contend on several locks, each critical section
    # on one picked at random (each lock has its own fencing order).
    count = int(config.get("locks", 1))
    if count > 1:
        locks = {str(k): backend.mutex(f"{config['name']}/{k}") for k in range(count)}
    else:
        locks = {"": backend.mutex(config["name"])}
    lock_keys = sorted(locks)
    stop_at = time.monotonic() + float(config["duration"])
    loop = asyncio.get_running_loop()

    def block(seconds: float) -> None:
        # Runs as a loop callback: the whole event loop (watchdog, heartbeats,
        # every task of this process) stands still, as under a long GC pause
        # or a blocking call in a coroutine.
        time.sleep(seconds)

    block_seconds = float(config["block"])
    block_in_cs = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, block_in_cs.set)
    loop.add_signal_handler(signal.SIGUSR2, block, block_seconds)
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)

    work = float(config["work"])
    grace = float(config["grace"])
    acquire_timeout = float(config["acquire_timeout"])

    async def task_loop(index: int) -> None:
        me = asyncio.current_task()
        if me is not None:
            me.set_name(f"w{worker}t{index}")
        register = RegisterClient(config["register"])
        serial = 0
        try:
            while time.monotonic() < stop_at and not stopping.is_set():
                serial += 1
                cs = f"w{worker}t{index}n{serial}"
                key = rng.choice(lock_keys)
                lock = locks[key]
                record: dict[str, Any] = {
                    "op": "record",
                    "cs": cs,
                    "worker": worker,
                    "token": None,
                    "start": None,
                    "end": None,
                    "rejected": False,
                    "lock": key,
                }
                try:
                    async with lock.hold(timeout=acquire_timeout):
                        record["start"] = time.monotonic_ns()
                        token = lock.fencing_token
                        record["token"] = token
                        write = {"op": "write", "cs": cs, "token": token, "worker": worker}
                        write["lock"] = key
                        begin = await register.call(
                            dict(write, phase="begin", session=session_of(backend))
                        )
                        if block_in_cs.is_set():
                            block_in_cs.clear()
                            block(block_seconds)
                        else:
                            await asyncio.sleep(rng.uniform(0, work))
                        commit = await register.call(dict(write, phase="commit"))
                        if not (begin["ok"] and commit["ok"]):
                            # A newer holder wrote: our hold is gone. The library
                            # must notice and cancel this body (LockLostError).
                            record["rejected"] = True
                            await asyncio.sleep(grace)
                        record["end"] = time.monotonic_ns()
                    record["outcome"] = "ok"
                except aiolocks.LockLostError as exc:
                    record["outcome"] = "lost"
                    record["detail"] = str(exc)[:200]
                except aiolocks.LockTimeoutError:
                    record["outcome"] = "timeout"
                except aiolocks.BackendUnavailableError as exc:
                    record["outcome"] = "unavailable"
                    record["detail"] = str(exc)[:200]
                except asyncio.CancelledError:
                    # Nobody cancels these tasks: a CancelledError escaping the
                    # `async with` is a library bug. Record it and go on.
                    record["outcome"] = "error:CancelledError"
                    record["detail"] = "CancelledError escaped although nobody cancelled the task"
                    current = asyncio.current_task()
                    if current is not None:
                        while current.cancelling():
                            current.uncancel()
                except Exception as exc:
                    record["outcome"] = f"error:{type(exc).__name__}"
                    record["detail"] = clip(str(exc))
                record["reported"] = time.monotonic_ns()  # a loss: when it was told
                if record["start"] is not None and record["end"] is None:
                    record["end"] = record["reported"]
                if trace is not None:
                    trace.write(
                        f"{time.monotonic():.3f} cs {cs} token={record['token']} "
                        f"rejected={record['rejected']} outcome={record['outcome']} "
                        f"{record.get('detail', '')}\n"
                    )
                await register.call(record)
                if record["outcome"] not in ("ok", "lost"):
                    await asyncio.sleep(0.2)
        finally:
            await register.close()

    await control.call({"op": "ready", "worker": worker})
    await asyncio.gather(*(task_loop(i) for i in range(int(config["tasks"]))))
    # Every task has left its `async with`: nothing may still be held.
    for _ in range(3):
        await asyncio.sleep(0)
    holds_left = len(backend._holds)
    close_error = None
    try:
        await backend.close()
    except BaseException as exc:  # reported to the checker, which fails the run
        close_error = repr(exc)
    await control.call(
        {"op": "done", "worker": worker, "holds_left": holds_left, "close_error": close_error}
    )
    await control.close()


def main() -> None:
    config = json.loads(sys.argv[1])
    asyncio.run(run(config))


if __name__ == "__main__":
    main()
