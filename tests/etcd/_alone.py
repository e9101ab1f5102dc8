"""An etcd driver used without an engine, as the engine would use it.

The engine opens a driver with its task set and, at close, finishes that
task set (the driver's watches run there as services) before it closes the
driver. Tests of the recipe itself do the same through these two calls.
"""

from __future__ import annotations

import weakref

from aiolocks._core.tasks import TaskSet
from aiolocks.etcd._driver import EtcdDriver

_TASKS: weakref.WeakKeyDictionary[EtcdDriver, TaskSet] = weakref.WeakKeyDictionary()


async def open_alone(driver: EtcdDriver) -> None:
    """``driver.open`` with a task set of its own."""
    tasks = _TASKS[driver] = TaskSet()
    await driver.open(tasks)


async def close_alone(driver: EtcdDriver) -> None:
    """Finish the driver's task set, then close it (the engine's order)."""
    tasks = _TASKS.pop(driver, None)
    if tasks is not None:
        await tasks.drain(cancel=True)
    await driver.close()
