"""Redlock: one exclusive hold on a majority of N independent Redis masters.

Design note
-----------
The algorithm from the Redis docs ("Distributed locks with Redis"), on the
same Lua scripts as the single-server driver:

1. Mint one field id, note the monotonic start time.
2. Run ``acquire.lua`` on every master concurrently, each bounded by a short
   per-node timeout (``min(lease / 10, connect_timeout)``) so a dead master
   cannot eat the lease.
3. Granted when at least ``N // 2 + 1`` masters said yes *and* the validity
   ``lease - elapsed - drift`` (``drift = 1 % of the lease + 2 ms``) is still
   positive. Otherwise release on **every** master (also those that did not
   answer: the reply may have been lost) and wait for an unlock message on
   any master, the shortest TTL reported, or a small random delay (to break
   split votes), then try again.
4. Fail fast: if more than ``N - quorum`` masters are unreachable, raise
   :class:`BackendUnavailableError` at once instead of waiting.
5. Release (and the clean-up of a given-up acquire) runs ``release.lua`` on
   every master, each bounded by ``min(lease / 5, connect_timeout)``: a
   master that does not answer keeps our field only until the lease runs
   out, and must not hold up the release for that long.

The watchdog renews on every master; a renewal counts when a majority
confirms, and the hold is lost when a majority reports the field gone or no
majority renewal succeeds within the validity.

What Redlock cannot promise (see ``docs/redis.md``): it assumes bounded
clock drift and bounded pauses. A process pause (GC, swap, stopped VM)
longer than the validity, or a server clock jump that expires keys early,
lets two clients both believe they hold the lock. The fencing token here is
the largest token among the masters that granted; tokens are derived from
server time and are *not* a safe fence across masters (Kleppmann's
critique): protect a resource with a token it can check itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast, final

from redis.exceptions import RedisError

from .._core.backoff import Backoff
from .._core.doctor import Diagnosis
from .._core.driver import Attempt, Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError
from .._core.participants import Participant
from .._core.tasks import TaskSet, gather_keeping_cancel
from ._access import UNREACHABLE
from ._driver import (
    MODE_CODES,
    TOMBSTONE_MS,
    LockKeys,
    RedisHold,
    RedisNode,
    _text,
    check_lock_options,
    lock_keys,
    parse_participants,
    validate_key_prefix,
    validate_lease_time,
)
from ._pubsub import Wake
from ._watchdog import Renewal, RenewResult, Watchdog

if TYPE_CHECKING:
    from ._admin import RedisAdmin

__all__ = ["RedlockDriver"]

logger = logging.getLogger("aiolocks.redis")

REDLOCK_FAMILIES = (Family.MUTEX, Family.SEMAPHORE_MUTEX, Family.LEADER)


@final
class RedlockDriver:
    """The :class:`~aiolocks._core.driver.Driver` over N independent masters."""

    capabilities = Capabilities(
        fair=False,
        queue_visible=False,
        can_lose=True,
        primitives=frozenset({"mutex", "semaphore_mutex", "leader_latch"}),
    )

    def __init__(
        self,
        nodes: Sequence[RedisNode],
        *,
        describe: str,
        lease_time: float,
        key_prefix: str,
    ) -> None:
        if not nodes:
            raise ValueError("redlock:// needs at least one host")
        self.nodes = list(nodes)
        self.quorum = len(self.nodes) // 2 + 1
        self._describe = describe
        self.lease_time = validate_lease_time(lease_time)
        self.key_prefix = validate_key_prefix(key_prefix)
        self.client_uuid = uuid.uuid4().hex
        self._holds: set[RedisHold] = set()
        self._closed = False
        self._tasks: TaskSet | None = None
        self.watchdog = Watchdog(
            self._renew_many, self._spawn, name=f"aiolocks-redlock-watchdog:{describe}"
        )

    def describe(self) -> str:
        return self._describe

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        if family not in REDLOCK_FAMILIES:
            raise ValueError(
                f"redlock:// supports mutex, semaphore_mutex and leader_latch, not {family.value}"
            )
        return check_lock_options(family, options, allow_fair=False)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """The watchdog's sender runs in the engine's task set (given to ``open``)."""
        if self._tasks is None:
            coro.close()
            raise RuntimeError("the Redlock driver was not opened")
        return self._tasks.spawn(coro, name=name)

    async def open(self, tasks: TaskSet) -> None:
        self._tasks = tasks
        results = await asyncio.gather(*(n.open() for n in self.nodes), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            if not isinstance(r, BackendUnavailableError):
                raise r
        if len(self.nodes) - len(failed) < self.quorum:
            raise BackendUnavailableError(
                f"only {len(self.nodes) - len(failed)} of {len(self.nodes)} Redlock masters of "
                f"{self._describe} are reachable; a lock needs {self.quorum}"
            ) from failed[0]
        for r in failed:
            logger.warning("Redlock master unreachable at open: %s", r)

    async def diagnose(self) -> Diagnosis:
        """``backend.doctor()``'s findings for every master (see :mod:`._doctor`)."""
        from ._doctor import diagnose_redlock

        return await diagnose_redlock(self)

    async def close(self) -> None:
        self._closed = True
        for hold in list(self._holds):
            hold.stop()
        self._holds.clear()
        self.watchdog.close()
        await asyncio.gather(*(n.close() for n in self.nodes), return_exceptions=True)

    def _lease(self, request: Request) -> float:
        lease = request.options.get("lease_time")
        return self.lease_time if lease is None else float(lease)  # type: ignore[arg-type]

    @staticmethod
    def drift(lease: float) -> float:
        """Clock-drift allowance of the Redlock paper: 1 % of the lease + 2 ms."""
        return lease * 0.01 + 0.002

    # -- acquire ---------------------------------------------------------------

    def begin(self, request: Request) -> Attempt:
        """Mint the one field id this acquire uses on every master."""
        lease = self._lease(request)
        keys = lock_keys(self.key_prefix, request.family, request.name)
        field = f"{self.client_uuid}:{secrets.token_hex(8)}"
        args: list[object] = [
            MODE_CODES[Mode.EXCLUSIVE], 1, int(lease * 1000), request.participant,
            "0", int(lease * 1000), "", "", field,
        ]  # fmt: skip
        return _RedlockAttempt(request, keys, field, lease, args, len(self.nodes))

    async def try_once(self, attempt: Attempt) -> list[Grant] | None:
        """One round on every master; on no quorum, give back what it won."""
        if self._closed:
            raise BackendUnavailableError(f"the Redlock backend {self._describe} is closed")
        a = cast(_RedlockAttempt, attempt)
        a.wake.clear()
        timeout = self._node_timeout(a.lease)
        start = time.monotonic()
        results = await gather_keeping_cancel(
            [self._try_node(i, node, a, timeout) for i, node in enumerate(self.nodes)]
        )
        validity = a.lease - (time.monotonic() - start) - self.drift(a.lease)
        tokens = [value for kind, value in results if kind == "ok"]
        if len(tokens) >= self.quorum and validity > 0:
            # No await from here to the return.
            a.written = [False] * len(self.nodes)
            return [self._grant(a, max(tokens), start)]
        a.results = results
        # Not ours: give back what we got, on every master that may have it
        # (bounded per master, so a stalled one does not hold up the next
        # round; what is left there is abandon's).
        await self._give_back(a, timeout)
        down = sum(1 for kind, _ in results if kind == "down")
        if down > len(self.nodes) - self.quorum:
            raise BackendUnavailableError(
                f"only {len(self.nodes) - down} of {len(self.nodes)} Redlock masters of "
                f"{self._describe} answered; a lock needs {self.quorum}"
            )
        return None

    def _node_timeout(self, lease: float) -> float:
        return max(0.05, min(lease / 10, self.nodes[0].connect_timeout))

    async def _try_node(
        self, index: int, node: RedisNode, a: _RedlockAttempt, timeout: float
    ) -> tuple[str, int]:
        """('ok', token) | ('busy', wait_ms) | ('down', 0) for one master."""
        a.written[index] = True
        try:
            async with asyncio.timeout(timeout):
                reply, _ = await node.try_acquire(a.keys, a.args)
        except (TimeoutError, *UNREACHABLE):
            # Unanswered: the script may still reach that master later.
            a.send_lost[index] = True
            return "down", 0
        if int(reply[0]) == 1:
            return "ok", int(_text(reply[1]))
        if not a.send_lost[index]:
            a.written[index] = False  # a definite "no" wrote nothing
        return "busy", int(reply[1])

    async def _give_back(self, a: _RedlockAttempt, timeout: float | None) -> None:
        """``release.lua`` for our field on every master that may hold it.

        ``timeout``: one try per master within it (between rounds); ``None``:
        the clean-up of :meth:`_clean_node` (abandon).
        """

        async def one(index: int, node: RedisNode) -> None:
            tombstone = a.send_lost[index]
            if timeout is None:
                removed = await self._clean_node(
                    node, a.keys, a.field, a.lease, tombstone=tombstone
                )
                done = removed is not None
            else:
                try:
                    async with asyncio.timeout(timeout):
                        tombstone_ms = min(int(a.lease * 1000), TOMBSTONE_MS) if tombstone else 0
                        await node.release(a.keys, "", [a.field], tombstone_ms)
                    done = True
                except (TimeoutError, RedisError, OSError):
                    done = False
            if done:
                a.written[index] = False

        await gather_keeping_cancel(
            [one(i, node) for i, node in enumerate(self.nodes) if a.written[i]],
            return_exceptions=True,
        )

    def cleanup_bound(self, lease: float) -> float:
        """How long clean-up (release, abandon) keeps trying one master, in seconds.

        A master that does not answer within it is left alone: what we wrote
        there lapses with the lease. Trying until the lease runs out would make
        every release wait that long while one master is down, though the
        masters that answered already let the next holder in.
        """
        return max(0.1, min(lease / 5, self.nodes[0].connect_timeout))

    async def _clean_node(
        self, node: RedisNode, keys: LockKeys, field: str, lease: float, *, tombstone: bool
    ) -> int | None:
        """``release.lua`` for ``field`` on one master, retried within :meth:`cleanup_bound`.

        How many fields the master removed (0: ours was not there any more);
        ``None`` when it did not answer in time (or refused), so the field
        there, if any, lapses with the lease.
        """
        tombstone_ms = min(int(lease * 1000), TOMBSTONE_MS) if tombstone else 0
        give_up = time.monotonic() + self.cleanup_bound(lease)
        backoff = Backoff(give_up, first=0.02, cap=0.25)
        while True:
            try:
                async with asyncio.timeout(max(0.0, give_up - time.monotonic())):
                    return await node.release(keys, "", [field], tombstone_ms)
            except (TimeoutError, *UNREACHABLE) as exc:
                if await backoff.wait():
                    continue
                logger.info(
                    "Redlock master %s did not answer the clean-up of %s (%s); "
                    "what is there lapses with the lease",
                    node.describe,
                    keys.holders,
                    str(exc) or type(exc).__name__,
                )
                return None
            except RedisError as exc:
                logger.warning("cleaning up %s on %s failed: %s", keys.holders, node.describe, exc)
                return None

    async def wait_for_change(self, attempt: Attempt, bound: float | None) -> None:
        """Subscribe on every master that answered (then return), later wait for an unlock."""
        a = cast(_RedlockAttempt, attempt)
        if not a.hubs:
            # Subscribe on every master that answered, then try again at once
            # (an unlock may have come before the subscription).
            for node, (kind, _) in zip(self.nodes, a.results, strict=True):
                if kind != "down" and node.hub is not None:
                    with contextlib.suppress(BackendUnavailableError):
                        node.hub.attach(a.keys.channel, a.wake)
                        a.hubs.append(node)
                        await node.hub.confirmed(a.keys.channel)
            if a.hubs:
                return
        waits = [value for kind, value in a.results if kind == "busy" and value >= 0]
        wait = min(waits) / 1000 if waits else a.lease / 3
        # A small random delay breaks split votes between contenders.
        wait = min(wait, a.lease / 3) + random.uniform(0, 0.02)
        if bound is not None:
            wait = min(wait, max(0.0, bound))
        if await a.wake.wait(wait):
            # Woken by an unlock: contenders on other clients got the same
            # message; a jitter keeps them from splitting the vote.
            await asyncio.sleep(random.uniform(0, 0.005))

    async def abandon(self, attempt: Attempt) -> None:
        """Give back our field on every master that may hold it (tombstones where unanswered).

        Not after close: a closed client would open connections nobody closes;
        what the attempt wrote lapses with its lease."""
        if self._closed:
            return
        await self._give_back(cast(_RedlockAttempt, attempt), None)

    def finish(self, attempt: Attempt) -> None:
        """Unsubscribe from every master."""
        a = cast(_RedlockAttempt, attempt)
        for node in a.hubs:
            if node.hub is not None:
                node.hub.detach(a.keys.channel, a.wake)
        a.hubs.clear()

    def _grant(self, a: _RedlockAttempt, token: int, start: float) -> Grant:
        request, lease = a.request, a.lease
        a.wake.won = True
        hold = RedisHold(a.keys, a.field, lease)
        grant = Grant(request, token, hold)
        hold.watchdog = self.watchdog.watch(
            Renewal(
                grant,
                hold,
                lease=lease,
                valid_until=start + lease - self.drift(lease),
                enabled=bool(request.options.get("watchdog", True)),
                owner=request.owner,
                drift=self.drift(lease),
            )
        )
        self._holds.add(hold)
        return grant

    async def _renew_many(self, renewals: Sequence[Renewal]) -> list[RenewResult]:
        """Renew each hold on every master; a hold counts as renewed on a majority."""
        results = await asyncio.gather(
            *(self._renew(r.payload) for r in renewals), return_exceptions=True
        )
        return list(results)

    async def _renew(self, hold: RedisHold) -> str | None:
        timeout = max(0.05, min(hold.lease / 10, self.nodes[0].connect_timeout))

        async def one(node: RedisNode) -> bool | None:
            try:
                async with asyncio.timeout(timeout):
                    return await node.renew(hold.keys, hold.field, hold.lease)
            except (TimeoutError, RedisError, OSError):
                return None

        results = await asyncio.gather(*(one(n) for n in self.nodes))
        if sum(1 for r in results if r is True) >= self.quorum:
            return None
        gone = sum(1 for r in results if r is False)
        if gone > len(self.nodes) - self.quorum:
            return f"its field is gone on {gone} of {len(self.nodes)} Redlock masters"
        raise BackendUnavailableError("no majority of Redlock masters renewed the lease")

    # -- release / inspect -------------------------------------------------------

    async def release(self, grant: Grant) -> bool:
        """``release.lua`` on every master (a lost reply may hide a grant anywhere).

        Each master is tried within :meth:`cleanup_bound`; one that does not
        answer keeps our field only until the lease runs out. ``False`` (the
        hold was lost) when our field was gone on more masters than a quorum
        can spare, the rule of the watchdog's renewal: a master's clock that
        jumped forward, or a restart without persistence, expired it there,
        so another client may have held the lock meanwhile even though the
        watchdog had not noticed yet.
        """
        hold = grant.handle
        if not isinstance(hold, RedisHold):
            return True
        hold.stop()
        self._holds.discard(hold)
        if self._closed:
            return True  # released when the backend closed; no I/O on closed clients
        # Each master within a short bound: a dead one must not hold the
        # release up (its copy lapses with the lease).
        answers = await gather_keeping_cancel(
            [
                self._clean_node(node, hold.keys, hold.field, hold.lease, tombstone=False)
                for node in self.nodes
            ],
            return_exceptions=True,
        )
        gone = sum(1 for removed in answers if removed == 0)
        return gone <= len(self.nodes) - self.quorum

    def admin(self) -> RedisAdmin:
        """Listing and force-release (``aiolocks list``/``break``) on every master."""
        from ._admin import RedisAdmin

        return RedisAdmin(self.nodes, self.key_prefix, self.describe())

    async def participants(self, name: str, family: Family) -> list[Participant]:
        keys = lock_keys(self.key_prefix, family, name)

        async def one(node: RedisNode) -> list[Participant] | None:
            try:
                return parse_participants(await node.inspect(keys))
            except (RedisError, OSError):
                return None

        views = await gather_keeping_cancel([one(n) for n in self.nodes])
        seen: dict[str, list[Participant]] = {}
        for view in views:
            for p in view or ():
                seen.setdefault(p.node or p.id, []).append(p)
        holders = [
            max(ps, key=lambda p: p.fencing_token or 0)
            for ps in seen.values()
            if len(ps) >= self.quorum
        ]
        return sorted(holders, key=lambda p: p.fencing_token or 0)


class _RedlockAttempt(Attempt):
    """One Redlock acquire: one field on every master, and per master what may be there."""

    __slots__ = (
        "args",
        "field",
        "hubs",
        "keys",
        "lease",
        "results",
        "send_lost",
        "wake",
        "written",
    )

    def __init__(
        self,
        request: Request,
        keys: LockKeys,
        field: str,
        lease: float,
        args: list[object],
        masters: int,
    ) -> None:
        super().__init__(request)
        self.keys = keys
        self.field = field
        self.lease = lease
        self.args = args
        #: per master: our field may be there
        self.written = [False] * masters
        #: per master: a script went unanswered and may still arrive (tombstone on cleanup)
        self.send_lost = [False] * masters
        self.results: list[tuple[str, int]] = [("down", 0)] * masters
        self.wake = Wake()
        self.hubs: list[RedisNode] = []
