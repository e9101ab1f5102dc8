"""``doctor`` findings about how open a PostgreSQL deployment is.

* ``postgres-no-tls``: the session is not encrypted (``pg_stat_ssl`` of our
  own session says ``ssl = false``): a warning, or info when the client
  reaches the server over this machine's loopback or a Unix socket. Not
  reported behind a pooler, where the server sees the pooler's link, not
  ours.
* ``postgres-superuser`` (warning): the role the locks use is a superuser,
  far more than the locks need; it also skips every privilege check, so a
  grant missing for the real lock role goes unnoticed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .._core.doctor import Finding, Severity, no_tls_finding
from .._core.hosts import is_loopback

__all__ = ["SecurityFacts", "plaintext_finding", "read_security", "superuser_finding"]

#: one statement: our session's TLS, the client address the server sees, the role
_FACTS_SQL: Final = (
    "SELECT (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), "
    "host(inet_client_addr()), current_user::text, "
    "(SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
)


@dataclass(frozen=True)
class SecurityFacts:
    """What the server says about the diagnosis session."""

    #: the session is encrypted (None: the server did not say)
    ssl: bool | None
    #: the client address as the server sees it (None: a Unix socket)
    client: str | None
    #: the role the session runs as
    role: str
    #: that role is a superuser (None: the server did not say)
    superuser: bool | None

    @property
    def local(self) -> bool:
        """The traffic stays on the server's machine (loopback or a Unix socket)."""
        return self.client is None or is_loopback(self.client)


async def read_security(conn: Any, timeout: float) -> SecurityFacts:
    """The :class:`SecurityFacts` of ``conn``'s session, in one statement."""
    row = await conn.fetchrow(_FACTS_SQL, timeout=timeout)
    return SecurityFacts(
        ssl=None if row[0] is None else bool(row[0]),
        client=None if row[1] is None else str(row[1]),
        role=str(row[2]),
        superuser=None if row[3] is None else bool(row[3]),
    )


def plaintext_finding(facts: SecurityFacts, *, pooled: bool, label: str) -> Finding | None:
    """Warning (info when local): the session is not encrypted."""
    if facts.ssl is not False or pooled:
        return None
    local = facts.local
    return no_tls_finding(
        "postgres-no-tls",
        label,
        local=local,
        exposed="the password exchange",
        fix=(
            "serve TLS (ssl = on in postgresql.conf) and connect with sslmode=verify-full "
            "and sslrootcert=..., or require it for the lock role (hostssl in pg_hba.conf)"
        ),
        details={"client": facts.client or "unix socket", "local": local},
    )


def superuser_finding(facts: SecurityFacts, label: str) -> Finding | None:
    """Warning: the lock role is a superuser."""
    if not facts.superuser:
        return None
    return Finding(
        code="postgres-superuser",
        severity=Severity.WARNING,
        title=f"{label}: the lock role {facts.role!r} is a superuser",
        breaks=(
            "nothing of the locks, but whoever gets this process's credentials owns the whole "
            "server; and a superuser skips every privilege check, so a grant the real lock "
            "role lacks is found only in production"
        ),
        fix=(
            "connect as a role with only the grants docs/security.md lists "
            "(create the tables once as an owner, then create_tables=false)"
        ),
        details={"role": facts.role},
    )
