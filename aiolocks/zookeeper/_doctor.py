"""``doctor`` for ZooKeeper: the session timeout the server granted, the ensemble, leftovers.

What is read, and from where:

* the negotiated session timeout: the client's session (the server's answer
  to the requested one, clamped to its ``minSessionTimeout`` /
  ``maxSessionTimeout``);
* version and mode of each server in the URL: the ``srvr`` four-letter word
  (always allowed by ZooKeeper); the server's session bounds: ``conf``;
* the ensemble's voting members: the ``/zookeeper/config`` znode (3.5+),
  read in the session, so no four-letter word is needed for it;
* how open the deployment is (credentials, ``acl``, TLS, the ACL of the
  lock root and of the lock folders): :mod:`._doctor_security`;
* leftovers under the lock root: a bounded walk of ``/aiolocks`` that finds
  lock nodes that are not ephemeral (they block their lock forever) and
  empty lock parents that never had a child. The server hides whether a node
  is a container (its ``ephemeralOwner`` reads 0 like a persistent node's),
  so the second check relies on what is true of both: ZooKeeper reaps a
  container only once a child has come and gone, and a persistent node never.
  The record store's folder (``/aiolocks/records``) is not walked: records
  are persistent nodes by design, not lock leftovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from aiozk import exc as zk_exc
from aiozk import protocol

from .._core.doctor import Diagnosis, Finding, Severity
from ._doctor_security import security_findings
from ._layout import RECORDS_ROOT

if TYPE_CHECKING:
    from ._driver import ZooKeeperDriver

__all__ = [
    "FourLetter",
    "diagnose_zookeeper",
    "ensemble_findings",
    "parse_dynamic_config",
    "session_timeout_finding",
    "version_finding",
]

#: the lock root walk stops after this many znodes (a huge tree is a finding itself)
WALK_LIMIT: Final = 5000

#: bound on each four-letter word and each request of the checks, seconds
CHECK_TIMEOUT: Final = 5.0

_NOT_ALLOWED: Final = "is not executed because it is not in the whitelist"


@dataclass(slots=True)
class FourLetter:
    """The answer of one server to a four-letter word (``text`` is ``None`` if refused)."""

    server: str
    text: str | None = None
    error: str | None = None

    @property
    def refused(self) -> bool:
        """The server answered, but the word is not in ``4lw.commands.whitelist``."""
        return self.error is not None and _NOT_ALLOWED in self.error


async def four_letter(host: str, port: int, word: str) -> FourLetter:
    """Send ``word`` to ``host:port`` and read the whole answer (bounded by CHECK_TIMEOUT)."""
    server = f"{host}:{port}"
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(word.encode())
                await writer.drain()
                data = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError) as exc:
        return FourLetter(server, error=f"{type(exc).__name__}: {exc}")
    text = data.decode("utf-8", "replace")
    if _NOT_ALLOWED in text or not text:
        return FourLetter(server, error=text.strip() or "empty answer")
    return FourLetter(server, text=text)


def _fields(text: str, sep: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, found, value = line.partition(sep)
        if found:
            out[key.strip()] = value.strip()
    return out


def parse_version(text: str) -> tuple[int, ...] | None:
    """``(3, 8, 0)`` from an ``srvr`` answer's ``Zookeeper version: 3.8.0-...`` line."""
    match = re.search(r"version:\s*(\d+)\.(\d+)\.(\d+)", text)
    return None if match is None else tuple(int(g) for g in match.groups())


def parse_dynamic_config(data: str) -> list[str]:
    """The voting members (``server.N=...`` lines that are not observers) of a dynamic config."""
    members = []
    for line in data.splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("server.") and ":observer" not in value:
            members.append(key.strip())
    return members


# -- pure evaluations ----------------------------------------------------------------


