"""Every ```python block of README.md and docs/*.md runs as the pages say to run it.

The pages say: paste the block into ``python -m asyncio`` (an asyncio REPL,
Python 3.11+), after the page's setup block, if it has one. This test does
exactly that, through a pseudo-terminal, one fresh REPL per block and
target:

* it types the page's setup blocks (a block preceded by
  ``<!-- snippet-setup -->``, such as ``backend = await
  aiolocks.connect("memory://")``), then the block, each as written and
  followed by one empty line (the Enter a reader presses after a block
  that ends indented);
* what the REPL shows as an error (a traceback, a ``SyntaxError`` or
  ``IndentationError`` from a blank line inside an indented block, an
  event-loop error) fails the test, with the REPL's screen;
* around the pasted text it types three lines of its own (see
  ``tests/docs/_repl.py``): before, one that points ``aiolocks.connect``
  at the target; after, one that checks that the block closed every
  backend it opened and left nothing held on the setup block's backends (a
  snippet must not teach a leak);
* targets: ``memory://``, the ``redis_server`` and the ``zookeeper_server``
  fixtures; on a server each run gets its own key prefix or chroot, and the
  URL's query options are kept when it names the target's kind of server
  (``Target.url_for``). ``aiolocks.connect`` still builds the backend the
  snippet's URL names first, without I/O, so a malformed URL or option
  still fails.

A block preceded by the line ``<!-- skip-snippet -->`` is not run (it needs
a particular server, such as a Sentinel set, etcd or PostgreSQL, or is a
fragment); ``<!-- skip-snippet: zookeeper -->`` skips it on the listed
targets only (say, a Redis-only lock option). Skipped blocks are still
checked for names they use but never define (``test_no_undefined_names``).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docs._repl import RESULT, Target

ROOT = Path(__file__).resolve().parents[2]
SKIP_MARK = "<!-- skip-snippet -->"
SETUP_MARK = "<!-- snippet-setup -->"
SKIP_COMMENT = re.compile(r"^<!--\s*skip-snippet(?::(?P<targets>[\w\s,]*))?\s*-->$")
SCRIPT_MARK = "<!-- snippet-script -->"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")


@dataclass(frozen=True)
class Snippet:
    """One fenced python block."""

    page: str
    line: int
    code: str
    skip_on: frozenset[str]
    """Targets this block is not run on (``TARGETS`` for a plain skip mark)."""
    setup: tuple[str, ...] = ()
    """Code of the page's setup blocks above this one, run first."""
    is_setup: bool = False
    is_script: bool = False
    """Preceded by ``<!-- snippet-script -->``: the page says to run it as ``python FILE``."""

    @property
    def first_line(self) -> str:
        return next((line.strip() for line in self.code.splitlines() if line.strip()), "")


def pages() -> list[Path]:
    """README.md and every docs/*.md page."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def extract(path: Path, root: Path = ROOT) -> list[Snippet]:
    """The ```python blocks of one Markdown page, with their line numbers."""
    page = str(path.relative_to(root))
    lines = path.read_text(encoding="utf-8").splitlines()
    snippets: list[Snippet] = []
    setup: list[str] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and not re.match(r"^\s*```\s*$", lines[index]):
            body.append(lines[index])
            index += 1
        index += 1  # the closing fence
        if opening["lang"] != "python":
            continue
        previous = next(
            (lines[i].strip() for i in range(start - 1, -1, -1) if lines[i].strip()), ""
        )
        code = textwrap.dedent("\n".join(body))
        is_setup = previous == SETUP_MARK
        is_script = previous == SCRIPT_MARK
        snippets.append(
            Snippet(
                page,
                start + 1,
                code,
                skip_on=frozenset() if is_setup or is_script else _skip_on(previous),
                setup=() if is_script else tuple(setup),
                is_setup=is_setup,
                is_script=is_script,
            )
        )
        if is_setup:
            setup.append(code)
    return snippets


