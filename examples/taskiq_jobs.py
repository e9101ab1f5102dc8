"""A scheduled taskiq job that runs once per period, however many schedulers send it.

`taskiq <https://taskiq-python.github.io/>`_ is an asyncio job queue. A
service deployed as several replicas runs a worker and a scheduler in each::

    export TASKIQ_BROKER_URL=redis://127.0.0.1:6379/0   # the queue (taskiq-redis)
    export AIOLOCKS_URL=zk://127.0.0.1:2181             # the locks: any backend
    export SHOP_DATABASE_URL=postgresql://postgres:aiolocks@127.0.0.1:5432/postgres
    taskiq worker examples.taskiq_jobs:broker --workers 2
    taskiq scheduler examples.taskiq_jobs:scheduler     # in every replica

Every scheduler sends ``settle_payments`` at every tick (``JOBS_INTERVAL``
seconds), so N replicas send it N times a tick, and a message whose worker
died mid-run is sent again at the next tick. The job makes sure the work
runs once per period (``JOBS_PERIOD`` seconds; the period is the slot
``now // JOBS_PERIOD``):

1. it takes ``locks/jobs/settle-payments/{slot}``; a copy that cannot get
   it within ``JOBS_LOCK_TIMEOUT`` gives up (``busy``): the holder is
   running the work;
2. under the lock it claims the slot's row in ``job_runs`` with its fencing
   token, unless the row is finished (``done-already``). An unfinished row
   means its holder died or lost its lock (we hold the lock now): the claim,
   ``... WHERE job_runs.fencing_token < $3``, takes the run over;
3. it does the work, then marks the row finished, fenced by the token: a
   holder that lost its lock part-way cannot mark it.

Each attempt is recorded in ``job_attempts`` (``ran``, ``done-already``,
``busy``, ``lost``), in the schema ``SHOP_SCHEMA`` (default ``shop``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Annotated, Any

from taskiq import Context, TaskiqDepends, TaskiqEvents, TaskiqScheduler, TaskiqState
from taskiq.schedule_sources import LabelScheduleSource
from taskiq_redis import ListQueueBroker

import aiolocks
from examples import shop

JOB = "settle-payments"

_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.job_runs (
    job text NOT NULL,
    slot bigint NOT NULL,
    fencing_token bigint NOT NULL,
    worker text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    PRIMARY KEY (job, slot)
);
CREATE TABLE IF NOT EXISTS {schema}.job_attempts (
    id bigserial PRIMARY KEY,
    job text NOT NULL,
    slot bigint NOT NULL,
    worker text NOT NULL,
    outcome text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
);
"""

#: claim the slot: a new row, or take over an unfinished one from an older token
_CLAIM = """
INSERT INTO job_runs (job, slot, fencing_token, worker) VALUES ($1, $2, $3, $4)
ON CONFLICT (job, slot) DO UPDATE
    SET fencing_token = excluded.fencing_token, worker = excluded.worker, started_at = now()
    WHERE job_runs.finished_at IS NULL AND job_runs.fencing_token < excluded.fencing_token
RETURNING 1
"""

_FINISH = """
UPDATE job_runs SET finished_at = now()
WHERE job = $1 AND slot = $2 AND fencing_token = $3 AND finished_at IS NULL
RETURNING 1
"""


@dataclass(frozen=True, slots=True)
class JobSettings:
    """The job's settings, from the environment (read when the module is imported)."""

    broker_url: str
    queue: str
    interval: int
    period: int
    lock_timeout: float
    work_seconds: float

    @classmethod
    def from_env(cls) -> JobSettings:
        """``TASKIQ_BROKER_URL``, ``TASKIQ_QUEUE``, ``JOBS_INTERVAL``, ``JOBS_PERIOD``,
        ``JOBS_LOCK_TIMEOUT``, ``JOBS_WORK_SECONDS``."""
        interval = int(_number("JOBS_INTERVAL", "60"))
        settings = cls(
            broker_url=os.environ.get("TASKIQ_BROKER_URL", "redis://127.0.0.1:6379/0"),
            queue=os.environ.get("TASKIQ_QUEUE", "aiolocks-jobs"),
            interval=interval,
            period=int(_number("JOBS_PERIOD", str(interval))),
            lock_timeout=_number("JOBS_LOCK_TIMEOUT", "1"),
            work_seconds=_number("JOBS_WORK_SECONDS", "1"),
        )
        if settings.interval < 1 or settings.period < 1:
            raise ValueError("JOBS_INTERVAL and JOBS_PERIOD must be whole seconds >= 1")
        if settings.lock_timeout <= 0 or settings.work_seconds < 0:
            raise ValueError("JOBS_LOCK_TIMEOUT must be > 0 and JOBS_WORK_SECONDS >= 0")
        return settings


