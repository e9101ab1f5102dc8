"""The cluster runner's own logic, without servers: schedule, per-lock fencing, loss windows."""

from __future__ import annotations

import random

from .checker import CsRecord, LogEntry, Register, Report, analyze
from .cluster import FAULT_KINDS, ClusterRun, FaultRecord, loss_windows, make_schedule


def test_schedule_is_fixed_by_the_seed_and_bounded() -> None:
    """Same seed, same schedule; every kind once per round; durations within their bounds."""
    first = make_schedule(random.Random(7), FAULT_KINDS, session=2.0, rounds=3)
    again = make_schedule(random.Random(7), FAULT_KINDS, session=2.0, rounds=3)
    other = make_schedule(random.Random(8), FAULT_KINDS, session=2.0, rounds=3)
    assert first == again
    assert first != other
    assert len(first) == 3 * len(FAULT_KINDS)
    for round_ in range(3):
        kinds = [step.kind for step in first[round_ * 5 : round_ * 5 + 5]]
        assert sorted(kinds) == sorted(FAULT_KINDS)
    assert all(3.0 <= step.hold <= 5.0 and 0.5 <= step.gap <= 1.5 for step in first)


def test_register_keeps_one_fencing_order_per_lock() -> None:
    """A token is stale only against the same lock's largest accepted token."""
    register = Register()

    def write(lock: str, token: int) -> bool:
        message = {"op": "write", "cs": f"{lock}{token}", "token": token, "phase": "begin"}
        return bool(register._dispatch({**message, "lock": lock, "worker": 0})["ok"])

    assert write("a", 5)
    assert write("b", 3)  # smaller than a's, but another lock
    assert not write("a", 4)
    assert write("b", 3)
    assert register.max_tokens == {"a": 5, "b": 3}


def test_analyze_checks_each_lock_on_its_own() -> None:
    """The same token on two locks is not a duplicate; on one lock it is."""
    register = Register()
    register.log = [
        LogEntry(0, "x", 5, "begin", True, "a"),
        LogEntry(1, "y", 5, "begin", True, "b"),
        LogEntry(2, "x", 5, "commit", True, "a"),
        LogEntry(3, "y", 5, "commit", True, "b"),
    ]
    register.records = [
        CsRecord("x", 0, 5, 100, 200, "ok", False, lock="a"),
        CsRecord("y", 1, 5, 150, 250, "ok", False, lock="b"),
    ]
    report = analyze("locks", 0, register)
    assert (report.duplicate_tokens, report.unfenced, report.overlaps) == (0, 0, 0)
    for entry in register.log:
        entry.lock = "a"
    for record in register.records:
        record.lock = "a"
    report = analyze("locks", 0, register)
    assert report.duplicate_tokens == 1
    assert report.unfenced == 1
    assert report.overlaps == 1


def test_loss_windows_measure_fault_to_first_loss_before_the_next_fault() -> None:
    """Each fault's window ends at the first loss reported after it and before the next fault."""
    register = Register()
    seconds = 1_000_000_000
    register.records = [
        CsRecord("p", 0, 1, 0, 0, "lost", True, reported=int(10.7 * seconds)),
        CsRecord("q", 0, 2, 0, 0, "lost", True, reported=int(10.4 * seconds)),
        CsRecord("r", 0, 3, 0, 0, "ok", False, reported=int(20.5 * seconds)),
        CsRecord("s", 0, 4, 0, 0, "lost", True, reported=int(31.0 * seconds)),
    ]
    faults = [
        FaultRecord("kill_member", 10.0, ""),
        FaultRecord("pause_member", 20.0, ""),
        FaultRecord("failover", 30.0, ""),
    ]
    loss_windows(faults, register)
    windows = [fault.window for fault in faults]
    assert windows[1] is None
    assert windows[0] is not None and abs(windows[0] - 0.4) < 1e-6
    assert windows[2] is not None and abs(windows[2] - 1.0) < 1e-6
    run = ClusterRun(Report("t", 0), [], faults)
    assert run.window_text() == (
        "failover 1/1 median 1.00s max 1.00s; kill_member 1/1 median 0.40s max 0.40s; "
        "pause_member 0/1"
    )
