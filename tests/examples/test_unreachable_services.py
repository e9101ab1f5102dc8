"""The payment apps answer 503, never 500, when the database goes away mid-payment or the
lock service cannot be reached."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from aiolocks.testing import PostgresServer, RedisServer, TcpProxy
from examples import aiohttp_app, fastapi_app, shop

from .conftest import fresh_schema, wait_for_file

ORDER = 1044


def _settings(server: PostgresServer, directory: Path) -> shop.Settings:
    directory.mkdir()
    pause = directory / "pause"
    pause.write_text("before-charge")
    return shop.Settings(database_url=server.url, provider_latency=0, pause_file=str(pause))


async def _stop_database_while_paused(server: PostgresServer, settings: shop.Settings) -> None:
    """Once a payment is paused (between its claim and its charge), stop the server and
    let the payment go on."""
    assert settings.pause_file is not None
    await wait_for_file(Path(settings.pause_file + ".held"))
    await asyncio.to_thread(server.stop)
    Path(settings.pause_file + ".taken").unlink()


@pytest.mark.asyncio
async def test_fastapi_and_aiohttp_answer_503_when_the_database_goes_away(
    postgres_restartable: PostgresServer, tmp_path: Path
) -> None:
    server = postgres_restartable
    settings = _settings(server, tmp_path / "fastapi")
    app = fastapi_app.create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client,
    ):
        paying = asyncio.create_task(client.post(f"/orders/{ORDER}/pay"))
        await _stop_database_while_paused(server, settings)
        response = await paying
        server.start()
        assert not app.state.backend._holds
    assert response.status_code == 503, response.text
    assert response.json()["detail"] == fastapi_app.unavailable_detail(ORDER, "database")

    settings = _settings(server, tmp_path / "aiohttp")
    web_app = aiohttp_app.create_app(settings)
    async with TestClient(TestServer(web_app)) as web_client:
        web_paying = asyncio.create_task(web_client.post(f"/orders/{ORDER + 1}/pay"))
        await _stop_database_while_paused(server, settings)
        async with await web_paying as web_response:
            lost = web_response.status, await web_response.text()
        server.start()
        # The database is back: paying again works, once.
        async with web_client.post(f"/orders/{ORDER + 1}/pay") as again:
            assert again.status == 200
        async with web_client.post(f"/orders/{ORDER}/pay") as other:
            assert other.status == 200
    assert lost == (503, aiohttp_app.unavailable_detail(ORDER + 1, "database"))


@pytest.mark.asyncio
async def test_fastapi_and_aiohttp_answer_503_when_the_lock_service_is_out_of_reach(
    redis_server: RedisServer, postgres_server: PostgresServer
) -> None:
    async with TcpProxy("127.0.0.1", redis_server.port) as proxy:
        with fresh_schema(postgres_server) as schema:
            settings = shop.Settings(
                lock_url=f"redis://{proxy.netloc}?connect_timeout=1",
                database_url=postgres_server.url,
                schema=schema,
            )
            app = fastapi_app.create_app(settings)
            transport = httpx.ASGITransport(app=app)
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
            ):
                proxy.refuse()
                proxy.cut()
                response = await client.post(f"/orders/{ORDER}/pay")
                proxy.heal()
            web_app = aiohttp_app.create_app(settings)
            async with TestClient(TestServer(web_app)) as web_client:
                proxy.refuse()
                proxy.cut()
                async with web_client.post(f"/orders/{ORDER}/pay") as web_response:
                    web = web_response.status, await web_response.text()
                proxy.heal()
    assert response.status_code == 503, response.text
    assert response.json()["detail"] == fastapi_app.unavailable_detail(ORDER, "lock service")
    assert web == (503, aiohttp_app.unavailable_detail(ORDER, "lock service"))
