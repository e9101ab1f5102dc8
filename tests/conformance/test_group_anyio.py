"""Group membership under anyio: a cancel scope re-delivers its cancellation at every await,
and still neither a join nor a leave leaves a member behind."""

from __future__ import annotations

import uuid

import anyio
import pytest

import aiolocks

from .test_anyio import anyio_backend  # noqa: F401 (a fixture)
from .test_group import group_of

pytestmark = pytest.mark.anyio


async def test_cancel_scopes_around_join_and_leave_leave_no_member(backend_url: str) -> None:
    name = f"conformance/group-anyio-{uuid.uuid4().hex[:10]}"
    async with aiolocks.connect(backend_url) as backend:
        group = group_of(backend, name)
        for delay in (0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1):
            with anyio.move_on_after(delay):
                async with group.join("scoped"):
                    await anyio.sleep(delay / 2)  # the scope ends in the join, body or leave
            assert await group.members() == [], f"a member was left behind (delay {delay})"
        with anyio.CancelScope() as scope:
            async with group.join("scoped"):
                scope.cancel()  # cancelled inside the body: the leave runs all the same
                await anyio.sleep(3600)
        assert scope.cancelled_caught
        assert await group.members() == []
