"""Which asyncpg errors mean "the server or the connection is gone" (retry or reconnect)."""

from __future__ import annotations

import asyncpg

__all__ = ["TRANSIENT"]

#: errors after which the statement may be sent again on another connection
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.CrashShutdownError,
)
