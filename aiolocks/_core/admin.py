"""Administrative operations: list the locks in use, force-release one.

A driver that supports them is a :class:`~aiolocks._core.driver.SupportsAdmin`:
its ``admin()`` method returns an :class:`AdminDriver`; the backend-specific
code lives in each backend package's ``_admin`` module.
:meth:`Backend.list_locks` and :meth:`Backend.force_release` are the public
entry points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, final

from .driver import Family, SupportsAdmin
from .participants import Participant

if TYPE_CHECKING:
    from .backend import Backend

__all__ = ["KINDS", "AdminDriver", "LockInfo", "force_release", "list_locks", "name_matches"]

#: the ``kind`` strings of :class:`LockInfo` and ``force_release()``, and their families
KINDS: dict[str, Family] = {family.value: family for family in Family}

#: why a force-released hold is lost, as its holder sees it
FORCE_RELEASED = "it was force-released by an administrator"


@final
@dataclass(frozen=True, slots=True)
class LockInfo:
    """One lock in use, as :meth:`Backend.list_locks` reports it.

    :ivar name: the canonical lock name
    :ivar kind: ``"mutex"``, ``"semaphore-mutex"``, ``"semaphore"``, ``"rwlock"`` or
        ``"leader"`` (each kind is a name space of its own)
    :ivar participants: holders first, then waiters (see :class:`Participant`)
    """

    name: str
    kind: str
    participants: tuple[Participant, ...]


class AdminDriver(Protocol):
    """What a driver's ``admin()`` returns."""

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """``(family, name)`` of every lock whose name starts with ``prefix`` and that has
        a holder or a waiter (or may have: a backend may report a lock just released)."""
        ...

    async def force_release(self, name: str, family: Family) -> int:
        """Remove every hold of ``name`` in ``family``; the number removed."""
        ...


def _admin(backend: Backend) -> AdminDriver:
    driver = backend._driver
    if not isinstance(driver, SupportsAdmin):
        raise NotImplementedError(f"{backend.url} does not support listing or force-release")
    return driver.admin()


def name_matches(name: str, prefix: str) -> bool:
    """``prefix`` is a plain string prefix of the canonical name (a leading ``/`` ignored)."""
    return name.startswith(prefix.lstrip("/"))


def _check_kind(kind: str | None) -> list[Family]:
    if kind is None:
        return list(Family)
    family = KINDS.get(kind) if isinstance(kind, str) else None
    if family is None:
        raise ValueError(f"unknown lock kind {kind!r}; expected one of {', '.join(KINDS)}")
    return [family]


async def list_locks(backend: Backend, prefix: str) -> list[LockInfo]:
    """See :meth:`Backend.list_locks`."""
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, got {type(prefix).__name__}")
    await backend.open()
    backend._engine.check_open()
    admin = _admin(backend)
    found: list[LockInfo] = []
    for family, name in sorted(
        set(await admin.lock_names(prefix.lstrip("/"))), key=lambda e: (e[1], e[0].value)
    ):
        participants = await backend._driver.participants(name, family)
        if participants:
            found.append(LockInfo(name, family.value, tuple(participants)))
    return found


async def force_release(backend: Backend, name: str, kind: str | None) -> int:
    """See :meth:`Backend.force_release`."""
    families = _check_kind(kind)
    key = backend._engine.validate_name(name)
    await backend.open()
    backend._engine.check_open()
    admin = _admin(backend)
    removed = 0
    for family in families:
        removed += await admin.force_release(key, family)
    return removed
