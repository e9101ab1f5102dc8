"""``backend.doctor()``: deployment settings that break lock guarantees, and a live self-test.

Most lock incidents come from the service's settings, not from the library:
an eviction policy that drops held locks, a server that restarts empty, a
session timeout the server quietly clamps. A driver reports what it can see
of its server as :class:`Finding` objects (through the optional ``diagnose()``
method of :class:`~aiolocks._core.driver.SupportsDiagnose`, see
:class:`Diagnosis`); the self-test here is the same for every
backend: acquire and release a scratch lock through the public API, time it
against the lease or session timeout, check that fencing tokens increase and
measure the clock offset between client and server where the server has a
clock to ask.

A driver that has no ``diagnose()`` method still gets the self-test. Adding
findings for a new backend means writing one ``async def diagnose(self) ->
Diagnosis`` on its driver; nothing here changes.
"""

from __future__ import annotations

import enum
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from .driver import Driver, SupportsDiagnose
from .errors import LockError

if TYPE_CHECKING:
    from .backend import Backend

__all__ = [
    "Diagnosis",
    "DoctorReport",
    "Finding",
    "SelfTest",
    "Severity",
    "clock_finding",
    "no_tls_finding",
    "round_trip_finding",
    "run_doctor",
]

logger = logging.getLogger("aiolocks")

#: version of the JSON document written by ``DoctorReport.to_dict()``
SCHEMA_VERSION: Final = 1

#: the scratch lock the self-test takes (a unique suffix is added per run)
SCRATCH_PREFIX: Final = "aiolocks-doctor/self-test-"

#: round trip above this fraction of the lease/session timeout: warning
RTT_WARNING_FRACTION: Final = 0.1
#: above this fraction: critical (the watchdog renews every third of a lease)
RTT_CRITICAL_FRACTION: Final = 1 / 3
#: clock offset (beyond the measurement's own uncertainty) worth a warning, seconds
CLOCK_WARNING_SECONDS: Final = 1.0


