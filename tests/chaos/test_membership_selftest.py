"""Negative controls for the membership checker: fabricated histories it must flag.

A checker that passes everything proves nothing. Each test hands the
checker's judge (``MembershipRun._judge``) a history with one known fault
(two owners of a key under one version, a departure nobody saw, a silent
loss) and checks that it is named; a consistent history yields no problem.
"""

from __future__ import annotations

import aiolocks
from aiolocks._core.partitioner import rendezvous_owner

from .membership import FINAL, Incarnation, MembershipReport, MembershipRun, View

KEYS = 50


def _run() -> MembershipRun:
    return MembershipRun("selftest", ["memory://selftest"], "memory://selftest", keys=KEYS)


def _member(run: MembershipRun, member_id: str, worker: int) -> Incarnation:
    backend = aiolocks.connect("memory://selftest")._backend  # never opened: no I/O
    inc = Incarnation(member_id, worker, backend)
    run.incarnations.append(inc)
    return inc


def _view(run: MembershipRun, at: float, member_id: str, members: tuple[str, ...]) -> View:
    """The view a correct member acts on: the keys rendezvous hashing gives it."""
    owned = frozenset(k for k in run.keys if rendezvous_owner(members, k) == member_id)
    return View(at, "v-" + "-".join(members), members, owned)


def _judged(run: MembershipRun) -> list[str]:
    report = MembershipReport(run.label)
    run._judge(report)
    return report.problems


def _consistent() -> tuple[MembershipRun, Incarnation, Incarnation]:
    """a and b see each other; b leaves at t=2 and a sees it go at t=2.5."""
    run = _run()
    a, b = _member(run, "a", 0), _member(run, "b", 1)
    a.views += [_view(run, 1.0, "a", ("a", "b")), _view(run, 2.5, "a", ("a",))]
    b.views += [_view(run, 1.0, "b", ("a", "b"))]
    a.joined_at = b.joined_at = 1.0
    b.departed_at, b.departure = 2.0, "leave"
    a.departed_at, a.departure = 3.0, FINAL
    return run, a, b


def test_a_consistent_history_has_no_problem() -> None:
    run, _, _ = _consistent()
    report = MembershipReport(run.label)
    run._judge(report)
    assert report.problems == []
    assert report.windows == {"leave": [0.5]}


def test_two_owners_of_a_key_under_one_version_are_flagged() -> None:
    run, _, b = _consistent()
    # b claims every key under the version both read: a's keys now have two owners
    wrong = b.views[0]
    b.views[0] = View(wrong.at, wrong.version, wrong.members, frozenset(run.keys))
    problems = _judged(run)
    assert any(p.startswith("(a)") and "owned by a and b" in p for p in problems), problems
    assert any("rendezvous hashing" in p for p in problems), problems


def test_one_version_with_two_member_lists_is_flagged() -> None:
    run, a, _ = _consistent()
    other = _view(run, 2.6, "a", ("a", "c"))
    a.views.append(View(other.at, a.views[0].version, other.members, other.owned))
    assert any("another member" in p for p in _judged(run))


def test_a_departure_never_seen_is_flagged() -> None:
    run, a, _ = _consistent()
    del a.views[1]  # a never acted on a view without b
    assert any(p.startswith("(b) a never saw b") for p in _judged(run))


def test_a_member_ended_by_a_fault_and_never_told_is_flagged() -> None:
    run, _, b = _consistent()
    b.departure = "delete"  # an operator deleted its record; b was never told
    assert any(p.startswith("(d) b ended by delete was never told") for p in _judged(run))
    b.lost_at = 2.1  # now it was told
    assert _judged(run) == []
