"""The loss flag shared by a lock's :class:`~.driver.Grant` and a record's :class:`~.records.Entry`.

Both stand for something the server holds on this process's behalf (a lock
node or key, an ephemeral record). The driver marks it lost once, with a
reason; the core listens and cancels what depended on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

__all__ = ["LossFlag"]


class LossFlag:
    """``lost`` and ``lost_reason``, and the listeners told once when it is set."""

    __slots__ = ("_listeners", "lost", "lost_reason")

    def __init__(self) -> None:
        self.lost = False
        self.lost_reason: str | None = None
        self._listeners: list[Callable[[Self], None]] = []

    def mark_lost(self: Self, reason: str) -> None:
        """Record that the server no longer backs this; tell every listener once."""
        if self.lost:
            return
        self.lost = True
        self.lost_reason = reason
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener(self)

    def add_loss_listener(self, listener: Callable[[Self], None]) -> None:
        """Call ``listener(self)`` when it is lost (at once if it already is)."""
        if self.lost:
            listener(self)
        else:
            self._listeners.append(listener)
