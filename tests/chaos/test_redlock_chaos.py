"""Redlock with clock jumps and process pauses: what fencing stops (``redlock.py``).

The test starts N independent masters of its own (3; 5 with
``AIOLOCKS_CHAOS_ALL=1`` or ``AIOLOCKS_CHAOS_LONG=1``), runs the chaos
workers over ``redlock://`` under the seeded schedule of
:mod:`tests.chaos.redlock` and asserts:

* the faults bit: a clock jump on a quorum of masters (or on fewer, with an
  empty restart of another) and a client pause past its lease each let a
  second client take a lock while its holder was still in its body, at
  least once: Redlock alone cannot prevent that;
* the fenced store accepted no write out of fencing order (no unfenced
  interleaving, no duplicate or regressing token) and refused the stale ones;
* every superseded holder was told (``LockLostError``): by its watchdog, by
  the end of its block (a lease that ran out while its process stood
  still), or by its release (its field gone on a majority of masters);
* nothing left in the workers or on any master.

Every supersession, its fault and the time from the fault to the holder
being told go to the chaos summary. See ``docs/chaos.md`` section 8.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import chaos_long
from .conftest import record_summary
from .redlock import JUMP_KINDS, PAUSE_KINDS, RedlockMasters, RedlockRun, chaos_all, run_redlock

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.timeout(1800 if chaos_long() else 180),
]


@pytest.fixture(
    params=[
        3,
        pytest.param(
            5,
            marks=pytest.mark.skipif(
                not chaos_all(),
                reason="5 masters: runs with AIOLOCKS_CHAOS_ALL=1 or AIOLOCKS_CHAOS_LONG=1",
            ),
        ),
    ]
)
def masters(request: pytest.FixtureRequest) -> Iterator[RedlockMasters]:
    """N masters of this test only (they are restarted empty by the faults)."""
    masters = RedlockMasters(int(request.param))
    try:
        try:
            masters.start()
        except Exception as exc:  # pragma: no cover - depends on the machine
            pytest.skip(f"cannot start {request.param} Redis servers here: {exc}")
        yield masters
    finally:
        masters.close()


def check_redlock(result: RedlockRun) -> None:
    """What must hold under clock jumps and pauses, and that the faults did bite."""
    run, report = result.run, result.run.report
    record_summary(result.summary(), result.as_json())
    events = "\n".join(run.events())
    logs = run.pool.logs() if run.pool is not None else ""
    details = "\n".join(report.problems[:40])
    context = f"{result.summary()}\n{details}\nfaults:\n{events}\n{logs}"
    assert len(run.faults) == len(run.schedule), events
    assert report.critical_sections >= 10, context
    # fencing: no accepted write out of order; no token twice or going back
    assert (report.unfenced, report.duplicate_tokens, report.token_regressions) == (0, 0, 0), (
        context
    )
    # every holder the store refused was told; nothing swallowed or left behind
    assert report.violations == 0, context
    assert not report.problems, context
    # the faults bit: Redlock alone let two clients hold one lock at once
    jumps, pauses = result.by_kind(JUMP_KINDS), result.by_kind(PAUSE_KINDS)
    assert jumps, f"no clock jump let a second holder in: {context}"
    assert pauses, f"no client pause let a second holder in: {context}"
    # ... and every superseded holder was told so
    silent = [s for s in result.found if not s.told]
    assert not silent, f"superseded holders never told: {silent}\n{context}"


@pytest.mark.asyncio
async def test_redlock_clock_jumps_and_pauses(masters: RedlockMasters, tmp_path: Path) -> None:
    """Clock jumps on masters, empty restarts, client pauses: fencing stops every stale write."""
    result = await run_redlock(masters, tmp_path)
    check_redlock(result)