def session_timeout_finding(
    requested: float, negotiated: float, bounds: tuple[float, float] | None
) -> Finding | None:
    """Warn when the server granted another session timeout than the one asked for."""
    if negotiated <= 0 or abs(requested - negotiated) < 0.001:
        return None
    shorter = negotiated < requested
    limits = ""
    if bounds is not None:
        limits = f" (server allows {bounds[0]:g} s to {bounds[1]:g} s)"
    breaks = (
        "holds are lost after a shorter silence than configured: a GC pause or network "
        "blip the application was sized for now expires the session"
        if shorter
        else "a crashed or partitioned holder keeps its locks longer than configured, so "
        "every other process waits that much longer"
    )
    bound = "minSessionTimeout" if not shorter else "maxSessionTimeout"
    return Finding(
        code="zk-session-timeout-clamped",
        severity=Severity.WARNING,
        title=(
            f"session_timeout {requested:g} s was requested, the server granted "
            f"{negotiated:g} s{limits}"
        ),
        breaks=breaks,
        fix=(
            f"change {bound} in zoo.cfg (defaults: 2 and 20 tickTime) so that it allows "
            f"{requested:g} s, or ask for a session_timeout inside the server's range"
        ),
        details={
            "requested_s": requested,
            "negotiated_s": negotiated,
            "server_min_s": None if bounds is None else bounds[0],
            "server_max_s": None if bounds is None else bounds[1],
        },
    )


def version_finding(server: str, version: tuple[int, ...]) -> Finding | None:
    """ZooKeeper before 3.5 has no container nodes (lock parents are never reaped)."""
    if version >= (3, 5, 0):
        return None
    text = ".".join(map(str, version))
    return Finding(
        code="zk-old-version",
        severity=Severity.CRITICAL,
        title=f"{server} runs ZooKeeper {text}; aiolocks needs 3.5 or later",
        breaks=(
            "ZooKeeper before 3.5 has no container nodes: lock parents cannot be created "
            "the way aiolocks creates them, and would never be reaped"
        ),
        fix="upgrade the ensemble to ZooKeeper 3.6 or later (3.5 is end of life)",
        details={"server": server, "version": text},
    )


