"""Sentinel credentials: the Sentinels' own password and the data servers' password."""

from __future__ import annotations

import gc
import uuid
import warnings
from collections.abc import Iterator

import pytest

import aiolocks
from aiolocks.testing.servers import RedisSentinelSet

pytestmark = [pytest.mark.redis, pytest.mark.asyncio]

DATA_PASSWORD = "DataS3cretPw"
SENTINEL_PASSWORD = "SentS3cretPw"


@pytest.fixture(scope="module")
def guarded_sentinels() -> Iterator[RedisSentinelSet]:
    """A master, a replica and three sentinels, every one of them behind a password."""
    with RedisSentinelSet(password=DATA_PASSWORD, sentinel_password=SENTINEL_PASSWORD) as s:
        yield s


def _url(sentinels: RedisSentinelSet, data: str, sentinel: str | None) -> str:
    hosts = sentinels.url.partition("://")[2]
    query = f"key_prefix=sec-{uuid.uuid4().hex[:8]}:"
    if sentinel is not None:
        query += f"&sentinel_password={sentinel}"
    return f"redis+sentinel://:{data}@{hosts}?{query}"


async def test_sentinel_and_data_passwords(guarded_sentinels: RedisSentinelSet) -> None:
    url = _url(guarded_sentinels, DATA_PASSWORD, SENTINEL_PASSWORD)
    async with aiolocks.connect(url) as one, aiolocks.connect(url) as other:
        async with one.mutex("sec/sentinel"):
            assert await other.mutex("sec/sentinel").acquire(timeout=0) is False
        assert repr(one).count(SENTINEL_PASSWORD) == 0


@pytest.mark.parametrize(
    ("data", "sentinel"),
    [(DATA_PASSWORD, None), (DATA_PASSWORD, "Wr0ngSentinelPw"), ("Wr0ngDataPw", SENTINEL_PASSWORD)],
)
async def test_wrong_or_missing_credentials_are_denied(
    guarded_sentinels: RedisSentinelSet, data: str, sentinel: str | None
) -> None:
    url = _url(guarded_sentinels, data, sentinel)
    with pytest.raises(aiolocks.AccessDeniedError) as info:
        async with aiolocks.connect(url, on_unavailable="local"):
            pass
    text = str(info.value)
    assert all(pw not in text for pw in (DATA_PASSWORD, SENTINEL_PASSWORD, "Wr0ng"))
    # told by the refusal itself, not found in the chain of connect_timeout
    # running out (redis-py used to retry a refused Sentinel until then)
    assert not isinstance(info.value.__cause__, TimeoutError), info.value.__cause__


async def test_refused_open_leaves_no_sentinel_connection(
    guarded_sentinels: RedisSentinelSet,
) -> None:
    """A failed open closes the Sentinel connections it made (the engine closes only an
    opened driver): found by the refused-password tests above."""
    url = _url(guarded_sentinels, "Wr0ngDataPw", SENTINEL_PASSWORD)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(aiolocks.AccessDeniedError):
            async with aiolocks.connect(url):
                pass
        gc.collect()
    unclosed = [str(w.message) for w in caught if "unclosed" in str(w.message)]
    assert unclosed == []
