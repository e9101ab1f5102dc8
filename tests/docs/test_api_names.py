"""docs/api.md really lists every public name; mkdocs.yml and the README are complete.

* Section 9 of ``docs/api.md`` has one ``### `module` `` table per public
  module (every module of the package whose path has no ``_`` part), and
  each table names exactly that module's ``__all__``: a name re-exported by
  a parent package (``aiolocks.testing.proxy.TcpProxy`` is
  ``aiolocks.testing.TcpProxy``) is listed under the parent only.
* Section 1 names every URL scheme ``aiolocks.connect`` accepts; section 7
  every subcommand and every long option of the command line (read from
  ``aiolocks COMMAND --help``); ``Capabilities``' fields are all named.
* ``mkdocs.yml``'s nav holds every page of docs/, and the README's layout
  every package directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import aiolocks
from aiolocks import _connect
from aiolocks.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
API = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")


def public_modules() -> dict[str, ModuleType]:
    """``aiolocks`` and every module under it without a ``_``-prefixed part."""
    found = {"aiolocks": aiolocks}
    for info in pkgutil.walk_packages(aiolocks.__path__, "aiolocks."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        found[info.name] = importlib.import_module(info.name)
    return found


def owners() -> dict[str, set[str]]:
    """Module -> the names of its ``__all__`` that no public parent re-exports."""
    modules = public_modules()
    owned: dict[str, set[str]] = {}
    for name, module in modules.items():
        owned[name] = set()
        for public in getattr(module, "__all__", []):
            obj = getattr(module, public)
            parents = [
                parent
                for parent in modules
                if name.startswith(parent + ".")
                and public in getattr(modules[parent], "__all__", [])
                and getattr(modules[parent], public) is obj
            ]
            if not parents:
                owned[name].add(public)
    return {name: names for name, names in owned.items() if names}


def section(text: str, heading: str) -> str:
    """The lines under ``heading`` up to the next heading of the same or a higher level.

    Lines in fenced code blocks (a ``# comment`` in Python) are never headings.
    """
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    fenced = False
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            return "\n".join(lines[start:index])
    return "\n".join(lines[start:])


def table_names(text: str) -> set[str]:
    """The first cell of every table row: ``| `name` | ...``."""
    return set(re.findall(r"^\| `([A-Za-z_][\w]*)` \|", text, re.MULTILINE))


def test_every_public_module_has_its_table_with_exactly_its_names() -> None:
    index = section(API, "## 9. Every public name, by module")
    owned = owners()
    listed_modules = set(re.findall(r"^### `([\w.]+)`$", index, re.MULTILINE))
    assert listed_modules == set(owned), (
        f"modules without a table: {sorted(set(owned) - listed_modules)}; "
        f"tables of no public module: {sorted(listed_modules - set(owned))}"
    )
    problems = []
    for module, names in sorted(owned.items()):
        listed = table_names(section(index, f"### `{module}`"))
        if listed != names:
            problems.append(
                f"{module}: missing {sorted(names - listed)}, not public {sorted(listed - names)}"
            )
    assert not problems, "\n".join(problems)


def test_section_1_names_every_url_scheme() -> None:
    connecting = section(API, "## 1. Connecting")
    missing = [s for s in _connect.SCHEMES if not re.search(rf"`{re.escape(s)}://", connecting)]
    assert not missing, f"schemes aiolocks.connect accepts but section 1 omits: {missing}"


def test_section_7_names_every_command_and_long_option() -> None:
    cli = section(API, "## 7. Command line")
    assert "aiolocks --version" in cli
    missing = []
    for spec in SUBCOMMANDS:
        if f"`aiolocks {spec.name}" not in cli:
            missing.append(spec.name)
        result = subprocess.run(
            [sys.executable, "-m", "aiolocks", spec.name, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        # the option lines of argparse's help: "  -n, --nonblock  ..." / "  --json ..."
        options = set(re.findall(r"^\s+(?:-\w[ ,\w]*, )?(--[\w-]+)", result.stdout, re.MULTILINE))
        missing += [
            f"{spec.name} {option}"
            for option in sorted(options - {"--help"})
            if f"`{option}" not in cli
        ]
    assert not missing, f"section 7 omits: {missing}"


def test_capabilities_fields_are_named() -> None:
    fields = [f.name for f in dataclasses.fields(aiolocks.Capabilities)]
    missing = [
        name
        for name in fields
        if name not in section(API, "## 8. Backends, events, metrics and helpers")
    ]
    assert not missing, f"Capabilities fields section 8 omits: {missing}"


def test_mkdocs_nav_has_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    missing = [page for page in pages if not re.search(rf":\s*{re.escape(page)}\s*$", nav, re.M)]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


def test_readme_layout_has_every_package() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    packages = sorted(path.parent.name for path in (ROOT / "aiolocks").glob("*/__init__.py"))
    missing = [name for name in packages if f"aiolocks/{name}/" not in readme]
    assert not missing, f"package directories the README's layout omits: {missing}"
