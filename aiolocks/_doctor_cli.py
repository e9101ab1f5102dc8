"""``aiolocks doctor URL [--json]``: check a lock service's settings and run a live self-test.

Exit status: 0 when nothing is critical, 1 when something is (an unreachable
server included), 64 for a bad URL or option. ``--json`` prints the report
as one JSON object (``DoctorReport.to_dict()``, see ``docs/operations.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from . import _connect
from ._core.doctor import DoctorReport

__all__ = ["EXIT_CRITICAL", "EXIT_OK", "add_parser", "doctor", "run"]

#: nothing critical was found
EXIT_OK = 0
#: at least one critical finding
EXIT_CRITICAL = 1
#: bad URL or option (sysexits EX_USAGE)
EXIT_USAGE = 64


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``doctor`` on the ``aiolocks`` command's subparsers; returns its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "doctor",
        help="check the lock service's settings and run a live self-test",
        description=(
            "Report deployment settings that break lock guarantees (eviction, persistence, "
            "replication, session timeouts, ensemble size, leftovers), then take and release "
            "a scratch lock. Exit 0 when nothing is critical, 1 otherwise."
        ),
    )
    parser.add_argument("url", nargs="?", default=None, help="backend URL (default: $AIOLOCKS_URL)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--no-self-test",
        dest="self_test",
        action="store_false",
        help="only read settings; take no scratch lock",
    )
    return parser


async def doctor(url: str, *, self_test: bool = True) -> DoctorReport:
    """Connect to ``url``, run ``backend.doctor()``, close; an unreachable server is a finding."""
    backend = _connect.backend_from_url(url)  # ValueError for a bad URL, before any I/O
    try:
        return await backend.doctor(self_test=self_test)
    finally:
        await backend.close()


def run(args: argparse.Namespace) -> int:
    """Run ``aiolocks doctor`` for parsed ``args``; returns the exit status."""
    url = args.url or os.environ.get("AIOLOCKS_URL")
    if not url:
        print("aiolocks doctor: no URL given and AIOLOCKS_URL is not set", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = asyncio.run(doctor(url, self_test=args.self_test))
    except ValueError as exc:
        print(f"aiolocks doctor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.to_json() if args.json else report.render())
    return report.exit_status
