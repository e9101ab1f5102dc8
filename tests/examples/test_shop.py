"""examples/shop.py: the fenced SQL of a payment, and the settings' checks."""

from __future__ import annotations

import pytest

import aiolocks
from examples import shop
from examples.shop_demo import Outcome, Reply

ORDER = 1077


@pytest.mark.asyncio
async def test_a_stale_token_cannot_charge_after_a_newer_claim(
    shop_settings: shop.Settings,
) -> None:
    async with (
        aiolocks.connect("memory://") as backend,
        shop.open_pool(shop_settings) as pool,
    ):
        await shop.migrate(pool, backend, shop_settings.schema)
        await shop.reset_order(pool, ORDER, cents=500)
        # Holder 5 lost its lock (paused, say) and holder 7 has claimed the order since.
        assert await pool.fetchval(shop._CLAIM, ORDER, 7) == 500
        with pytest.raises(shop.SupersededError):
            await shop.pay(pool, ORDER, fencing_token=5, settings=shop_settings)
        assert await shop.charges(pool, ORDER) == []
        # Claimed by 5 first, then by 7 before 5 charges: 5's charge is refused too.
        await shop.reset_order(pool, ORDER, cents=500)
        assert await pool.fetchval(shop._CLAIM, ORDER, 5) == 500
        assert await pool.fetchval(shop._CLAIM, ORDER, 7) == 500
        assert await pool.fetchrow(shop._CHARGE, ORDER, 5, "stale") is None
        # The newest holder charges once; any later attempt finds the order paid.
        charge = await shop.pay(pool, ORDER, fencing_token=9, settings=shop_settings)
        assert charge == shop.Charge(ORDER, 500, 9, shop.WORKER)
        with pytest.raises(shop.AlreadyPaidError):
            await shop.pay(pool, ORDER, fencing_token=11, settings=shop_settings)
        with pytest.raises(shop.UnknownOrderError):
            await shop.pay(pool, 5, fencing_token=12, settings=shop_settings)
        assert await shop.charges(pool, ORDER) == [charge]
        assert await shop.order_state(pool, ORDER) == ("paid", charge)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({}, "no database"),
        ({"SHOP_DATABASE_URL": "postgresql://h/db", "SHOP_SCHEMA": "Shop; DROP"}, "SHOP_SCHEMA"),
        ({"SHOP_DATABASE_URL": "postgresql://h/db", "SHOP_LOCK_TIMEOUT": "0"}, "LOCK_TIMEOUT"),
        ({"SHOP_DATABASE_URL": "postgresql://h/db", "SHOP_PROVIDER_LATENCY": "-1"}, "LATENCY"),
        ({"SHOP_DATABASE_URL": "postgresql://h/db", "SHOP_LOCK_TIMEOUT": "2s"}, "LOCK_TIMEOUT"),
    ],
)
def test_bad_settings_are_a_clear_value_error(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        shop.Settings.from_env(env)


def test_settings_round_trip_through_the_environment() -> None:
    settings = shop.Settings(
        lock_url="zk://127.0.0.1:2181",
        database_url="postgresql://h/db",
        schema="shop_a",
        lock_timeout=3.5,
        provider_latency=0.0,
        pause_file="/tmp/pause",
    )
    assert shop.Settings.from_env(settings.to_env()) == settings


def _reply(status: int, token: int | None = None) -> Reply:
    body: dict[str, object] = {"fencing_token": token} if token is not None else {"detail": "x"}
    return Reply(status, body, "http://w")


@pytest.mark.parametrize(
    ("replies", "retries", "broken", "tokens", "ok"),
    [
        ([_reply(200, 7), _reply(409)], [], 0, [7], True),
        ([_reply(503), _reply(200, 9)], [_reply(409)], 1, [9], True),
        ([_reply(503), _reply(409)], [_reply(409)], 1, [5], True),  # charged, then lost
        ([_reply(503), _reply(409)], [_reply(200, 9)], 1, [9], True),
        ([_reply(200, 7), _reply(500)], [], 0, [7], False),  # a 500
        ([_reply(200, 7), _reply(200, 8)], [], 0, [7, 8], False),  # two charges
        ([_reply(409), _reply(409)], [], 0, [7], False),  # nobody paid, no loss
        ([_reply(503)], [_reply(503)], 1, [7], False),  # the retry failed too
        ([_reply(200, 8)], [], 0, [7], False),  # the 200 is not the charge
        ([_reply(409)], [], 1, [], False),  # no charge
    ],
)
def test_the_demo_outcome_check(
    replies: list[Reply], retries: list[Reply], broken: int, tokens: list[int], ok: bool
) -> None:
    charges = [shop.Charge(ORDER, 100, token, "w") for token in tokens]
    assert Outcome(replies, retries, broken, charges).ok is ok
