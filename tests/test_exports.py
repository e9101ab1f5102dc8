"""The public surface: __all__ complete and sorted, no client imported eagerly."""

from __future__ import annotations

import inspect
import subprocess
import sys

import aiolocks


def test_all_is_sorted_and_complete() -> None:
    assert aiolocks.__all__ == sorted(aiolocks.__all__)
    public = {name for name in dir(aiolocks) if not name.startswith(("_", "@"))}
    modules = {
        "cli",
        "etcd",
        "memory",
        "opentelemetry",
        "postgres",
        "prometheus",
        "redis",
        "zookeeper",
        "testing",
    }
    assert public - modules - {"annotations"} <= set(aiolocks.__all__) | {"__version__"}
    for name in aiolocks.__all__:
        obj = getattr(aiolocks, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__doc__, f"aiolocks.{name} has no docstring"


def test_error_tree() -> None:
    for name in (
        "LockNotOwnedError",
        "LockLostError",
        "LockTimeoutError",
        "DeadlockError",
        "InvalidLockNameError",
        "BackendUnavailableError",
        "AccessDeniedError",
    ):
        assert issubclass(getattr(aiolocks, name), aiolocks.LockError)
    assert issubclass(aiolocks.AccessDeniedError, PermissionError)
    assert not issubclass(aiolocks.AccessDeniedError, aiolocks.BackendUnavailableError)
    assert issubclass(aiolocks.LockNotOwnedError, RuntimeError)
    assert issubclass(aiolocks.LockTimeoutError, TimeoutError)
    assert issubclass(aiolocks.InvalidLockNameError, ValueError)


def test_import_loads_no_client() -> None:
    code = (
        "import sys, aiolocks; import aiolocks.memory; "
        "bad = [m for m in ('aiozk', 'redis') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
