"""Run a command in a process group of its own, and make sure all of it ends.

Used by ``aiolocks run`` and ``aiolocks elect``. The command starts in a new
session (``setsid``), so it leads a process group of its own that every
process it forks joins, however deep. Signals go to the whole group
(``killpg``), never to the direct child alone, so that a shell's children do
not go on working after the lock is gone.

:meth:`ProcessGroup.wait` returns only when no process of the group is left
(the command may exit while a background child of it still runs). On Linux
the runner makes itself a *child subreaper*: descendants whose parent exits
are re-parented to it instead of to init, and it reaps the ones of its group,
so a zombie never makes the group look alive (in a container whose init does
not reap, for example).

What a process group cannot catch: a descendant that calls ``setsid()`` or
``setpgid()`` itself (a daemon that double-forks *and* starts a new session)
leaves the group, and no signal sent to the group reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import math
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import final

__all__ = ["ProcessGroup", "exit_status", "make_subreaper"]

logger = logging.getLogger("aiolocks")

#: how often the group is looked at once its leader has exited (no event exists for that)
_GROUP_POLL_INTERVAL = 0.05

_PR_SET_CHILD_SUBREAPER = 36


def make_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        return False


def exit_status(returncode: int) -> int:
    """A shell-style exit status: the code itself, or 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@final
class ProcessGroup:
    """A command running as the leader of a new process group.

    >>> group = await ProcessGroup.start(["sh", "-c", "sleep 1 & sleep 2"])  # doctest: +SKIP
    >>> status = await group.wait()  # both sleeps are gone  # doctest: +SKIP
    """

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.pgid = proc.pid
        """The process group id (the leader's pid)."""
        self._subreaper = False

    @classmethod
    async def start(
        cls, command: Sequence[str], env: Mapping[str, str] | None = None
    ) -> ProcessGroup:
        """Start ``command`` in a new session; ``OSError`` when it cannot be executed."""
        proc = await asyncio.create_subprocess_exec(
            *command, env=None if env is None else dict(env), start_new_session=True
        )
        group = cls(proc)
        group._subreaper = make_subreaper()
        return group

    @property
    def pid(self) -> int:
        """The pid of the command (the group leader)."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The leader's return code (negative: killed by that signal), ``None`` while it runs."""
        return self._proc.returncode

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to every process of the group; False when none is left."""
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - the pgid was reused by somebody else
            return False
        return True

    def alive(self) -> bool:
        """Some process of the group still exists (zombies of ours are reaped first)."""
        if self._proc.returncode is None:
            return True
        self._reap_group()
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _reap_group(self) -> None:
        """Reap re-parented members of the group (only after the leader was reaped)."""
        if not self._subreaper:
            return
        while True:
            try:
                pid, _ = os.waitpid(-self.pgid, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:  # pragma: no cover - defensive
                if exc.errno == errno.EINTR:
                    continue
                return
            if pid == 0:
                return

    async def wait_leader(self) -> int:
        """Wait for the command itself to exit; its raw return code."""
        return await self._proc.wait()

    async def wait(self) -> int:
        """Wait until no process of the group is left; the leader's raw return code."""
        code = await self._proc.wait()
        while self.alive():
            await asyncio.sleep(_GROUP_POLL_INTERVAL)
        return code

    async def terminate(self, kill_after: float) -> int:
        """TERM the group, KILL it ``kill_after`` seconds later (if finite); wait until gone."""
        self.signal(signal.SIGTERM)
        if math.isinf(kill_after):
            return await self.wait()
        try:
            async with asyncio.timeout(kill_after):
                return await self.wait()
        except TimeoutError:
            pass
        logger.warning(
            "process group %d still runs %s s after SIGTERM; sending SIGKILL", self.pgid, kill_after
        )
        # KILL until nothing is left: a member may fork between two rounds
        while self.alive():
            self.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_GROUP_POLL_INTERVAL):
                    await self._proc.wait()
            await asyncio.sleep(0)
        return await self._proc.wait()
