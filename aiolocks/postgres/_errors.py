"""Which asyncpg errors mean "the server or the connection is gone" (retry or reconnect),
and which mean "the server refused us" (:class:`AccessDeniedError`, never retried)."""

from __future__ import annotations

import ssl

import asyncpg

from .._core.errors import AccessDeniedError

__all__ = ["REFUSED", "TRANSIENT", "denied"]

#: the server refused the login or a permission (wrong password, role may
#: not log in, no ``CONNECT`` or table privilege)
REFUSED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InsufficientPrivilegeError,
    ssl.SSLCertVerificationError,
)

#: errors after which the statement may be sent again on another connection
TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.CrashShutdownError,
)


def denied(exc: BaseException, what: str, where: str) -> AccessDeniedError | None:
    """The :class:`AccessDeniedError` for ``exc`` (or its cause), or None if not a refusal."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return None
        if isinstance(current, REFUSED):
            return AccessDeniedError(
                f"PostgreSQL {where} refused access ({what}): {current} "
                "(check the role, password, grants and TLS certificates)"
            )
        current = current.__cause__ or current.__context__
    return None