class Severity(enum.Enum):
    """How bad a finding is. Only ``CRITICAL`` makes ``aiolocks doctor`` exit 1."""

    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for critical, 1 for warning, 2 for info (sort order of a report)."""
        return _RANK[self]


_RANK: Final = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``doctor`` found about a deployment.

    :param code: stable identifier (``redis-eviction-policy``), for CI rules
    :param severity: :class:`Severity`
    :param title: one line saying what was found, with the values seen
    :param breaks: one sentence: which guarantee this breaks, and how
    :param fix: the setting to change (or the check to make by hand)
    :param details: the raw values the finding is based on (JSON-safe)
    """

    code: str
    severity: Severity
    title: str
    breaks: str
    fix: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """This finding as a JSON-ready dict (``severity`` as its text)."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "title": self.title,
            "breaks": self.breaks,
            "fix": self.fix,
            "details": dict(self.details),
        }


@dataclass(slots=True)
class Diagnosis:
    """What a driver's ``diagnose()`` returns: its findings and what the self-test needs.

    :param findings: configuration findings, in any order
    :param timeout: how long a hold survives without contact (Redis
        ``lease_time``, ZooKeeper negotiated session timeout), seconds;
        ``None`` when holds cannot time out
    :param timeout_name: what ``timeout`` is called for this backend
    :param server_time: returns the server's wall clock (Unix seconds), for
        the clock-offset measurement; ``None`` when the server has none to ask
    """

    findings: list[Finding] = field(default_factory=list)
    timeout: float | None = None
    timeout_name: str = "timeout"
    server_time: Callable[[], Awaitable[float]] | None = None


@dataclass(slots=True)
class SelfTest:
    """The outcome of the live self-test (every value measured, ``None`` if not reached)."""

    lock_name: str
    acquired: bool = False
    released: bool = False
    fencing_tokens: list[int] = field(default_factory=list)
    #: each fencing token larger than the one before (``None``: fewer than two)
    tokens_increasing: bool | None = None
    #: slowest acquire+release cycle of the scratch lock, seconds
    round_trip: float | None = None
    timeout: float | None = None
    timeout_name: str | None = None
    #: server clock minus client clock, seconds (``None``: not measured)
    clock_offset: float | None = None
    #: half the round trip of the clock read: the offset is known to +- this
    clock_uncertainty: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """The scratch lock was taken and given back, and tokens increased."""
        return (
            self.error is None
            and self.acquired
            and self.released
            and self.tokens_increasing is not False
        )

    def to_dict(self) -> dict[str, Any]:
        """The self-test as a JSON-ready dict (times in seconds)."""
        return {
            "ok": self.ok,
            "lock_name": self.lock_name,
            "acquired": self.acquired,
            "released": self.released,
            "fencing_tokens": list(self.fencing_tokens),
            "tokens_increasing": self.tokens_increasing,
            "round_trip_s": self.round_trip,
            "timeout_s": self.timeout,
            "timeout_name": self.timeout_name,
            "clock_offset_s": self.clock_offset,
            "clock_uncertainty_s": self.clock_uncertainty,
            "error": self.error,
        }


@dataclass(slots=True)
class DoctorReport:
    """What ``await backend.doctor()`` returns.

    >>> report = await backend.doctor()          # doctest: +SKIP
    >>> [f.code for f in report.findings if f.severity is Severity.CRITICAL]  # doctest: +SKIP
    ['redis-eviction-policy']
    """

    url: str
    findings: list[Finding]
    self_test: SelfTest | None

    @property
    def ok(self) -> bool:
        """No critical finding."""
        return not any(f.severity is Severity.CRITICAL for f in self.findings)

    @property
    def exit_status(self) -> int:
        """``aiolocks doctor``'s exit status: 0 when nothing is critical, else 1."""
        return 0 if self.ok else 1

    def codes(self, severity: Severity | None = None) -> list[str]:
        """The codes of the findings (of one severity, if given), in report order."""
        return [f.code for f in self.findings if severity is None or f.severity is severity]

    def get(self, code: str) -> Finding | None:
        """The finding with this code, or ``None``."""
        for finding in self.findings:
            if finding.code == code:
                return finding
        return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``aiolocks doctor --json`` (see ``docs/operations.md``)."""
        counts = {s.value: 0 for s in Severity}
        for finding in self.findings:
            counts[finding.severity.value] += 1
        return {
            "schema": SCHEMA_VERSION,
            "url": self.url,
            "ok": self.ok,
            "exit_status": self.exit_status,
            "counts": counts,
            "findings": [f.to_dict() for f in self.findings],
            "self_test": None if self.self_test is None else self.self_test.to_dict(),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    def render(self) -> str:
        """A human-readable report (what ``aiolocks doctor`` prints without ``--json``)."""
        lines = [f"aiolocks doctor {self.url}"]
        test = self.self_test
        if test is not None:
            lines.append("")
            lines.append("self-test:")
            lines.append(
                f"  scratch lock {test.lock_name!r}: "
                f"acquired={_yes(test.acquired)} released={_yes(test.released)}"
            )
            if test.fencing_tokens:
                order = {True: "increasing", False: "NOT increasing", None: "n/a"}
                tokens = ", ".join(str(t) for t in test.fencing_tokens)
                lines.append(f"  fencing tokens: {tokens} ({order[test.tokens_increasing]})")
            if test.round_trip is not None:
                against = ""
                if test.timeout is not None:
                    against = f" against {test.timeout_name} {test.timeout:g} s"
                lines.append(
                    f"  acquire+release round trip: {test.round_trip * 1000:.1f} ms{against}"
                )
            if test.clock_offset is not None:
                lines.append(
                    f"  server clock - client clock: {test.clock_offset * 1000:+.1f} ms "
                    f"(+- {(test.clock_uncertainty or 0) * 1000:.1f} ms)"
                )
            else:
                lines.append(
                    "  clock offset: not measured (this backend has no server clock to ask)"
                )
            if test.error:
                lines.append(f"  error: {test.error}")
        lines.append("")
        if not self.findings:
            lines.append("findings: none")
        else:
            lines.append(f"findings ({len(self.findings)}):")
            for finding in self.findings:
                lines.append(
                    f"  [{finding.severity.value.upper()}] {finding.code}: {finding.title}"
                )
                lines.append(f"      breaks: {finding.breaks}")
                lines.append(f"      fix:    {finding.fix}")
        lines.append("")
        counts = dict.fromkeys(Severity, 0)
        for finding in self.findings:
            counts[finding.severity] += 1
        verdict = "OK" if self.ok else "CRITICAL"
        lines.append(
            f"{verdict}: {counts[Severity.CRITICAL]} critical, "
            f"{counts[Severity.WARNING]} warning, {counts[Severity.INFO]} info"
        )
        return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


# -- evaluation of measured values (pure; the self-test and tests use them) ----------


def round_trip_finding(
    round_trip: float, timeout: float | None, timeout_name: str
) -> Finding | None:
    """A finding when a lock round trip takes a large part of the lease/session timeout."""
    if timeout is None or timeout <= 0:
        return None
    share = round_trip / timeout
    if share < RTT_WARNING_FRACTION:
        return None
    severity = Severity.CRITICAL if share >= RTT_CRITICAL_FRACTION else Severity.WARNING
    return Finding(
        code="slow-round-trip",
        severity=severity,
        title=(
            f"an acquire+release round trip took {round_trip * 1000:.0f} ms, "
            f"{share:.0%} of {timeout_name} ({timeout:g} s)"
        ),
        breaks=(
            "renewals and heartbeats that slow leave little or no margin before the server "
            "lets a hold go, so holds are lost under load or on a network blip"
        ),
        fix=(
            f"raise {timeout_name} well above the round trip (at least 10x), or run the "
            "client closer to the server"
        ),
        details={"round_trip_s": round_trip, "timeout_s": timeout, "share": share},
    )


def no_tls_finding(
    code: str, where: str, *, local: bool, exposed: str, fix: str, details: dict[str, Any]
) -> Finding:
    """The ``<backend>-no-tls`` finding: a warning, or info when the traffic stays local.

    :param code: the finding's code (``redis-no-tls``)
    :param where: the server(s), as the title names them
    :param local: the traffic stays on this machine (loopback, Unix socket)
    :param exposed: what a reader of the network sees besides the lock traffic
    :param fix: how to turn TLS on for this backend
    :param details: the raw values (JSON-safe)
    """
    return Finding(
        code=code,
        severity=Severity.INFO if local else Severity.WARNING,
        title=f"{where}: the connection is not encrypted (no TLS)",
        breaks=(
            f"whoever can read the network sees {exposed} and the lock traffic, "
            "and can take over the connection"
        ),
        fix=fix,
        details=details,
    )


def clock_finding(offset: float, uncertainty: float) -> Finding | None:
    """A finding when client and server clocks differ by more than a second (beyond error)."""
    apart = abs(offset) - uncertainty
    if apart < CLOCK_WARNING_SECONDS:
        return None
    side = "ahead of" if offset > 0 else "behind"
    return Finding(
        code="clock-offset",
        severity=Severity.WARNING,
        title=f"the server clock is {abs(offset):.3f} s {side} this client's clock",
        breaks=(
            "lease expiries and timestamps that the server writes and clients read "
            "(lock status, logs, fencing tokens derived from server time) do not line up, "
            "and a clock that is stepped back can repeat time-based values"
        ),
        fix="run NTP (chrony, systemd-timesyncd) on the servers and the clients",
        details={"offset_s": offset, "uncertainty_s": uncertainty},
    )


# -- the run ----------------------------------------------------------------------


def _unreachable(url: str, exc: BaseException) -> Finding:
    return Finding(
        code="backend-unreachable",
        severity=Severity.CRITICAL,
        title=f"could not reach {url}: {exc}",
        breaks="no lock can be taken while the lock service cannot be reached",
        fix="check the URL, the network path and that the server runs",
        details={"error": f"{type(exc).__name__}: {exc}"},
    )


async def _measure_clock(
    server_time: Callable[[], Awaitable[float]], test: SelfTest, samples: int = 3
) -> None:
    """Keep the sample with the shortest round trip (its midpoint is the best estimate)."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        before = time.time()
        started = time.perf_counter()
        server = await server_time()
        rtt = time.perf_counter() - started
        offset = server - (before + rtt / 2)
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None
    test.clock_offset = best[0]
    test.clock_uncertainty = best[1] / 2


