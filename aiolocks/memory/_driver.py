"""Driver of the ``memory://`` backend.

The queues, futures and fencing counters are the process-local store of
:mod:`aiolocks._core.localstore` (the core also takes degraded holds from
it); this module adds what makes it a backend: administration, ``doctor``,
:class:`MemoryBackend` and the URL.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, final

from .._core.backend import Backend
from .._core.doctor import Diagnosis
from .._core.localstore import LocalDriver
from ._records import MemoryRecords

if TYPE_CHECKING:
    from ._admin import MemoryAdmin

__all__ = ["MemoryBackend", "MemoryDriver", "from_url"]


@final
class MemoryDriver(LocalDriver):
    """The ``memory://`` driver: the process-local store, with admin and ``doctor``."""

    def __init__(self, store: str = "default") -> None:
        super().__init__(store)
        self._records = MemoryRecords(store)

    def records(self) -> MemoryRecords:
        """The record store under the coordination recipes (groups, latches, ``once``)."""
        return self._records

    async def close(self) -> None:
        """This driver's ephemeral records go, as a session's would."""
        self._records.close()
        await super().close()

    def admin(self) -> MemoryAdmin:
        """Listing and force-release (``aiolocks list``/``break``)."""
        from ._admin import MemoryAdmin

        return MemoryAdmin(self)

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings: one reminder that this lock is process-local."""
        from ._doctor import diagnose

        return diagnose(self.describe())


@final
class MemoryBackend(Backend):
    """The in-process backend (``memory://``).

    >>> async with MemoryBackend() as backend:  # doctest: +SKIP
    ...     async with backend.mutex("jobs/report"):
    ...         ...

    Backends built with the same ``store`` name in one event loop share locks.
    """

    def __init__(self, store: str = "default") -> None:
        if not isinstance(store, str) or not store or "/" in store:
            raise ValueError(
                f"memory store name must be a non-empty str without '/', got {store!r}"
            )
        super().__init__(MemoryDriver(store))


def from_url(url: str, **options: object) -> MemoryBackend:
    """``memory://`` (the shared default store) or ``memory://<store>``; no options."""
    if options:
        raise ValueError(f"memory:// takes no options, got {', '.join(sorted(options))}")
    if not isinstance(url, str):
        raise ValueError(f"backend URL must be a str, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "memory":
        raise ValueError(f"not a memory:// URL: {url!r}")
    rest, _, query = rest.partition("?")
    if query:
        first = query.split("&")[0].split("=")[0]
        raise ValueError(f"unknown option {first!r} in {url!r}: memory:// takes no options")
    store = rest.rstrip("/") or "default"
    if not _STORE_NAME.fullmatch(store):
        raise ValueError(
            f"invalid memory store name {store!r} in {url!r}: use letters, digits, '.', '_', '-'"
        )
    return MemoryBackend(store)


_STORE_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
