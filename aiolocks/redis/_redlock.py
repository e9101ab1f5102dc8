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
from collections.abc import Callable, Mapping, Sequence
from typing import final

from redis.exceptions import RedisError

from .._core.doctor import Diagnosis
from .._core.driver import Capabilities, Family, Grant, Mode, Request
from .._core.errors import BackendUnavailableError
from .._core.participants import Participant
from ._driver import (
    MODE_CODES,
    TRANSIENT,
    RedisHold,
    RedisNode,
    _Attempt,
    _text,
    check_lock_options,
    lock_keys,
    parse_participants,
    validate_key_prefix,
    validate_lease_time,
)
from ._pubsub import Wake
from ._watchdog import Renewal, RenewResult, Watchdog

__all__ = ["RedlockDriver"]

logger = logging.getLogger("aiolocks.redis")

REDLOCK_FAMILIES = (Family.MUTEX, Family.SEMAPHORE_MUTEX, Family.LEADER)


@final
class RedlockDriver:
    """The :class:`~aiolocks._core.driver.Driver` over N independent masters."""

    capabilities = Capabilities(fair=False, queue_visible=False, can_lose=True)
    isolates_acquire = False
    isolates_release = False

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
        self.watchdog = Watchdog(
            self._renew_many, self.nodes[0].spawn, name=f"aiolocks-redlock-watchdog:{describe}"
        )

    def describe(self) -> str:
        return self._describe

    def lock_options(self, family: Family, options: Mapping[str, object]) -> Mapping[str, object]:
        if family not in REDLOCK_FAMILIES:
            raise ValueError(
                f"redlock:// supports mutex, semaphore_mutex and leader_latch, not {family.value}"
            )
        return check_lock_options(family, options, allow_fair=False)

    async def open(self) -> None:
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

    async def acquire(self, request: Request, deadline: float | None) -> list[Grant] | None:
        if self._closed:
            raise BackendUnavailableError(f"the Redlock backend {self._describe} is closed")
        lease = self._lease(request)
        keys = lock_keys(self.key_prefix, request.family, request.name)
        field = f"{self.client_uuid}:{secrets.token_hex(8)}"
        args: list[object] = [
            MODE_CODES[Mode.EXCLUSIVE], 1, int(lease * 1000), request.participant,
            "0", int(lease * 1000), "", "", field,
        ]  # fmt: skip
        # One _Attempt per master per round: a round's cleanup may still run
        # in the background while the next round is on the wire.
        current: list[list[_Attempt]] = [[]]

        def new_round() -> list[_Attempt]:
            current[0] = [_Attempt(keys, [field], "", lease) for _ in self.nodes]
            return current[0]

        try:
            return await self._acquire(request, deadline, new_round, args, lease)
        except BaseException:
            await self._cleanup(current[0], [True] * len(current[0]))
            raise

    async def _cleanup(self, attempts: Sequence[_Attempt], wait: Sequence[bool]) -> None:
        """Release on every master, answered or not: a lost reply may hide a grant.

        Masters that did not answer are cleaned up in the background (owned
        by their node, finished by close()), so a stalled master does not
        hold up the next round.
        """
        waited = []
        for node, attempt, must_wait in zip(self.nodes, attempts, wait, strict=True):
            attempt.dirty = True
            if must_wait:
                waited.append(node.cleanup(attempt))
            else:
                node.spawn(node.cleanup(attempt), name="aiolocks-redlock-cleanup")
        await asyncio.gather(*waited, return_exceptions=True)

    async def _try_node(
        self, node: RedisNode, attempt: _Attempt, args: Sequence[object], timeout: float
    ) -> tuple[str, int]:
        """('ok', token) | ('busy', wait_ms) | ('down', 0) for one master."""
        try:
            async with asyncio.timeout(timeout):
                reply, _ = await node.shielded(node.try_acquire(attempt.keys, args), attempt)
        except (TimeoutError, *TRANSIENT):
            return "down", 0
        if int(reply[0]) == 1:
            return "ok", int(_text(reply[1]))
        return "busy", int(reply[1])

    async def _round(
        self, attempts: Sequence[_Attempt], args: Sequence[object], lease: float
    ) -> tuple[list[tuple[str, int]], float]:
        timeout = max(0.05, min(lease / 10, self.nodes[0].connect_timeout))
        start = time.monotonic()
        results = await asyncio.gather(
            *(
                self._try_node(node, a, args, timeout)
                for node, a in zip(self.nodes, attempts, strict=True)
            )
        )
        return list(results), start

    async def _acquire(
        self,
        request: Request,
        deadline: float | None,
        new_round: Callable[[], list[_Attempt]],
        args: Sequence[object],
        lease: float,
    ) -> list[Grant] | None:
        wake = Wake()
        async with contextlib.AsyncExitStack() as stack:
            subscribed = False
            while True:
                wake.clear()
                attempts = new_round()
                results, start = await self._round(attempts, args, lease)
                validity = lease - (time.monotonic() - start) - self.drift(lease)
                tokens = [value for kind, value in results if kind == "ok"]
                if len(tokens) >= self.quorum and validity > 0:
                    return [self._grant(request, attempts[0], max(tokens), lease, start)]
                # Not ours: give back what we got, on every master.
                await self._cleanup(attempts, [kind != "down" for kind, _ in results])
                down = sum(1 for kind, _ in results if kind == "down")
                if down > len(self.nodes) - self.quorum:
                    raise BackendUnavailableError(
                        f"only {len(self.nodes) - down} of {len(self.nodes)} Redlock masters of "
                        f"{self._describe} answered; a lock needs {self.quorum}"
                    )
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                if not subscribed:
                    # Subscribe on every master that answered, then try again
                    # at once (an unlock may have come before the subscription).
                    subscribed = True
                    for node, (kind, _) in zip(self.nodes, results, strict=True):
                        if kind != "down" and node.hub is not None:
                            with contextlib.suppress(BackendUnavailableError):
                                await stack.enter_async_context(
                                    node.hub.listen(attempts[0].keys.channel, wake)
                                )
                    continue
                waits = [value for kind, value in results if kind == "busy" and value >= 0]
                bound = min(waits) / 1000 if waits else lease / 3
                # A small random delay breaks split votes between contenders.
                bound = min(bound, lease / 3) + random.uniform(0, 0.02)
                if deadline is not None:
                    bound = min(bound, max(0.0, deadline - now))
                if await wake.wait(bound):
                    # Woken by an unlock: contenders on other clients got the
                    # same message; a jitter keeps them from splitting the vote.
                    await asyncio.sleep(random.uniform(0, 0.005))

    def _grant(
        self, request: Request, attempt: _Attempt, token: int, lease: float, start: float
    ) -> Grant:
        hold = RedisHold(attempt.keys, attempt.fields[0], lease)
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

    async def release(self, grant: Grant) -> None:
        hold = grant.handle
        if not isinstance(hold, RedisHold) or hold.released:
            return
        hold.stop()
        self._holds.discard(hold)
        attempts = [_Attempt(hold.keys, [hold.field], "", hold.lease) for _ in self.nodes]
        await self._cleanup(attempts, [True] * len(attempts))

    async def participants(self, name: str, family: Family) -> list[Participant]:
        keys = lock_keys(self.key_prefix, family, name)

        async def one(node: RedisNode) -> list[Participant] | None:
            try:
                return parse_participants(await node.shielded(node.inspect(keys)))
            except (RedisError, OSError):
                return None

        views = await asyncio.gather(*(one(n) for n in self.nodes))
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