async def self_test(
    backend: Backend, diagnosis: Diagnosis, *, cycles: int = 3, timeout: float = 10.0
) -> tuple[SelfTest, list[Finding]]:
    """Take and give back a scratch mutex ``cycles`` times through the public API.

    Records the fencing tokens (they must increase), the slowest cycle, and
    the clock offset; returns the record and the findings it leads to.
    """
    test = SelfTest(
        lock_name=f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}",
        timeout=diagnosis.timeout,
        timeout_name=diagnosis.timeout_name if diagnosis.timeout is not None else None,
    )
    findings: list[Finding] = []
    lock = backend.mutex(test.lock_name)
    slowest = 0.0
    try:
        for _ in range(cycles):
            test.released = False
            started = time.perf_counter()
            async with lock.hold(timeout=timeout) as held:
                test.acquired = True
                token = held.fencing_token
                if token is not None:
                    test.fencing_tokens.append(token)
            test.released = True
            slowest = max(slowest, time.perf_counter() - started)
            too_slow = diagnosis.timeout is not None and (
                slowest >= diagnosis.timeout * RTT_CRITICAL_FRACTION
            )
            if too_slow and len(test.fencing_tokens) >= 2:
                break  # already critical; two tokens still show their order
        test.round_trip = slowest
        if diagnosis.server_time is not None:
            await _measure_clock(diagnosis.server_time, test)
    except (LockError, OSError, TimeoutError) as exc:
        test.error = f"{type(exc).__name__}: {exc}"
    tokens = test.fencing_tokens
    if len(tokens) >= 2:
        test.tokens_increasing = all(a < b for a, b in itertools.pairwise(tokens))
    if test.error is not None:
        findings.append(
            Finding(
                code="self-test-failed",
                severity=Severity.CRITICAL,
                title=f"the scratch lock {test.lock_name!r} could not be taken and released",
                breaks="locks cannot be relied on: the self-test's plain acquire/release failed",
                fix="see the error in the self-test section; check permissions (ACLs) and load",
                details={"error": test.error},
            )
        )
    if test.tokens_increasing is False:
        findings.append(
            Finding(
                code="fencing-not-increasing",
                severity=Severity.CRITICAL,
                title=f"fencing tokens of successive holds did not increase: {tokens}",
                breaks=(
                    "a resource that checks fencing tokens cannot tell an old holder from a new one"
                ),
                fix="report this as a bug, with the server version and this output",
                details={"tokens": list(tokens)},
            )
        )
    if test.round_trip is not None:
        slow = round_trip_finding(test.round_trip, diagnosis.timeout, diagnosis.timeout_name)
        if slow is not None:
            findings.append(slow)
    if test.clock_offset is not None and test.clock_uncertainty is not None:
        skew = clock_finding(test.clock_offset, test.clock_uncertainty)
        if skew is not None:
            findings.append(skew)
    return test, findings


