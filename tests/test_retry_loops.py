"""Retry loops in the library wait with ``Backoff``, not with their own sleeps.

A loop that catches an error and sleeps a computed delay before going round
again is a retry-with-backoff loop: it must use
:class:`aiolocks._core.backoff.Backoff`, so every backend backs off the same
way. A computed sleep in such a loop that is not a retry (a keep-alive
cadence, a random pause that breaks a tie) carries a ``# not a retry: <why>``
comment on its line or the line above.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import aiolocks

PACKAGE = Path(aiolocks.__file__).parent
#: the test servers and fault proxy of ``aiolocks.testing`` pace processes, not locks
NOT_SCANNED = ("testing",)
MARKER = "# not a retry:"

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _same_scope(node: ast.AST) -> Iterator[ast.AST]:
    """``node``'s descendants, not entering nested functions or classes."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _SCOPES):
            continue
        yield child
        yield from _same_scope(child)


def _is_sleep(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == "sleep" and isinstance(func.value, ast.Name)
    return isinstance(func, ast.Name) and func.id == "sleep"


def _marked(lines: list[str], lineno: int) -> bool:
    above = lines[lineno - 2].strip() if lineno >= 2 else ""
    return MARKER in lines[lineno - 1] or above.startswith(MARKER)


def unmarked_retry_sleeps(source: str) -> list[int]:
    """Lines of ``sleep(<not a constant>)`` calls in a loop that has an ``except``, unmarked."""
    lines = source.splitlines()
    found: set[int] = set()
    for loop in ast.walk(ast.parse(source)):
        if not isinstance(loop, ast.While | ast.For | ast.AsyncFor):
            continue
        inside = list(_same_scope(loop))
        if not any(isinstance(node, ast.ExceptHandler) for node in inside):
            continue
        for node in inside:
            if (
                _is_sleep(node)
                and isinstance(node, ast.Call)
                and node.args
                and not isinstance(node.args[0], ast.Constant)
                and not _marked(lines, node.lineno)
            ):
                found.add(node.lineno)
    return sorted(found)


def test_finds_a_hand_written_backoff() -> None:
    source = (
        "async def run():\n"
        "    delay = 0.1\n"
        "    while True:\n"
        "        try:\n"
        "            return await go()\n"
        "        except OSError:\n"
        "            pass\n"
        "        await asyncio.sleep(delay)\n"
        "        delay = min(delay * 2, 1.0)\n"
    )
    assert unmarked_retry_sleeps(source) == [8]
    # The same under an outer loop, and with a bare ``sleep``: still found.
    nested = source.replace("asyncio.sleep", "sleep").replace("\n    ", "\n        ")
    nested = nested.replace("async def run():\n", "async def run():\n    for _ in x:\n")
    assert unmarked_retry_sleeps(nested) == [9]


def test_leaves_constants_marked_lines_and_loops_without_except() -> None:
    body = (
        "async def run(pause):\n"
        "    while True:\n"
        "        try:\n"
        "            await go()\n"
        "        except OSError:\n"
        "            pass\n"
        "        await asyncio.sleep(0.1)\n"
        "        await asyncio.sleep(pause)  # not a retry: the keep-alive cadence\n"
        "        # not a retry: a random pause that breaks a tie\n"
        "        await asyncio.sleep(pause)\n"
        "    while True:\n"
        "        await asyncio.sleep(pause)\n"
        "        async def inner():\n"
        "            try:\n"
        "                pass\n"
        "            except OSError:\n"
        "                pass\n"
    )
    assert unmarked_retry_sleeps(body) == []


def _library_files() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in NOT_SCANNED
    )


def test_library_retry_loops_use_backoff() -> None:
    files = _library_files()
    backends = {path.relative_to(PACKAGE).parts[0] for path in files}
    # the scan reads the backends and the core, not an empty set
    assert {"_core", "etcd", "memory", "postgres", "redis", "zookeeper"} <= backends
    found = {
        f"{path.relative_to(PACKAGE).as_posix()}:{line}": path.read_text(encoding="utf-8")
        .splitlines()[line - 1]
        .strip()
        for path in files
        for line in unmarked_retry_sleeps(path.read_text(encoding="utf-8"))
    }
    assert found == {}, (
        "retry loops sleeping a delay of their own (use aiolocks._core.backoff.Backoff, "
        f"or mark a pause that is not a retry with {MARKER!r}): {found}"
    )
