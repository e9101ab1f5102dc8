"""Code shape: no function in ``aiolocks/`` is longer than 80 lines.

A long function decides several things at once; split it by idea and name
the pieces after what they decide. The allowlist below holds the functions
still too long (none now); it may only shrink (a listed function that got
short fails the test too, so that its line is removed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiolocks

PACKAGE = Path(aiolocks.__file__).parent
LIMIT = 80

#: "<path under aiolocks/>:<qualified name>" of the functions still over the
#: limit (none left).
ALLOWED_LONG: frozenset[str] = frozenset()


def long_functions(source: str, limit: int = LIMIT) -> dict[str, int]:
    """Qualified name -> length in lines (``def`` line to last line) of the functions over
    ``limit``; nested functions and methods are named ``Outer.inner``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > limit:
                        found[name] = length
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_measures_nested_functions_and_methods() -> None:
    outer = "\n".join(f"        x = {i}" for i in range(4))
    inner = "\n".join(f"            y = {i}" for i in range(4))
    source = f"class C:\n    def m(self):\n{outer}\n        def inner():\n{inner}\n"
    assert long_functions(source, limit=5) == {"C.m": 10}
    assert long_functions(source, limit=4) == {"C.m": 10, "C.m.inner": 5}


def test_no_function_over_80_lines() -> None:
    found = {
        f"{path.relative_to(PACKAGE).as_posix()}:{name}": length
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, length in long_functions(path.read_text(encoding="utf-8")).items()
    }
    too_long = {name: length for name, length in found.items() if name not in ALLOWED_LONG}
    assert too_long == {}, f"functions over {LIMIT} lines (split them by idea): {too_long}"
    now_short = sorted(ALLOWED_LONG - found.keys())
    assert now_short == [], f"no longer over {LIMIT} lines, remove from ALLOWED_LONG: {now_short}"
