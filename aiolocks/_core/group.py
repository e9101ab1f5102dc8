"""Group membership (tooz groups, Curator ``GroupMember``, kazoo ``Party``), built once.

Design
------
A member is an *ephemeral* record ``group/<name>/<child>`` of the backend's
record store (:mod:`aiolocks._core.records`): ``child`` is a hash of the
member id, so any id fits the store's child syntax and one id is one key (a
second join of the same id is refused by the store's create-if-absent); the
value is JSON ``{"id", "capabilities", "nonce"}``. The record is tied to the
backend's session: a member whose process dies or whose session expires
leaves by itself, and the others' snapshots wake when the server lets it go.

Loss is never silent. The driver marks our record's :class:`Entry` lost the
moment it knows the session ended; a watcher task also follows the group
(through the one read per backend that every follower of the group in the
process shares, :mod:`aiolocks._core.groupfeed`) and reports a record
deleted or replaced behind our back, and the backend's ``close()`` (which
cancels that watcher) ends the membership too. Like a lost lock hold
(``_core/hold.py``, after CPython's ``asyncio.timeout()``), the body of
``async with group.join()`` is then cancelled once, and its exit withdraws
that cancellation and raises :class:`LockLostError`, unless somebody else
also cancelled the task, whose cancellation then wins.

Cancellation never leaks a member: the join and the leave run in tasks owned
by the backend and are awaited to their end even when the caller is
cancelled; a caller cancelled during the join deletes the record it wrote
before the cancellation propagates. A join that *failed* (the reply was
lost) may still have been applied: the record is read back and deleted when
it carries this attempt's ``nonce`` (Curator's protected mode).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

from .coordination import finish, store_of
from .errors import BackendUnavailableError, LockLostError
from .groupfeed import subscribe
from .jsonvalues import JSONValue, dump_json, load_json
from .names import has_control_character
from .records import Entry, Record, Records

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Group", "GroupMembership", "Member", "check_id"]

logger = logging.getLogger("aiolocks")

T = TypeVar("T")


def check_id(what: str, value: object) -> str:
    """A participant or member id: a uuid when ``None``; else a non-empty printable str."""
    if value is None:
        return uuid.uuid4().hex
    if (
        not isinstance(value, str)
        or not value
        or len(value.encode("utf-8", "surrogatepass")) > 1024
        or has_control_character(value)
    ):
        raise ValueError(
            f"{what} must be a non-empty str of at most 1024 bytes without control "
            f"characters, got {value!r}"
        )
    return value


def member_child(member_id: str) -> str:
    """The record child of a member id: 32 hex digits of its BLAKE2b hash."""
    return hashlib.blake2b(member_id.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@final
class Member:
    """One member of a group: its ``id`` and the ``capabilities`` it joined with.

    ``group.join()`` yields the member it made; ``group.members()`` and
    ``group.watch()`` list every member as read. Two members are equal when
    their ids and capabilities are; ``group`` is the :class:`Group` read from.
    """

    __slots__ = ("_capabilities", "_group", "_id", "_membership")

    def __init__(
        self,
        id: str,
        capabilities: dict[str, JSONValue],
        group: Group,
        membership: GroupMembership | None = None,
    ) -> None:
        self._id = id
        self._capabilities = capabilities
        self._group = group
        self._membership = membership

    @property
    def id(self) -> str:
        """The member id given to ``join()`` (a uuid unless given)."""
        return self._id

    @property
    def capabilities(self) -> dict[str, JSONValue]:
        """The JSON object given to ``join()`` as read back (a fresh copy each time)."""
        loaded = load_json(dump_json("capabilities", self._capabilities))
        assert isinstance(loaded, dict)
        return loaded

    @property
    def group(self) -> Group:
        """The group this member belongs to."""
        return self._group

    @property
    def is_lost(self) -> bool:
        """This process's membership ended without a leave (session lost, backend closed)."""
        membership = self._membership
        return membership is not None and membership.lost

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Member):
            return NotImplemented
        return (self._id, self._capabilities) == (other._id, other._capabilities)

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"Member(id={self._id!r}, capabilities={self._capabilities!r})"


