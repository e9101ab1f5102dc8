"""Shared pieces of the chaos suite: the seed banner and the summary at the end of the run.

``AIOLOCKS_CHAOS_SEED`` picks the seed (printed in the header and in every
summary line), ``AIOLOCKS_CHAOS_SCALE`` multiplies run lengths and iteration
counts, and ``AIOLOCKS_CHAOS_REPORT=path.json`` writes every figure to a file.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from .checker import chaos_scale, chaos_seed

#: summary lines collected by the tests, printed at the end of the session
SUMMARIES: list[str] = []
#: every report as JSON, written to ``AIOLOCKS_CHAOS_REPORT`` when set
REPORTS: list[dict[str, Any]] = []


def record_summary(line: str, data: dict[str, Any] | None = None) -> None:
    """Keep a summary line for the end of the session (and print it now, for ``-s``)."""
    SUMMARIES.append(line)
    if data is not None:
        REPORTS.append(data)
    print(line)


def pytest_report_header(config: pytest.Config) -> str:
    """Show the seed, so that a failing run can be repeated."""
    seed, scale = chaos_seed(), chaos_scale()
    return f"aiolocks chaos: AIOLOCKS_CHAOS_SEED={seed} AIOLOCKS_CHAOS_SCALE={scale}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print every chaos figure at the end of the run (copy-paste material for the README)."""
    if not SUMMARIES:
        return
    terminalreporter.section("aiolocks chaos summary")
    for line in SUMMARIES:
        terminalreporter.write_line(line)
    path = os.environ.get("AIOLOCKS_CHAOS_REPORT", "").strip()
    if path:
        with open(path, "w") as out:
            json.dump(REPORTS, out, indent=2, default=str)
