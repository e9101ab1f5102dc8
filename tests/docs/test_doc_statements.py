"""Statements the docs once made that contradicted the code or a measurement.

Each entry is a phrase (compared with runs of whitespace folded into one
space, so line breaks do not hide it) that must not come back, and the
truth that replaced it. The pages searched are README.md, docs/*.md, the
docstrings and messages of the package, and ``aiolocks break --help``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: old statement -> the truth (and where it is measured or implemented)
WRONG: dict[str, str] = {
    # Redis loss after a break or a deleted key: keyspace events report it at
    # once (docs/benchmarks.md "Loss latency": p50 1.09 ms, p99 9.97 ms);
    # renewal timing only where the events are off or refused, and on Redlock.
    "On Redis at the next lease renewal": "Redis notices at once (keyspace events)",
    "| Redis | at its next lease renewal": "Redis notices at once (keyspace events)",
    "at the next renewal on Redis": "Redis notices at once (keyspace events)",
    "Redis: next renewal": "Redis notices at once (keyspace events)",
    "on Redis at their next lease renewal": "Redis notices at once (keyspace events)",
    "on Redis at the next lease renewal": "Redis notices at once (keyspace events)",
    "noticed by its holder at the next lease renewal": "at once (keyspace events)",
    # force-release exists: aiolocks break / Backend.force_release
    "forceUnlock()` | not offered": "aiolocks break / backend.force_release",
    "`forceUnlock` | not offered": "aiolocks break / backend.force_release",
    # aiolocks doctor has etcd checks (aiolocks/etcd/_doctor.py)
    "etcd (coming with that backend)": "the etcd findings are listed",
    "clock offset from the server's `now()`": "doctor does not check the etcd clock",
    # ZooKeeper accepts fair=/lease_time=/watchdog= and ignores them (_core/options.py)
    "take no `lease_time`": "ZooKeeper accepts and ignores lease_time=",
    # the docs speak to readers, not to the project's maintainers
    "the lead reruns": "rerun python -m benchmarks",
    # the command line prints one spelling of each lock kind (status JSON keys)
    "(`mutex`, `semaphore_mutex`, `read_write_lock`, `semaphore`, `leader_latch`)": (
        "status keys: mutex, semaphore-mutex, rwlock, semaphore, leader"
    ),
}


def _folded(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _texts() -> dict[str, str]:
    found = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    for path in sorted((ROOT / "docs").glob("*.md")):
        found[f"docs/{path.name}"] = path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "aiolocks").rglob("*.py")):
        found[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    return found


@pytest.mark.parametrize("phrase", list(WRONG))
def test_old_wrong_statement_is_gone(phrase: str) -> None:
    needle = _folded(phrase).lower()
    places = [name for name, text in _texts().items() if needle in _folded(text).lower()]
    assert not places, f"{phrase!r} is wrong ({WRONG[phrase]}), still in {places}"


def test_break_help_tells_the_redis_truth() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aiolocks", "break", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    text = _folded(result.stdout).lower()
    for phrase in WRONG:
        assert _folded(phrase).lower() not in text, phrase
    assert "keyspace events" in text
