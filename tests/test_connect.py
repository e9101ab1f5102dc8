"""connect(): URL dispatch and the errors a new user meets first."""

from __future__ import annotations

import pytest

import aiolocks


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nosuch://x", "unknown URL scheme 'nosuch'"),
        ("localhost:2181", "expected 'scheme://"),
        ("://x", "expected 'scheme://"),
        ("memory://a/b", "invalid memory store name"),
        ("memory://?x=1", "unknown option 'x'"),
    ],
)
def test_bad_urls_name_the_problem(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aiolocks.connect(url)


def test_url_must_be_a_string() -> None:
    with pytest.raises(ValueError, match="must be a str"):
        aiolocks.connect(b"memory://")  # type: ignore[arg-type]


def test_memory_takes_no_options() -> None:
    with pytest.raises(ValueError, match="takes no options"):
        aiolocks.connect("memory://", lease_time=3)


@pytest.mark.asyncio
async def test_await_and_context_manager_forms() -> None:
    backend = await aiolocks.connect("memory://connect-test")
    assert isinstance(backend, aiolocks.Backend)
    assert backend.url == "memory://connect-test"
    await backend.close()
    assert backend.closed
    async with aiolocks.connect("MEMORY://connect-test") as other:
        lock = other.mutex("a")
        async with lock:
            assert lock.is_owned_by_current_task()
    assert other.closed


@pytest.mark.asyncio
async def test_unknown_lock_option_is_a_value_error() -> None:
    async with aiolocks.connect("memory://") as backend:
        with pytest.raises(ValueError, match="unknown option 'colour'"):
            backend.mutex("a", colour="red")
        with pytest.raises(ValueError, match="lease_time"):
            backend.mutex("a", lease_time=-1)
