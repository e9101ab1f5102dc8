"""The ``@aiolocks.once(backend_or_url, name, ...)`` decorator over :meth:`Backend.once`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from ._connect import backend_from_url, connect
from ._core.backend import Backend
from ._core.names import validate_name
from ._core.once import check_periods

__all__ = ["once"]

P = ParamSpec("P")
T = TypeVar("T")


def once(
    backend_or_url: Backend | str,
    name: str,
    *,
    at_most_for: float,
    at_least_for: float = 0.0,
    hard_bound: bool = False,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T | None]]]:
    """Run the decorated coroutine function at most once per period across processes.

    >>> @aiolocks.once("redis://10.0.0.5:6379/0", "jobs/report", at_most_for=600,
    ...                at_least_for=50)  # doctest: +SKIP
    ... async def report() -> None:
    ...     ...

    Each call does ``async with backend.once(name, ...) as ran`` around the
    function: it returns the function's result when this process ran it,
    ``None`` when another one has the job (it never waits). With a URL, each
    call connects a backend and closes it afterwards (fine for a job that
    runs every few seconds or less often); pass a :class:`Backend` to share
    one connection. See :meth:`Backend.once` and ``docs/jobs.md``.

    :raises ValueError: a bad name, URL or period (at decoration time).
    :raises TypeError: the decorated function is not a coroutine function.
    """
    validate_name(name)
    check_periods(at_most_for, at_least_for)
    if isinstance(backend_or_url, str):
        backend_from_url(backend_or_url)  # a bad URL fails here, before any I/O
    elif not isinstance(backend_or_url, Backend):
        raise TypeError(f"once() takes a Backend or a URL, got {type(backend_or_url).__name__}")

    def decorate(
        function: Callable[P, Awaitable[T]],
    ) -> Callable[P, Coroutine[Any, Any, T | None]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"@aiolocks.once needs a coroutine function, got {function!r}")

        async def run_on(backend: Backend, *args: P.args, **kwargs: P.kwargs) -> T | None:
            job = backend.once(
                name, at_most_for=at_most_for, at_least_for=at_least_for, hard_bound=hard_bound
            )
            async with job as ran:
                if ran:
                    return await function(*args, **kwargs)
            return None

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T | None:
            if isinstance(backend_or_url, str):
                async with connect(backend_or_url) as backend:
                    return await run_on(backend, *args, **kwargs)
            return await run_on(backend_or_url, *args, **kwargs)

        return wrapper

    return decorate
