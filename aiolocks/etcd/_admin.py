"""``aiolocks list`` / ``aiolocks break`` for etcd: read and delete the queue keys.

A lock's queue is every key under ``<root><family>\\x00<name>\\x00``; listing
reads the keys (not the values) under the root and groups them by queue.
Breaking a lock deletes its holders' keys only: each holder's own watch sees
the delete and reports the loss at once, and the waiters go on in order.
Each key is deleted in a transaction of its own that first compares the
key's create revision with the one the listing read, so a key written again
between the read and the delete (a newer hold under the same name) stays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core.admin import name_matches
from .._core.driver import Family
from ._client import Compare, DeleteOp, DeleteResult, RangeOp

if TYPE_CHECKING:
    from ._driver import EtcdDriver

__all__ = ["EtcdAdmin"]


class EtcdAdmin:
    """The admin operations of one etcd driver."""

    def __init__(self, driver: EtcdDriver) -> None:
        self._driver = driver

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """``(family, name)`` of every queue under the backend's root with a key in it."""
        root = self._driver.root
        found: set[tuple[Family, str]] = set()
        for family in Family:
            start = root + f"{family.value}\x00".encode()
            result = await self._driver.client.range(
                RangeOp.of(start, prefix=True, keys_only=True)
            )
            for kv in result.kvs:
                name, sep, _ = kv.key[len(start) :].partition(b"\x00")
                if not sep:
                    continue  # not a queue key of ours
                text = name.decode("utf-8", "replace")
                if name_matches(text, prefix):
                    found.add((family, text))
        return sorted(found, key=lambda entry: (entry[1], entry[0].value))

    async def force_release(self, name: str, family: Family) -> int:
        """Delete the holders' keys of ``name`` in ``family``; how many were deleted."""
        holders = [
            (p.node.encode(), p.fencing_token)
            for p in await self._driver.participants(name, family)
            if p.is_holder and p.node and p.fencing_token is not None
        ]
        return await self.delete_holds(holders)

    async def delete_holds(self, holds: Sequence[tuple[bytes, int]]) -> int:
        """Delete each ``(key, create_revision)`` whose key still has that create revision.

        One transaction per key (a transaction's compares are all or
        nothing): a key deleted and written again since it was read has
        another create revision and is left alone. A transaction whose
        answer was lost is sent again: its compare makes the repeat harmless
        (it then counts the key as not deleted).
        """
        deleted = 0
        for key, revision in holds:
            result = await self._driver.client.txn(
                [Compare.create_revision(key, "==", revision)], [DeleteOp.of(key)], [], retry=True
            )
            if result.succeeded:
                deleted += sum(r.deleted for r in result.responses if isinstance(r, DeleteResult))
        return deleted
