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
from ._core.engine import ON_UNAVAILABLE
from ._core.errors import LockError
from ._core.urls import redact_url, scrub_exception, split_userinfo

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

#: backend package -> the extra that installs its dependencies
EXTRAS: dict[str, str] = {"aiolocks.postgres": "postgres", "aiolocks.etcd": "etcd"}


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build (but do not open) the backend for ``url``; ``ValueError`` names what is wrong."""
    if not isinstance(url, str):
        raise ValueError(f"backend URL must be a str such as 'memory://', got {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise ValueError(
            f"invalid backend URL {redact_url(url)!r}: expected 'scheme://...' with a scheme among "
            f"{', '.join(SCHEMES)}"
        )
    module_name = SCHEMES.get(scheme.lower())
    if module_name is None:
        raise ValueError(
            f"unknown URL scheme {scheme!r} in {redact_url(url)!r}; supported: {', '.join(SCHEMES)}"
        )
    if scheme != scheme.lower():
        url = scheme.lower() + url[len(scheme) :]
    try:
        url, on_unavailable = _take_on_unavailable(url, options.pop("on_unavailable", None))
        backend: Backend = importlib.import_module(module_name).from_url(url, **options)
    except ValueError as exc:
        # every backend package redacts its own messages; this catches any it missed
        raise scrub_exception(exc, url) from None
    except ImportError as exc:  # an optional dependency: name the pip install line
        missing = _missing_dependency(exc)
        if missing is None:
            raise
        extra = EXTRAS.get(module_name)
        install = f"pip install 'aiolocks[{extra}]'" if extra else "pip install aiolocks"
        raise ImportError(f"{scheme}:// needs {missing}, not installed: {install}") from exc
    backend.on_unavailable = on_unavailable
    return backend


def _missing_dependency(exc: ImportError) -> str | None:
    """The third-party module whose absence caused ``exc`` (None: not a missing dependency)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ModuleNotFoundError) and cause.name:
            return None if cause.name.startswith("aiolocks") else cause.name
        cause = cause.__cause__
    return None


def _take_on_unavailable(url: str, keyword: object) -> tuple[str, str]:
    """Remove ``on_unavailable=`` from the URL's query; the value (keyword wins), default "raise".

    It is the engine's option, not the backend package's, so every scheme
    takes it the same way.
    """
    scheme, _, rest = url.partition("://")
    userinfo, remainder = split_userinfo(rest)
    head = f"{scheme}://{userinfo + '@' if userinfo is not None else ''}"
    location, sep, query = remainder.partition("?")
    base = head + location
    if not sep:
        return url, "raise" if keyword is None else _checked(keyword)
    kept: list[str] = []
    found: object = None
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "on_unavailable":
            if found is not None:
                raise ValueError(f"on_unavailable given twice in {redact_url(url)!r}")
            found = value
        else:
            kept.append(part)
    if keyword is not None and found is not None and keyword != found:
        raise ValueError(
            f"on_unavailable={keyword!r} contradicts on_unavailable={found!r} "
            f"in the URL {redact_url(url)!r}"
        )
    chosen = keyword if keyword is not None else found
    rebuilt = base + ("?" + "&".join(kept) if kept else "")
    return rebuilt, "raise" if chosen is None else _checked(chosen)


def _checked(value: object) -> str:
    if value not in ON_UNAVAILABLE:
        raise ValueError(
            f"on_unavailable must be one of {', '.join(map(repr, ON_UNAVAILABLE))}, got {value!r}"
        )
    return str(value)


@final
class _Connecting:
    """What ``connect()`` returns: awaitable, and an async context manager."""

    __slots__ = ("_backend", "_url")

    def __init__(self, backend: Backend, url: str) -> None:
        self._backend = backend
        #: the URL as given, only to redact its secrets out of open() errors
        self._url = url

    def __repr__(self) -> str:
        return f"<connecting {self._backend.url}>"

    def __await__(self) -> Generator[Any, None, Backend]:
        return self._open().__await__()

    async def _open(self) -> Backend:
        try:
            await self._backend.open()
        except BaseException as exc:
            await self._backend.close()
            if isinstance(exc, LockError | OSError | ValueError):
                scrub_exception(exc, self._url)
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
    ``key_prefix``, ``connect_timeout``...), and, on every scheme,
    ``on_unavailable``: ``"raise"`` (default: an acquire that cannot reach
    the server raises :class:`BackendUnavailableError`) or ``"local"`` (it
    takes a process-local lock of the same name and kind instead, marked
    ``lock.is_degraded``; see ``docs/degradation.md``). ``connect()`` itself
    still needs the server once.

    :raises ValueError: unknown scheme, malformed URL or bad option (at once,
        before any I/O; the message names the offending part).
    :raises BackendUnavailableError: the server cannot be reached within
        ``connect_timeout`` (default 10 s).
    """
    return _Connecting(backend_from_url(url, **options), url)
