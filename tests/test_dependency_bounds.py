"""Every runtime dependency is bounded on both sides, and CI runs both ends.

``scripts/test.sh`` installs the highest versions pyproject.toml allows;
``scripts/test-lowest.sh`` pins the lowest ones from
``.ci/lowest-constraints.txt``. This test keeps that file equal to the lower
bounds written in pyproject.toml, so a raised bound cannot go untested.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the extras that are part of the library (not tools for tests, docs, benchmarks)
RUNTIME_EXTRAS = ("anyio", "prometheus", "etcd", "postgres", "otel")
_REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)(\[[^\]]*\])?(?P<spec>[^;]*)")


def _runtime_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in RUNTIME_EXTRAS:
        lines += project["optional-dependencies"][extra]
    found: dict[str, str] = {}
    for line in lines:
        match = _REQUIREMENT.fullmatch(line.strip())
        assert match is not None, line
        found[_normal(match["name"])] = match["spec"].replace(" ", "")
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lowest_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / ".ci" / "lowest-constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_normal(name)] = version
    return pins


def test_every_runtime_dependency_has_both_bounds() -> None:
    for name, spec in _runtime_requirements().items():
        assert re.search(r">=[0-9]", spec), f"{name} has no lower bound: {spec!r}"
        assert re.search(r"<[0-9]", spec), f"{name} has no upper bound: {spec!r}"


def test_the_lowest_run_pins_exactly_the_lower_bounds() -> None:
    pins = _lowest_pins()
    for name, spec in _runtime_requirements().items():
        lower = re.search(r">=([0-9][^,]*)", spec)
        assert lower is not None
        assert name in pins, f"{name} is not pinned in .ci/lowest-constraints.txt"
        assert _release(pins[name]) == _release(lower.group(1)), (
            f"{name}: pyproject.toml says >={lower.group(1)}, the lowest run pins {pins[name]}"
        )


def _release(version: str) -> tuple[int, ...]:
    parts = [int(part) for part in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def test_ci_runs_the_lowest_versions_too() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in ci and "scripts/test-lowest.sh" in ci
