"""Redis administration: list the locks in use (SCAN), force-release (delete the holders).

A force-released hold is noticed by its holder at once through its key's
keyspace events (or, where they are off or refused, at the next lease
renewal, every third of ``lease_time``): its field is gone and the hold is
marked lost. Waiters are woken through the lock's channel at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, final

from redis.exceptions import RedisError

from .._core.admin import KINDS, name_matches
from .._core.driver import Family
from .._core.errors import InvalidLockNameError
from .._core.names import validate_name
from ._access import map_error
from ._keys import lock_keys

if TYPE_CHECKING:
    from ._driver import RedisNode

__all__ = ["RedisAdmin"]

# KEYS[1] holders hash   KEYS[2] waiter queue   ARGV[1] channel
# Deletes every hold, wakes the waiters, and drops the fence counter (field
# '#') like a release does when it is behind server time (tokens restart
# from server time); tombstones ('!' fields) are dropped with the holds.
_FORCE_RELEASE = """
local n, last = 0, nil
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] == '#' then
    last = tonumber(all[i + 1])
  elseif string.byte(all[i], 1) ~= 33 then
    n = n + 1
  end
end
if n > 0 then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[1], 'released')
  -- queued waiters listen on their process's channel, not the lock's
  local head = redis.call('LINDEX', KEYS[2], 0)
  if head then
    local prefix = string.match(KEYS[1], '^([^{]*)')
    redis.call('PUBLISH', prefix .. 'grant:' .. string.match(head, '^([^:]*)'), '- ' .. head)
  end
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if last and last >= now_us then
    redis.call('HSET', KEYS[1], '#', string.format('%.0f', last))
    redis.call('PEXPIRE', KEYS[1], math.floor((last - now_us) / 1000) + 2)
  end
end
return n
"""

_QUEUE_SUFFIX = "}:queue"


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def parse_lock_key(key: str, key_prefix: str) -> tuple[Family, str] | None:
    """``(family, name)`` of a holders hash or fair-queue key; ``None`` for other keys."""
    if not key.startswith(key_prefix + "{"):
        return None
    rest = key[len(key_prefix) + 1 :]
    if rest.endswith(_QUEUE_SUFFIX):
        rest = rest[: -len(_QUEUE_SUFFIX)]
    elif rest.endswith("}"):
        rest = rest[:-1]
    else:
        return None
    family_value, sep, name = rest.partition(":")
    family = KINDS.get(family_value)
    if not sep or family is None or not name:
        return None
    return family, name


def _lock_of(raw: object, key_prefix: str) -> tuple[Family, str] | None:
    """``(family, name)`` of a key, or None for a key no aiolocks lock could have written
    (not UTF-8, or a name :func:`validate_name` refuses): another program's key under
    the prefix is skipped, not fatal, and never printed."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        return None
    parsed = parse_lock_key(text, key_prefix)
    if parsed is None:
        return None
    try:
        validate_name(parsed[1])
    except InvalidLockNameError:
        return None
    return parsed


@final
class RedisAdmin:
    """:class:`aiolocks._core.admin.AdminDriver` over one or more Redis nodes (Redlock: all)."""

    def __init__(self, nodes: Sequence[RedisNode], key_prefix: str, describe: str) -> None:
        self._nodes = list(nodes)
        self._prefix = key_prefix
        self._describe = describe

    async def lock_names(self, prefix: str) -> list[tuple[Family, str]]:
        """SCAN every node for holder hashes and fair queues under the key prefix."""
        pattern = _glob_escape(self._prefix) + "{*"
        found: set[tuple[Family, str]] = set()
        for node in self._nodes:
            client: Any = node.client
            try:
                async for raw in client.scan_iter(match=pattern, count=500):
                    parsed = _lock_of(raw, self._prefix)
                    if parsed is not None and name_matches(parsed[1], prefix):
                        found.add(parsed)
            except (RedisError, OSError) as exc:
                raise map_error(exc, "listing locks", self._describe) from exc
        return sorted(found, key=lambda e: (e[1], e[0].value))

    async def force_release(self, name: str, family: Family) -> int:
        """Delete the holders hash on every node; the largest number of holds removed."""
        keys = lock_keys(self._prefix, family, name)
        removed = 0
        for node in self._nodes:
            client: Any = node.client
            try:
                count = await client.eval(_FORCE_RELEASE, 2, keys.holders, keys.queue, keys.channel)
            except (RedisError, OSError) as exc:
                raise map_error(exc, f"force-releasing {name!r}", self._describe) from exc
            removed = max(removed, int(count))
        return removed
