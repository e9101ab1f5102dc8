"""Real Apache Curator in the tests: compile ``CuratorDriver.java`` and talk to it line by line.

Debian's ``libcurator-recipes-java`` (Curator 5.x) and a JDK are needed
(``scripts/install-servers.sh`` installs both). Outside CI the interop tests
skip when either is missing; with ``CI=true`` they fail instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

__all__ = ["CURATOR_JAR", "CuratorProcess", "compile_driver"]

#: its manifest's Class-Path names curator-framework, curator-client,
#: zookeeper, zookeeper-jute, guava and slf4j-api
CURATOR_JAR: Final = Path("/usr/share/java/curator-recipes.jar")
SOURCE: Final = Path(__file__).with_name("CuratorDriver.java")

#: how long a reply may take: JVM start, Curator's first connection, an acquire
#: on a loaded machine
REPLY_TIMEOUT: Final = 30.0


def _missing(what: str) -> None:
    reason = f"interop with Apache Curator needs {what}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: install it with scripts/install-servers.sh)")
    pytest.skip(f"{reason}; install it with scripts/install-servers.sh")


def compile_driver(out: Path) -> Path:
    """Compile the driver into ``out``; skip (fail in CI) when javac or Curator is missing."""
    javac = shutil.which("javac")
    if javac is None:
        _missing("a JDK (javac): default-jdk-headless")
    if not CURATOR_JAR.exists():
        _missing(f"{CURATOR_JAR}: libcurator-recipes-java")
    done = subprocess.run(
        [str(javac), "-nowarn", "-d", str(out), "-cp", str(CURATOR_JAR), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"javac failed:\n{done.stderr}")
    return out


class CuratorProcess:
    """One JVM running the driver: send commands, wait for the reply lines they cause.

    Replies arrive in any order (each handle has its own Java thread), so
    :meth:`expect` waits for one line with a given start, keeping the others
    for later calls.
    """

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._lines: list[str] = []
        self._arrived = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, classes: Path) -> CuratorProcess:
        """Start the JVM (its stderr, ZooKeeper client logging, is discarded)."""
        java = shutil.which("java")
        if java is None:
            _missing("a Java runtime")
        assert java is not None
        proc = await asyncio.create_subprocess_exec(
            java,
            "-Xshare:auto",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            f"{classes}{os.pathsep}{CURATOR_JAR}",
            "CuratorDriver",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return cls(proc)

    async def _read(self) -> None:
        stdout = self._proc.stdout
        assert stdout is not None
        while line := await stdout.readline():
            self._lines.append(line.decode().rstrip("\n"))
            self._arrived.set()
        self._lines.append("eof")
        self._arrived.set()

    def send(self, command: str) -> None:
        """Write one command line (replies come through :meth:`expect`)."""
        stdin = self._proc.stdin
        assert stdin is not None
        stdin.write(f"{command}\n".encode())

    def seen(self, prefix: str) -> bool:
        """A reply starting with ``prefix`` has arrived and is not consumed yet."""
        return any(line.startswith(prefix) for line in self._lines)

    async def expect(self, prefix: str, timeout: float = REPLY_TIMEOUT) -> str:
        """The next reply starting with ``prefix`` (consumed); an ``error`` reply fails."""
        async with asyncio.timeout(timeout):
            while True:
                for i, line in enumerate(self._lines):
                    if line.startswith(prefix):
                        return self._lines.pop(i)
                    if line.startswith("error ") or line == "eof":
                        raise AssertionError(f"Curator driver: {line} (waiting for {prefix!r})")
                self._arrived.clear()
                await self._arrived.wait()

    async def call(self, command: str, reply: str) -> str:
        """Send ``command`` and wait for the reply starting with ``reply``."""
        self.send(command)
        return await self.expect(reply)

    async def close(self) -> None:
        """Ask the driver to quit (closing its Curator clients); kill it if it does not."""
        with contextlib.suppress(ConnectionError):
            self.send("quit")
        try:
            async with asyncio.timeout(10):
                await self._proc.wait()
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
