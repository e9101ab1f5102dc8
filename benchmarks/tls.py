"""The cost of TLS, side by side: ``python -m benchmarks.tls``.

For each backend (Redis, ZooKeeper, etcd) one local server serves plain
text and TLS with a client certificate (the test certificates of
:mod:`aiolocks.testing.tls`; both URLs dial ``localhost``, so the TLS one
checks the host name). Per backend, ``--rounds`` interleaved rounds (the
order flips every round), each of:

* **cycle**: ``--cycles`` uncontended ``acquire()`` + ``release()`` of one
  mutex over an open backend (µs per cycle): what TLS costs per message;
* **connect**: opening and closing a backend (ms): the handshake.

It prints one JSON line per backend with the median of each side and the
median, min and max of the per-round ratios TLS/plain (ratios, because
this machine may be busy: both sides of a round see the same load). A
backend whose server is not installed gets a line with ``skipped``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiolocks
from aiolocks.testing import EtcdServer
from aiolocks.testing.servers import RedisServer, ServerNotInstalledError, ZooKeeperServer
from aiolocks.testing.tls import TlsFiles, make_tls_files

__all__ = ["BACKENDS", "UrlPair", "main", "measure"]

BACKENDS = ("redis", "zookeeper", "etcd")


@dataclass(frozen=True, slots=True)
class UrlPair:
    """The plain and the TLS URL of one server."""

    plain: str
    tls: str


def _client_query(tls: TlsFiles) -> str:
    return f"ssl_ca_certs={tls.ca_cert}&ssl_certfile={tls.client_cert}&ssl_keyfile={tls.client_key}"


#: per backend: its test server, its plain URL and its TLS URL (``{port}``,
#: ``{tls_port}``: the server's; ``{client}``: the CA and client certificate)
_SERVERS: dict[str, tuple[type[RedisServer | ZooKeeperServer | EtcdServer], str, str]] = {
    "redis": (
        RedisServer,
        "redis://localhost:{port}/0",
        "rediss://localhost:{tls_port}/0?{client}",
    ),
    "zookeeper": (
        ZooKeeperServer,
        "zk://localhost:{port}",
        "zk://localhost:{tls_port}?tls=true&{client}",
    ),
    "etcd": (EtcdServer, "etcd://localhost:{port}", "etcds://localhost:{tls_port}?{client}"),
}


@contextlib.contextmanager
def _serve(backend: str, tls: TlsFiles) -> Iterator[UrlPair]:
    """Start ``backend``'s server with plain text and TLS; its two URLs."""
    server_class, plain, secure = _SERVERS[backend]
    with server_class(tls=tls) as server:
        values = {"port": server.port, "tls_port": server.tls_port, "client": _client_query(tls)}
        yield UrlPair(plain.format(**values), secure.format(**values))


async def _cycles(backend: aiolocks.Backend, cycles: int) -> float:
    """µs per uncontended acquire + release."""
    mutex = backend.mutex("bench-tls/cycle")
    started = time.perf_counter()
    for _ in range(cycles):
        await mutex.acquire()
        await mutex.release()
    return (time.perf_counter() - started) / cycles * 1e6


async def _connect(url: str) -> float:
    """ms to open and close a backend."""
    started = time.perf_counter()
    async with aiolocks.connect(url):
        pass
    return (time.perf_counter() - started) * 1e3


def _summary(plain: list[float], tls: list[float]) -> dict[str, float]:
    ratios = [t / p for p, t in zip(plain, tls, strict=True) if p]
    return {
        "plain": statistics.median(plain),
        "tls": statistics.median(tls),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


async def measure(urls: UrlPair, rounds: int, cycles: int) -> dict[str, object]:
    """Interleaved rounds, plain against TLS: per-side medians and TLS/plain ratios."""
    if rounds < 1 or cycles < 1:
        raise ValueError(f"rounds and cycles must be >= 1, not {rounds} and {cycles}")
    sides = [("plain", urls.plain), ("tls", urls.tls)]
    cycle_us: dict[str, list[float]] = {"plain": [], "tls": []}
    connect_ms: dict[str, list[float]] = {"plain": [], "tls": []}
    async with aiolocks.connect(urls.plain) as plain, aiolocks.connect(urls.tls) as tls:
        backends = {"plain": plain, "tls": tls}
        for name, _ in sides:  # warm-up, not measured
            await _cycles(backends[name], max(1, cycles // 2))
        for r in range(rounds):
            for name, url in sides if r % 2 == 0 else sides[::-1]:
                cycle_us[name].append(await _cycles(backends[name], cycles))
                connect_ms[name].append(await _connect(url))
    cycle = _summary(cycle_us["plain"], cycle_us["tls"])
    connect = _summary(connect_ms["plain"], connect_ms["tls"])
    return {
        "cycle_plain_us": round(cycle["plain"], 1),
        "cycle_tls_us": round(cycle["tls"], 1),
        "cycle_ratio": round(cycle["ratio_median"], 3),
        "cycle_ratio_range": [round(cycle["ratio_min"], 3), round(cycle["ratio_max"], 3)],
        "connect_plain_ms": round(connect["plain"], 2),
        "connect_tls_ms": round(connect["tls"], 2),
        "connect_ratio": round(connect["ratio_median"], 3),
        "connect_ratio_range": [round(connect["ratio_min"], 3), round(connect["ratio_max"], 3)],
    }


def main(argv: list[str] | None = None) -> int:
    """Start each backend's server with TLS, measure, print one JSON line per backend."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tls")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    with tempfile.TemporaryDirectory() as folder:
        tls = make_tls_files(Path(folder) / "tls")
        for name in backends:
            row: dict[str, object] = {"backend": name, "rounds": args.rounds, "cycles": args.cycles}
            try:
                with _serve(name, tls) as urls:
                    row.update(asyncio.run(measure(urls, args.rounds, args.cycles)))
            except ServerNotInstalledError as exc:
                row["skipped"] = str(exc)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
