"""``memory://`` administration: list the queues in use, force-release holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from .._core.admin import FORCE_RELEASED, name_matches
from .._core.driver import Family

if TYPE_CHECKING:
    from ._driver import MemoryDriver

__all__ = ["MemoryAdmin"]


@final
class MemoryAdmin:
    """:class:`aiolocks._core.admin.AdminDriver` over a memory store."""

    def __init__(self, driver: MemoryDriver) -> None:
        self._driver = driver

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """Every (family, name) with a non-empty queue in this store."""
        store = self._driver._get_store()
        return [key for key in store.queues if name_matches(key[1], prefix)]

    async def force_release(self, name: str, family: Family) -> int:
        """Mark every holder lost (its body is cancelled at once) and let waiters in."""
        store = self._driver._get_store()
        queue = store.queues.get((family, name))
        if queue is None:
            return 0
        grants = list(queue.holders)
        for grant in grants:
            grant.mark_lost(FORCE_RELEASED)
            store.release(grant)
        return len(grants)
