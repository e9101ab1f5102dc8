"""The in-process ``memory://`` backend: every primitive, same contract, no server.

It is a product backend (the embedded default, and the one to use in unit
tests of code that takes locks), not a mock: FIFO-fair queues, event-driven
waits on futures (no polling), fencing tokens, read/write and semaphore
rules identical to the server backends. Holds cannot be lost, except by
``backend.close()``.

``memory://`` shares one store per event loop in the process: two backends
from ``connect("memory://")`` contend like two processes on one server.
``memory://<store>`` names a separate store.
"""

from __future__ import annotations

from ._driver import MemoryBackend, from_url

__all__ = ["MemoryBackend", "from_url"]
