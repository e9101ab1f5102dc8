"""``TaskSet.drain`` (a backend's close waits for its background tasks).

A task that has just finished still sits in the set until its done callback
runs. Since Python 3.12, ``asyncio.gather`` of finished tasks returns a
finished future, so a drain that gathered every task in the set never
awaited anything and spun forever on such a task, blocking the event loop
(seen as a hang of the ZooKeeper case of
``test_semaphore_in_task_group_with_fail_after`` on 3.12).
"""

from __future__ import annotations

import asyncio

import pytest

from aiolocks._core.tasks import TaskSet

pytestmark = pytest.mark.asyncio


async def _nothing() -> None:
    return None


async def test_drain_returns_with_a_finished_task_whose_callback_has_not_run() -> None:
    tasks = TaskSet()
    task = tasks.spawn(_nothing(), name="finishes-at-once")
    await asyncio.sleep(0)  # the task runs and finishes; its done callback waits in the loop
    assert task.done() and len(tasks) == 1
    await asyncio.wait_for(tasks.drain(cancel=True), 5)
    await asyncio.sleep(0)
    assert len(tasks) == 0


async def test_drain_waits_for_running_tasks_and_cancels_them() -> None:
    tasks = TaskSet()
    started = asyncio.Event()
    finished: list[str] = []

    async def long() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            finished.append("cleaned up")

    task = tasks.spawn(long(), name="long")
    await started.wait()
    await asyncio.wait_for(tasks.drain(cancel=True), 5)
    assert task.cancelled() and finished == ["cleaned up"]


async def test_a_service_is_not_work_in_flight_but_drain_finishes_it() -> None:
    tasks = TaskSet()
    started = asyncio.Event()

    async def watcher() -> None:
        started.set()
        await asyncio.sleep(30)

    service = tasks.spawn(watcher(), name="service", service=True)
    await started.wait()
    assert len(tasks) == 0, "a service counted as work in flight"
    work = tasks.spawn(_nothing(), name="work")
    assert len(tasks) == 1
    await work
    await asyncio.sleep(0)
    assert len(tasks) == 0
    await asyncio.wait_for(tasks.drain(cancel=True), 5)
    assert service.cancelled()