def sort_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Critical first, then warnings, then info; stable within a severity."""
    return sorted(findings, key=lambda f: f.severity.rank)


async def run_doctor(backend: Backend, driver: Driver, *, live: bool = True) -> DoctorReport:
    """Everything ``backend.doctor()`` does (see :meth:`aiolocks.Backend.doctor`)."""
    url = backend.url
    diagnose = driver.diagnose if isinstance(driver, SupportsDiagnose) else None
    try:
        await backend.open()
    except (LockError, OSError, TimeoutError) as exc:
        findings = [_unreachable(url, exc)]
        if diagnose is not None:
            # Some of the service may answer (a Cluster or Redlock with one
            # master down): say which part is missing where the driver can.
            try:
                findings.extend((await diagnose()).findings)
            except Exception:
                logger.debug("doctor: no diagnosis of %s after a failed open", url, exc_info=True)
        # A failed open may leave connections behind (the masters that did
        # answer); the backend never opened, so its close() will not close them.
        try:
            await driver.close()
        except Exception:
            logger.debug("doctor: closing %s after a failed open", url, exc_info=True)
        return DoctorReport(url=url, findings=sort_findings(findings), self_test=None)
    try:
        diagnosis = Diagnosis() if diagnose is None else await diagnose()
    except (LockError, OSError, TimeoutError) as exc:
        return DoctorReport(url=url, findings=[_unreachable(url, exc)], self_test=None)
    findings = list(diagnosis.findings)
    test: SelfTest | None = None
    if live:
        test, more = await self_test(backend, diagnosis)
        findings.extend(more)
    return DoctorReport(url=url, findings=sort_findings(findings), self_test=test)
