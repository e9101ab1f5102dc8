"""The public surface: __all__ complete and sorted (lazy imports: tests/test_layering.py)."""

from __future__ import annotations

import inspect

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


def test_one_connection_state_enum_for_every_backend_with_a_session() -> None:
    from aiolocks import etcd, postgres, zookeeper
    from aiolocks._core.states import ConnectionState

    assert zookeeper.ConnectionState is ConnectionState
    assert etcd.ConnectionState is ConnectionState
    assert postgres.ConnectionState is ConnectionState
    assert [state.value for state in ConnectionState] == [
        "connected",
        "suspended",
        "reconnected",
        "lost",
    ]
