"""``doctor`` for etcd: the server version, the members and leader, the lease TTL.

* **Version.** etcd 3.4's server-side Lock (``etcdctl lock``, the v3lock
  API, Go's concurrency package of that release) can return a lock whose
  lease expired while it waited. aiolocks reads its own key again before
  claiming anything, but other programs taking the same locks on a 3.4
  server are exposed, and 3.4 is out of support: warning below 3.5.
* **Members and leader.** Each endpoint of the URL is asked for its status
  on a connection of its own: one that does not answer is a warning (the
  client fails over to the others), none answering is the backend being
  unavailable, and no leader, or endpoints disagreeing about it, is critical
  (no write, hence no acquire or renewal, can succeed without one).
* **Lease TTL against the election timeout.** etcd grants no lease shorter
  than 1.5 election timeouts; doctor grants (and revokes) a 1-second lease
  to learn that minimum. A lease TTL below three election timeouts leaves
  the keep-alive (every third of the TTL) no margin across one leader
  election: warning.
* **How open the cluster is.** ``etcd-open`` (warning): the cluster does not
  check users (``auth enable`` was never run), so whoever reaches a member
  can delete any lock key. Asked with ``AuthStatus`` (etcd 3.5+); on 3.4,
  which lacks it, a backend that works without a user in its URL and
  without a client certificate proves it (with a client certificate the
  member may take the certificate's name as the user: not reported).
  ``etcd-no-tls``: the URL is not ``etcds://`` (warning; info when every
  endpoint is on this machine's loopback).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from .._core.doctor import Diagnosis, Finding, Severity, no_tls_finding
from .._core.errors import BackendUnavailableError
from .._core.hosts import all_loopback
from ._client import EtcdClient

if TYPE_CHECKING:
    from ._driver import EtcdDriver

__all__ = [
    "diagnose_etcd",
    "leader_findings",
    "open_finding",
    "plaintext_finding",
    "ttl_finding",
    "version_finding",
]

#: the first etcd release whose lease checks are safe for locks
SAFE_VERSION: Final = (3, 5)
#: seconds each endpoint gets to answer its status request
CHECK_TIMEOUT: Final = 5.0


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def version_finding(endpoint: str, version: str) -> Finding | None:
    """A warning when ``version`` is older than 3.5 (or cannot be read)."""
    numbers = _version_tuple(version)
    if numbers and numbers[:2] >= SAFE_VERSION:
        return None
    return Finding(
        code="etcd-version",
        severity=Severity.WARNING,
        title=f"etcd {version or '(unknown)'} at {endpoint} is older than 3.5",
        breaks=(
            "etcd 3.4's server-side Lock (etcdctl lock, Go clients of that release) can "
            "return a lock whose lease expired while waiting: two holders, if other "
            "programs share these locks"
        ),
        fix="upgrade the cluster to etcd 3.5 or later",
        details={"endpoint": endpoint, "version": version},
    )


def leader_findings(statuses: dict[str, dict[str, object]]) -> list[Finding]:
    """Critical when no member knows a leader, or members disagree about it."""
    leaders = {int(str(s.get("leader", 0))) for s in statuses.values()}
    details = {ep: str(s.get("leader", 0)) for ep, s in statuses.items()}
    if not statuses:
        return []
    if leaders == {0} or 0 in leaders:
        return [
            Finding(
                code="etcd-no-leader",
                severity=Severity.CRITICAL,
                title="an etcd member reports no leader",
                breaks="no write can commit without a leader: no acquire, release or renewal",
                fix="restore quorum (a majority of members up and connected)",
                details={"leaders": details},
            )
        ]
    if len(leaders) > 1:
        return [
            Finding(
                code="etcd-split-leader",
                severity=Severity.CRITICAL,
                title=f"the endpoints name {len(leaders)} different leaders",
                breaks=(
                    "the endpoints may belong to different clusters: locks taken through "
                    "one are invisible to the other"
                ),
                fix="list the members of one cluster only in the etcd:// URL",
                details={"leaders": details},
            )
        ]
    return []


def ttl_finding(lease_ttl: int, min_ttl: int) -> Finding | None:
    """A warning when ``lease_ttl`` is below three election timeouts (``min_ttl`` = 1.5 of them)."""
    election = min_ttl / 1.5
    if lease_ttl >= 3 * election:
        return None
    return Finding(
        code="etcd-lease-ttl",
        severity=Severity.WARNING,
        title=(
            f"lease_ttl={lease_ttl}s is short against the election timeout "
            f"(about {election:g}s; etcd's minimum lease TTL is {min_ttl}s)"
        ),
        breaks=(
            "one leader election can outlast the keep-alive's margin, so every hold of the "
            "backend is reported lost"
        ),
        fix=f"use lease_ttl of at least {max(min_ttl, round(3 * election + 0.5))} seconds",
        details={"lease_ttl": lease_ttl, "min_ttl": min_ttl},
    )


def open_finding(endpoints: Sequence[str], how: str) -> Finding:
    """Warning: the cluster does not check users (``how``: how doctor knows)."""
    return Finding(
        code="etcd-open",
        severity=Severity.WARNING,
        title=f"etcd at {', '.join(endpoints)} does not check users (auth is disabled)",
        breaks=(
            "whoever reaches a member can delete or overwrite any lock key, so two processes "
            "may both believe they hold a lock"
        ),
        fix=(
            "create a user whose role may read and write the lock prefix only, run "
            "'etcdctl auth enable', and connect with etcd://user:password@... "
            "(see docs/security.md)"
        ),
        details={"endpoints": list(endpoints), "how": how},
    )


def plaintext_finding(endpoints: Sequence[str]) -> Finding:
    """Warning (info when every endpoint is on the loopback): the connection is not encrypted."""
    hosts = [endpoint.rpartition(":")[0] or endpoint for endpoint in endpoints]
    loopback = all_loopback(hosts)
    return no_tls_finding(
        "etcd-no-tls",
        f"etcd at {', '.join(endpoints)}",
        local=loopback,
        exposed="the password, the auth token",
        fix="serve TLS on the members' client URLs and connect with etcds://...&ssl_ca_certs=...",
        details={"endpoints": list(endpoints), "loopback": loopback},
    )


async def security_findings(driver: EtcdDriver) -> list[Finding]:
    """``etcd-open`` and ``etcd-no-tls`` for the backend's cluster and URL."""
    options = driver.options
    findings: list[Finding] = []
    if options.username is None:  # with a user, opening the backend proved auth is on
        enabled = await driver.client.auth_enabled(timeout=CHECK_TIMEOUT)
        if enabled is False:
            findings.append(open_finding(options.endpoints, "AuthStatus: auth disabled"))
        elif enabled is None and (options.tls is None or options.tls.certfile is None):
            how = "etcd 3.4 has no AuthStatus; requests without a user or certificate succeed"
            findings.append(open_finding(options.endpoints, how))
    if options.tls is None:
        findings.append(plaintext_finding(options.endpoints))
    return findings


