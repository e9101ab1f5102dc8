"""The keys of a Redis lock (the driver, its admin and its record store share them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import final

from .._core.driver import Family

__all__ = ["LockKeys", "lock_keys"]


@final
@dataclass(frozen=True, slots=True)
class LockKeys:
    """The keys and channel of one lock; they share one ``{hash tag}`` (one cluster slot).

    The holders hash also carries the lock's fence counter (field ``#``) and
    the tombstones of attempts given up while their acquire script was on
    the wire (fields ``!<field id>``): see ``scripts/acquire.lua``.
    """

    holders: str
    queue: str
    queue_timeouts: str
    channel: str

    @property
    def acquire_keys(self) -> list[str]:
        return [self.holders, self.queue, self.queue_timeouts]


@functools.lru_cache(maxsize=4096)
def lock_keys(prefix: str, family: Family, name: str) -> LockKeys:
    """Map ``(family, name)`` to its keys: ``<prefix>{<family>:<name>}[:suffix]``.

    The prefix may not contain braces, so the hash tag is always ours: it
    starts at our ``{`` and ends at the first ``}`` after it (inside the name
    if the name has one), the same for every key of the lock.
    """
    base = f"{prefix}{{{family.value}:{name}}}"
    return LockKeys(base, f"{base}:queue", f"{base}:queue-timeouts", base)
