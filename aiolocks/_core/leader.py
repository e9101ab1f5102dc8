"""LeaderLatch (Curator's LeaderLatch), built once on any driver.

A started latch is a participant that queues for an exclusive hold of
``Family.LEADER``: a ZooKeeper ephemeral-sequential node, a Redis leased key
kept alive by the watchdog, a memory queue entry. The head of the queue is
the leader. A background task owned by the backend runs the loop
"acquire -> lead until the hold is lost or the latch is closed -> release
-> queue again", so a leader that loses its session or lease steps down and
the next participant takes over; a newcomer never pre-empts a live leader.

Advertising (etcd's ``Proclaim``/``Observe``). On a backend with a record
store (:mod:`aiolocks._core.records`) the leader also writes an ephemeral
record ``latch/<name>/leader`` = JSON ``{"id", "value", "token"}`` when it
gains leadership, updates it by version on ``proclaim()``, and deletes it
(by version) when it steps down, before releasing the hold, so an observer
sees ``None`` between two terms rather than the old leader. A record left by
an earlier term (its session has not ended yet) has a smaller fencing token:
the new leader deletes it; a record with a larger token means this latch is
the stale one, and it writes nothing. ``observe()`` is a loop of snapshots of
that record, so it works on a latch that never runs for leadership.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, final

from .coordination import finish, store_of
from .driver import Family, Mode, Request
from .errors import BackendUnavailableError
from .group import check_id
from .hold import Hold
from .jsonvalues import JSONValue, dump_json, load_json
from .participants import Participant
from .records import Entry, Record, Records, SupportsRecords
from .tasks import wait_finished
from .timeouts import check_timeout

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["LeaderLatch"]

logger = logging.getLogger("aiolocks")

#: how long the leader's watch on its record waits between two reads when nothing wakes it
_RECHECK = 30.0


@final
class LeaderLatch:
    """Leader election among the started latches of one name.

    >>> latch = backend.leader_latch("leaders/cron", participant_id="host-a")  # doctest: +SKIP
    >>> async with latch:  # start() ... close()  # doctest: +SKIP
    ...     if await latch.wait_for_leadership(timeout=30):
    ...         ...

    Exactly one started latch per name has leadership at a time. When the
    leader closes or loses its session/lease, the next one takes over.
    ``has_leadership`` turns false as soon as a loss is detected (a warning
    is logged); the latch then queues again by itself.

    :raises RuntimeError: ``start()`` on a latch that was already started.
    """

    def __init__(
        self,
        engine: Engine,
        name: str,
        participant_id: str | None,
        options: Mapping[str, object],
        value: object = None,
    ) -> None:
        participant_id = check_id(f"leader latch {name!r}: participant_id", participant_id)
        self._name = name
        self._key = engine.validate_name(name)
        self._engine = engine
        self._participant_id = participant_id
        self._options = engine.lock_options(Family.LEADER, options)
        self._value = _json_value(name, value)
        self._store: Records | None = None
        self._record_key = ""  # latch/<name>/leader, where there is a store
        if value is not None or isinstance(engine.driver, SupportsRecords):
            self._store = store_of(engine, f"leader latch {name!r} with a value")
            self._record_key = engine.validate_name(f"latch/{self._key}") + "/leader"
        self._advert: Entry | None = None  # our leader record, while we lead
        self._advert_term: Hold | None = None  # the term whose record is settled
        self._advert_watch: asyncio.Task[None] | None = None
        self._advert_lock = asyncio.Lock()
        self._wake = asyncio.Event()  # wakes the runner: loss, or the record to write again
        self._hold: Hold | None = None
        self._runner: asyncio.Task[None] | None = None
        self._leading = asyncio.Event()
        self._state = "latent"  # latent -> started -> closed

    @property
    def name(self) -> str:
        """The name this latch was created with."""
        return self._name

    @property
    def participant_id(self) -> str:
        """This participant's id (a uuid unless given)."""
        return self._participant_id

    @property
    def has_leadership(self) -> bool:
        """This latch leads now."""
        hold = self._hold
        return hold is not None and hold.grant.verify()

    @property
    def fencing_token(self) -> int | None:
        """Token of the current leadership term; ``None`` when not leading."""
        hold = self._hold
        return None if hold is None or hold.lost else hold.token

    @property
    def value(self) -> JSONValue:
        """What this latch advertises while it leads (``value=``, then ``proclaim()``)."""
        return self._value

    @property
    def is_started(self) -> bool:
        """``start()`` was called and ``close()`` was not."""
        return self._state == "started"

    def __repr__(self) -> str:
        role = "leader" if self.has_leadership else self._state
        return f"<LeaderLatch {self._name!r} id={self._participant_id!r} {role}>"

    async def start(self) -> None:
        """Join the election; returns at once (leadership comes later)."""
        if self._state != "latent":
            raise RuntimeError(f"leader latch {self._name!r} was already {self._state}")
        self._engine.check_open()
        await self._engine.open()
        self._state = "started"
        self._engine.latches.add(self)
        self._runner = self._engine.spawn(
            self._run(), name=f"aiolocks-leader:{self._key}:{self._participant_id}"
        )

    async def close(self) -> None:
        """Leave the election, giving up leadership; idempotent; completes even if cancelled."""
        if self._state == "closed":
            return
        self._state = "closed"
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            cancelled = await wait_finished(runner)
            if cancelled is not None:
                raise cancelled

    def stop_on_close(self) -> None:
        """The backend is closing: stop leading without awaiting."""
        self._state = "closed"
        if self._runner is not None:
            self._runner.cancel()
            self._runner = None

    async def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Wait until this latch leads; ``False`` when ``timeout`` passed first.

        :raises RuntimeError: the latch is not started.
        """
        seconds = check_timeout(timeout)
        if self._state != "started":
            raise RuntimeError(f"leader latch {self._name!r} is {self._state}, not started")
        try:
            async with asyncio.timeout(seconds):
                while not self._leads():
                    await self._leading.wait()
                    if not self._leads():
                        self._leading.clear()
        except TimeoutError:
            return self._leads()
        return True

    def _leads(self) -> bool:
        hold = self._hold
        return hold is not None and not hold.lost

    async def leader(self) -> Participant | None:
        """The current leader, with the ``value`` it advertises; ``None`` when nobody started.

        ``value`` is ``None`` until the leader's record is written (just after it gains
        leadership) and on a backend without a record store.
        """
        for participant in await self.participants():
            if participant.is_holder:
                if self._store is None:
                    return participant
                advertised = _advertised(await self._store.read(self._record_key))
                if advertised is not None and advertised.id == participant.id:
                    return dataclasses.replace(participant, value=advertised.value)
                return participant
        return None

    async def proclaim(self, value: object) -> None:
        """Advertise ``value`` (JSON) as this latch's value: now if it leads, and in later terms.

        >>> await latch.proclaim({"url": "http://10.0.0.7:8080"})  # doctest: +SKIP

        Observers (``observe()``, ``leader()``) see it once the leader's record is
        updated; a latch that does not lead keeps it for when it does.

        :raises ValueError: ``value`` is not JSON (before any I/O).
        :raises NotImplementedError: the backend has no record store.
        """
        store = self._records("proclaim()")
        self._value = _json_value(self._name, value)
        hold = self._hold
        if hold is None or hold.lost:
            return
        rewrite, cancelled = await finish(
            self._engine, self._rewrite(store, hold), f"aiolocks-proclaim:{self._key}"
        )
        if cancelled is not None:
            raise cancelled
        rewrite.result()  # its error, if any

    async def observe(self) -> AsyncIterator[Participant | None]:
        """Yield the leader now, then again each time it changes or proclaims a value.

        >>> async for leader in latch.observe():  # doctest: +SKIP
        ...     print(None if leader is None else (leader.id, leader.value))

        ``None`` while nobody leads (between two terms, too). Works on a latch
        that was never started. The leader is the one whose record is written:
        a leader whose session ended is gone as soon as the server lets its
        record go.

        :raises NotImplementedError: the backend has no record store.
        """
        store = self._records("observe()")
        self._engine.check_open()
        await self._engine.open()
        seen: tuple[int | None] | None = None  # (record version,) last yielded
        while True:
            with await store.snapshot(self._record_key.rpartition("/")[0]) as snap:
                record = snap.records.get("leader")
                state = (None if record is None else record.version,)
                if state != seen:
                    seen = state
                    yield _advertised(record)
                await snap.changed(None)

    def _records(self, what: str) -> Records:
        if self._store is None:
            return store_of(self._engine, f"leader latch {self._name!r}: {what}")
        return self._store

    async def participants(self) -> list[Participant]:
        """Every started latch of this name, the leader first."""
        return await self._engine.participants(Family.LEADER, self._key)

    async def __aenter__(self) -> LeaderLatch:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _run(self) -> None:
        engine = self._engine
        request = Request(
            name=self._key,
            family=Family.LEADER,
            mode=Mode.EXCLUSIVE,
            participant=self._participant_id,
            options=self._options,
        )
        while True:
            try:
                grants = await engine.acquire(request, None)
            except BackendUnavailableError as exc:
                if engine.closed:
                    return
                logger.warning("leader latch %r: cannot reach %s: %s", self._name, engine.url, exc)
                await asyncio.sleep(1.0)
                continue
            if not grants:
                continue
            # Leadership is a hold like any other: "lost", "renewed" and
            # "released" events, and close() releases it.
            hold = Hold(engine, grants[0], kind="leader latch", owner=None)
            hold.grant.add_loss_listener(self._waker)
            self._hold = hold
            self._leading.set()
            try:
                await self._lead(hold)
                logger.warning(
                    "leader latch %r (%s) lost leadership: %s",
                    self._name,
                    self._participant_id,
                    hold.grant.lost_reason,
                )
            finally:
                self._hold = None
                self._leading.clear()
                # stop advertising before the next leader can start
                withdrawn = await self._withdraw()
                try:
                    await engine.release(hold)
                except Exception as exc:
                    logger.warning("leader latch %r: releasing failed: %s", self._name, exc)
                if withdrawn is not None:
                    raise withdrawn

    def _waker(self, _: object) -> None:
        self._wake.set()

    async def _lead(self, hold: Hold) -> None:
        """Keep this term's leader record written (where there is a store) until the loss."""
        while not hold.lost:
            self._wake.clear()
            if self._store is not None and self._advert_term is not hold:
                written, cancelled = await finish(
                    self._engine,
                    self._advertise(self._store, hold),
                    f"aiolocks-advertise:{self._key}",
                )
                if cancelled is not None:
                    raise cancelled
                if written.exception() is not None:
                    logger.warning(
                        "leader latch %r: writing the leader record failed (again in 1 s): %s",
                        self._name,
                        written.exception(),
                    )
                    try:
                        async with asyncio.timeout(1.0):
                            await self._wake.wait()
                    except TimeoutError:
                        pass
                    continue
            await self._wake.wait()

    def _advert_data(self, hold: Hold) -> bytes:
        what = f"leader latch {self._name!r}: value"
        return dump_json(
            what, {"id": self._participant_id, "value": self._value, "token": hold.token}
        )

    async def _advertise(self, store: Records, hold: Hold) -> None:
        """Write the leader record of ``hold``'s term, replacing one an earlier term left."""
        async with self._advert_lock:
            for _ in range(3):
                if hold.lost or self._hold is not hold:
                    return
                entry = await store.join(self._record_key, self._advert_data(hold))
                if entry is not None:
                    self._advert, self._advert_term = entry, hold
                    entry.add_loss_listener(self._advert_lost)
                    self._advert_watch = self._engine.spawn(
                        self._watch_advert(store, entry), name=f"aiolocks-advert:{self._key}"
                    )
                    return
                record = await store.read(self._record_key)
                if record is None:
                    continue
                other = _advertised(record)
                token = None if other is None else other.fencing_token
                if token is not None and token > hold.token:
                    self._advert_term = hold  # a later term wrote it: this latch is stale
                    return
                await store.delete(self._record_key, version=record.version)
            raise BackendUnavailableError(
                f"leader latch {self._name!r}: the leader record kept being replaced"
            )

    async def _watch_advert(self, store: Records, entry: Entry) -> None:
        """Notice our leader record deleted or replaced behind our back: write it again."""
        prefix = self._record_key.rpartition("/")[0]
        while self._advert is entry and not entry.lost and not self._engine.closed:
            try:
                # read under the lock: no proclaim() update in flight when comparing versions
                async with self._advert_lock:
                    snap = await store.snapshot(prefix)
                with snap:
                    record = snap.records.get("leader")
                    if record is None or record.version != entry.version:
                        if self._advert is entry:
                            self._advert, self._advert_term = None, None
                            self._wake.set()
                        return
                    await snap.changed(_RECHECK)
            except BackendUnavailableError as exc:
                logger.debug("leader latch %r: watching the leader record: %s", self._name, exc)
                await asyncio.sleep(1.0)

    def _advert_lost(self, entry: Entry) -> None:
        if self._advert is entry:
            self._advert_term = None  # write it again while leading
            self._wake.set()

    async def _rewrite(self, store: Records, hold: Hold) -> None:
        """``proclaim()``: update this term's leader record with the new value."""
        async with self._advert_lock:
            entry = self._advert
            if hold.lost or self._hold is not hold or self._advert_term is not hold:
                self._wake.set()  # the runner writes the record (with the new value)
                return
            if entry is None:
                return  # a later term's record stands: this latch is stale
            version = await store.update(entry.key, self._advert_data(hold), version=entry.version)
            if version is None:  # deleted or replaced behind our back
                self._advert, self._advert_term = None, None
                self._wake.set()
            else:
                entry.version = version

    async def _withdraw(self) -> asyncio.CancelledError | None:
        """Delete this term's leader record (awaited to its end); the caller's cancellation."""
        if self._store is None:
            return None
        _, cancelled = await finish(
            self._engine, self._delete_advert(self._store), f"aiolocks-withdraw:{self._key}"
        )
        return cancelled

    async def _delete_advert(self, store: Records) -> None:
        async with self._advert_lock:
            entry, self._advert, self._advert_term = self._advert, None, None
            watch, self._advert_watch = self._advert_watch, None
            if watch is not None:
                watch.cancel()
            if entry is None or entry.lost:
                return  # nothing written, or it went with the session
            try:
                await store.delete(entry.key, version=entry.version)
            except Exception as exc:
                logger.warning("leader latch %r: deleting the leader record: %s", self._name, exc)


def _json_value(name: str, value: object) -> JSONValue:
    """``value`` as every process will read it back (JSON round trip), or ValueError."""
    return load_json(dump_json(f"leader latch {name!r}: value", value))


def _advertised(record: Record | None) -> Participant | None:
    """The leader a leader record names, or ``None`` (absent or not ours)."""
    if record is None:
        return None
    try:
        data = load_json(record.value)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    member_id, token = data.get("id"), data.get("token")
    if not isinstance(member_id, str) or not isinstance(token, int):
        return None
    return Participant(member_id, True, token, "exclusive", value=data.get("value"))
