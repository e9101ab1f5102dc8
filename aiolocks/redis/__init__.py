"""Redis backends: Redisson's locks on ``redis.asyncio``.

``redis://``, ``rediss://``, ``redis+sentinel://``, ``redis+cluster://`` go to
:class:`RedisBackend`; ``redlock://`` to :class:`RedlockBackend`. Build one
with :func:`aiolocks.connect` (which calls :func:`from_url`), or wrap a
client you already have: ``RedisBackend(redis.asyncio.Redis(...))``.
See ``docs/redis.md`` for the algorithms and their limits.
"""

from ._backend import RedisBackend as RedisBackend
from ._backend import RedlockBackend as RedlockBackend
from ._backend import from_url as from_url

__all__ = ["RedisBackend", "RedlockBackend", "from_url"]