def _skip_on(comment: str) -> frozenset[str]:
    match = SKIP_COMMENT.match(comment)
    if match is None:
        return frozenset()
    if match["targets"] is None:
        return frozenset(TARGETS)
    targets = frozenset(match["targets"].replace(",", " ").split())
    unknown = targets - set(TARGETS)
    if unknown:
        raise ValueError(f"unknown target(s) {sorted(unknown)} in {comment!r}; known: {TARGETS}")
    return targets


def _params() -> list[Any]:
    params = []
    for path in pages():
        for snippet in extract(path):
            for target in TARGETS:
                marks: list[pytest.MarkDecorator] = []
                if target in snippet.skip_on:
                    marks.append(pytest.mark.skip(reason=f"marked {SKIP_MARK} (for {target})"))
                ident = f"{snippet.page}:{snippet.line}-{target}"
                params.append(pytest.param(snippet, target, id=ident, marks=marks))
    return params


#: target -> fixture giving an object with ``.url`` (None: memory)
TARGETS: dict[str, str | None] = {
    "memory": None,
    "redis": "redis_server",
    "zookeeper": "zookeeper_server",
}


@pytest.fixture
def target(request: pytest.FixtureRequest, snippet_target: str) -> Target:
    """The backend kind and server one snippet runs on."""
    fixture = TARGETS[snippet_target]
    if fixture is None:
        return Target("memory", "memory://")
    server = request.getfixturevalue(fixture)
    return Target(snippet_target, str(server.url))


def test_pages_have_snippets() -> None:
    found = {path.name: len(extract(path)) for path in pages()}
    for page in ("README.md", "quickstart.md", "recipes.md", "pitfalls.md", "naming.md"):
        assert found.get(page, 0) > 0, f"{page} has no python snippet: {found}"


def test_extract_honours_skip_mark(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n\n<!-- skip-snippet -->\n```python\ny = 2\n```\n"
        "```bash\nls\n```\n",
        encoding="utf-8",
    )
    snippets = extract(page, root=tmp_path)
    found = [(snippet.line, snippet.code, snippet.skip_on) for snippet in snippets]
    assert found == [(3, "x = 1", frozenset()), (8, "y = 2", frozenset(TARGETS))]
    page.write_text(
        "```python\na = 0\n```\n<!-- snippet-setup -->\n```python\nb = 1\n```\n"
        "```python\nc = b\n```\n",
        encoding="utf-8",
    )
    snippets = extract(page, root=tmp_path)
    assert [(s.code, s.setup, s.is_setup) for s in snippets] == [
        ("a = 0", (), False),
        ("b = 1", (), True),
        ("c = b", ("b = 1",), False),
    ]
    assert _skip_on("<!-- skip-snippet: zookeeper -->") == {"zookeeper"}
    assert _skip_on("<!-- skip-snippet: redis, zookeeper -->") == {"redis", "zookeeper"}
    with pytest.raises(ValueError, match="unknown target"):
        _skip_on("<!-- skip-snippet: etcd -->")


def test_target_urls_keep_fitting_options_and_isolate() -> None:
    zk = Target("zookeeper", "zk://127.0.0.1:2181", tag="docs-x")
    assert zk.url_for("zk://a:1,b:2/app?session_timeout=10") == (
        "zk://127.0.0.1:2181/docs-x?session_timeout=10"
    )
    assert zk.url_for("redis://r:6379/0?lease_time=5") == "zk://127.0.0.1:2181/docs-x"
    redis = Target("redis", "redis://127.0.0.1:6379", tag="docs-y")
    assert redis.url_for("redis://r:6379/0?lease_time=15&key_prefix=prod:") == (
        "redis://127.0.0.1:6379?lease_time=15&key_prefix=docs-y%3A"
    )
    assert Target("memory", "memory://", tag="docs-z").url_for("zk://h:1") == "memory://docs-z"