@final
class Group:
    """A named group of members, tied to the backend's session (tooz, Curator GroupMember).

    >>> group = backend.group("workers/billing")  # doctest: +SKIP
    >>> async with group.join("host-a", {"cpus": 8}) as member:  # doctest: +SKIP
    ...     async for members in group.watch():
    ...         print([m.id for m in members])

    A member whose session ends (process killed, session expired, lease not
    renewed) leaves by itself; the others' ``watch()`` sees it as soon as
    the server lets its record go. A process whose own membership is lost
    while inside ``async with group.join()`` has that body cancelled, and
    the block raises :class:`LockLostError`.

    :raises NotImplementedError: the backend has no record store.
    :raises InvalidLockNameError: ``name`` is not a valid lock name.
    """

    def __init__(self, engine: Engine, name: str) -> None:
        key = engine.validate_name(name)
        self._store = store_of(engine, f"group {name!r}")
        self._engine = engine
        self._name = name
        self._prefix: Final = engine.validate_name(f"group/{key}")

    @property
    def name(self) -> str:
        """The name this group was created with."""
        return self._name

    def __repr__(self) -> str:
        return f"<Group {self._name!r}>"

    def join(
        self, member_id: str | None = None, capabilities: Mapping[str, object] | None = None
    ) -> GroupMembership:
        """Join as ``member_id`` (a uuid when ``None``) for the ``async with`` block.

        ``capabilities``: a JSON object the other members read (``Member.capabilities``).
        The ``as`` target is this process's :class:`Member`.

        :raises ValueError: a bad id or capabilities (before any I/O); on entry,
            a member with this id is already in the group (its session has not ended).
        :raises LockLostError: the membership was lost while the block ran.
        """
        member_id = check_id(f"group {self._name!r}: member_id", member_id)
        if capabilities is None:
            capabilities = {}
        if not isinstance(capabilities, Mapping):
            raise ValueError(
                f"group {self._name!r}: capabilities must be a dict of JSON values, "
                f"got {type(capabilities).__name__}"
            )
        what = f"group {self._name!r}: capabilities"
        # the capabilities as every member will read them (JSON round trip)
        loaded = load_json(dump_json(what, dict(capabilities)))
        assert isinstance(loaded, dict)
        return GroupMembership(self, member_id, loaded)

    async def members(self) -> list[Member]:
        """Every member now, sorted by id."""
        self._engine.check_open()
        await self._engine.open()
        with await self._store.snapshot(self._prefix) as snap:
            return self._read(snap.records)

    async def watch(self) -> AsyncIterator[list[Member]]:
        """Yield the member list now, then again after every join and leave.

        >>> async for members in group.watch():  # doctest: +SKIP
        ...     print(sorted(m.id for m in members))

        Changes that happen while the loop body runs are not missed: the
        next list is read after them. Several changes close together may
        come as one list. Close the iterator (``break``) to stop watching.
        """
        async for _, members in self._states():
            yield members

    async def _states(self) -> AsyncIterator[tuple[tuple[tuple[str, int], ...], list[Member]]]:
        """``watch()`` with each list's state: the sorted (child, record version) pairs."""
        self._engine.check_open()
        await self._engine.open()
        seen: tuple[tuple[str, int], ...] | None = None
        with subscribe(self._engine, self._store, self._prefix) as subscription:
            while True:
                read = await subscription.next()
                if read.error is not None:
                    raise read.error
                state = read.state
                if state != seen:
                    seen = state
                    yield state, self._read(read.records)

    def _read(self, records: Mapping[str, Record]) -> list[Member]:
        members = []
        for child, record in records.items():
            try:
                value = load_json(record.value)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                continue
            member_id, capabilities = value.get("id"), value.get("capabilities")
            if (
                isinstance(member_id, str)
                and isinstance(capabilities, dict)
                and member_child(member_id) == child
            ):
                members.append(Member(member_id, capabilities, self))
        members.sort(key=lambda member: member.id)
        return members

    def _key(self, member_id: str) -> str:
        return f"{self._prefix}/{member_child(member_id)}"


