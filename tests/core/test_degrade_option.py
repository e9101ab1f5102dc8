"""The ``on_unavailable`` switch: validation before any I/O, and where it applies."""

from __future__ import annotations

import pytest

import aiolocks
from aiolocks._connect import backend_from_url


@pytest.mark.asyncio
async def test_default_is_raise_and_memory_never_degrades() -> None:
    async with aiolocks.connect("memory://dg-opt") as backend:
        assert backend.on_unavailable == "raise"
        lock = backend.mutex("dg/a")
        async with lock:
            assert not lock.is_degraded
        assert not lock.is_degraded  # not held
    async with aiolocks.connect("memory://dg-opt", on_unavailable="local") as backend:
        assert backend.on_unavailable == "local"
        lock = backend.mutex("dg/a")
        async with lock:
            assert not lock.is_degraded  # memory:// is always reachable
        sem = backend.semaphore("dg/s", 2)
        async with sem.lease() as lease:
            assert not lease.is_degraded
        multi = aiolocks.MultiLock([backend.mutex("dg/m1"), backend.mutex("dg/m2")])
        async with multi:
            assert not multi.is_degraded


@pytest.mark.parametrize("bad", ["Local", "fallback", "", 1, None])
def test_bad_value_is_a_value_error_naming_the_option(bad: object) -> None:
    if bad is None:
        # None is the keyword default: it means "raise"
        assert backend_from_url("memory://", on_unavailable=None).on_unavailable == "raise"
        return
    with pytest.raises(ValueError, match="on_unavailable"):
        backend_from_url("memory://", on_unavailable=bad)


def test_url_option_on_every_scheme_is_taken_before_the_backend_parses_it() -> None:
    backend = backend_from_url("memory://dg-url?on_unavailable=local")
    assert backend.on_unavailable == "local"
    assert backend.url == "memory://dg-url"
    redis = backend_from_url("redis://127.0.0.1:1/0?on_unavailable=local&lease_time=5")
    assert redis.on_unavailable == "local"
    zk = backend_from_url("zk://127.0.0.1:1?session_timeout=5&on_unavailable=raise")
    assert zk.on_unavailable == "raise"
    with pytest.raises(ValueError, match="on_unavailable"):
        backend_from_url("redis://127.0.0.1:1/0?on_unavailable=maybe")
    with pytest.raises(ValueError, match="twice"):
        backend_from_url("memory://?on_unavailable=local&on_unavailable=local")
    with pytest.raises(ValueError, match="contradicts"):
        backend_from_url("memory://?on_unavailable=local", on_unavailable="raise")


def test_setter_validates() -> None:
    backend = backend_from_url("memory://")
    backend.on_unavailable = "local"
    assert backend.on_unavailable == "local"
    with pytest.raises(ValueError, match="on_unavailable must be one of 'raise', 'local'"):
        backend.on_unavailable = "silent"
    assert backend.on_unavailable == "local"
