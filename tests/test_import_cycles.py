"""No import circle among ``aiolocks`` modules, lazy imports included.

An import inside a function is still an arrow between two modules: two
modules that import each other (one of them lazily, to get past the circle
at load time) cannot be read, tested or replaced one without the other.
Imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiolocks

PACKAGE = Path(aiolocks.__file__).parent


def _module_name(path: Path) -> str:
    parts = ("aiolocks", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports anywhere (functions too), by name.

    ``from pkg import name`` names ``pkg.name`` when that is a module, else ``pkg``.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target:
            found.add(target)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for statement in node.orelse:
                visit(statement)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                resolve(full if full in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every ``aiolocks`` module -> the ``aiolocks`` modules it imports."""
    paths = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    known = set(paths)
    return {
        name: imports_of(
            path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known
        )
        for name, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(groups)


def test_finds_lazy_imports_and_skips_type_checking() -> None:
    source = "\n".join(
        [
            "from typing import TYPE_CHECKING",
            "from . import b",
            "if TYPE_CHECKING:",
            "    from .c import C",
            "def f():",
            "    from .d import thing",
            "    import pkg.e",
        ]
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d", "pkg.e"}
    assert imports_of(source, "pkg.a", False, known) == {"pkg.b", "pkg.d", "pkg.e"}


def test_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert cycles(import_graph()) == []