async def diagnose_etcd(driver: EtcdDriver) -> Diagnosis:
    """Ask every endpoint for its status, and the cluster for its minimum lease TTL."""
    options = driver.options
    findings: list[Finding] = []
    statuses: dict[str, dict[str, object]] = {}
    failed: dict[str, str] = {}
    for endpoint in options.endpoints:
        probe = EtcdClient(
            [endpoint],
            connect_timeout=CHECK_TIMEOUT,
            request_timeout=CHECK_TIMEOUT,
            username=options.username,
            password=options.password,
            tls=options.tls,
        )
        try:
            statuses[endpoint] = await probe.status(timeout=CHECK_TIMEOUT)
        except BackendUnavailableError as exc:
            failed[endpoint] = str(exc)
        finally:
            await probe.close()
    if not statuses:
        raise BackendUnavailableError(
            "no etcd endpoint answered: " + "; ".join(f"{e}: {m}" for e, m in failed.items())
        )
    for endpoint, error in failed.items():
        findings.append(
            Finding(
                code="etcd-member-unreachable",
                severity=Severity.WARNING,
                title=f"etcd endpoint {endpoint} did not answer",
                breaks="the backend fails over to the other endpoints; one fewer to fail over to",
                fix=f"check {endpoint} (etcdctl endpoint health), or remove it from the URL",
                details={"endpoint": endpoint, "error": error},
            )
        )
    for endpoint, status in statuses.items():
        found = version_finding(endpoint, str(status.get("version", "")))
        if found is not None:
            findings.append(found)
    findings.extend(leader_findings(statuses))
    client = driver.client
    grant = await client.lease_grant(1)
    with contextlib.suppress(BackendUnavailableError):
        await client.lease_revoke(grant.id)
    found = ttl_finding(options.lease_ttl, grant.ttl)
    if found is not None:
        findings.append(found)
    findings.extend(await security_findings(driver))
    return Diagnosis(findings=findings, timeout=float(options.lease_ttl), timeout_name="lease_ttl")
