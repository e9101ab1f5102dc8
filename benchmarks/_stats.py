"""Pure statistics over recorded critical sections: percentiles, overlaps, handoffs, fairness.

Every contended run records one :class:`Hold` per critical section, with
``time.monotonic_ns()`` stamps. On Linux that clock (``CLOCK_MONOTONIC``) is
shared by every process of the machine, so holds from several worker
processes can be merged and compared directly.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Hold",
    "count_overlaps",
    "handoff_gaps_ns",
    "jain_index",
    "median",
    "percentile",
]


@dataclass(frozen=True, slots=True)
class Hold:
    """One critical section: who, when it asked, when it got the lock, when it let go.

    ``requested <= entered <= exited``, all ``time.monotonic_ns()``.
    """

    worker: str
    requested: int
    entered: int
    exited: int


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    frac = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * frac)


def median(values: Iterable[float]) -> float:
    """Median of the finite values; NaN when there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def count_overlaps(holds: Iterable[Hold]) -> int:
    """How many critical sections began before an earlier one had ended.

    Sections are sorted by entry; each one that enters before the latest
    exit seen so far overlaps at least one other. A correct mutex gives 0.
    """
    overlaps = 0
    latest_exit = -1
    for hold in sorted(holds, key=lambda h: h.entered):
        if hold.entered < latest_exit:
            overlaps += 1
        latest_exit = max(latest_exit, hold.exited)
    return overlaps


def handoff_gaps_ns(holds: Iterable[Hold]) -> list[int]:
    """Release-to-grant gaps of real handoffs, in nanoseconds.

    A handoff is a pair of consecutive holds where the next holder is a
    different worker that was already waiting (its request was sent before
    the previous holder let go). The gap is how long the lock stayed free
    while somebody was queued for it: release round trip + wake-up + the
    waiter's acquire. A holder that re-takes the lock itself is not a
    handoff (no waiter was served).
    """
    ordered = sorted(holds, key=lambda h: h.entered)
    gaps: list[int] = []
    for prev, nxt in itertools.pairwise(ordered):
        if nxt.worker != prev.worker and nxt.requested < prev.exited:
            gaps.append(max(0, nxt.entered - prev.exited))
    return gaps


def jain_index(counts: Sequence[int]) -> float:
    """Jain's fairness index of per-worker hold counts: 1 = perfectly even, 1/n = one worker."""
    if not counts:
        return math.nan
    total = sum(counts)
    squares = sum(c * c for c in counts)
    if squares == 0:
        return math.nan
    return total * total / (len(counts) * squares)


def per_worker_counts(holds: Iterable[Hold], workers: Iterable[str]) -> list[int]:
    """Holds per worker, including workers that never got the lock (count 0)."""
    counts = Counter(h.worker for h in holds)
    return [counts.get(w, 0) for w in workers]
