"""Server-side counters: what each lock costs the server, not what the client believes.

Redis
    ``MONITOR`` lists every command a client sends, and marks the commands a
    Lua script runs inside with ``[<db> lua]``: so a monitored pass counts
    client requests (round trips) and script-internal commands separately.
    ``INFO commandstats`` gives the same totals without the monitor's
    overhead (used for the renewal rate of the many-locks scenario).
ZooKeeper
    ``mntr``: ``zk_packets_received`` (requests, pings included),
    ``zk_znode_count``, ``zk_watch_count``; ``wchs``: watches and watched
    paths.
"""

from __future__ import annotations

import re
import socket
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["RedisMonitor", "commandstats_calls", "parse_mntr", "parse_wchs"]

_MONITOR_LINE = re.compile(r'^\+\d+\.\d+ \[(\d+) ([^\]]+)\] "([^"]+)"')


@dataclass
class MonitorCounts:
    """Commands seen by a :class:`RedisMonitor`, keyed by upper-case command name."""

    client: Counter[str] = field(default_factory=Counter)
    in_scripts: Counter[str] = field(default_factory=Counter)

    @property
    def client_total(self) -> int:
        """Requests sent by clients (round trips, pipelined or not)."""
        return sum(self.client.values())

    @property
    def script_total(self) -> int:
        """Commands run inside Lua scripts."""
        return sum(self.in_scripts.values())


class RedisMonitor:
    """Count the commands a Redis server receives while the ``with`` block runs.

    >>> with RedisMonitor(host, port) as counts:   # doctest: +SKIP
    ...     run_cycles()
    >>> counts.client_total / cycles              # doctest: +SKIP

    Leaving the block sends a marker ``ECHO`` from another connection and
    reads the monitor stream up to it, so every command sent before the
    block ended is counted. The monitor's own and the marker's connections
    are not counted.
    """

    def __init__(self, host: str, port: int, *, timeout: float = 30.0) -> None:
        self._host = host
        self._port = port
        self._timeout = timeout
        self._marker = f"aiolocks-bench-{uuid.uuid4().hex}"
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.counts = MonitorCounts()

    def __enter__(self) -> MonitorCounts:
        sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
        sock.sendall(b"MONITOR\r\n")
        reader = sock.makefile("rb")
        first = reader.readline()
        if not first.startswith(b"+OK"):
            sock.close()
            raise RuntimeError(f"MONITOR refused: {first!r}")
        self._sock = sock
        self._thread = threading.Thread(target=self._read, args=(reader,), daemon=True)
        self._thread.start()
        return self.counts

    def _read(self, reader: object) -> None:
        from io import BufferedReader

        assert isinstance(reader, BufferedReader)
        try:
            for raw in reader:
                line = raw.decode("utf-8", "replace")
                match = _MONITOR_LINE.match(line)
                if match is None:
                    continue
                source, command = match.group(2), match.group(3).upper()
                if command == "ECHO" and self._marker in line:
                    return
                if source == "lua":
                    self.counts.in_scripts[command] += 1
                else:
                    self.counts.client[command] += 1
        except BaseException as exc:  # reported by __exit__
            self._error = exc

    def __exit__(self, *exc_info: object) -> None:
        try:
            with socket.create_connection((self._host, self._port), timeout=self._timeout) as s:
                payload = f"*2\r\n$4\r\nECHO\r\n${len(self._marker)}\r\n{self._marker}\r\n"
                s.sendall(payload.encode())
                s.recv(4096)
            if self._thread is not None:
                self._thread.join(self._timeout)
                if self._thread.is_alive():
                    raise RuntimeError("the MONITOR stream did not reach the end marker")
        finally:
            if self._sock is not None:
                self._sock.close()
        if self._error is not None:
            raise RuntimeError("reading the MONITOR stream failed") from self._error


def commandstats_calls(info: dict[str, str]) -> dict[str, int]:
    """``{"evalsha": calls, ...}`` from a parsed ``INFO commandstats``."""
    out: dict[str, int] = {}
    for key, value in info.items():
        if not key.startswith("cmdstat_"):
            continue
        for part in value.split(","):
            name, _, number = part.partition("=")
            if name == "calls":
                out[key.removeprefix("cmdstat_")] = int(number)
    return out


def parse_mntr(text: str) -> dict[str, str]:
    """``mntr`` output as ``{"zk_packets_received": "123", ...}``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if key:
            out[key.strip()] = value.strip()
    return out


def parse_wchs(text: str) -> tuple[int, int, int]:
    """``wchs`` output as ``(connections, paths, total watches)``."""
    match = re.search(r"(\d+) connections watching (\d+) paths", text)
    total = re.search(r"Total watches:\s*(\d+)", text)
    if match is None or total is None:
        raise ValueError(f"unexpected wchs output: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(total.group(1))
