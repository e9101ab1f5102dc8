"""examples/taskiq_jobs.py on a real taskiq deployment: two worker processes (``taskiq worker
--workers 2``) and two schedulers that both send the job every second. The worker running
the job is killed part-way (SIGKILL): another takes the run over once the dead one's lock
is gone, and the work is finished exactly once while the schedulers keep sending."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest

import aiolocks
from aiolocks.testing import PostgresServer, RedisServer
from examples import taskiq_jobs
from examples.shop_demo import ROOT

from .conftest import fresh_schema, lock_server_url, with_option

#: the lock servers of this test: the queue's own Redis (each run starts five processes;
#: the payment and worker-pool tests cover the other lock servers)
JOB_LOCK_SERVERS = ["redis"]

#: how long a dead worker's lock outlives it, per lock server
FAST_EXPIRY = {"zookeeper": "session_timeout=4", "etcd": "lease_ttl=3"}


@contextmanager
def _deployment(env: dict[str, str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A taskiq worker (2 processes) and two schedulers; stopped at the end."""
    taskiq = [sys.executable, "-m", "taskiq"]
    commands = [
        [*taskiq, "worker", "examples.taskiq_jobs:broker", "--workers", "2"],
        [*taskiq, "scheduler", "examples.taskiq_jobs:scheduler"],
        [*taskiq, "scheduler", "examples.taskiq_jobs:scheduler"],
    ]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            processes.append(
                subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _until(db: Any, sql: str, what: str, processes: list[subprocess.Popen[bytes]]) -> Any:
    """Poll ``sql`` until it returns a row (the deployment must stay up meanwhile)."""
    try:
        async with asyncio.timeout(120):
            while True:
                try:
                    row = await db.fetchrow(sql)
                except asyncpg.UndefinedTableError:  # the workers have not created it yet
                    row = None
                if row is not None:
                    return row
                assert all(p.poll() is None for p in processes), "a taskiq process exited"
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


@pytest.mark.asyncio
@pytest.mark.parametrize("label", JOB_LOCK_SERVERS)
async def test_scheduled_job_runs_once_across_workers_even_when_one_dies(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    postgres_server: PostgresServer,
    label: str,
) -> None:
    lock_url = with_option(lock_server_url(request, label), FAST_EXPIRY.get(label))
    with fresh_schema(postgres_server) as schema:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TASKIQ_BROKER_URL": redis_server.url,
            "TASKIQ_QUEUE": f"aiolocks-jobs-{uuid.uuid4().hex[:8]}",
            "AIOLOCKS_URL": lock_url,
            "SHOP_DATABASE_URL": postgres_server.url,
            "SHOP_SCHEMA": schema,
            "JOBS_INTERVAL": "1",
            "JOBS_PERIOD": "1000000000",  # one slot for the whole test
            "JOBS_WORK_SECONDS": "2",
        }
        db = await asyncpg.connect(postgres_server.url, server_settings={"search_path": schema})
        try:
            with _deployment(env) as processes:
                first = await _until(
                    db, "SELECT worker FROM job_runs", "a worker started the job", processes
                )
                killed = int(first["worker"].rsplit(":", 1)[1])
                os.kill(killed, signal.SIGKILL)  # in the middle of the work
                done = await _until(
                    db,
                    "SELECT worker FROM job_runs WHERE finished_at IS NOT NULL",
                    "another worker finished the job",
                    processes,
                )
                # The schedulers keep sending it: every later copy finds it done.
                await _until(
                    db,
                    "SELECT 1 FROM job_attempts WHERE outcome = 'done-already' "
                    "HAVING count(*) >= 4",
                    "four more copies were sent and skipped",
                    processes,
                )
            runs = await db.fetch("SELECT worker, finished_at FROM job_runs")
            attempts = await db.fetch("SELECT outcome FROM job_attempts")
            outcomes = Counter(row["outcome"] for row in attempts)
        finally:
            await db.close()
    assert len(runs) == 1
    assert runs[0]["finished_at"] is not None
    assert done["worker"] != first["worker"], "the killed worker cannot have finished it"
    assert outcomes["ran"] == 1, outcomes
    assert set(outcomes) <= {"ran", "done-already", "busy"}, outcomes


@pytest.mark.asyncio
async def test_run_once_skips_a_finished_slot_takes_over_an_orphan_and_gives_up_when_busy(
    postgres_server: PostgresServer,
) -> None:
    job = taskiq_jobs.JOB
    with fresh_schema(postgres_server) as schema:
        pool = await asyncpg.create_pool(
            postgres_server.url, min_size=1, max_size=2, server_settings={"search_path": schema}
        )
        try:
            async with aiolocks.connect("memory://") as backend:
                await taskiq_jobs._migrate(backend, pool, schema)
                assert await taskiq_jobs.run_once(backend, pool, 1) == "ran"
                assert await taskiq_jobs.run_once(backend, pool, 1) == "done-already"
                # A run whose worker died (unfinished, an older token): taken over.
                await pool.execute(
                    "INSERT INTO job_runs (job, slot, fencing_token, worker) "
                    "VALUES ($1, 2, 0, 'dead:1')",
                    job,
                )
                assert await taskiq_jobs.run_once(backend, pool, 2) == "ran"
                # A copy that finds the slot's lock held (the run in progress, in another
                # task: a mutex is reentrant for its holder) gives up.
                async with backend.mutex(f"locks/jobs/{job}/3").hold(timeout=5):
                    copy = asyncio.create_task(taskiq_jobs.run_once(backend, pool, 3))
                    assert await copy == "busy"
            rows = await pool.fetch("SELECT slot, worker, finished_at FROM job_runs ORDER BY slot")
        finally:
            await pool.close()
    assert [row["slot"] for row in rows] == [1, 2]
    assert all(row["finished_at"] is not None for row in rows)
    assert rows[1]["worker"] != "dead:1"
