"""Layering: the core imports no backend, and ``import aiolocks`` loads no client library.

Drivers import ``aiolocks._core``; the core never imports a driver package
or the client library a driver wraps. The arrows only point down, so a
backend can be read (and replaced) without the core, and ``import aiolocks``
stays cheap for a program that uses ``memory://`` only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import aiolocks

CORE = Path(aiolocks.__file__).parent / "_core"

#: backend packages of aiolocks and the client libraries behind them
FORBIDDEN_IN_CORE = (
    "aiolocks.memory",
    "aiolocks.redis",
    "aiolocks.zookeeper",
    "aiolocks.etcd",
    "aiolocks.postgres",
    "aiozk",
    "redis",
    "asyncpg",
    "grpc",
)

#: libraries ``import aiolocks`` must not load (anyio: an optional extra, never imported)
LAZY_LIBRARIES = ("aiozk", "redis", "asyncpg", "grpc", "anyio")


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved.

    ``from . import x`` yields ``package.x`` as well as ``package``, so that a
    backend imported by name from its parent package is seen too.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_resolves_relative_imports(tmp_path: Path) -> None:
    """The scanner itself sees a relative import of a backend (so the rule can fail)."""
    source = tmp_path / "engine.py"
    source.write_text(
        "from ..memory._driver import MemoryDriver\nfrom .. import redis\nimport aiozk.exc\n"
    )
    modules = [module for _, module in imported_modules(source, "aiolocks._core")]
    assert "aiolocks.memory._driver" in modules
    assert "aiolocks.redis" in modules
    assert "aiozk.exc" in modules


def test_core_imports_no_backend() -> None:
    files = sorted(CORE.glob("*.py"))
    assert files, CORE
    offenders = [
        f"{path.name}:{line}: {module}"
        for path in files
        for line, module in imported_modules(path, "aiolocks._core")
        if any(is_under(module, banned) for banned in FORBIDDEN_IN_CORE)
    ]
    assert offenders == [], "aiolocks/_core must not import a backend:\n" + "\n".join(offenders)


def test_import_aiolocks_loads_no_client_library_nor_anyio() -> None:
    code = (
        "import sys, aiolocks, aiolocks.memory\n"
        f"bad = [m for m in {LAZY_LIBRARIES!r} if m in sys.modules]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import that runs at import time (not inside a function)."""
    found: list[tuple[int, str]] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or ""))
        stack.extend(ast.iter_child_nodes(node))
    return found


def test_module_level_scan_skips_function_bodies() -> None:
    tree = ast.parse("import os\nif True:\n    import anyio\ndef f():\n    import anyio.abc\n")
    assert sorted(module_level_imports(tree)) == [(1, "os"), (3, "anyio")]


def test_aiolocks_never_imports_anyio_at_module_level() -> None:
    """anyio is an optional extra: a module-level import would make it a hard dependency.

    Only a guarded import inside a function (``aiolocks.testing`` helpers)
    would be allowed; today there is none at all.
    """
    package = Path(aiolocks.__file__).parent
    offenders = [
        f"{path.relative_to(package)}:{line}"
        for path in sorted(package.rglob("*.py"))
        for line, module in module_level_imports(
            ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        )
        if is_under(module, "anyio")
    ]
    assert offenders == [], "anyio imported at module level: " + ", ".join(offenders)
