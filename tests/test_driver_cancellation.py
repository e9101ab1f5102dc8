"""Cancellation policy lives in the core: the backends hold none of their own.

The driver contract (``aiolocks/_core/driver.py``) says a driver never
catches ``CancelledError``, never shields and owns no task set: background
work goes into the engine's task set given to ``open(tasks)``, waits that
must outlast a cancellation use ``aiolocks._core.tasks`` (``wait_done``,
``wait_finished``, ``stop_task``), and a cancellation a client library
swallowed is raised again with ``cancelled_again``. This test reads the
backend packages (ast) and fails on each way around that rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiolocks

PACKAGE = Path(aiolocks.__file__).parent
BACKENDS = ("redis", "zookeeper", "etcd", "postgres", "memory")

#: "<path under aiolocks/>:<line text stripped>" -> why it is allowed. Keep it empty.
ALLOWED: dict[str, str] = {}


def _is_cancelled_error(node: ast.expr) -> bool:
    """``CancelledError`` or ``asyncio.CancelledError`` (alone or in a tuple)."""
    if isinstance(node, ast.Tuple):
        return any(_is_cancelled_error(item) for item in node.elts)
    if isinstance(node, ast.Name):
        return node.id == "CancelledError"
    if isinstance(node, ast.Attribute):
        return node.attr == "CancelledError"
    return False


def _callee(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def policy_breaches(source: str) -> list[tuple[int, str]]:
    """(line, what) of every shield, task set built, and caught or suppressed cancellation."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name == "shield":
                found.append((node.lineno, "asyncio.shield"))
            elif name == "TaskSet":
                found.append((node.lineno, "a TaskSet of its own"))
            elif name == "suppress" and any(_is_cancelled_error(arg) for arg in node.args):
                found.append((node.lineno, "suppress(CancelledError)"))
        elif (
            isinstance(node, ast.ExceptHandler)
            and node.type is not None
            and _is_cancelled_error(node.type)
        ):
            found.append((node.lineno, "except CancelledError"))
    return sorted(found)


def test_finds_each_breach() -> None:
    source = "\n".join(
        [
            "import asyncio, contextlib",
            "async def f(fut, tasks):",
            "    await asyncio.shield(fut)",
            "    own = TaskSet()",
            "    with contextlib.suppress(asyncio.CancelledError):",
            "        await fut",
            "    try:",
            "        await fut",
            "    except (ValueError, asyncio.CancelledError):",
            "        pass",
            "    try:",
            "        await fut",
            "    except BaseException:",  # cleanup, then re-raise: the allowed idiom
            "        raise",
        ]
    )
    assert policy_breaches(source) == [
        (3, "asyncio.shield"),
        (4, "a TaskSet of its own"),
        (5, "suppress(CancelledError)"),
        (9, "except CancelledError"),
    ]


def test_backends_hold_no_cancellation_policy() -> None:
    found: dict[str, str] = {}
    for backend in BACKENDS:
        for path in sorted((PACKAGE / backend).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            for line, what in policy_breaches(source):
                key = f"{path.relative_to(PACKAGE).as_posix()}:{lines[line - 1].strip()}"
                found[key] = what
    unexpected = {key: what for key, what in found.items() if key not in ALLOWED}
    assert unexpected == {}, (
        "cancellation policy in a backend (use the engine's task set and "
        f"aiolocks._core.tasks instead): {unexpected}"
    )
    stale = sorted(ALLOWED.keys() - found.keys())
    assert stale == [], f"no longer found, remove from ALLOWED: {stale}"


#: backend modules that start tasks of their own, and why (see "Tasks of the
#: protocol clients" in docs/architecture.md). Everything else spawns into
#: the engine's task set.
OWN_TASKS: dict[str, str] = {
    "zookeeper/_client.py": "requests over an application's aiozk client, its state watcher",
    "zookeeper/_connection.py": "the session's connect loop",
    "etcd/_client.py": "the gRPC client's lease keep-alive, watch stream and its writer",
    "redis/_pubsub.py": "the pub/sub connection's reader and command writer",
    "postgres/_lease.py": "one pool hand-back awaited through cancellation (wait_finished)",
}


def _starts_tasks(source: str) -> bool:
    return any(
        isinstance(node, ast.Call) and _callee(node) in {"create_task", "ensure_future"}
        for node in ast.walk(ast.parse(source))
    )


def test_only_protocol_clients_start_their_own_tasks() -> None:
    starting = {
        path.relative_to(PACKAGE).as_posix()
        for backend in BACKENDS
        for path in (PACKAGE / backend).rglob("*.py")
        if _starts_tasks(path.read_text(encoding="utf-8"))
    }
    assert starting - OWN_TASKS.keys() == set(), (
        "a backend module starts a task of its own; spawn into the engine's task "
        "set (or, for a protocol client's I/O loop, list it in OWN_TASKS)"
    )
    assert OWN_TASKS.keys() - starting == set(), "no longer starts tasks: remove from OWN_TASKS"
