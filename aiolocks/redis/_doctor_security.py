"""``doctor`` findings about how open a Redis deployment is, and what aiolocks changes on it.

* ``redis-open`` (warning): the server lets anyone in without a password
  (its ``default`` user is ``nopass``): whoever reaches the port can delete
  or take any lock.
* ``redis-no-tls``: the connection is not encrypted (a warning unless the
  server is on this machine's loopback, then info).
* ``redis-config-set`` (info): with ``keyspace_events=auto`` (the default)
  aiolocks turns keyspace notifications on with ``CONFIG SET`` on the server.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .._core.doctor import Finding, Severity, no_tls_finding
from .._core.hosts import is_loopback

if TYPE_CHECKING:
    from ._doctor import Server
    from ._driver import RedisNode

__all__ = ["security_findings"]

#: seconds each security check may take
_TIMEOUT = 5.0


def _connection_facts(client: Any) -> tuple[str | None, bool | None]:
    """``(host, uses TLS)`` of ``client``'s connections, from redis-py's public attributes."""
    from redis.asyncio.connection import SSLConnection

    if hasattr(client, "get_nodes"):  # a cluster: its first known node
        nodes = client.get_nodes()
        if not nodes:
            return None, None
        node = nodes[0]
        return str(node.host), issubclass(node.connection_class, SSLConnection)
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None, None
    host = pool.connection_kwargs.get("host")
    return (str(host) if host else None), issubclass(pool.connection_class, SSLConnection)


def open_server_finding(label: str) -> Finding:
    """Warning: the server's ``default`` user needs no password."""
    return Finding(
        code="redis-open",
        severity=Severity.WARNING,
        title=f"{label}: the default user needs no password (nopass)",
        breaks=(
            "anyone who reaches the port can delete or overwrite any lock key, so two "
            "processes may both believe they hold a lock"
        ),
        fix=(
            "set a password (requirepass) or give the default user one, and connect as an "
            "ACL user limited to the lock keys (see docs/security.md)"
        ),
        details={"server": label},
    )


def plaintext_finding(label: str, host: str) -> Finding:
    """Warning (info on loopback): the connection is not encrypted."""
    loopback = is_loopback(host)
    return no_tls_finding(
        "redis-no-tls",
        label,
        local=loopback,
        exposed="the password",
        fix="serve TLS (tls-port) and connect with rediss:// or ssl=true, ssl_ca_certs=...",
        details={"server": label, "host": host, "loopback": loopback},
    )


def config_set_finding(label: str) -> Finding:
    """Info: aiolocks changes ``notify-keyspace-events`` on the server itself."""
    return Finding(
        code="redis-config-set",
        severity=Severity.INFO,
        title=(
            f"{label}: aiolocks sets notify-keyspace-events with CONFIG SET "
            "(keyspace_events=auto, the default)"
        ),
        breaks=(
            "nothing of the locks: a client changes a shared server's configuration, which "
            "other users of the server may not expect"
        ),
        fix=(
            "set notify-keyspace-events to include Kghxe in the server's configuration and "
            "connect with keyspace_events=listen (or off)"
        ),
        details={"server": label},
    )


async def _default_user_open(server: Server) -> bool:
    """The ``default`` user is on and ``nopass`` (False when we may not ask)."""
    try:
        async with asyncio.timeout(_TIMEOUT):
            reply = await server.call("ACL", "GETUSER", "default")
    except (RedisError, OSError, TimeoutError):
        return False  # a user that may not read ACLs: ACLs are in use
    if isinstance(reply, dict):
        flags = reply.get("flags") or reply.get(b"flags") or []
    elif isinstance(reply, list) and len(reply) >= 2:
        flags = reply[1]
    else:
        return False
    texts = {f.decode() if isinstance(f, bytes) else str(f) for f in flags}
    return "nopass" in texts and "on" in texts


async def security_findings(server: Server, node: RedisNode) -> list[Finding]:
    """The findings above for one server that ``node``'s client reaches."""
    findings: list[Finding] = []
    if await _default_user_open(server):
        findings.append(open_server_finding(server.label))
    host, tls = _connection_facts(node.client)
    if tls is False and host is not None:
        findings.append(plaintext_finding(server.label, host))
    if node.keyspace_events == "auto":
        findings.append(config_set_finding(server.label))
    return findings
