"""Installing or importing aiolocks does not change other processes' test runs."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata


def test_no_pytest_entry_point() -> None:
    plugins = [ep for ep in metadata.entry_points(group="pytest11") if "aiolocks" in ep.value]
    assert plugins == [], "pytest must load the plugin only when a project opts in"


def test_importing_the_launchers_registers_no_exit_hook() -> None:
    code = (
        "import atexit, sys\n"
        "registered = []\n"
        "real = atexit.register\n"
        "def spy(f, *a, **k):\n"
        "    if getattr(f, '__module__', '').startswith('aiolocks'):\n"
        "        registered.append(f)\n"
        "    return real(f, *a, **k)\n"
        "atexit.register = spy\n"
        "import aiolocks.testing.servers, aiolocks.testing.pytest_plugin\n"
        "sys.exit(len(registered))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, timeout=60)
    assert result.returncode == 0, f"{result.returncode} atexit hook(s) registered at import"
