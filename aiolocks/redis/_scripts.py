"""The Lua scripts of the Redis driver, kept as ``scripts/*.lua`` files.

Each script is registered on a client with redis-py's ``register_script``
(for its SHA1); ``RedisNode.evalsha`` sends it as ``EVALSHA`` and, when the
server answers ``NOSCRIPT`` (after a restart or ``SCRIPT FLUSH``), loads it
and sends it again. ``Scripts.load`` preloads them at ``open()`` so that an
uncontended acquire costs exactly one ``EVALSHA``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import final

from ._client import RedisCommands, RedisScript

__all__ = ["SCRIPT_NAMES", "Scripts", "source"]

SCRIPT_NAMES = ("acquire", "release", "renew", "inspect", "pass_on", "records")


#: scripts that work on the waiter queue: ``scripts/queue.lua`` (its entries
#: and their deadlines) goes in front of each
QUEUE_SCRIPTS = ("acquire", "release")


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua`` (with ``queue.lua`` in front where it is used)."""
    text = resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text("utf-8")
    if name in QUEUE_SCRIPTS:
        text = source("queue") + text
    return text


@final
@dataclass(frozen=True, slots=True)
class Scripts:
    """The scripts registered on one client (``redis.asyncio`` Redis or RedisCluster)."""

    acquire: RedisScript
    release: RedisScript
    renew: RedisScript
    inspect: RedisScript
    pass_on: RedisScript
    #: the record store (``_records.py``): one script, one branch per operation
    records: RedisScript

    @classmethod
    def register(cls, client: RedisCommands) -> Scripts:
        """Register every script on ``client`` (no I/O)."""
        return cls(*(client.register_script(source(name)) for name in SCRIPT_NAMES))

    async def load(self, client: RedisCommands) -> None:
        """``SCRIPT LOAD`` each script (on every primary for a cluster client)."""
        for name in SCRIPT_NAMES:
            await client.script_load(source(name))
