"""python-etcd3's ``Lock`` (PyPI ``etcd3``), timed in a process of its own.

``python -m benchmarks.etcd_py3 ENDPOINT uncontended CYCLES`` or ``... contended
SECONDS THREADS``; prints one JSON object. python-etcd3 is synchronous and its
generated protobuf code only imports with the pure-Python protobuf runtime
(``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``), which would slow every
other contender's protobuf down if it ran in their process: hence the
separate process (:func:`benchmarks.etcd.run` starts it).
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
import uuid
from typing import Any


def _client(endpoint: str) -> Any:
    etcd3 = importlib.import_module("etcd3")
    host, _, port = endpoint.rpartition(":")
    return etcd3.client(host=host, port=int(port))


def uncontended(endpoint: str, cycles: int) -> dict[str, Any]:
    """Median and all samples (s) of ``cycles`` acquire + release cycles of one lock."""
    client = _client(endpoint)
    lock = client.lock(f"bench-py3-{uuid.uuid4().hex[:6]}", ttl=30)
    for _ in range(max(10, cycles // 10)):
        lock.acquire()
        lock.release()
    samples = []
    for _ in range(cycles):
        started = time.perf_counter()
        lock.acquire()
        lock.release()
        samples.append(time.perf_counter() - started)
    client.close()
    return {"samples": samples}


def contended(endpoint: str, seconds: float, threads: int) -> dict[str, Any]:
    """Holds per second of ``threads`` threads (two clients) taking one lock in turn."""
    name = f"bench-py3-c-{uuid.uuid4().hex[:6]}"
    clients = [_client(endpoint), _client(endpoint)]
    state = {"inside": 0, "overlaps": 0, "holds": 0}
    guard = threading.Lock()
    stop_at = time.monotonic() + seconds

    def work(index: int) -> None:
        lock = clients[index % 2].lock(name, ttl=30)
        while time.monotonic() < stop_at:
            if not lock.acquire(timeout=30):
                continue
            with guard:
                state["inside"] += 1
                if state["inside"] > 1:
                    state["overlaps"] += 1
            time.sleep(0.001)
            with guard:
                state["inside"] -= 1
                state["holds"] += 1
            lock.release()

    started = time.monotonic()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    for client in clients:
        client.close()
    return {"holds_per_s": state["holds"] / elapsed, "overlaps": state["overlaps"]}


def main(argv: list[str]) -> int:
    """Run one measurement and print it as JSON."""
    endpoint, mode = argv[0], argv[1]
    if mode == "uncontended":
        result = uncontended(endpoint, int(argv[2]))
    else:
        result = contended(endpoint, float(argv[2]), int(argv[3]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
