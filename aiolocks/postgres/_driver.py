"""The PostgreSQL driver, ``mode=advisory``: session-level advisory locks on asyncpg.

Design note
-----------
**Sessions.** An advisory lock belongs to the server *session* that took it,
so the driver keeps its own connections (never a pooled one that goes back
to a pool, whose reset runs ``pg_advisory_unlock_all()``). The *primary*
session runs every non-blocking try, the heartbeat, ``participants`` and the
releases of what it holds. A blocking ``pg_advisory_lock`` occupies its
connection until granted, so each waiting attempt borrows an *extra*
session; the lock it wins stays held by that session (a lock cannot move
between sessions) until released, and the session goes back to the idle
list once it holds nothing.

**One server lock per session and key.** Advisory locks stack per session: a
second ``pg_try_advisory_lock`` of the same key on the same session succeeds.
The driver therefore never sends a lock call for a key (in a mode) on a
session that already holds or is asking for it: another session is used
instead, and the server arbitrates between sessions as between processes.
Reentrancy stays the core's. A write-to-read downgrade is the one
exception: it takes the shared lock on the writer's own session, which the
server grants at once, so no queued writer slips in.

**Readers share.** The first reader of a name in this backend takes the
shared lock on a session; later readers *join* it (:class:`_Shared` counts
them; each draws its own token, in a statement that refuses while a session
waits for the name exclusively, as the server refuses a fresh shared try
then) and the last one out unlocks. Readers that must wait queue behind the
one of them that asks the server, and join its grant. So readers never need
a session each.

**Connections.** At most ``1 + max_sessions`` connections per backend: the
primary plus ``max_sessions`` extra sessions (default 8), each either waiting
for one lock or holding the locks it won. Tries (semaphore slots included)
run on the primary, so a free lock is taken whatever the extra sessions do;
``max_sessions`` bounds the names waited for on the server at once (plus
what such waits won and still hold). When every extra session is busy,
a further waiter waits for a local release or a session to come free, and
tries again at least every ``heartbeat`` seconds (a lock freed by another
process is noticed that way only in this overflow case).

**Hand-offs.** Tasks of this backend waiting for an exclusive lock
(mutex, semaphore mutex, write lock) that another of its tasks holds, or
already waits for on the server, queue locally instead of taking a session
each. A release with a task queued keeps the server lock on its session and
passes it on with a new token (the chain's tokens are drawn in one round
trip, see :meth:`PostgresAdvisoryDriver._hand_off`); after ``MAX_HANDOFFS``
in a row it really unlocks so that other processes get their turn. Idle
extra sessions are closed only after ``heartbeat`` seconds idle.

**Fencing tokens** come from one sequence (see :mod:`._sql`).

**Participants.** ``pg_locks`` shows sessions, not holds (readers joined on
one lock, a hold passed on by a hand-off, tasks queued in a backend). So
``participants`` lists what each session stands for: ours from memory,
another backend's by asking it with ``NOTIFY`` (it answers with ids and
tokens; nothing is written per grant for that).

**Semaphores.** A semaphore of N is N slot keys, taken on the primary; a
try chooses among the slots we do not hold once the primary is its own
(tries run one after the other), so it never mistakes the candidates of a
concurrent try for held slots. A waiter cannot block on
"any of N" keys, so semaphore releases send ``NOTIFY`` on the backend's
channel with the semaphore's name, the primary session ``LISTEN``s, and a
waiter wakes on a notification (or a local release), then tries again. A
crashed holder publishes nothing: a semaphore waiter also tries again every
``heartbeat`` seconds.

**Loss.** Each session has a termination listener (the server ended it, the
socket closed): every hold of the session is lost at once. The heartbeat
runs every ``heartbeat / 2`` seconds on each session that holds locks,
compares ``pg_locks`` with what the session should hold, and gives up on a
session whose check does not answer within ``heartbeat / 2 + 1`` s (a
stalled link): it is closed and its holds are lost. A hold is so declared
lost within ``heartbeat`` + 1 s of its session's end. TCP keep-alives are
set on both ends of every session, and the heartbeat keeps
``idle_session_timeout`` from ending an idle holder.

**Cancellation.** Before a lock call is sent, the (key, mode) is reserved on
the session and the attempt notes the call as unanswered; when its answer
arrives the note is cleared. ``abandon`` runs the check-and-unlock query on
that same session (asyncpg keeps the order of one connection, after the
cancelled call), which releases a lock the server granted after we stopped
listening.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast, final

import asyncpg

from .._core.backoff import Backoff
from .._core.doctor import Diagnosis
from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError, LockError
from .._core.options import check_portable_options
from .._core.participants import Participant
from .._core.tasks import TaskSet, wait_done
from ._asyncpg_compat import bind_execute, stale, statement_state
from ._client import Connect, Connection
from ._errors import REFUSED, denied
from ._errors import TRANSIENT as _TRANSIENT
from ._sql import (
    AdvisoryQueries,
    TableNames,
    advisory_key,
    configure_keepalives,
    ensure_schema,
    held_advisory_locks,
    probe_session,
    slot_keys,
)
from ._state import ConnectionState, StateBroadcaster

if TYPE_CHECKING:
    from ._admin import PostgresAdvisoryAdmin
    from ._records import PostgresRecords

__all__ = ["DEFAULT_MAX_SESSIONS", "PostgresAdvisoryDriver", "PostgresPoolerError"]

logger = logging.getLogger("aiolocks.postgres")

#: extra sessions (waiting or holding what they won) per backend, besides the primary
DEFAULT_MAX_SESSIONS = 8

#: fencing names remembered as recorded (then forgotten at once; re-recording is harmless)
_MAX_REGISTERED = 65536

#: local hand-offs of one lock in a row before it is really unlocked (so that
#: other processes' waiters, queued on the server, get their turn)
MAX_HANDOFFS = 16

#: seconds ``participants`` waits for another backend to tell its holder's token
_TOKEN_ASK_BOUND = 1.0

#: seconds a write-to-read downgrade may take on the writer's session (it is
#: granted at once; this only bounds a surprise)
_DOWNGRADE_BOUND = 5.0


#: a connection the server ended between two of our calls can surface as a
#: client protocol error on the next call; the session is unusable either way
_BROKEN: tuple[type[BaseException], ...] = (*_TRANSIENT, asyncpg.exceptions.InternalClientError)


#: a lock call's errors that become a :class:`LockError` (unavailable, or
#: :class:`AccessDeniedError` for a refused privilege)
_FAILED: tuple[type[BaseException], ...] = (*_TRANSIENT, *REFUSED)


#: what a reconnect attempt waits out (the server is not reachable yet)
_RECONNECT_ERRORS: tuple[type[BaseException], ...] = (BackendUnavailableError, *_BROKEN)


class _SessionGone(BackendUnavailableError):
    """A lock call found its session ended by the server (a try may go again, once)."""


class PostgresPoolerError(LockError, RuntimeError):
    """``mode=advisory`` was pointed at a connection pooler, where session locks mean nothing."""


def _unavailable(exc: BaseException, what: str, where: str) -> LockError:
    return denied(exc, what, where) or BackendUnavailableError(
        f"PostgreSQL {where}: {what} failed: {exc!r}"
    )


# (key, shared)
LockId = tuple[int, bool]


class _Session:
    """One server session (asyncpg connection) and what it holds or asks for."""

    __slots__ = (
        "alive",
        "conn",
        "dedicated",
        "grants",
        "idle_since",
        "io",
        "pid",
        "primary",
        "reserved",
        "statements",
        "waiting",
        "waiting_fence",
        "waiting_for",
        "waiting_mode",
    )

    def __init__(self, conn: Any, primary: bool) -> None:
        self.conn = conn
        self.primary = primary
        self.pid = int(conn.get_server_pid())
        self.io = asyncio.Lock()
        #: lock ids with a call in flight or held (never sent twice on one session)
        self.reserved: set[LockId] = set()
        #: grants this session backs -> their lock id
        self.grants: dict[Grant, LockId] = {}
        self.waiting = False
        #: loop time the session last became idle (retired after ``heartbeat``)
        self.idle_since = 0.0
        #: reserved for one leader latch (no other lock is sent here meanwhile)
        self.dedicated = False
        #: participant id, fencing name and mode of the attempt waiting on this session
        self.waiting_for: str | None = None
        self.waiting_fence = ""
        self.waiting_mode = ""
        self.alive = True
        #: query -> (prepared statement, its protocol-level state or ``None``)
        self.statements: dict[str, tuple[Any, Any]] = {}

    def idle(self) -> bool:
        return (
            self.alive
            and not self.waiting
            and not self.dedicated
            and not self.reserved
            and not self.grants
        )

    def settle(self) -> None:
        """Drop the leader dedication once the session holds and asks for nothing."""
        if not self.reserved and not self.grants and not self.waiting:
            self.dedicated = False

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        async with self.io:
            rows: list[Any] = await self.conn.fetch(query, *args, timeout=timeout)
            return rows

    def rows(
        self, query: str, args: tuple[Any, ...], timeout: float | None = None
    ) -> Awaitable[list[Any]]:
        """The rows (at most one) of one of the driver's own statements; hold ``io``.

        The lock and unlock calls are the whole uncontended cycle: each is
        prepared once per session, then run through
        :func:`._asyncpg_compat.bind_execute` (asyncpg's protocol, on the
        releases its version gate admits) or the public
        ``PreparedStatement.fetch``, with the same result. Not a coroutine:
        a protocol call returns the protocol's own awaitable.
        """
        known = self.statements.get(query)
        if known is not None:
            rows = bind_execute(self.conn, known[1], args, timeout)
            if rows is not None:
                return rows
        return self._rows_slow(query, args, timeout)

    async def _rows_slow(
        self, query: str, args: tuple[Any, ...], timeout: float | None
    ) -> list[Any]:
        known = self.statements.get(query)
        if known is None or stale(known[1]):
            prepared = await self.conn.prepare(query, timeout=timeout)
            known = self.statements[query] = (prepared, statement_state(self.conn, prepared))
        prepared, state = known
        rows = bind_execute(self.conn, state, args, timeout)
        if rows is None:
            # (also a connection closed meanwhile: the public call says so)
            public: list[Any] = await prepared.fetch(*args, timeout=timeout)
            return public[:1]
        return await rows


class _PgAttempt(Attempt):
    """One acquire: where its calls went and what the wait won."""

    __slots__ = (
        "fence",
        "generation",
        "grants",
        "handoff",
        "hands_off",
        "keys",
        "pending",
        "reads",
        "retried",
        "server_wait",
        "wait_session",
    )

    def __init__(self, request: Request, keys: list[int], fence: str, hands_off: bool) -> None:
        super().__init__(request)
        self.keys = keys
        #: the name's fencing-table name, ``"<family>/<name>"``
        self.fence = fence
        #: an exclusive hold a release may pass to another task (see :func:`_hands_off`)
        self.hands_off = hands_off
        #: a read that may join the backend's shared hold of the name (see :class:`_Shared`)
        self.reads = (
            request.family is Family.READ_WRITE
            and request.mode is Mode.READ
            and request.downgrade_of is None
        )
        #: lock ids reserved by this attempt, per session, whose call may have won
        self.pending: list[tuple[_Session, LockId]] = []
        self.grants: list[Grant] | None = None
        self.wait_session: _Session | None = None
        #: the driver's change count when the last try began: a wait returns at
        #: once if a local release or a NOTIFY came in since (none is missed)
        self.generation = -1
        #: while queued for a local hand-off: set when handed the lock (or woken)
        self.handoff: asyncio.Future[None] | None = None
        #: the lock id this attempt is blocked on at the server (counted once)
        self.server_wait: LockId | None = None
        #: a try already went again after its session was ended under it
        self.retried = False


@final
class _Handle:
    """``Grant.handle``: the session that holds the lock and the lock id."""

    __slots__ = ("hands_off", "lock", "notify", "session", "shared")

    def __init__(
        self,
        session: _Session,
        lock: LockId,
        hands_off: bool,
        notify: bool,
        shared: _Shared | None = None,
    ) -> None:
        self.session = session
        self.lock = lock
        #: the shared hold this read counts on (the last one out unlocks)
        self.shared = shared
        #: a release may hand the lock to a task queued in this backend
        self.hands_off = hands_off
        #: a semaphore slot: its release sends ``NOTIFY`` for the waiters
        self.notify = notify


@final
class _Shared:
    """One server shared lock of a read/write name, held for every reader of the backend on it.

    A session holds a shared advisory lock once, for as many readers of this
    backend as join it (counted here, not on the server): readers need no
    session each. The last reader out unlocks.
    """

    __slots__ = ("grants", "lock", "session")

    def __init__(self, session: _Session, lock: LockId) -> None:
        self.session = session
        self.lock = lock
        #: the reads counting on this server lock
        self.grants: set[Grant] = set()

    def joinable(self) -> bool:
        """Held, and not on a session that also holds the write lock (a downgrade)."""
        return (
            bool(self.grants)
            and self.session.alive
            and (self.lock[0], False) not in self.session.reserved
        )


def _fencing_name(request: Request) -> str:
    return f"{request.family.value}/{request.name}"


@final
class PostgresAdvisoryDriver:
    """Advisory-lock driver (see the module docstring)."""

    capabilities = Capabilities(fair=False, queue_visible=True, can_lose=True)

    def __init__(
        self,
        connect: Connect,
        *,
        describe: str,
        heartbeat: float = 5.0,
        tables: TableNames | None = None,
        create_tables: bool = True,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        release_connection: Callable[[Any], Awaitable[None]] | None = None,
        check_pooler: bool = True,
    ) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
        if not isinstance(heartbeat, int | float) or isinstance(heartbeat, bool) or heartbeat <= 0:
            raise ValueError(f"heartbeat must be a number of seconds > 0, got {heartbeat!r}")
        self._connect = connect
        self._describe = describe
        self._heartbeat = float(heartbeat)
        self._tables = tables or TableNames()
        self._create_tables = create_tables
        self._max_sessions = max_sessions
        self._release_connection = release_connection
        self._check_pooler = check_pooler
        self._queries = AdvisoryQueries.build(self._tables)
        self._primary: _Session | None = None
        self._primary_lock = asyncio.Lock()
        self._extra: list[_Session] = []
        self._opening = 0
        self._owned: TaskSet | None = None
        self._beat_timer: asyncio.TimerHandle | None = None
        self._retire_timer: asyncio.TimerHandle | None = None
        self._beat_task: asyncio.Task[None] | None = None
        #: woken on every local release, session freed, semaphore NOTIFY
        self._change: asyncio.Future[None] | None = None
        #: how many times :meth:`_wake` ran (a try notes it; see ``_PgAttempt.generation``)
        self._generation = 0
        #: (family, name) -> (key, fencing name) of exclusive and shared locks
        self._names: dict[tuple[Family, str], tuple[int, str]] = {}
        self._closed = False
        #: semaphore name -> largest max_leases seen (participants lists every slot)
        self._slots: dict[str, int] = {}
        #: fencing names known to have their row (grants skip the row write)
        self._registered: set[str] = set()
        #: exclusive lock id -> our grant holding it (may be stale: check before use)
        self._held_by: dict[LockId, Grant] = {}
        #: read/write key -> the shared hold that new readers join
        self._shared: dict[int, _Shared] = {}
        #: lock id -> our attempts queued for a hand-off (exclusive) or for the
        #: shared grant another reader of ours asks for (shared), in arrival order
        self._queued: dict[LockId, dict[_PgAttempt, None]] = {}
        #: lock id -> how many of our attempts block on the server for it (or, for
        #: a shared lock, try it)
        self._server_waiters: dict[LockId, int] = {}
        #: exclusive lock id -> hand-offs in a row since its last real unlock
        self._handoffs: dict[LockId, int] = {}
        #: exclusive lock id -> (session, tokens drawn for the rest of a hand-off chain)
        self._tokens: dict[LockId, tuple[_Session, list[int]]] = {}
        #: the connection state (see :mod:`._state`)
        self.states = StateBroadcaster()
        self._reconnect_task: asyncio.Task[None] | None = None
        #: (pid, fencing name) -> the answer to our question for what that session holds
        self._entry_asks: dict[tuple[int, str], asyncio.Future[list[_Entry]]] = {}
        #: (pid, fencing name) -> the parts of that answer received so far
        self._entry_parts: dict[tuple[int, str], dict[int, list[_Entry]]] = {}
        #: the record store (:meth:`records`), made on first use
        self._records: PostgresRecords | None = None

    # -- identity ---------------------------------------------------------

    def describe(self) -> str:
        """``postgresql://host:port/db`` without credentials."""
        return self._describe

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        """Accept the portable ``fair``/``lease_time``/``watchdog`` (no effect here)."""
        return check_portable_options(family, options, self._describe)

    def records(self) -> PostgresRecords:
        """The record store under the coordination recipes (one per driver; no I/O)."""
        if self._records is None:
            from ._records import AdvisoryLink, PostgresRecords

            self._records = PostgresRecords(AdvisoryLink(self), self._tables)
        return self._records

    @property
    def channel(self) -> str:
        """The ``NOTIFY`` channel of semaphore releases."""
        return self._tables.channel

    # -- sessions ---------------------------------------------------------

    def _wake(self) -> None:
        self._generation += 1
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)
        if self._queued:
            self._wake_queued()

    def _change_future(self) -> asyncio.Future[None]:
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    async def _new_session(self, primary: bool) -> _Session:
        try:
            conn = await self._connect()
        except (*_TRANSIENT, *REFUSED) as exc:
            raise _unavailable(exc, "connect", self._describe) from exc
        try:
            if primary and self._check_pooler:
                probe = await probe_session(conn, statements=2)
                if probe.pooled:
                    raise PostgresPoolerError(
                        f"{self._describe}: {probe.describe()}; session advisory locks are "
                        "meaningless behind a pooler: connect to the server directly, or use "
                        "mode=lease"
                    )
            idle = max(1.0, self._heartbeat)
            await configure_keepalives(conn, idle=idle, interval=1.0, count=3)
            if primary:
                await ensure_schema(conn, self._tables, create=self._create_tables)
                await conn.add_listener(self.channel, self._on_notify)
                await conn.add_listener(self._tables.token_channel, self._on_token)
        except BaseException:
            await self._drop_connection(conn)
            raise
        session = _Session(conn, primary)
        conn.add_termination_listener(lambda _conn: self._session_ended(session, "closed"))
        return session

    async def _drop_connection(self, conn: Any) -> None:
        if self._release_connection is not None:
            try:
                conn.terminate()
            finally:
                await self._release_connection(conn)
        else:
            conn.terminate()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, _payload: str) -> None:
        self._wake()

    def _on_token(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        """``??<pid>,<pid>… <fence>``: a question (:meth:`_ask_entries`); ``!!{…}``: an answer."""
        try:
            if payload.startswith("??"):
                pids_text, fence = payload[2:].split(" ", 1)
                self._answer_entries([int(p) for p in pids_text.split(",")], fence)
            elif payload.startswith("!!"):
                answer = json.loads(payload[2:])
                if isinstance(answer, dict):
                    self._on_answer(answer)
        except (ValueError, KeyError, TypeError, IndexError):
            logger.debug("ignored a malformed notification %r", payload)

    def _session_ended(self, session: _Session, why: str) -> None:
        if not session.alive:
            return
        if (session.primary or session.grants) and not self._closed:
            self.states.set(ConnectionState.LOST)
            self._start_reconnect()
        session.alive = False
        if session is self._primary:
            self._primary = None
        if session in self._extra:
            self._extra.remove(session)
        grants = list(session.grants)
        session.grants.clear()
        session.reserved.clear()
        for key in [k for k, hold in self._shared.items() if hold.session is session]:
            del self._shared[key]
        for lock in [k for k, (owner, _t) in self._tokens.items() if owner is session]:
            del self._tokens[lock]
        for grant in grants:
            grant.mark_lost(
                f"its PostgreSQL session (pid {session.pid}) ended ({why}); "
                "the server dropped its advisory locks"
            )
        # Whatever ended it, the connection is done: close it (a broken but
        # open one would keep its session and locks) and, when it was borrowed,
        # hand it back so that the user's pool does not shrink for good
        # (both steps are idempotent; the callers that drop it too are fine).
        if self._records is not None:
            self._records.session_ended(session, why)  # its ephemeral records went too
        session.conn.terminate()
        if self._release_connection is not None and self._owned is not None:
            self._owned.spawn(
                self._drop_connection(session.conn), name="aiolocks-pg-return", log_errors=False
            )
        self._wake()

    def _start_reconnect(self) -> None:
        """Open a primary session again in the background (the state's ``RECONNECTED``)."""
        if self._owned is None or self._closed:
            return
        if self._reconnect_task is None or self._reconnect_task.done():
            self._reconnect_task = self._owned.spawn(
                self._reconnect(), name="aiolocks-pg-reconnect"
            )

    async def _reconnect(self) -> None:
        backoff = Backoff(math.inf, first=0.05, cap=self._heartbeat)
        while not self._closed:
            primary = self._primary
            try:
                if primary is not None and primary.alive:
                    await primary.fetch("SELECT 1", timeout=self._heartbeat)
                    self.states.connected()
                    return
                await self._get_primary()  # reports RECONNECTED
                return
            except _RECONNECT_ERRORS as exc:
                logger.info("PostgreSQL %s: not connected yet: %r", self._describe, exc)
                self.states.set(ConnectionState.SUSPENDED)
            await backoff.wait()

    async def _get_primary(self) -> _Session:
        if self._closed:
            raise BackendUnavailableError(f"backend {self._describe} is closed")
        primary = self._primary
        if primary is not None and primary.alive:
            return primary
        async with self._primary_lock:
            primary = self._primary
            if primary is None or not primary.alive:
                primary = self._primary = await self._new_session(primary=True)
                self.states.connected()
            return primary

    async def _session_for(
        self, lock: LockId, *, wait: bool, leader: bool = False
    ) -> _Session | None:
        """A session where ``lock`` may be sent, or ``None`` when every one is taken.

        ``leader``: an extra session of its own (its ``application_name`` shows
        the participant id to other processes), like a wait.
        """
        if not wait and not leader:
            primary = await self._get_primary()
            if not _touches(primary, lock[0]):
                return primary
            for session in self._extra:
                if (
                    session.alive
                    and not session.waiting
                    and not session.dedicated
                    and not _touches(session, lock[0])
                ):
                    return session
        else:
            for session in self._extra:
                if session.idle():
                    if leader:
                        session.dedicated = True
                    return session
        if len(self._extra) + self._opening >= self._max_sessions:
            return None
        self._opening += 1
        try:
            session = await self._new_session(primary=False)
        finally:
            self._opening -= 1
        if leader:
            session.dedicated = True
        self._extra.append(session)
        return session

    def _maybe_retire(self, session: _Session) -> None:
        """Arm the retirement of idle extra sessions (one is kept; see :meth:`_retire_idle`).

        Not at once: under contention a session freed now is wanted again
        a moment later, and a new connection costs far more than a query.
        """
        session.settle()
        if session.primary or not session.idle():
            return
        session.idle_since = asyncio.get_running_loop().time()
        if self._retire_timer is None and not self._closed:
            self._retire_timer = asyncio.get_running_loop().call_later(
                self._heartbeat, self._retire_idle
            )

    def _retire_idle(self) -> None:
        """Close extra sessions idle for ``heartbeat`` seconds or more, keeping one idle."""
        self._retire_timer = None
        if self._closed:
            return
        now = asyncio.get_running_loop().time()
        idle = sorted(
            (s for s in self._extra if s.idle()), key=lambda s: s.idle_since, reverse=True
        )
        for session in idle[1:]:
            if now - session.idle_since < self._heartbeat:
                continue
            self._extra.remove(session)
            session.alive = False
            if self._release_connection is None:
                session.conn.terminate()
            elif self._owned is not None:
                self._owned.spawn(self._drop_connection(session.conn), name="aiolocks-pg-retire")
        if sum(1 for s in self._extra if s.idle()) > 1:
            self._retire_timer = asyncio.get_running_loop().call_later(
                self._heartbeat, self._retire_idle
            )

    # -- lifecycle --------------------------------------------------------

    async def open(self, tasks: TaskSet) -> None:
        """Connect the primary session (pooler check, keep-alives, tables); start the heartbeat."""
        self._owned = tasks
        await self._get_primary()

    def _ensure_heartbeat(self) -> None:
        """Arm the heartbeat timer when the first hold appears (it stops once none is left).

        A timer, not a sleeping task: between two checks nothing runs, and a
        check is a short owned task.
        """
        if self._beat_timer is None and self._beat_task is None and not self._closed:
            self._beat_timer = asyncio.get_running_loop().call_later(
                self._heartbeat / 2, self._beat
            )

    def _beat(self) -> None:
        self._beat_timer = None
        if self._closed or self._owned is None:
            return
        self._beat_task = self._owned.spawn(self._heartbeat_once(), name="aiolocks-pg-heartbeat")

    async def _heartbeat_once(self) -> None:
        try:
            timeout = self._heartbeat / 2 + 1.0
            sessions = [s for s in [self._primary, *self._extra] if s is not None and s.alive]
            for session in sessions:
                if session.grants:
                    await self._check_session(session, timeout=timeout)
        finally:
            self._beat_task = None
        if any(s.grants for s in [self._primary, *self._extra] if s is not None):
            self._ensure_heartbeat()

    async def close(self) -> None:
        """Stop the heartbeat and close every session (the server drops what they held).

        This backend's ephemeral records are deleted first (an orderly leave).
        """
        if self._records is not None and not self._closed:
            await self._records.close()
        self._closed = True
        timer, self._beat_timer = self._beat_timer, None
        if timer is not None:
            timer.cancel()
        retire, self._retire_timer = self._retire_timer, None
        if retire is not None:
            retire.cancel()
        task = self._beat_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        sessions = [s for s in [self._primary, *self._extra] if s is not None]
        self._primary = None
        self._extra = []
        self.states.close()
        for session in sessions:
            session.alive = False
            await self._drop_connection(session.conn)
        self._wake()

    async def _check_session(self, session: _Session, *, timeout: float) -> None:
        if session.waiting:
            return
        try:
            async with session.io:
                # Waiting for the session's turn, its holds may all have been
                # released and the session retired (closed): nothing to check.
                if not session.alive or not session.grants:
                    return
                expected = dict(session.grants)
                held = await held_advisory_locks(
                    cast(Connection, _Timed(session.conn, timeout)), self._queries
                )
        except _BROKEN as exc:  # TimeoutError is an OSError
            logger.warning(
                "PostgreSQL session pid %s did not answer the heartbeat: %r", session.pid, exc
            )
            self._session_ended(session, f"heartbeat failed: {exc!r}")
            await self._drop_connection(session.conn)
            return
        for grant, (key, shared) in expected.items():
            if grant not in session.grants:
                continue  # released meanwhile
            if ("ShareLock" if shared else "ExclusiveLock") not in held.get(key, frozenset()):
                session.grants.pop(grant, None)
                session.reserved.discard((key, shared))
                handle = grant.handle
                if isinstance(handle, _Handle) and handle.shared is not None:
                    self._leave_shared(grant, handle.shared)
                grant.mark_lost(
                    f"the heartbeat found no advisory lock {key} in pg_locks for session "
                    f"pid {session.pid} (unlocked behind our back)"
                )

    # -- attempts ---------------------------------------------------------

    def _name(self, family: Family, name: str) -> tuple[int, str]:
        """``(key, fencing name)`` of a lock, hashed once per name (SHA-256 is not free)."""
        known = self._names.get((family, name))
        if known is None:
            if len(self._names) >= _MAX_REGISTERED:
                self._names.clear()
            known = self._names[(family, name)] = (
                advisory_key(family.value, name),
                f"{family.value}/{name}",
            )
        return known

    def begin(self, request: Request) -> Attempt:
        """Compute the key(s); no I/O (advisory locks need no minted ids)."""
        family = request.family
        if family is Family.SEMAPHORE:
            self._slots[request.name] = max(request.max_leases, self._slots.get(request.name, 1))
            keys = slot_keys(request.name, request.max_leases)
            return _PgAttempt(request, keys, _fencing_name(request), False)
        key, fence = self._name(family, request.name)
        return _PgAttempt(request, [key], fence, _hands_off(request))

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """``pg_try_advisory_lock*`` with the fencing bump, on a session free for that key."""
        a: _PgAttempt = attempt  # type: ignore[assignment]  # (our begin made it; no cast call)
        if a.grants is not None:
            return a.grants
        # Noted before the try: a release between our "no" and the wait is not missed.
        a.generation = self._generation
        request = a.request
        if request.mode is Mode.LEASE:
            return await self._try_slots(a)
        key = a.keys[0]
        shared = request.mode is Mode.READ
        lock = (key, shared)
        if a.hands_off and self._held_by and self._holder(lock) is not None:
            # Held by another task of this backend: the server would say no;
            # wait for the hand-off instead.
            return None
        if a.reads:
            hold = self._shared.get(key)
            if hold is not None and hold.joinable():
                return await self._join(a, hold)
            if self._server_waiters.get(lock, 0) > 0:
                return None  # another reader of ours asks the server: join its grant
        if request.downgrade_of is not None:
            handle = request.downgrade_of.handle
            session: _Session | None = handle.session if isinstance(handle, _Handle) else None
            if session is None or not session.alive or lock in session.reserved:
                session = await self._session_for(lock, wait=False)
        elif request.family is Family.LEADER:
            session = await self._leader_session(a, lock, wait=False)
        else:
            session = self._primary
            if (
                session is None
                or not session.alive
                or (session.reserved and _touches(session, key))
            ):
                session = await self._session_for(lock, wait=False)
        if session is None:
            return None
        query, extra = self._grant_sql(a, wait=False, shared=shared)
        downgrade = request.downgrade_of
        if (
            downgrade is not None
            and isinstance(downgrade.handle, _Handle)
            and downgrade.handle.session is session
        ):
            # The try form refuses while a writer waits; the blocking form
            # is granted at once on the session that holds the write lock
            # (the server puts it ahead of the waiters it would conflict
            # with). A short bound guards the shared connection anyway.
            try:
                wait_query, wait_extra = self._grant_sql(a, wait=True, shared=True)
                row = await self._send(
                    a, session, lock, wait_query, a.keys[0], *wait_extra, timeout=_DOWNGRADE_BOUND
                )
            except TimeoutError:
                await self._unlock_pending(a)
                return None
            return None if row is None else [self._grant(a, session, lock, int(row[0]))]
        if a.reads:
            self._begin_server_wait(a, lock)  # the backend's other readers wait for this one
        try:
            row = await self._send(a, session, lock, query, a.keys[0], *extra)
        except _SessionGone:
            self._end_server_wait(a)
            if a.retried:
                raise
            a.retried = True  # once: the next session is a fresh one
            return await self.try_once(a)
        grants = None if row is None else [self._grant(a, session, lock, int(row[0]))]
        if a.reads:
            self._end_server_wait(a)  # after the grant is recorded: the readers join it
        return grants

    async def _join(self, a: _PgAttempt, hold: _Shared) -> list[Grant] | None:
        """A read counted on the shared lock the backend holds: a token, no lock call.

        Refused (``None``) while a session waits for the name exclusively, as
        the server refuses a fresh shared try then: the reader waits behind
        that writer. Also when the hold ended while the token was drawn.
        """
        primary = await self._get_primary()
        try:
            rows = await primary.fetch(self._queries.join_shared, a.keys[0])
        except _FAILED as exc:
            raise _unavailable(exc, "lock call", self._describe) from exc
        # Answered: from here to the return, no await.
        if not rows or self._shared.get(a.keys[0]) is not hold or not hold.joinable():
            return None
        return [self._grant(a, hold.session, hold.lock, int(rows[0][0]), hold)]

    async def _leader_session(self, a: _PgAttempt, lock: LockId, *, wait: bool) -> _Session | None:
        """An extra session of the latch's own, named after its participant id."""
        session = await self._session_for(lock, wait=wait, leader=True)
        if session is None:
            return None
        session.dedicated = True
        if session.waiting_for != a.request.participant:
            session.waiting_for = a.request.participant
            try:
                async with session.io:
                    await session.conn.execute(
                        "SELECT set_config('application_name', $1, false)",
                        a.request.participant[:63],
                    )
            except _FAILED as exc:
                raise _unavailable(exc, "set application_name", self._describe) from exc
        return session

    async def _send(
        self,
        a: _PgAttempt,
        session: _Session,
        lock: LockId,
        query: str,
        *args: Any,
        timeout: float | None = None,
    ) -> Any:
        """Run one lock call for ``lock`` on ``session``; the row when granted, else ``None``."""
        session.reserved.add(lock)
        entry = (session, lock)
        a.pending.append(entry)
        io = session.io
        try:
            await io.acquire()  # (not ``async with``: one coroutine less per call)
            try:
                rows = await session.rows(query, args, timeout)
                row = rows[0] if rows else None
            finally:
                io.release()
        except TimeoutError:
            raise
        except _BROKEN as exc:
            if session.conn.is_closed() or isinstance(exc, asyncpg.InternalClientError):
                # The server ended the session under the call (an operator's
                # pg_terminate_backend): it is gone, and so is any lock it had
                # won. Close it for good; the caller may try a fresh one.
                self._session_ended(session, f"lock call failed: {exc!r}")
                if entry in a.pending:
                    a.pending.remove(entry)
                raise _SessionGone(
                    f"PostgreSQL {self._describe}: lock call failed: {exc!r}"
                ) from exc
            raise _unavailable(exc, "lock call", self._describe) from exc
        except REFUSED as exc:
            # A privilege the statement needs (the token sequence, the fencing
            # table) is refused: never retried. The entry stays pending, so
            # the caller's cleanup gives back a lock the statement may have won.
            raise _unavailable(exc, "lock call", self._describe) from exc
        # Answered: from here to the return, no await.
        a.pending.remove(entry)
        if row is None:
            session.reserved.discard(lock)
            session.settle()
        return row

    def _grant_sql(self, a: _PgAttempt, *, wait: bool, shared: bool) -> tuple[str, tuple[str, ...]]:
        """The grant statement and its arguments after the key: ``_register`` for a new name."""
        q = self._queries
        fence = a.fence
        if fence in self._registered:
            if wait:
                return (q.lock_shared if shared else q.lock_exclusive), ()
            return (q.try_shared if shared else q.try_exclusive), ()
        if wait:
            return (q.lock_shared_register if shared else q.lock_exclusive_register), (fence,)
        return (q.try_shared_register if shared else q.try_exclusive_register), (fence,)

    def _grant(
        self,
        a: _PgAttempt,
        session: _Session,
        lock: LockId,
        token: int,
        hold: _Shared | None = None,
    ) -> Grant:
        # Granted: the name's fencing row exists (this grant or an earlier one wrote it).
        registered = self._registered
        if a.fence not in registered:
            if len(registered) >= _MAX_REGISTERED:
                registered.clear()
            registered.add(a.fence)
        request = a.request
        if a.reads and hold is None:
            # A new server shared lock: the backend's next readers join it.
            hold = _Shared(session, lock)
            current = self._shared.get(lock[0])
            if current is None or not current.joinable():
                self._shared[lock[0]] = hold
                self._wake()  # readers waiting for a session may join now
        handle = _Handle(session, lock, a.hands_off, request.family is Family.SEMAPHORE, hold)
        grant = Grant(request, token, handle=handle)
        session.grants[grant] = lock
        if hold is not None:
            hold.grants.add(grant)
        if a.hands_off:
            self._held_by[lock] = grant
        if self._beat_timer is None:
            self._ensure_heartbeat()
        return grant

    async def _try_slots(self, a: _PgAttempt) -> list[Grant] | None:
        request = a.request
        primary = await self._get_primary()
        grants: list[Grant] = []
        while len(grants) < request.count:
            row, taken = await self._try_slot(a, primary)
            if row is None or taken is None:
                break
            grants.append(self._grant(a, primary, taken, int(row[1])))
        if len(grants) == request.count:
            return grants
        # Not all of them: give back the ones taken (count > 1) and report "not now".
        for grant in grants:
            await self.release(grant)
        return None

    async def _try_slot(self, a: _PgAttempt, primary: _Session) -> tuple[Any, LockId | None]:
        """One ``try_slot`` statement on the primary: ``(row, slot taken)``, or ``(None, None)``.

        The slots still free are chosen once the session is ours (``io``
        held): slot tries of the backend's tasks run one after the other, so
        a try never mistakes the slots another try is asking for, and then
        gives back, for held ones (it would wait for a release that may
        never come while those slots sit free).
        """
        async with primary.io:
            free = [k for k in a.keys if (k, False) not in primary.reserved]
            if not free:
                return None, None
            # Reserve every candidate: the statement may take any one of them.
            reserved = [(k, False) for k in free]
            for lock in reserved:
                primary.reserved.add(lock)
                a.pending.append((primary, lock))
            try:
                if a.fence in self._registered:
                    row = await primary.conn.fetchrow(self._queries.try_slot, free)
                else:
                    row = await primary.conn.fetchrow(
                        self._queries.try_slot_register, free, a.fence
                    )
            except _FAILED as exc:
                raise _unavailable(exc, "lock call", self._describe) from exc
        # Answered: from here to the return, no await.
        taken = None if row is None else (free[int(row[0])], False)
        for lock in reserved:
            a.pending.remove((primary, lock))
            if lock != taken:
                primary.reserved.discard(lock)
        return row, taken

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Block on ``pg_advisory_lock*`` on an extra session (semaphores: a NOTIFY)."""
        a: _PgAttempt = attempt  # type: ignore[assignment]
        request = a.request
        if a.grants is not None:
            return
        if request.mode is Mode.LEASE or request.downgrade_of is not None:
            await self._wait_local(a, bound, self._heartbeat)
            return
        shared = request.mode is Mode.READ
        lock = (a.keys[0], shared)
        if a.hands_off and (
            self._holder(lock) is not None or self._server_waiters.get(lock, 0) > 0
        ):
            await self._wait_handoff(a, lock, bound)
            return
        if a.reads and self._server_waiters.get(lock, 0) > 0:
            await self._wait_handoff(a, lock, bound)  # join what that reader is granted
            return
        if request.family is Family.LEADER:
            session = await self._leader_session(a, lock, wait=True)
        else:
            session = await self._session_for(lock, wait=True)
        if session is None:
            await self._wait_local(a, bound, self._heartbeat)
            return
        if a.hands_off or a.reads:
            self._begin_server_wait(a, lock)
        query, extra = self._grant_sql(a, wait=True, shared=shared)
        session.waiting = True
        session.waiting_for = request.participant
        session.waiting_fence = a.fence
        session.waiting_mode = request.mode.value
        a.wait_session = session
        try:
            row = await self._send(a, session, lock, query, a.keys[0], *extra, timeout=bound)
        except TimeoutError:
            # The bound passed; the server may have granted just then.
            session.waiting = False
            self._end_server_wait(a)
            await self._unlock_pending(a)
            return
        # (cancelled or failed: ``finish`` ends the server wait, after ``abandon``)
        session.waiting = False
        if row is not None:
            a.grants = [self._grant(a, session, lock, int(row[0]))]
        self._end_server_wait(a)  # after the grant is recorded: the queue stays put

    def _begin_server_wait(self, a: _PgAttempt, lock: LockId) -> None:
        """Count ``a`` among our attempts asking the server for ``lock`` (the others queue)."""
        a.server_wait = lock
        self._server_waiters[lock] = self._server_waiters.get(lock, 0) + 1

    def _end_server_wait(self, a: _PgAttempt) -> None:
        lock, a.server_wait = a.server_wait, None
        if lock is not None:
            left = self._server_waiters.get(lock, 0) - 1
            if left > 0:
                self._server_waiters[lock] = left
            else:
                self._server_waiters.pop(lock, None)
                self._wake_queued(lock)  # nobody of ours on the server now: retry

    def _holder(self, lock: LockId) -> Grant | None:
        """Our grant holding exclusive ``lock``, if any (drops a stale record)."""
        grant = self._held_by.get(lock)
        if grant is None:
            return None
        handle = grant.handle
        assert isinstance(handle, _Handle)
        if handle.session.alive and grant in handle.session.grants:
            return grant
        del self._held_by[lock]
        return None

    async def _wait_handoff(self, a: _PgAttempt, lock: LockId, bound: float | None) -> None:
        """Queue for ``lock`` behind another task of this backend (no session, no query).

        Woken by a hand-off (``a.grants`` set), by any local change, or after
        ``heartbeat`` seconds at the latest, and then tries again.
        """
        if a.generation != self._generation:
            return  # something changed since the try: try again first
        queue = self._queued.setdefault(lock, {})
        handoff = a.handoff = asyncio.get_running_loop().create_future()
        queue[a] = None
        try:
            limit = self._heartbeat if bound is None else min(bound, self._heartbeat)
            await wait_done(handoff, limit)
        finally:
            self._unqueue(a, lock)

    def _unqueue(self, a: _PgAttempt, lock: LockId) -> None:
        queue = self._queued.get(lock)
        if queue is not None:
            queue.pop(a, None)
            if not queue:
                del self._queued[lock]
        a.handoff = None

    def _wake_queued(self, lock: LockId | None = None) -> None:
        """Wake the first attempt queued for ``lock`` (every lock: ``None``): it tries again.

        Not while another task of ours blocks on the server for that lock or
        holds it: a try would fail, and that task hands the lock on. Only the
        first: it takes the lock or blocks on the server for it, the others
        stay queued behind it; when it ends without either, ``finish`` wakes
        the next one. A shared lock wakes every queued reader: the one that
        asked the server was answered, and each of them joins its grant (or,
        refused, one asks the server again and the others queue again).
        """
        locks = list(self._queued) if lock is None else [lock]
        for each in locks:
            if self._server_waiters.get(each, 0) > 0 or self._holder(each) is not None:
                continue
            for waiter in self._queued.get(each, {}):
                if waiter.handoff is not None and not waiter.handoff.done():
                    waiter.handoff.set_result(None)
                    if not each[1]:
                        break  # exclusive: one; shared: every reader joins

    async def _wait_local(self, a: _PgAttempt, bound: float | None, cap: float) -> None:
        if a.generation != self._generation:
            return  # something changed since the try: try again first
        limit = cap if bound is None else min(bound, cap)
        await wait_done(self._change_future(), limit)

    async def _unlock_pending(self, a: _PgAttempt) -> None:
        """Check-and-unlock every call of ``a`` whose answer we did not get."""
        while a.pending:
            session, (key, shared) = a.pending[0]
            if session.alive:
                mode = "ShareLock" if shared else "ExclusiveLock"
                try:
                    async with session.io:
                        await session.conn.fetch(self._queries.unlock_if_held, key, mode)
                except _TRANSIENT as exc:
                    # The session is gone: the server dropped its locks.
                    self._session_ended(session, f"cleanup failed: {exc!r}")
            a.pending.pop(0)
            session.reserved.discard((key, shared))
            session.waiting = False
            self._maybe_retire(session)
        self._wake()

    async def abandon(self, attempt: Attempt) -> None:
        """Unlock what an unanswered call may have won, and what a finished wait won."""
        a = cast(_PgAttempt, attempt)
        await self._unlock_pending(a)
        granted, a.grants = a.grants, None
        for grant in granted or ():
            await self.release(grant)

    def finish(self, attempt: Attempt) -> None:
        """Leave the hand-off queue; nothing else to drop locally."""
        a: _PgAttempt = attempt  # type: ignore[assignment]
        if a.handoff is not None:
            self._unqueue(a, (a.keys[0], a.reads))
        if a.server_wait is not None:
            self._end_server_wait(a)
        if a.hands_off and a.grants is None and self._queued:
            self._wake_queued((a.keys[0], False))  # ended empty-handed: the next one tries
        session = a.wait_session
        if session is not None and not a.pending:
            session.waiting = False

    async def release(self, grant: Grant) -> bool:
        """``pg_advisory_unlock*`` on the session that holds it; ``False`` if it was not held."""
        handle = grant.handle
        assert isinstance(handle, _Handle)
        session = handle.session
        lock = handle.lock
        if not session.alive:
            return False
        if grant not in session.grants:
            return False  # released before (idempotent) or found lost
        if handle.hands_off and self._queued and self._queued.get(lock):
            handed = await self._hand_off(grant, session, lock)
            if handed is not None:
                return handed
        if handle.shared is not None and self._leave_shared(grant, handle.shared):
            del session.grants[grant]
            return True  # other readers of ours still hold the server lock
        key, shared = lock
        io = session.io
        try:
            await io.acquire()  # (not ``async with``: one coroutine less per call)
            try:
                if handle.notify:
                    # a semaphore slot: unlock and wake the waiters in one statement
                    rows = await session.rows(
                        self._queries.unlock_notify, (key, self.channel, grant.request.name)
                    )
                elif shared:
                    rows = await session.rows(self._queries.unlock_shared, (key,))
                else:
                    rows = await session.rows(self._queries.unlock_exclusive, (key,))
                held = bool(rows) and rows[0][0]
            finally:
                io.release()
        except _BROKEN as exc:
            was_alive = session.alive
            self._session_ended(session, f"release failed: {exc!r}")
            if was_alive:
                # the server drops the session's locks once the connection is gone
                await self._drop_connection(session.conn)
            return False
        if session.grants.pop(grant, None) is not None:
            session.reserved.discard(lock)
        if handle.hands_off:
            if self._held_by.get(lock) is grant:
                del self._held_by[lock]
            if self._handoffs:
                self._handoffs.pop(lock, None)
            if self._tokens:
                self._tokens.pop(lock, None)  # the chain ended: its leftovers are void
        if not session.primary:
            self._maybe_retire(session)
        self._wake()
        return bool(held)

    def _leave_shared(self, grant: Grant, hold: _Shared) -> bool:
        """Take ``grant`` off its shared hold; ``True`` while other reads still count on it.

        The last one out stops new readers from joining (before its unlock is
        sent) and unlocks.
        """
        hold.grants.discard(grant)
        if hold.grants:
            return True
        if self._shared.get(hold.lock[0]) is hold:
            del self._shared[hold.lock[0]]
        return False

    async def _hand_off(self, grant: Grant, session: _Session, lock: LockId) -> bool | None:
        """Pass the server lock of ``grant`` to the first task queued for it in this backend.

        The session keeps the advisory lock; the next task gets a new token.
        The first hand-off of a chain draws the tokens of the whole chain in
        one round trip (``nextval`` up to ``MAX_HANDOFFS`` times); the later
        ones need none. That is safe because the lock stays held by this
        session from the first hand-off to the last: no one else gets a token
        for this name meanwhile, every token drawn later (after the real
        unlock) is larger, and a token is used only if it is larger than the
        current holder's (a leftover of an earlier chain never is).
        ``None``: not handed off (the caller unlocks): nobody queued, or
        ``MAX_HANDOFFS`` in a row were made (then the server's queue, other
        processes, go next). ``False``: the session failed (the hold is lost).
        """
        done = self._handoffs.get(lock, 0)
        if done >= MAX_HANDOFFS:
            return None
        batch = self._tokens.get(lock)
        if batch is not None and (batch[0] is not session or not batch[1]):
            batch = None
        if batch is None or batch[1][0] <= grant.token:
            try:
                async with session.io:
                    rows = await session.conn.fetch(self._queries.next_token, MAX_HANDOFFS - done)
            except _BROKEN as exc:
                was_alive = session.alive
                self._session_ended(session, f"hand-off failed: {exc!r}")
                if was_alive:
                    await self._drop_connection(session.conn)
                return False
            batch = self._tokens[lock] = (session, [int(r[0]) for r in rows])
        # From here to the return, no await: the lock moves in one step.
        if grant not in session.grants or not session.alive:
            return False  # lost meanwhile (the session ended)
        successor = next(
            (w for w in self._queued.get(lock, {}) if w.grants is None and w.handoff), None
        )
        if successor is None:
            return None  # the queue emptied while the token was drawn: unlock
        token = batch[1].pop(0)
        if not batch[1]:
            del self._tokens[lock]
        handoff = successor.handoff
        self._unqueue(successor, lock)
        del session.grants[grant]
        successor.grants = [self._grant(successor, session, lock, token)]
        self._handoffs[lock] = self._handoffs.get(lock, 0) + 1
        if handoff is not None and not handoff.done():
            handoff.set_result(None)
        return True

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for this server (see :mod:`._doctor`).

        Runs on a connection of its own, so it also reports why the backend
        refused to open (a pooler in the way).
        """
        from ._doctor import CHECK_TIMEOUT, diagnose_postgres

        async def connect() -> Any:
            try:
                return await self._connect()
            except (*_TRANSIENT, *REFUSED) as exc:
                raise _unavailable(exc, "connect", self._describe) from exc

        async def server_time() -> float:
            primary = await self._get_primary()
            rows = await primary.fetch(
                "SELECT extract(epoch FROM clock_timestamp())::float8", timeout=CHECK_TIMEOUT
            )
            return float(rows[0][0])

        try:
            return await diagnose_postgres(
                connect,
                self._drop_connection,
                mode="advisory",
                label=self._describe,
                interval=self._heartbeat / 2,
                timeout=self._heartbeat,
                server_time=server_time,
            )
        except _TRANSIENT as exc:
            raise _unavailable(exc, "diagnosis", self._describe) from exc

    def admin(self) -> PostgresAdvisoryAdmin:
        """Listing and force-release (``aiolocks list``/``break``)."""
        from ._admin import PostgresAdvisoryAdmin

        return PostgresAdvisoryAdmin(self)

    async def participants(self, name: str, family: Family) -> list[Participant]:
        """Holders, then waiters; each session in ``pg_locks`` stands for the holds it backs.

        A session of ours, or of another aiolocks backend (asked by ``NOTIFY``,
        see :meth:`_ask_entries`), lists every hold and waiter it stands for:
        the readers counted on one shared lock, the tasks queued in that
        backend for a hand-off, with their participant ids and tokens. A
        session that does not answer (not aiolocks) is one entry ``pid:<pid>``.
        """
        primary = await self._get_primary()
        if family is Family.SEMAPHORE:
            key_list = slot_keys(name, self._slots.get(name, 1))
        else:
            key_list = [advisory_key(family.value, name)]
        rows: list[Any] = []
        for key in key_list:
            rows.extend(await primary.fetch(self._queries.participants, key))
        fence = f"{family.value}/{name}"
        ours = {s.pid for s in self._sessions()}
        foreign = sorted({int(r[0]) for r in rows} - ours)
        answers = await self._ask_entries(primary, foreign, fence) if foreign else {}
        if any(self._queued.get((key, shared)) for key in key_list for shared in (False, True)):
            # tasks queued for a hand-off while no session of ours is in pg_locks yet
            involved = {int(r[0]) for r in rows} & ours
            if not involved:
                rows.append((primary.pid, "", False, None))
        holders: list[Participant] = []
        waiters: list[Participant] = []
        described: set[int] = set()
        for row in rows:
            pid, granted = int(row[0]), bool(row[2])
            entries = self._entries(pid, fence) if pid in ours else answers.get(pid)
            if entries is None:
                # not an aiolocks session (or one that did not answer in time)
                shared = str(row[1]) == "ShareLock"
                other = str(row[3]) if family is Family.LEADER and row[3] else f"pid:{pid}"
                (holders if granted else waiters).append(
                    Participant(
                        id=other,
                        is_holder=granted,
                        mode=_mode_name(family, shared),
                        node=f"pid:{pid}",
                    )
                )
                continue
            if pid in described:
                continue
            described.add(pid)
            for ident, token, mode, holding in entries:
                (holders if holding else waiters).append(
                    Participant(
                        id=ident,
                        is_holder=holding,
                        fencing_token=token,
                        mode=mode,
                        node=f"pid:{pid}",
                    )
                )
        return holders + waiters

    def _sessions(self) -> list[_Session]:
        return [s for s in [self._primary, *self._extra] if s is not None and s.alive]

    def _entries(self, pid: int, fence: str) -> list[_Entry] | None:
        """What our session ``pid`` stands for on the lock ``fence``; ``None``: not ours.

        Its holds (``(id, token, mode, holding)``), the attempt blocked on it;
        and the tasks queued in this backend for that lock, on the answer of
        the smallest pid among our sessions holding or waiting for it (each
        appears once).
        """
        sessions = self._sessions()
        session = next((s for s in sessions if s.pid == pid), None)
        if session is None:
            return None
        entries: list[_Entry] = [
            (g.request.participant, g.token, g.request.mode.value, True)
            for g in session.grants
            if _fencing_name(g.request) == fence
        ]
        if session.waiting and session.waiting_for and session.waiting_fence == fence:
            entries.append((session.waiting_for, None, session.waiting_mode, False))
        involved = [
            s.pid
            for s in sessions
            if (s.waiting and s.waiting_fence == fence)
            or any(_fencing_name(g.request) == fence for g in s.grants)
        ]
        if self._queued and (not involved or min(involved) == pid):
            entries.extend(
                (w.request.participant, None, w.request.mode.value, False)
                for queue in self._queued.values()
                for w in queue
                if w.fence == fence
            )
        return entries

    async def _ask_entries(
        self, primary: _Session, pids: list[int], fence: str
    ) -> dict[int, list[_Entry]]:
        """Ask the backends of sessions ``pids`` what they stand for on ``fence`` (one NOTIFY).

        Each aiolocks backend answers for its own sessions within
        ``_TOKEN_ASK_BOUND`` seconds; a session that does not answer is left
        out of the result.
        """
        loop = asyncio.get_running_loop()
        asked: dict[int, asyncio.Future[list[_Entry]]] = {}
        for pid in pids:
            future = self._entry_asks.get((pid, fence))
            if future is None or future.done():
                future = self._entry_asks[(pid, fence)] = loop.create_future()
            asked[pid] = future
        try:
            await primary.fetch(
                "SELECT pg_notify($1, $2)",
                self._tables.token_channel,
                f"??{','.join(map(str, pids))} {fence}",
            )
            await asyncio.wait(asked.values(), timeout=_TOKEN_ASK_BOUND)
            return {pid: f.result() for pid, f in asked.items() if f.done()}
        finally:
            for pid, future in asked.items():
                if self._entry_asks.get((pid, fence)) is future:
                    del self._entry_asks[(pid, fence)]
                    self._entry_parts.pop((pid, fence), None)

    def _answer_entries(self, pids: list[int], fence: str) -> None:
        """Publish what our sessions among ``pids`` stand for on ``fence`` (``_ask_entries``)."""
        primary = self._primary
        if primary is None or self._owned is None:
            return
        payloads: list[str] = []
        for pid in pids:
            entries = self._entries(pid, fence)
            if entries is not None:
                payloads.extend(_answer_payloads(pid, fence, entries))
        if not payloads:
            return

        async def answer(session: _Session = primary) -> None:
            try:
                await session.fetch(
                    "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
                    self._tables.token_channel,
                    payloads,
                    timeout=_TOKEN_ASK_BOUND,
                )
            except _BROKEN as exc:  # TimeoutError is an OSError
                logger.debug("could not publish what a session holds: %r", exc)

        self._owned.spawn(answer(), name="aiolocks-pg-token")

    def _on_answer(self, answer: Mapping[str, Any]) -> None:
        """One part of another backend's answer to :meth:`_ask_entries`."""
        key = (int(answer["p"]), str(answer["f"]))
        future = self._entry_asks.get(key)
        if future is None or future.done():
            return
        parts = self._entry_parts.setdefault(key, {})
        parts[int(answer["i"])] = [
            (str(e[0]), None if e[1] is None else int(e[1]), str(e[2]), bool(e[3]))
            for e in answer["e"]
        ]
        if len(parts) >= int(answer["n"]):
            del self._entry_parts[key]
            future.set_result([entry for _i, part in sorted(parts.items()) for entry in part])


#: (participant id, fencing token or None, mode, holding)
_Entry = tuple[str, int | None, str, bool]

#: bytes of one answer NOTIFY at most (the server's limit is 8000)
_PAYLOAD_BYTES = 7000


def _answer_payloads(pid: int, fence: str, entries: list[_Entry]) -> list[str]:
    """``!!``-prefixed JSON parts of one session's answer, each small enough for a NOTIFY."""
    head = len(_compact({"p": pid, "f": fence, "i": 0, "n": 0, "e": []}).encode()) + 32
    parts: list[list[_Entry]] = [[]]
    size = head
    for entry in entries:
        length = len(_compact(entry).encode()) + 1
        if parts[-1] and size + length > _PAYLOAD_BYTES:
            parts.append([])
            size = head
        parts[-1].append(entry)
        size += length
    return [
        "!!" + _compact({"p": pid, "f": fence, "i": i, "n": len(parts), "e": part})
        for i, part in enumerate(parts)
    ]


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _hands_off(request: Request) -> bool:
    """An exclusive hold that a release may pass to another task of the backend."""
    return (
        request.family in (Family.MUTEX, Family.SEMAPHORE_MUTEX, Family.READ_WRITE)
        and request.mode in (Mode.EXCLUSIVE, Mode.WRITE)
        and request.downgrade_of is None
    )


def _touches(session: _Session, key: int) -> bool:
    """``session`` holds or asks for ``key`` in some mode (never send it there again)."""
    return (key, False) in session.reserved or (key, True) in session.reserved


def _mode_name(family: Family, shared: bool) -> str:
    if family is Family.READ_WRITE:
        return "read" if shared else "write"
    if family is Family.SEMAPHORE:
        return "lease"
    return "exclusive"


@final
class _Timed:
    """A connection whose queries carry a timeout (for the heartbeat)."""

    __slots__ = ("_conn", "_timeout")

    def __init__(self, conn: Any, timeout: float) -> None:
        self._conn = conn
        self._timeout = timeout

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        rows: list[Any] = await self._conn.fetch(query, *args, timeout=self._timeout)
        return rows
