"""``aiolocks.connect(url)``: URL -> backend.

The scheme picks the backend package, which parses and checks the whole URL
(and keyword options) before any network I/O; only then is the backend
opened. Backend packages are imported on demand, so ``import aiolocks``
imports neither aiozk nor redis.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator
from types import TracebackType
from typing import Any, final

from ._core.backend import Backend

__all__ = ["SCHEMES", "connect"]

#: scheme -> module with ``from_url(url, **options) -> Backend``
SCHEMES: dict[str, str] = {
    "memory": "aiolocks.memory",
    "zk": "aiolocks.zookeeper",
    "redis": "aiolocks.redis",
    "rediss": "aiolocks.redis",
    "redis+sentinel": "aiolocks.redis",
    "redis+cluster": "aiolocks.redis",
    "redlock": "aiolocks.redis",
    "postgresql": "aiolocks.postgres",
    "postgres": "aiolocks.postgres",
    "etcd": "aiolocks.etcd",
}


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build (but do not open) the backend for ``url``; ``ValueError`` names what is wrong."""
    if not isinstance(url, str):
        raise ValueError(f"backend URL must be a str such as 'memory://', got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ValueError(
            f"invalid backend URL {url!r}: expected 'scheme://...' with a scheme among "
            f"{', '.join(SCHEMES)}"
        )
    module_name = SCHEMES.get(scheme.lower())
    if module_name is None:
        raise ValueError(
            f"unknown URL scheme {scheme!r} in {url!r}; supported: {', '.join(SCHEMES)}"
        )
    if scheme != scheme.lower():
        url = scheme.lower() + url[len(scheme) :]
    module = importlib.import_module(module_name)
    backend: Backend = module.from_url(url, **options)
    return backend


@final
class _Connecting:
    """What ``connect()`` returns: awaitable, and an async context manager."""

    __slots__ = ("_backend",)

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def __await__(self) -> Generator[Any, None, Backend]:
        return self._open().__await__()

    async def _open(self) -> Backend:
        try:
            await self._backend.open()
        except BaseException:
            await self._backend.close()
            raise
        return self._backend

    async def __aenter__(self) -> Backend:
        return await self._open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._backend.close()


def connect(url: str = "memory://", **options: Any) -> _Connecting:
    """Open a backend from a URL; await it, or use it as an async context manager.

    >>> async with aiolocks.connect("zk://127.0.0.1:2181") as backend:  # doctest: +SKIP
    ...     async with backend.mutex("locks/pay/order-1001"):
    ...         ...
    >>> backend = await aiolocks.connect("redis://127.0.0.1:6379/0")  # doctest: +SKIP
    >>> await backend.close()  # doctest: +SKIP

    Schemes: ``memory://``, ``zk://``, ``redis://``, ``rediss://``,
    ``redis+sentinel://``, ``redis+cluster://``, ``redlock://``,
    ``postgresql://`` / ``postgres://``, ``etcd://``. Keyword
    options are the URL's query options (``session_timeout``, ``lease_time``,
    ``key_prefix``, ``connect_timeout``...).

    :raises ValueError: unknown scheme, malformed URL or bad option (at once,
        before any I/O; the message names the offending part).
    :raises BackendUnavailableError: the server cannot be reached within
        ``connect_timeout`` (default 10 s).
    """
    return _Connecting(backend_from_url(url, **options))
