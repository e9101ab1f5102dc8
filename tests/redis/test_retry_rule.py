"""The one retry rule of the Redis loops: a refusal is final at once, an outage is retried.

Every loop that retries Redis commands for a caller (acquire tries, the
release, the clean-up of an abandoned acquire, record writes and their
undo) asks :func:`aiolocks.redis._access.retry_after`; these tests pin what
it answers for the errors redis-py raises.
"""

from __future__ import annotations

import math
import ssl
import time

import pytest
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolocks._core.backoff import Backoff
from aiolocks.redis._access import retry_after

pytestmark = pytest.mark.asyncio

REFUSALS = [
    # redis-py raises a refused password at reconnect as a ConnectionError subclass
    AuthenticationError("invalid username-password pair or user is disabled."),
    NoPermissionError("NOPERM this user has no permissions to run the 'evalsha' command"),
    ResponseError("WRONGPASS invalid username-password pair"),
    RedisConnectionError(
        "Error 1 connecting: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"
    ),
]


@pytest.mark.parametrize("exc", REFUSALS, ids=lambda exc: type(exc).__name__)
async def test_a_refusal_is_final_without_waiting(exc: Exception) -> None:
    backoff = Backoff(math.inf, first=30.0)  # a wait would outlast the test's timeout
    assert await retry_after(exc, backoff) is False


async def test_a_refusal_deep_in_the_chain_is_final() -> None:
    wrapped = RedisConnectionError("Error connecting")
    wrapped.__cause__ = ssl.SSLCertVerificationError(1, "certificate verify failed")
    assert await retry_after(wrapped, Backoff(math.inf, first=30.0)) is False


async def test_an_outage_is_retried_after_the_backoff_delay() -> None:
    backoff = Backoff(math.inf, first=0.01)
    outage = RedisConnectionError("Connection refused")
    assert await retry_after(outage, backoff) is True
    assert backoff.delay == pytest.approx(0.02)  # it waited one delay and doubled it


async def test_an_outage_past_the_limit_is_final() -> None:
    backoff = Backoff(time.monotonic() - 1)
    assert await retry_after(RedisConnectionError("Connection refused"), backoff) is False