def ensemble_findings(members: int, listed: int) -> list[Finding]:
    """Ensemble size and quorum, and how many of its servers the connect string names."""
    findings: list[Finding] = []
    if members <= 1:
        findings.append(
            Finding(
                code="zk-single-server",
                severity=Severity.WARNING,
                title="ZooKeeper runs as a single server (standalone)",
                breaks=(
                    "when that server stops, every session and every hold is lost and no "
                    "lock can be taken until it is back: there is no quorum to fail over to"
                ),
                fix="run an ensemble of 3 or 5 servers and list them all in the zk:// URL",
                details={"members": members},
            )
        )
        return findings
    if members % 2 == 0:
        findings.append(
            Finding(
                code="zk-even-ensemble",
                severity=Severity.INFO,
                title=f"the ensemble has {members} voting members (quorum {members // 2 + 1})",
                breaks=(
                    f"an even ensemble tolerates no more failures than {members - 1} servers "
                    "would, and needs one more server for its quorum"
                ),
                fix=f"run {members - 1} or {members + 1} voting members",
                details={"members": members, "quorum": members // 2 + 1},
            )
        )
    if listed < members:
        findings.append(
            Finding(
                code="zk-connect-string-partial",
                severity=Severity.WARNING,
                title=f"the zk:// URL names {listed} of the {members} ensemble members",
                breaks=(
                    "when the listed servers are down the client cannot reach the others: "
                    "the session expires and every hold is lost although a quorum is up"
                ),
                fix="list every ensemble member in the zk:// URL",
                details={"members": members, "listed": listed},
            )
        )
    return findings


# -- the lock root walk ---------------------------------------------------------------


@dataclass(slots=True)
class Leftovers:
    """What the walk of the lock root found."""

    stale_lock_nodes: list[str] = field(default_factory=list)
    empty_parents: list[str] = field(default_factory=list)
    #: folders with lock nodes in them (their ACL decides who may break the holds)
    lock_folders: list[str] = field(default_factory=list)
    visited: int = 0
    truncated: bool = False


def _is_lock_node(name: str) -> bool:
    return name.startswith("_c_")


async def walk_lock_root(driver: ZooKeeperDriver, root: str) -> Leftovers:
    """Breadth-first over ``root`` (below the chroot), at most :data:`WALK_LIMIT` znodes."""
    monitor = driver.monitor
    link = driver.monitor.link
    found = Leftovers()
    queue = [root]
    while queue:
        path = queue.pop(0)
        if path == RECORDS_ROOT:
            continue  # the record store: records are persistent nodes, not lock leftovers
        if found.visited >= WALK_LIMIT:
            found.truncated = True
            break
        try:
            reply = await monitor.call(
                protocol.GetChildren2Request(path=link.normalize_path(path), watch=False),
                time.monotonic() + CHECK_TIMEOUT,
                retry=True,
            )
        except zk_exc.NoNode:
            continue
        found.visited += 1
        stat = reply.stat
        owner = int(stat.ephemeral_owner)
        persistent = owner == 0
        name = path.rsplit("/", 1)[-1]
        if path != root and persistent:
            if _is_lock_node(name):
                found.stale_lock_nodes.append(path)
            elif (
                not reply.children
                and int(stat.child_version) == 0
                and path.count("/") > root.count("/") + 1
            ):
                found.empty_parents.append(path)
        if any(_is_lock_node(child) for child in reply.children):
            found.lock_folders.append(path)
        queue.extend(f"{path}/{child}" for child in sorted(reply.children))
    return found


def leftover_findings(found: Leftovers, root: str) -> list[Finding]:
    """Findings for persistent lock nodes and persistent empty parents under ``root``."""
    findings: list[Finding] = []
    if found.stale_lock_nodes:
        findings.append(
            Finding(
                code="zk-stale-lock-nodes",
                severity=Severity.CRITICAL,
                title=(
                    f"{len(found.stale_lock_nodes)} persistent lock node(s) under {root}, "
                    f"e.g. {found.stale_lock_nodes[0]}"
                ),
                breaks=(
                    "a lock node that is not ephemeral never goes away with its session: the "
                    "lock it belongs to stays held (or its queue blocked) forever"
                ),
                fix=(
                    "make sure no holder uses them, then delete them (zkCli.sh delete <path>); "
                    "`aiolocks status` shows who they claim to be"
                ),
                details={"paths": found.stale_lock_nodes[:50]},
            )
        )
    if found.empty_parents:
        findings.append(
            Finding(
                code="zk-empty-lock-parents",
                severity=Severity.WARNING,
                title=(
                    f"{len(found.empty_parents)} empty lock parent(s) that never had a child "
                    f"under {root}, e.g. {found.empty_parents[0]}"
                ),
                breaks=(
                    "ZooKeeper never reaps such nodes (a container only after its last child "
                    "is gone, a persistent node never): they pile up, one per name, growing "
                    "memory, snapshots and restart time"
                ),
                fix=(
                    "delete them (zkCli.sh delete <path>; a lock being set up at this instant "
                    "shows up here too, so run doctor again first); find what creates them"
                ),
                details={"paths": found.empty_parents[:50]},
            )
        )
    if found.truncated:
        findings.append(
            Finding(
                code="zk-lock-root-large",
                severity=Severity.INFO,
                title=f"more than {WALK_LIMIT} znodes under {root}; the walk stopped there",
                breaks="leftovers beyond the first znodes were not checked",
                fix="look for stale nodes with zkCli.sh, or delete unused lock names",
                details={"limit": WALK_LIMIT},
            )
        )
    return findings


# -- entry point -----------------------------------------------------------------------


def _listed_servers(servers: str) -> list[tuple[str, int]]:
    out = []
    for item in servers.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host:
            host, port = port, "2181"
        out.append((host.strip("[]"), int(port)))
    return out


async def _dynamic_members(driver: ZooKeeperDriver) -> list[str] | None:
    """Voting members from ``/zookeeper/config`` (outside any chroot); ``None`` if unreadable."""
    try:
        reply = await driver.monitor.call(
            protocol.GetDataRequest(path="/zookeeper/config", watch=False),
            time.monotonic() + CHECK_TIMEOUT,
            retry=True,
        )
    except (zk_exc.ZKError, TimeoutError):
        return None
    return parse_dynamic_config(bytes(reply.data or b"").decode("utf-8", "replace"))


async def _session_bounds(
    answered: Sequence[FourLetter],
) -> tuple[tuple[float, float] | None, Finding | None]:
    """The server's session-timeout bounds (``conf``), or the finding that ``conf`` is refused."""
    if not answered:
        return None, None
    host, _, port = answered[0].server.rpartition(":")
    conf = await four_letter(host, int(port), "conf")
    if conf.text is not None:
        values = _fields(conf.text, "=")
        try:
            return (
                int(values["minSessionTimeout"]) / 1000,
                int(values["maxSessionTimeout"]) / 1000,
            ), None
        except (KeyError, ValueError):
            return None, None
    if not conf.refused:
        return None, None
    refused = ["conf"]
    return None, Finding(
        code="zk-4lw-unavailable",
        severity=Severity.INFO,
        title=(
            f"four-letter word(s) {', '.join(refused)} not allowed by "
            f"4lw.commands.whitelist; the server's session-timeout bounds were not read"
        ),
        breaks=(
            "doctor could not report the server's minSessionTimeout/maxSessionTimeout "
            "(the negotiated timeout is still checked)"
        ),
        fix="add conf (and srvr, mntr for monitoring) to 4lw.commands.whitelist",
        details={"refused": refused},
    )


async def diagnose_zookeeper(driver: ZooKeeperDriver, root: str) -> Diagnosis:
    """All ZooKeeper findings for an open driver."""
    findings: list[Finding] = []
    listed = _listed_servers(driver._servers)
    srvr: Sequence[FourLetter] = await asyncio.gather(
        *(four_letter(host, port, "srvr") for host, port in listed)
    )
    modes: list[str] = []
    answered = [answer for answer in srvr if answer.text is not None]
    for answer in srvr:
        if answer.text is None:
            if not answer.refused:
                findings.append(
                    Finding(
                        code="zk-server-unreachable",
                        severity=Severity.WARNING,
                        title=f"{answer.server} (in the URL) did not answer: {answer.error}",
                        breaks=(
                            "the ensemble runs with one server fewer: one more failure may "
                            "cost the quorum, and every hold with it"
                        ),
                        fix="bring the server back, or remove it from the URL",
                        details={"server": answer.server, "error": answer.error},
                    )
                )
            continue
        mode = _fields(answer.text, ":").get("Mode", "")
        modes.append(mode)
        version = parse_version(answer.text)
        if version is not None:
            old = version_finding(answer.server, version)
            if old is not None:
                findings.append(old)
    bounds, conf_finding = await _session_bounds(answered)
    if conf_finding is not None:
        findings.append(conf_finding)
    # session timeout (of the backend's own session)
    negotiated = float(driver.monitor.link.timeout or 0)
    clamped = session_timeout_finding(driver._session_timeout, negotiated, bounds)
    if clamped is not None:
        findings.append(clamped)
    # ensemble
    members = await _dynamic_members(driver)
    if members:
        findings.extend(ensemble_findings(len(members), len(listed)))
    elif "standalone" in modes:
        findings.extend(ensemble_findings(1, len(listed)))
    # leftovers
    leftovers = await walk_lock_root(driver, root)
    findings.extend(leftover_findings(leftovers, root))
    # how open the deployment is
    hosts = [host for host, _ in listed]
    findings.extend(await security_findings(driver, hosts, [root, *leftovers.lock_folders]))
    return Diagnosis(
        findings=findings,
        timeout=negotiated or driver._session_timeout,
        timeout_name="session timeout",
        server_time=None,
    )
