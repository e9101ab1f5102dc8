"""One acquisition as the core sees it, and what happens when it is lost.

A :class:`Hold` wraps the driver's :class:`Grant` with what every backend
shares: the owning task and its reentrancy count, the ``async with`` bodies
that run under it, and loss handling.

Loss follows CPython's ``asyncio.timeout()``: when the driver reports the
grant lost, every task running an ``async with`` body of this hold is
cancelled once (``task.cancel()``), and the body's ``__aexit__`` withdraws
that request with ``task.uncancel()``. If nobody else asked for cancellation
meanwhile, the ``CancelledError`` becomes :class:`LockLostError`; if someone
did (a timeout scope, a task group, a user ``task.cancel()``), the
cancellation wins and propagates, as in ``asyncio.timeout()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .driver import Family, Grant

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Hold"]

logger = logging.getLogger("aiolocks")

#: The empty ``_bodies``/``_loss_cancelled`` every hold starts with; never
#: written (a hold makes its own dict before its first write).
_NOTHING: dict[asyncio.Task[object], Any] = {}


class Hold:
    """One acquisition: its grant(s), owner task, reentrancy count and bodies."""

    __slots__ = (
        "_bodies",
        "_loss_cancelled",
        "acquired_at",
        "count",
        "engine",
        "grant",
        "kind",
        "ledger_key",
        "name",
        "on_owner_done",
        "owner",
        "released",
    )

    def __init__(
        self,
        engine: Engine,
        grant: Grant,
        kind: str,
        owner: asyncio.Task[object] | None,
    ) -> None:
        # (positional or keyword: the acquire path passes them positionally,
        # which builds no keyword dict when instantiating a class)
        self.engine = engine
        self.grant = grant
        self.kind = kind
        self.name = grant.request.name
        self.owner = owner
        self.count = 1
        self.acquired_at = time.monotonic()
        self.released = False
        self.on_owner_done: Callable[[asyncio.Task[object]], object] | None = None
        #: the engine's ledger this hold is recorded in (task-owned locks)
        self.ledger_key: tuple[Family, str, str] | None = None
        # task -> stack of task.cancelling() values at each body entry
        # (both start as one shared empty dict, replaced at the first write:
        # most holds never run an ``async with`` body, fewer still are lost)
        self._bodies: dict[asyncio.Task[object], list[int]] = _NOTHING
        # task -> the cancelling() baseline of its outermost body, for tasks we cancelled
        self._loss_cancelled: dict[asyncio.Task[object], int] = _NOTHING
        engine.register_hold(self)
        grant.add_loss_listener(self._on_grant_lost)
        grant.event_sink = engine.grant_event_sink

    def owner_ended(self, task: asyncio.Task[object]) -> None:
        """Done callback of the owner task: a hold still in its ledger is an orphan."""
        key = self.ledger_key
        if key is None:
            return
        engine = self.engine
        ledger = engine.ledgers.get(key)
        if ledger is not None and ledger.get(task) is self:
            del ledger[task]
            if not ledger:
                del engine.ledgers[key]
            engine.release_orphan(self)

    @property
    def token(self) -> int:
        """Fencing token of this hold."""
        return self.grant.token

    @property
    def degraded(self) -> bool:
        """Taken from the process-local fallback store while the server was unreachable."""
        return self.grant.degraded

    @property
    def lost(self) -> bool:
        """The server no longer backs this hold."""
        return self.grant.lost

    def _on_grant_lost(self, grant: Grant) -> None:
        # Also when found at release time (the server had no hold left to
        # release): logged and reported, though no body is left to cancel.
        logger.warning(
            "%s %r lost its hold (fencing token %d): %s",
            self.kind,
            self.name,
            grant.token,
            grant.lost_reason,
            extra={
                "aiolocks_event": "lost",
                "aiolocks_lock": self.name,
                "aiolocks_kind": self.kind,
                "aiolocks_token": grant.token,
                "aiolocks_reason": grant.lost_reason,
            },
        )
        self.engine.emit_hold("lost", self)
        if self._loss_cancelled is _NOTHING:
            self._loss_cancelled = {}
        for task, stack in self._bodies.items():
            if stack and task not in self._loss_cancelled and not task.done():
                self._loss_cancelled[task] = stack[0]
                task.cancel(f"aiolocks: hold of {self.kind} {self.name!r} was lost")

    def enter_body(self, task: asyncio.Task[object]) -> None:
        """Record that ``task`` runs an ``async with`` body under this hold."""
        if self._bodies is _NOTHING:
            self._bodies = {}
        self._bodies.setdefault(task, []).append(task.cancelling())

    def leave_body(self, task: asyncio.Task[object]) -> bool:
        """Leave a body of ``task`` at once if there is no loss to settle; else ``False``.

        ``True``: the body left, the hold is not lost (outcome ``"held"``).
        ``False``: nothing changed; call :meth:`exit_body`, which settles the
        loss. The ``async with`` exits take this path first, so that a body
        ending normally costs no await.
        """
        grant = self.grant
        if grant.lost or task in self._loss_cancelled:
            return False
        until = grant.valid_until
        if until is not None and time.monotonic() > until:
            return False  # exit_body's verify() turns it into a loss
        stack = self._bodies.get(task)
        if stack:
            stack.pop()
            if not stack:
                del self._bodies[task]
        return True

    async def exit_body(self, task: asyncio.Task[object], exc: BaseException | None) -> str:
        """Leave a body of ``task`` and say how it ended.

        Returns ``"held"`` (the hold was never lost), ``"lost"`` (raise
        :class:`LockLostError`) or ``"cancelled"`` (lost, but somebody else
        also cancelled the task: let the cancellation propagate). Withdraws our
        loss cancellation, and absorbs it when the body ended before it was
        delivered, like ``asyncio.timeout()``.
        """
        stack = self._bodies.get(task)
        if stack:
            stack.pop()
            if not stack:
                del self._bodies[task]
        # The loss may have happened while the event loop was blocked, with
        # no chance for the driver to notice: check the hold's deadline now
        # (after this body left the list, so only other bodies are cancelled).
        self.grant.verify()
        baseline = self._loss_cancelled.pop(task, None)
        if baseline is None:
            return "lost" if self.lost else "held"
        if task.uncancel() > baseline:
            return "cancelled"
        if not isinstance(exc, asyncio.CancelledError):
            # The body finished (or failed) before our cancellation reached
            # it. uncancel() does not withdraw a pending request on every
            # Python version, so absorb it here rather than let it hit an
            # unrelated await later.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                if task.cancelling() > baseline:
                    return "cancelled"
        return "lost"
