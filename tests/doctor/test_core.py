"""``backend.doctor()`` and ``aiolocks doctor``: the report model, the self-test, the CLI."""

from __future__ import annotations

import json

import pytest

import aiolocks
from aiolocks import DoctorReport, Finding, Severity
from aiolocks._core.doctor import (
    CLOCK_WARNING_SECONDS,
    RTT_CRITICAL_FRACTION,
    RTT_WARNING_FRACTION,
    SCRATCH_PREFIX,
    clock_finding,
    round_trip_finding,
)
from aiolocks.cli import main


def _finding(code: str, severity: Severity) -> Finding:
    return Finding(code=code, severity=severity, title="t", breaks="b", fix="f")


def test_exit_status_follows_critical_findings_only() -> None:
    quiet = DoctorReport("memory://", [_finding("a", Severity.WARNING)], None)
    assert quiet.ok and quiet.exit_status == 0
    loud = DoctorReport(
        "memory://", [_finding("a", Severity.INFO), _finding("b", Severity.CRITICAL)], None
    )
    assert not loud.ok and loud.exit_status == 1
    assert loud.codes(Severity.CRITICAL) == ["b"]
    assert loud.get("a") is not None and loud.get("zzz") is None


def test_json_document_shape() -> None:
    report = DoctorReport(
        "redis://h:1/0",
        [Finding("x", Severity.CRITICAL, "title", "breaks", "fix", {"n": 1})],
        None,
    )
    doc = json.loads(report.to_json())
    assert doc["schema"] == 1
    assert doc["url"] == "redis://h:1/0"
    assert doc["ok"] is False and doc["exit_status"] == 1
    assert doc["counts"] == {"critical": 1, "warning": 0, "info": 0}
    assert doc["findings"] == [
        {
            "code": "x",
            "severity": "critical",
            "title": "title",
            "breaks": "breaks",
            "fix": "fix",
            "details": {"n": 1},
        }
    ]
    assert doc["self_test"] is None


def test_round_trip_thresholds() -> None:
    assert round_trip_finding(1.0, None, "lease_time") is None
    assert round_trip_finding(RTT_WARNING_FRACTION * 10 * 0.9, 10.0, "lease_time") is None
    warning = round_trip_finding(RTT_WARNING_FRACTION * 10 * 1.1, 10.0, "lease_time")
    assert warning is not None and warning.severity is Severity.WARNING
    assert warning.code == "slow-round-trip" and "lease_time" in warning.fix
    critical = round_trip_finding(RTT_CRITICAL_FRACTION * 10 * 1.1, 10.0, "session timeout")
    assert critical is not None and critical.severity is Severity.CRITICAL


def test_clock_thresholds_account_for_uncertainty() -> None:
    assert clock_finding(0.002, 0.001) is None
    # far apart, but not beyond what the measurement can tell
    assert clock_finding(CLOCK_WARNING_SECONDS + 0.5, 1.0) is None
    ahead = clock_finding(CLOCK_WARNING_SECONDS + 2.0, 0.001)
    assert ahead is not None and ahead.code == "clock-offset" and "ahead" in ahead.title
    behind = clock_finding(-(CLOCK_WARNING_SECONDS + 2.0), 0.001)
    assert behind is not None and "behind" in behind.title


@pytest.mark.asyncio
async def test_memory_doctor_runs_the_self_test() -> None:
    async with aiolocks.connect("memory://doctor-core") as backend:
        report = await backend.doctor()
        test = report.self_test
        assert test is not None and test.ok
        assert test.lock_name.startswith(SCRATCH_PREFIX)
        assert len(test.fencing_tokens) == 3 and test.tokens_increasing is True
        assert test.round_trip is not None and test.clock_offset is None
        assert report.codes() == ["memory-process-local"]
        assert report.exit_status == 0
        # the scratch lock is free again: another task takes it at once
        async with backend.mutex(test.lock_name).hold(timeout=0):
            pass


@pytest.mark.asyncio
async def test_doctor_without_self_test_takes_no_lock() -> None:
    async with aiolocks.connect("memory://doctor-core") as backend:
        report = await backend.doctor(self_test=False)
        assert report.self_test is None
        assert report.to_dict()["self_test"] is None


@pytest.mark.asyncio
async def test_unreachable_server_is_a_critical_finding() -> None:
    backend = aiolocks._connect.backend_from_url("redis://127.0.0.1:1/0?connect_timeout=2")
    try:
        report = await backend.doctor()
    finally:
        await backend.close()
    assert report.codes() == ["backend-unreachable"]
    assert report.exit_status == 1 and report.self_test is None


def test_cli_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "memory://", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True
    assert [f["code"] for f in doc["findings"]] == ["memory-process-local"]
    assert doc["self_test"]["tokens_increasing"] is True


def test_cli_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "memory://"]) == 0
    out = capsys.readouterr().out
    assert "memory-process-local" in out and "OK: 0 critical" in out


def test_cli_unreachable_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "redis://127.0.0.1:1/0?connect_timeout=2", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"][0]["code"] == "backend-unreachable"


def test_cli_bad_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "bogus://x"]) == 64
    assert "bogus" in capsys.readouterr().err
    assert main(["doctor", "redis://h:1/0?lease_time=-1"]) == 64
    assert "lease_time" in capsys.readouterr().err


def test_cli_url_from_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIOLOCKS_URL", "memory://")
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["url"] == "memory://"
    monkeypatch.delenv("AIOLOCKS_URL")
    assert main(["doctor"]) == 64
    assert "AIOLOCKS_URL" in capsys.readouterr().err


def test_exports() -> None:
    for name in ("DoctorReport", "Finding", "SelfTest", "Severity"):
        assert name in aiolocks.__all__
        assert getattr(aiolocks, name).__doc__
    assert aiolocks.Backend.doctor.__doc__


def _no_tls_findings(local: bool) -> list[Finding]:
    """Each backend's ``*-no-tls`` finding, for servers on the loopback or not."""
    from aiolocks.etcd._doctor import plaintext_finding as etcd
    from aiolocks.postgres._doctor_security import SecurityFacts
    from aiolocks.postgres._doctor_security import plaintext_finding as postgres
    from aiolocks.redis._doctor_security import plaintext_finding as redis
    from aiolocks.zookeeper._doctor_security import plaintext_finding as zookeeper

    host = "[::1]" if local else "10.0.0.2"
    facts = SecurityFacts(ssl=False, client=host.strip("[]"), role="locks", superuser=False)
    pg = postgres(facts, pooled=False, label="db")
    assert pg is not None
    return [redis("r", host), zookeeper("zk", [host]), etcd([f"{host}:2379"]), pg]


@pytest.mark.parametrize("local", [True, False])
def test_every_backend_words_no_tls_alike(local: bool) -> None:
    findings = _no_tls_findings(local)
    codes = [f.code for f in findings]
    assert codes == ["redis-no-tls", "zookeeper-no-tls", "etcd-no-tls", "postgres-no-tls"]
    severity = Severity.INFO if local else Severity.WARNING
    for found in findings:
        assert found.severity is severity, found
        assert found.title.endswith(": the connection is not encrypted (no TLS)"), found
        assert found.breaks.startswith("whoever can read the network sees "), found
        assert "TLS" in found.fix, found
