"""``doctor`` findings about how open a ZooKeeper deployment is.

* ``zookeeper-open`` (warning): the backend connects without credentials
  (no ``user:password@`` in the ``zk://`` URL), so the nodes it creates are
  world-writable (``world:anyone`` with every permission): any client that
  reaches the ensemble can delete a held lock's node, or queue in front.
* ``zookeeper-no-tls``: the connection is not encrypted (a warning unless
  every server of the URL is on this machine's loopback, then info).
* ``zookeeper-world-writable`` (warning): credentials are given, but the
  lock nodes are world-writable anyway: ``acl=open`` in the URL, or the lock
  root or a lock folder found by doctor's walk grants ``world:anyone`` more
  than READ (``getACL``; created by a client without credentials, or by
  hand). In ZooKeeper the right to create or delete a node is checked on its
  parent, so a world-writable lock folder lets anyone break its holds.

What is read: the backend's own options (credentials, ``acl``, TLS), and
the ACL of the lock root and of at most :data:`ACL_SAMPLE` lock folders.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from aiozk import ACL, protocol
from aiozk import exc as zk_exc

from .._core.doctor import Finding, Severity, no_tls_finding
from .._core.hosts import all_loopback

if TYPE_CHECKING:
    from ._driver import ZooKeeperDriver

__all__ = [
    "ACL_SAMPLE",
    "acl_is_world_writable",
    "open_finding",
    "plaintext_finding",
    "security_findings",
    "world_writable_finding",
]

#: at most this many lock folders get their ACL read
ACL_SAMPLE: Final = 50

#: seconds each ACL read may take
_TIMEOUT: Final = 5.0

#: permissions that let a client change a node or its children (all but READ)
_CHANGE: Final = ACL.WRITE_PERM | ACL.CREATE_PERM | ACL.DELETE_PERM | ACL.ADMIN_PERM


def acl_is_world_writable(acl: Sequence[Any]) -> bool:
    """``acl`` (aiozk ``ACL`` entries) grants ``world:anyone`` more than READ."""
    return any(
        entry.id.scheme == "world" and entry.id.id == "anyone" and int(entry.perms) & _CHANGE
        for entry in acl
    )


def open_finding(servers: str) -> Finding:
    """Warning: no credentials, so every node the backend creates is world-writable."""
    return Finding(
        code="zookeeper-open",
        severity=Severity.WARNING,
        title=f"{servers}: the backend connects without credentials; lock nodes are world-writable",
        breaks=(
            "any client that reaches the ensemble can delete a held lock's node (the lock "
            "goes to the next in line while its holder still runs) or queue in front"
        ),
        fix=(
            "connect with zk://user:password@... (acl=creator, the default with credentials: "
            "nodes writable by that user only, readable by anyone; see docs/security.md)"
        ),
        details={"servers": servers},
    )


def plaintext_finding(servers: str, hosts: Sequence[str]) -> Finding:
    """Warning (info when every server is on the loopback): the connection is not encrypted."""
    loopback = all_loopback(hosts)
    return no_tls_finding(
        "zookeeper-no-tls",
        servers,
        local=loopback,
        exposed="the credentials",
        fix=(
            "serve TLS (secureClientPort) and connect with ?tls=true&ssl_ca_certs=... "
            "(see docs/security.md)"
        ),
        details={"servers": servers, "loopback": loopback},
    )


def world_writable_finding(acl_open: bool, paths: Sequence[str]) -> Finding:
    """Warning: credentials are given, but lock nodes or folders are world-writable."""
    if acl_open:
        title = "credentials are given, but acl=open leaves the lock nodes world-writable"
    else:
        title = (
            f"{len(paths)} node(s) of the lock root or its lock folders grant world:anyone "
            f"write access, e.g. {paths[0]}"
        )
    return Finding(
        code="zookeeper-world-writable",
        severity=Severity.WARNING,
        title=title,
        breaks=(
            "any client that reaches the ensemble, with or without credentials, can delete "
            "a held lock's node or queue in front of the waiters"
        ),
        fix=(
            "drop acl=open from the URL (acl=creator is the default with credentials); for "
            "folders created without credentials: setAcl them (zkCli.sh setAcl -R <path> "
            "digest:user:<hash>:cdrwa,world:anyone:r) or delete them while no lock uses them"
        ),
        details={"acl_open": acl_open, "paths": list(paths[:ACL_SAMPLE])},
    )


async def world_writable_paths(driver: ZooKeeperDriver, paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` (below the chroot) whose ACL grants ``world:anyone`` write access."""
    monitor = driver.monitor
    link = monitor.link
    found: list[str] = []
    for path in paths:
        try:
            reply = await monitor.call(
                protocol.GetACLRequest(path=link.normalize_path(path)),
                time.monotonic() + _TIMEOUT,
                retry=True,
            )
        except zk_exc.NoNode:
            continue  # gone since the walk
        if acl_is_world_writable(reply.acl):
            found.append(path)
    return found


async def security_findings(
    driver: ZooKeeperDriver, hosts: Sequence[str], folders: Sequence[str]
) -> list[Finding]:
    """The findings above; ``folders``: the lock root and the lock folders the walk found."""
    servers = driver._servers
    findings: list[Finding] = []
    own_session = driver._given is None  # an application's aiozk client: its auth is unknown
    if own_session and not driver._credentials:
        findings.append(open_finding(servers))
    if driver._ssl_context is None:  # aiozk's own client has no TLS either
        findings.append(plaintext_finding(servers, hosts))
    if findings and findings[0].code == "zookeeper-open":
        return findings  # world-writable by construction: the ACLs tell nothing more
    acl_open = own_session and driver._acl is None
    paths = await world_writable_paths(driver, folders[: ACL_SAMPLE + 1])
    if acl_open or paths:
        findings.append(world_writable_finding(acl_open, paths))
    return findings
