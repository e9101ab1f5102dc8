"""docker-compose.yml: everything it names exists in the repository, and its app runs.

Docker is not needed: the file is parsed, every service, file, module and
environment variable it refers to is looked up, and the app service's
command runs here as written (its several uvicorn workers on the test's own
Redis and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from aiolocks.testing import PostgresServer, RedisServer, free_port
from examples import shop
from examples.shop_demo import ROOT, pay_concurrently

from .conftest import fresh_schema

yaml = pytest.importorskip("yaml")

COMPOSE = ROOT / "docker-compose.yml"
DOCS = ROOT / "docs" / "docker.md"

#: the executables of the server images (not files of this repository)
IMAGE_COMMANDS = {"redis-server", "redis-sentinel", "postgres", "/usr/local/bin/etcd", "sh"}


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def test_every_service_has_an_image_or_a_build_in_the_repo() -> None:
    for name, service in _services().items():
        assert "image" in service or "build" in service, name
        if "build" in service:
            build = service["build"]
            context = ROOT / build["context"]
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert context.is_dir(), name
            assert dockerfile.is_file(), f"{name}: no {dockerfile}"
            for line in dockerfile.read_text().splitlines():
                if line.startswith("COPY "):
                    *sources, _ = line.split()[1:]
                    for source in sources:
                        assert (context / source).exists(), f"{dockerfile}: COPY {source}"


def test_every_dependency_is_a_service() -> None:
    services = _services()
    for name, service in services.items():
        depends = service.get("depends_on", [])
        for other in depends if isinstance(depends, list) else list(depends):
            assert other in services, f"{name} depends on {other}, which is not a service"


def test_every_command_names_something_that_exists() -> None:
    checked = 0
    for name, service in _services().items():
        command = _command(service)
        if not command:
            continue
        if command[0] in IMAGE_COMMANDS:
            continue
        for word in command:
            if re.fullmatch(r"[a-z_][\w.]*:[A-Za-z_]\w*", word):  # module:attribute
                module, _, attribute = word.partition(":")
                assert hasattr(importlib.import_module(module), attribute), f"{name}: {word}"
                checked += 1
            elif word.endswith(".py") or word.startswith(("./", "examples/", "scripts/")):
                assert (ROOT / word).exists(), f"{name}: {word}"
                checked += 1
        assert command[0] in {"uvicorn", "python", "taskiq"}, f"{name}: {command[0]}?"
    assert checked, "no command names anything of the repository"


def test_paths_and_variables_in_the_comments_exist() -> None:
    text = COMPOSE.read_text()
    for path in re.findall(r"(?:\./)?(?:scripts|examples|docs)/[\w./-]+", text):
        assert (ROOT / path.rstrip(".")).exists(), path
    plugin = (ROOT / "aiolocks" / "testing" / "pytest_plugin.py").read_text()
    for variable in re.findall(r"\b(AIOLOCKS_\w+)=", text):
        assert variable in plugin, f"{variable} is not read by the test fixtures"


def test_the_docs_list_every_service() -> None:
    docs = DOCS.read_text()
    listed = set(re.findall(r"^\| `([\w-]+)`", docs, flags=re.MULTILINE))
    ranges = re.findall(r"^\| `([\w-]+?)(\d)`\.\.`[\w-]+?(\d)`", docs, flags=re.MULTILINE)
    for prefix, first, last in ranges:
        listed |= {f"{prefix}{n}" for n in range(int(first), int(last) + 1)}
    for group in re.findall(r"^\| ((?:`[\w-]+`, )+`[\w-]+`) \|", docs, flags=re.MULTILINE):
        listed |= set(re.findall(r"`([\w-]+)`", group))
    assert set(_services()) == listed, set(_services()) ^ listed


def _app_env(service: str = "app") -> dict[str, str]:
    environment: dict[str, str] = _services()[service]["environment"]
    # "${NAME:-default}" as compose substitutes it when NAME is not set
    return {key: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value) for key, value in environment.items()}


def test_the_app_environment_is_what_the_app_reads() -> None:
    settings = shop.Settings.from_env(_app_env())
    assert settings.lock_url.startswith("redis://")
    assert settings.database_url.startswith("postgresql://")
    assert "--workers" in _command(_services()["app"])


def test_the_job_services_set_only_what_the_code_reads() -> None:
    code = "".join((ROOT / "examples" / name).read_text() for name in ("taskiq_jobs.py", "shop.py"))
    services = _services()
    for name in ("jobs-worker", "jobs-scheduler"):
        environment = _app_env(name)
        shop.Settings.from_env(environment)
        for variable in environment:
            assert f'"{variable}"' in code, f"{name}: nothing reads {variable}"
    assert services["jobs-scheduler"]["deploy"]["replicas"] >= 2, "one scheduler per replica"


@pytest.mark.asyncio
async def test_the_app_command_runs_several_workers_that_pay_once(
    redis_server: RedisServer, postgres_server: PostgresServer
) -> None:
    command = _command(_services()["app"])
    assert int(command[command.index("--workers") + 1]) >= 2
    port = free_port()
    command[command.index("--port") + 1] = str(port)
    command[command.index("--workers") + 1] = "2"  # as written, with fewer CPUs to spare
    with fresh_schema(postgres_server) as schema:
        env = {
            **os.environ,
            **_app_env(),
            "AIOLOCKS_URL": redis_server.url,
            "SHOP_DATABASE_URL": postgres_server.url,
            "SHOP_SCHEMA": schema,
            "PYTHONPATH": str(ROOT),
        }
        assert command[0] == "uvicorn"
        process = subprocess.Popen([sys.executable, "-m", *command], cwd=ROOT, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            await _wait_ready(url, process)
            replies = await pay_concurrently([url], 1001, requests=6, clients=3)
        finally:
            process.terminate()
            process.wait(timeout=30)
    codes = sorted(reply.status for reply in replies)
    assert codes == [200] + [409] * 5, replies


async def _wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(base_url=url) as client, asyncio.timeout(90):
        while True:
            assert process.poll() is None, "the app exited"
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)


def test_compose_is_valid_yaml_with_known_top_level_keys() -> None:
    compose = _compose()
    assert set(compose) <= {"services", "x-zookeeper", "x-etcd", "x-sentinel", "x-jobs"}
    assert Path(COMPOSE).read_text().count("\t") == 0