@final
class GroupMembership:
    """``async with group.join(...) as member:``: one membership of this process.

    Entering writes the member record and returns the :class:`Member`;
    leaving deletes it. See :meth:`Group.join`.
    """

    __slots__ = (
        "_baseline",
        "_cancelled_by_loss",
        "_capabilities",
        "_entry",
        "_group",
        "_id",
        "_state",
        "_task",
        "_watcher",
    )

    def __init__(self, group: Group, member_id: str, capabilities: dict[str, JSONValue]) -> None:
        self._group = group
        self._id = member_id
        self._capabilities = capabilities
        self._entry: Entry | None = None
        self._task: asyncio.Task[Any] | None = None
        self._baseline = 0
        self._cancelled_by_loss = False
        self._watcher: asyncio.Task[None] | None = None
        self._state = "new"  # new -> joined -> left

    @property
    def lost(self) -> bool:
        """The membership ended without a leave."""
        return self._entry is not None and self._entry.lost

    def __repr__(self) -> str:
        return f"<GroupMembership {self._group.name!r} id={self._id!r} {self._state}>"

    async def __aenter__(self) -> Member:
        if self._state != "new":
            raise RuntimeError(f"group {self._group.name!r}: this join() was already used")
        group = self._group
        engine = group._engine
        engine.check_open()
        await engine.open()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("group.join() must be used inside an asyncio task")
        self._state = "joining"
        entry = self._entry = await self._write()
        if engine.closed:  # closed while joining: the session (and the record) ended with it
            entry.mark_lost("the backend was closed")
        if entry.lost:  # lost before the block could start
            cancelled = await self._leave()
            if cancelled is not None:
                raise cancelled
            raise LockLostError(
                f"group {group.name!r}: member {self._id!r} was lost before the block "
                f"could start ({entry.lost_reason})"
            )
        # No await from here to the body: the loss listener knows the body's task.
        self._task = task
        self._baseline = task.cancelling()
        self._state = "joined"
        entry.add_loss_listener(self._on_lost)
        self._watcher = engine.spawn(
            self._watch_own_record(entry), name=f"aiolocks-member:{group.name}:{self._id}"
        )
        self._watcher.add_done_callback(self._watcher_done)
        return Member(self._id, self._capabilities, group, self)

    async def _write(self) -> Entry:
        """Write the member record; delete it again if the caller was cancelled meanwhile."""
        group = self._group
        key = group._key(self._id)
        nonce = uuid.uuid4().hex
        value = dump_json(
            "member", {"id": self._id, "capabilities": self._capabilities, "nonce": nonce}
        )
        joining, cancelled = await finish(
            group._engine, group._store.join(key, value), f"aiolocks-join:{key}"
        )
        error = None if joining.cancelled() else joining.exception()
        if joining.cancelled() or error is not None:
            self._state = "left"
            # The reply may have been lost after the server applied the write.
            _, again = await finish(
                group._engine, _delete_if_nonce(group._store, key, nonce), f"aiolocks-unjoin:{key}"
            )
            if cancelled is not None:
                raise cancelled
            if again is not None:
                raise again
            if error is not None:
                raise error
            group._engine.check_open()  # the backend's close() cancelled the join
            raise BackendUnavailableError(f"group {group.name!r}: the join was cancelled")
        entry = joining.result()
        if cancelled is not None:
            self._state = "left"
            if entry is not None:
                await finish(
                    group._engine,
                    _delete_quietly(group._store, key, entry.version),
                    f"aiolocks-unjoin:{key}",
                )
            raise cancelled
        if entry is None:
            self._state = "left"
            raise ValueError(
                f"group {group.name!r} already has a member {self._id!r} "
                "(a previous session of that id may not have ended yet)"
            )
        return entry

    def _on_lost(self, entry: Entry) -> None:
        logger.warning(
            "group %r: member %r was lost: %s", self._group.name, self._id, entry.lost_reason
        )
        task = self._task
        if task is None or task.done() or self._state != "joined" or self._cancelled_by_loss:
            return  # no body to cancel, or cancelled once already
        self._cancelled_by_loss = True
        task.cancel(f"aiolocks: membership of group {self._group.name!r} was lost")

    async def _watch_own_record(self, entry: Entry) -> None:
        """Report our record deleted or replaced behind our back, or the backend closing.

        It reads nothing itself: it follows the reads of the group shared by
        the whole process (:mod:`aiolocks._core.groupfeed`), taking only
        reads started after the join.
        """
        group = self._group
        engine = group._engine
        key_child = member_child(self._id)
        try:
            with subscribe(engine, group._store, group._prefix) as subscription:
                while not entry.lost:
                    read = await subscription.next()
                    if isinstance(read.error, BackendUnavailableError):
                        # the driver's session machinery reports a real loss
                        logger.debug("group %r: member %r: %s", group.name, self._id, read.error)
                    elif read.error is not None:
                        raise read.error
                    else:
                        record = read.records.get(key_child)
                        if record is None or record.version != entry.version:
                            entry.mark_lost("the member record was deleted or replaced")
        except BackendUnavailableError:
            if not engine.closed:
                raise
            # (the backend's close() ended the shared follower)
            entry.mark_lost("the backend was closed")

    def _watcher_done(self, watcher: asyncio.Task[None]) -> None:
        """The backend's ``close()`` cancels the watcher: the membership ends with the session.

        A done callback, not an ``except`` in the watcher: a task cancelled
        before its first step never runs its coroutine.
        """
        entry = self._entry
        if self._state != "joined" or entry is None:
            return
        if watcher.cancelled():
            if self._group._engine.closed:
                entry.mark_lost("the backend was closed")
            return
        failure = watcher.exception()
        if failure is not None:
            # nothing follows the member record any more: never a silent loss
            entry.mark_lost(f"following the group failed ({failure!r})")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            outcome = await self._settle(exc)
        finally:
            # leave even if settling was cancelled: the member must not outlive the block
            cancelled = await self._leave()
        if cancelled is not None or outcome == "cancelled":
            if isinstance(exc, asyncio.CancelledError):
                return  # the body's own cancellation propagates
            raise cancelled or asyncio.CancelledError()
        if outcome == "lost":
            entry = self._entry
            assert entry is not None
            raise LockLostError(
                f"group {self._group.name!r}: member {self._id!r} was lost while the block "
                f"ran ({entry.lost_reason})"
            ) from exc

    async def _settle(self, exc: BaseException | None) -> str:
        """``"held"``, ``"lost"`` or ``"cancelled"``: withdraw our loss cancellation, if any.

        As ``asyncio.timeout()`` does: our own cancellation becomes
        LockLostError only if nobody else asked for one meanwhile.
        """
        task, self._task = self._task, None
        lost = self.lost
        if not self._cancelled_by_loss or task is None:
            return "lost" if lost else "held"
        self._cancelled_by_loss = False
        if task.uncancel() > self._baseline:
            return "cancelled"
        if not isinstance(exc, asyncio.CancelledError):
            # the body ended before our cancellation reached it: absorb it here
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                if task.cancelling() > self._baseline:
                    return "cancelled"
        return "lost"

    async def _leave(self) -> asyncio.CancelledError | None:
        """Stop the watcher and delete the member record (awaited to its end)."""
        self._state = "left"
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        entry = self._entry
        group = self._group
        if entry is None or group._engine.closed:
            return None  # closing the backend ends its session and the record with it
        _, cancelled = await finish(
            group._engine,
            _delete_quietly(group._store, entry.key, entry.version),
            f"aiolocks-leave:{entry.key}",
        )
        return cancelled


async def _delete_quietly(store: Records, key: str, version: int) -> None:
    """Delete our record at its version; a failure is logged (its session will end it)."""
    try:
        await store.delete(key, version=version)
    except Exception as exc:
        logger.warning("deleting the record %r failed: %s", key, exc)


async def _delete_if_nonce(store: Records, key: str, nonce: str) -> None:
    """Delete the record at ``key`` if this attempt wrote it (a join whose reply was lost)."""
    try:
        record = await store.read(key)
        if record is None:
            return
        try:
            value = load_json(record.value)
        except ValueError:
            return
        if isinstance(value, dict) and value.get("nonce") == nonce:
            await store.delete(key, version=record.version)
    except Exception as exc:
        logger.warning("cleaning up the record %r failed: %s", key, exc)
