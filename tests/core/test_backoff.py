"""``Backoff``: the delays it asks for, checked without timing anything."""

from __future__ import annotations

import asyncio
import math
import random
import time

import pytest

from aiolocks._core.backoff import Backoff


def _delays(backoff: Backoff, count: int) -> list[float | None]:
    return [backoff.next_delay() for _ in range(count)]


def test_doubles_up_to_the_cap() -> None:
    backoff = Backoff(math.inf, first=0.05, cap=0.3)
    assert _delays(backoff, 5) == [0.05, 0.1, 0.2, 0.3, 0.3]


def test_a_first_delay_over_the_cap_is_kept_once() -> None:
    backoff = Backoff(math.inf, first=2.0, cap=0.5)
    assert _delays(backoff, 3) == [2.0, 0.5, 0.5]


def test_infinite_give_up_never_exhausts() -> None:
    backoff = Backoff(math.inf, first=1e6, cap=1e9)
    assert not backoff.exhausted()
    assert all(delay is not None for delay in _delays(backoff, 50))


def test_gives_up_when_the_next_delay_would_end_past_give_up() -> None:
    backoff = Backoff(time.monotonic() + 60.0, first=10.0, cap=100.0)
    # 10, 20, 40: the next 80 would end past the limit.
    assert _delays(backoff, 3) == [10.0, 20.0, 40.0]
    assert backoff.exhausted()
    assert backoff.next_delay() is None
    assert backoff.delay == 80.0  # giving up does not move on


def test_jitter_stays_within_its_fraction_and_does_not_bend_the_doubling() -> None:
    random.seed(26)
    backoff = Backoff(math.inf, first=0.05, cap=2.0, jitter=0.2)
    plain = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    delays = _delays(backoff, len(plain))
    for delay, expected in zip(delays, plain, strict=True):
        assert delay is not None
        assert expected * 0.8 <= delay <= expected * 1.2
    assert delays != plain  # the factors are random, not all exactly 1
    assert backoff.delay == 2.0


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 1.5, math.nan])
def test_bad_jitter_is_a_value_error(jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        Backoff(math.inf, jitter=jitter)


@pytest.mark.asyncio
async def test_wait_sleeps_the_delays_and_refuses_when_exhausted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    backoff = Backoff(time.monotonic() + 60.0, first=10.0, cap=25.0)
    results = [await backoff.wait() for _ in range(4)]
    monkeypatch.undo()
    # The fake sleeps move no clock: each next delay still fits in 60 s.
    assert slept == [10.0, 20.0, 25.0, 25.0]
    assert results == [True, True, True, True]
    late = Backoff(time.monotonic() - 1.0)
    assert await late.wait() is False
