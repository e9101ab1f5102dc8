"""The partitioner: which member of a group owns a key (tooz's ``Partitioner``).

Design
------
Rendezvous (highest random weight) hashing, Thaler and Ravishankar 1996:
the owner of a key is the member whose ``BLAKE2b(member id, key)`` score is
highest. It needs no ring and no coordination: every process that reads the
same member list computes the same owner for every key, and when a member
joins or leaves only the keys it wins or held move, about ``1/N`` of them
(the others' scores did not change). BLAKE2b, not Python's ``hash()``,
which differs between processes.

Hand-over order
---------------
Each member learns the membership from its own reads of the group, so two
members may briefly hold different views. The rules:

1. Two members that read the same membership (equal ``Partition.version``)
   never both own a key: the owner is a function of the member list.
2. :meth:`Partitioner.owner` and :meth:`Partitioner.owns` answer from the
   last :class:`Partition` that :meth:`Partitioner.changes` yielded: the
   view moves only when the worker is handed the new one, so a worker is
   always told (by ``changes()``) before the partitioner says it no longer
   owns a key. Stop the keys that left ``owned`` before starting new ones.
3. Across *different* views (one member has seen a join, another not yet)
   a key can be owned by two members for the time the news takes to reach
   the second one (an event on every backend with events, within a second
   of the server noticing). Work that must never run twice at once also
   takes a lock on the key: ``backend.mutex(f"jobs/{key}")``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable
from typing import final

from .group import Member

__all__ = ["Partition", "Partitioner", "rendezvous_owner"]


def _prepared(member_ids: Iterable[str]) -> tuple[tuple[str, hashlib.blake2b], ...]:
    """Each member id with a BLAKE2b state already fed the id (copied per key)."""
    return tuple(
        (member_id, hashlib.blake2b(_utf8(member_id) + b"\0", digest_size=8))
        for member_id in sorted(set(member_ids))
    )


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _owner(prepared: tuple[tuple[str, hashlib.blake2b], ...], key: str) -> str | None:
    data = _utf8(key)
    best: tuple[bytes, str] | None = None
    for member_id, state in prepared:
        scorer = state.copy()
        scorer.update(data)
        score = (scorer.digest(), member_id)  # ties (never seen) go to the larger id
        if best is None or score > best:
            best = score
    return None if best is None else best[1]


def rendezvous_owner(member_ids: Iterable[str], key: str) -> str | None:
    """The owner of ``key`` among ``member_ids`` by rendezvous hashing; ``None`` when empty.

    A pure function: the same ids give the same owner in every process.
    """
    return _owner(_prepared(member_ids), key)


@final
class Partition:
    """One membership view: the members, and the keys this member owns under it.

    ``key in partition`` is ``partition.owns(key)``.

    :ivar members: the member ids of the view, sorted
    :ivar member_id: the member this partition is for
    :ivar version: a digest of the membership read; equal on every member
        that read the same membership
    """

    __slots__ = ("_prepared", "member_id", "members", "version")

    def __init__(self, member_id: str, members: Iterable[str], version: str = "") -> None:
        self._prepared = _prepared(members)
        self.member_id = member_id
        self.members: tuple[str, ...] = tuple(m for m, _ in self._prepared)
        self.version = version or _digest([(m, "") for m in self.members])

    def owner(self, key: str) -> str:
        """The member id that owns ``key`` under this view.

        :raises LookupError: the view has no members.
        """
        owner = _owner(self._prepared, _checked_key(key))
        if owner is None:
            raise LookupError(f"no member owns {key!r}: the group has no members")
        return owner

    def owns(self, key: str) -> bool:
        """This member owns ``key`` under this view."""
        return _owner(self._prepared, _checked_key(key)) == self.member_id

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.owns(key)

    def select(self, keys: Iterable[str]) -> list[str]:
        """The keys among ``keys`` this member owns, in their order."""
        return [key for key in keys if self.owns(key)]

    def __repr__(self) -> str:
        return f"<Partition {self.member_id!r} of {len(self.members)} members {self.version}>"


def _checked_key(key: object) -> str:
    if not isinstance(key, str):
        raise ValueError(f"a partition key must be a str, got {type(key).__name__} {key!r}")
    return key


def _digest(pairs: Iterable[tuple[str, object]]) -> str:
    """A short digest of (member, record version) pairs: the membership version."""
    state = hashlib.blake2b(digest_size=8)
    for member_id, version in sorted((m, str(v)) for m, v in pairs):
        state.update(_utf8(member_id) + b"\0" + version.encode() + b"\0")
    return state.hexdigest()


@final
class Partitioner:
    """Split a key space among the members of a group by rendezvous hashing.

    >>> async with backend.group("workers").join() as member:  # doctest: +SKIP
    ...     partitioner = aiolocks.Partitioner(member)
    ...     async for owned in partitioner.changes():
    ...         for shard in SHARDS:
    ...             ...  # run the shards in ``owned``, stop the others

    Every member computes the same owner from the same member list, and a
    join or leave moves about ``1/N`` of the keys. ``owner()`` and
    ``owns()`` answer from the last view ``changes()`` yielded (a worker is
    told before it must stop a key); the hand-over order is described in
    ``docs/api.md`` ("Coordination"). A member owns nothing until its own
    record is in the view.

    :raises ValueError: ``member`` is not a :class:`Member`.
    """

    def __init__(self, member: Member) -> None:
        if not isinstance(member, Member):
            raise ValueError(
                f"Partitioner needs a Member (from group.join()), got {type(member).__name__}"
            )
        self._member = member
        self._partition: Partition | None = None

    @property
    def member(self) -> Member:
        """The member this partitioner answers for."""
        return self._member

    @property
    def partition(self) -> Partition | None:
        """The last view ``changes()`` yielded; ``None`` before the first."""
        return self._partition

    def _current(self) -> Partition:
        partition = self._partition
        if partition is None:
            raise RuntimeError(
                f"partitioner of {self._member.id!r} has no membership view yet: "
                "iterate changes() first"
            )
        return partition

    def owner(self, key: str) -> str:
        """The member id that owns ``key`` under the current view.

        :raises RuntimeError: ``changes()`` has not yielded a view yet.
        :raises LookupError: the view has no members.
        """
        return self._current().owner(key)

    def owns(self, key: str) -> bool:
        """This member owns ``key`` under the current view.

        :raises RuntimeError: ``changes()`` has not yielded a view yet.
        """
        return self._current().owns(key)

    async def changes(self) -> AsyncIterator[Partition]:
        """Yield the current :class:`Partition`, then a new one on every membership change.

        The partitioner's view becomes the yielded one at the moment it is
        yielded. It ends only when the caller stops iterating (a lost
        membership cancels the ``async with group.join()`` body around it).
        """
        member = self._member
        async for state, members in member.group._states():
            partition = Partition(member.id, (m.id for m in members), _digest(state))
            self._partition = partition
            yield partition
