"""One assertion for an acquire the server refuses (wrong credentials, a missing permission)."""

from __future__ import annotations

import logging

import pytest

import aiolocks


async def assert_acquire_refused(
    backend: aiolocks.Backend,
    name: str,
    caplog: pytest.LogCaptureFixture,
    *,
    match: str | None = None,
    timeout: float | None = None,
    quiet: bool = True,
) -> None:
    """Acquiring mutex ``name`` raises :class:`aiolocks.AccessDeniedError`, never degrades.

    ``match``: a pattern the error's message must contain; ``timeout``: the
    acquire's own. ``quiet``: the refusal wrote nothing, so the acquire's
    clean-up has nothing to give back and no warning is logged (a refusal
    is the caller's error, not something left behind on the server).
    """
    lock = backend.mutex(name)
    with caplog.at_level(logging.WARNING, logger="aiolocks"):
        caplog.clear()
        with pytest.raises(aiolocks.AccessDeniedError, match=match):
            async with lock.hold(timeout=timeout):
                pytest.fail(f"acquired {name!r} although the server refuses it")
    assert not lock.is_degraded
    if quiet:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warnings == [], warnings