def _number(name: str, default: str) -> float:
    text = os.environ.get(name, default)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None


SETTINGS = JobSettings.from_env()
broker = ListQueueBroker(SETTINGS.broker_url, queue_name=SETTINGS.queue)
scheduler = TaskiqScheduler(broker, sources=[LabelScheduleSource(broker)])


@broker.on_event(TaskiqEvents.WORKER_STARTUP)
async def open_resources(state: TaskiqState) -> None:
    """In each worker process: the lock backend, the database pool, the tables."""
    shop_settings = shop.Settings.from_env()
    state.backend = await aiolocks.connect(shop_settings.lock_url)
    try:
        state.pool = await _create_pool(shop_settings)
        try:
            await _migrate(state.backend, state.pool, shop_settings.schema)
        except BaseException:
            await state.pool.close()
            raise
    except BaseException:
        await state.backend.close()
        raise


async def _migrate(backend: aiolocks.Backend, pool: Any, schema: str) -> None:
    """Create the tables once across every worker (they take turns under a lock)."""
    async with backend.mutex(f"locks/jobs/migrate/{schema}").hold(timeout=60):
        await pool.execute(_SCHEMA.format(schema=schema))


async def _create_pool(settings: shop.Settings) -> Any:
    import asyncpg

    return await asyncpg.create_pool(
        settings.database_url,
        min_size=1,
        max_size=4,
        server_settings={"search_path": settings.schema, "application_name": "aiolocks-jobs"},
    )


@broker.on_event(TaskiqEvents.WORKER_SHUTDOWN)
async def close_resources(state: TaskiqState) -> None:
    """Close what :func:`open_resources` opened (releasing any lock still held)."""
    await state.pool.close()
    await state.backend.close()


@broker.task(task_name=JOB, schedule=[{"interval": SETTINGS.interval}])
async def settle_payments(context: Annotated[Context, TaskiqDepends()]) -> str:
    """The scheduled job; returns what this attempt did (also in ``job_attempts``)."""
    backend: aiolocks.Backend = context.state.backend
    pool = context.state.pool
    slot = int(time.time()) // SETTINGS.period
    outcome = await run_once(backend, pool, slot)
    await pool.execute(
        "INSERT INTO job_attempts (job, slot, worker, outcome) VALUES ($1, $2, $3, $4)",
        JOB,
        slot,
        shop.WORKER,
        outcome,
    )
    return outcome


async def run_once(backend: aiolocks.Backend, pool: Any, slot: int) -> str:
    """Run the work of ``slot`` unless it ran; ``ran``, ``done-already``, ``busy`` or ``lost``."""
    lock = backend.mutex(f"locks/jobs/{JOB}/{slot}")
    try:
        async with lock.hold(timeout=SETTINGS.lock_timeout):
            token = lock.fencing_token
            assert token is not None
            if await pool.fetchval(_CLAIM, JOB, slot, token, shop.WORKER) is None:
                return "done-already"
            await asyncio.sleep(SETTINGS.work_seconds)  # the work: a report, a settlement...
            if await pool.fetchval(_FINISH, JOB, slot, token) is None:
                return "lost"  # a newer holder took the run over: it finishes it
            return "ran"
    except aiolocks.LockTimeoutError:
        return "busy"  # another worker is running it now
    except aiolocks.LockLostError:
        return "lost"  # the run stays unfinished: the next attempt takes it over
