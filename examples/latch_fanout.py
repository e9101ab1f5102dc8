"""A batch fanned out to worker processes, joined with ``backend.count_down_latch()``.

::

    python examples/latch_fanout.py --url redis://127.0.0.1:6379/0          # 4 workers
    python examples/latch_fanout.py --url postgresql://... --workers 8 --items 1000
    python examples/latch_fanout.py                   # memory://, workers as tasks

The coordinator names a batch, sets the batch's latch to the number of
workers (``try_set_count``), starts the workers and waits on the latch.
Each worker (a process of its own, ``--worker I``) computes its share of the
batch (the sum of the squares of every ``--workers``-th item), writes it to
``part-I.json`` in the batch folder, then counts the latch down. When the
count reaches zero the coordinator wakes, reads the parts and prints the
total. The latch lives on the lock server, so the coordinator needs nothing
from the workers but their count-downs: it would work the same with workers
started by another host, or by a queue.

``memory://`` lives inside one process, so there the workers are tasks with
connections of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiolocks


def share(items: int, workers: int, index: int) -> int:
    """Worker ``index``'s part of the batch: the sum of the squares of its items."""
    return sum(item * item for item in range(index, items, workers))


async def worker(url: str, batch: str, folder: Path, index: int, workers: int, items: int) -> None:
    """Compute this worker's part, write it, then count the batch's latch down."""
    async with aiolocks.connect(url) as backend:
        hold = folder / f"hold-{index}"
        while hold.exists():  # a test holds this worker back: it deletes the file to go on
            await asyncio.sleep(0.05)
        part = folder / f"part-{index}.json"
        scratch = part.with_suffix(".tmp")
        scratch.write_text(json.dumps({"worker": index, "sum": share(items, workers, index)}))
        os.replace(scratch, part)  # whole, or not there
        await backend.count_down_latch(batch).count_down()


@dataclass
class Result:
    """What the coordinator saw when the latch opened."""

    batch: str
    parts: dict[int, int]
    total: int
    expected: int


async def _start_workers(
    url: str, batch: str, folder: Path, workers: int, items: int
) -> list[asyncio.Future[object]]:
    """Start the workers: processes, or tasks on ``memory://``."""
    if url.startswith("memory:"):
        return [
            asyncio.ensure_future(worker(url, batch, folder, i, workers, items))
            for i in range(workers)
        ]
    args = ["--url", url, "--batch", batch, "--folder", str(folder)]
    args += ["--workers", str(workers), "--items", str(items)]
    processes = [
        await asyncio.create_subprocess_exec(sys.executable, __file__, "--worker", str(i), *args)
        for i in range(workers)
    ]
    return [asyncio.ensure_future(process.wait()) for process in processes]


async def coordinate(
    url: str,
    folder: Path,
    *,
    workers: int = 4,
    items: int = 100,
    timeout: float = 120,
    batch: str | None = None,
) -> Result:
    """Set the latch, start the workers, wait for the latch, add up the parts.

    ``batch`` names the batch's latch (default: a fresh name).
    """
    batch = batch or f"batches/fanout-{uuid.uuid4().hex[:8]}"
    async with aiolocks.connect(url) as backend:
        latch = backend.count_down_latch(batch)
        if not await latch.try_set_count(workers):
            raise RuntimeError(f"batch {batch} already has a count")
        running = await _start_workers(url, batch, folder, workers, items)
        try:
            if not await latch.wait(timeout=timeout):
                raise TimeoutError(
                    f"{await latch.get_count()} worker(s) still busy after {timeout} s"
                )
            parts = {}
            for i in range(workers):
                parts[i] = json.loads((folder / f"part-{i}.json").read_text())["sum"]
        finally:
            exits = await asyncio.gather(*running, return_exceptions=True)
        failed = [code for code in exits if code not in (0, None)]
        if failed:
            raise RuntimeError(f"worker(s) failed: {failed}")
    expected = sum(item * item for item in range(items))
    return Result(batch, parts, sum(parts.values()), expected)


def main(argv: list[str] | None = None) -> int:
    """The command line: a coordinator, or one worker (``--worker``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="memory://")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--worker", type=int, default=None, help="run worker I of a batch")
    parser.add_argument("--batch", default=None, help="(worker) the batch's latch name")
    parser.add_argument("--folder", default=None, help="(worker) where the parts go")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.items < 0:
        parser.error("--workers must be >= 1 and --items >= 0")
    if args.worker is not None:
        if args.batch is None or args.folder is None:
            parser.error("--worker needs --batch and --folder")
        asyncio.run(
            worker(args.url, args.batch, Path(args.folder), args.worker, args.workers, args.items)
        )
        return 0
    with tempfile.TemporaryDirectory() as folder:
        result = asyncio.run(
            coordinate(args.url, Path(folder), workers=args.workers, items=args.items)
        )
    print(f"batch {result.batch}: {len(result.parts)} parts, total {result.total}")
    return 0 if result.total == result.expected else 1


if __name__ == "__main__":
    sys.exit(main())