@pytest.mark.parametrize(("snippet", "snippet_target"), _params())
def test_snippet_runs(snippet: Snippet, target: Target, tmp_path: Path) -> None:
    """Paste the block into ``python -m asyncio`` as a reader does; nothing may fail or leak."""
    if snippet.is_script:
        run_as_script(snippet, target, tmp_path)
        return
    instrument = (
        f"import tests.docs._repl as _repl; "
        f"_repl.install({target.kind!r}, {target.base_url!r}, {target.tag!r})"
    )
    typed = [instrument, *(f"{code}\n" for code in snippet.setup), "_repl.setup_done()"]
    typed += [f"{snippet.code}\n", "await _repl.check()"]
    screen = run_in_repl("\n".join(typed) + "\n")
    found = re.search(re.escape(RESULT) + r"(\{.*\})@@", screen)
    assert found is not None, f"the REPL never finished the block:\n{screen[-4000:]}"
    result = json.loads(found.group(1))
    assert not result["errors"], f"the REPL showed {result['errors']}:\n{screen[-6000:]}"
    if not snippet.is_setup:
        assert not result["left_open"], (
            f"the snippet left a backend open (close it, or use async with): {result['left_open']}"
        )
    assert not result["held"], (
        f"the snippet left locks held: {result['held']} (release in finally / use async with)"
    )


def run_as_script(snippet: Snippet, target: Target, tmp_path: Path) -> None:
    """A ``<!-- snippet-script -->`` block: saved to a file and run with ``python FILE``."""
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code + "\n", encoding="utf-8")
    redirect = (
        "import runpy, sys; import tests.docs._repl as _repl; "
        f"_repl.redirect({target.kind!r}, {target.base_url!r}, {target.tag!r}); "
        "runpy.run_path(sys.argv[1], run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", redirect, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def run_in_repl(text: str, limit: float = 120) -> str:
    """Type ``text`` into a fresh ``python -m asyncio`` on a pseudo-terminal; its screen.

    Returns once the screen shows the result line of ``_repl.check()`` (or
    after ``limit`` seconds, or when the REPL exits).
    """
    master, slave = pty.openpty()
    # a wide terminal, so that readline never wraps a long line of a snippet
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
    env = {**os.environ, "TERM": "dumb", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncio"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    os.set_blocking(master, False)
    pending = text.encode()
    screen = b""
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline and not re.search(rb"@@RESULT@@\{.*\}@@", screen):
            readable, writable, _ = select.select([master], [master] if pending else [], [], 0.5)
            if writable:  # as fast as the terminal takes it: a paste
                pending = pending[os.write(master, pending[:512]) :]
            if readable:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the REPL exited
                    break
                if not chunk:
                    break
                screen += chunk
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    return screen.decode(errors="replace").replace("\r\n", "\n")


def test_no_undefined_names(tmp_path: Path) -> None:
    """Every block, skipped ones too, defines or imports each name it uses.

    A block is checked with the page's setup blocks above it and ``asyncio``
    (which ``python -m asyncio`` imports), by ruff's undefined-name rule.
    """
    pytest.importorskip("ruff")
    files: dict[str, str] = {}
    for path in pages():
        for snippet in extract(path):
            name = f"{snippet.page.replace('/', '_').replace('.', '_')}_{snippet.line}.py"
            code = "\n".join(["import asyncio", *snippet.setup, snippet.code])
            (tmp_path / name).write_text(code + "\n", encoding="utf-8")
            files[name] = f"{snippet.page}:{snippet.line}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--select",
            "F821",
            "--output-format",
            "concise",
            "--no-cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    undefined = [
        line.replace(str(tmp_path) + "/", "")
        for line in result.stdout.splitlines()
        if "F821" in line
    ]
    readable = [f"{files[line.split(':')[0]]}: {line.split(' ', 1)[1]}" for line in undefined]
    assert not readable, "undefined names in doc snippets:\n" + "\n".join(readable)
    assert result.returncode == 0, result.stdout + result.stderr
