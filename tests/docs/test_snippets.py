"""Every ```python block of README.md and docs/*.md runs as written, on every backend.

How a snippet runs (also described in docs/index.md), as a reader would run
it in ``python -m asyncio``:

* its code is compiled with top-level ``await`` allowed and awaited in a
  fresh namespace that holds only ``asyncio`` (which ``python -m asyncio``
  imports); every other name must come from the snippet itself or from the
  page's *setup blocks*: a block preceded by ``<!-- snippet-setup -->`` is
  run before every later block of its page, in the same namespace, the way
  a reader runs it first (it shows, say, ``backend = await
  aiolocks.connect("memory://")`` and the stand-ins ``order`` and
  ``charge``);
* targets: ``memory://``, the ``redis_server`` fixture and the
  ``zookeeper_server`` fixture (the last once ``aiolocks.zookeeper``
  imports); on a server each run gets its own key prefix or chroot;
* ``aiolocks.connect(url, **options)`` first builds the backend the URL
  names, without any I/O, so a malformed URL or option still fails, and
  then connects to the target instead: the URL's query options are kept
  when it names the target's kind of server (``zk://`` on ZooKeeper, any
  Redis scheme on Redis), so ``session_timeout`` or ``lease_time`` still
  reach the backend; two connections of one snippet contend like two
  processes;
* afterwards, every backend the snippet itself opened must be closed again
  and nothing may stay held on the backends of the setup blocks (which the
  test closes, as the reader closes the REPL): a snippet must not teach a
  leak.

A block preceded by the line ``<!-- skip-snippet -->`` is not run (it needs
a particular server or is a fragment); ``<!-- skip-snippet: zookeeper -->``
skips it on the listed targets only (say, a Redis-only lock option). Blocks
of pages owned elsewhere that do not run yet are listed in ``KNOWN_BROKEN``
as strict xfails, with the fix.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import re
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest

import aiolocks
from aiolocks import _connect

ROOT = Path(__file__).resolve().parents[2]
SKIP_MARK = "<!-- skip-snippet -->"
SETUP_MARK = "<!-- snippet-setup -->"
SKIP_COMMENT = re.compile(r"^<!--\s*skip-snippet(?::(?P<targets>[\w\s,]*))?\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")

#: (page, first line of the block) -> why it does not run yet and the fix.
#: Strict: once the page is fixed the xfail turns into a failure; drop the entry then.
KNOWN_BROKEN: dict[tuple[str, str], str] = {}


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
        snippets.append(
            Snippet(
                page,
                start + 1,
                code,
                skip_on=frozenset() if is_setup else _skip_on(previous),
                setup=tuple(setup),
                is_setup=is_setup,
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
                broken = KNOWN_BROKEN.get((snippet.page, snippet.first_line))
                if broken is not None:
                    marks.append(pytest.mark.xfail(reason=broken, strict=True))
                ident = f"{snippet.page}:{snippet.line}-{target}"
                params.append(pytest.param(snippet, target, id=ident, marks=marks))
    return params


#: target -> fixture giving an object with ``.url`` (None: memory)
TARGETS: dict[str, str | None] = {
    "memory": None,
    "redis": "redis_server",
    "zookeeper": "zookeeper_server",
}
REDIS_SCHEMES = frozenset({"redis", "rediss", "redis+sentinel", "redis+cluster", "redlock"})


def _kind(url: str) -> str:
    scheme = url.partition("://")[0].lower()
    if scheme == "zk":
        return "zookeeper"
    return "redis" if scheme in REDIS_SCHEMES else "memory"


@dataclass
class Target:
    """Where the snippets of one test run: a base URL and an isolation tag."""

    kind: str
    base_url: str
    tag: str = field(default_factory=lambda: f"docs-{uuid.uuid4().hex[:10]}")

    def url_for(self, snippet_url: str = "memory://") -> str:
        """The target URL for a URL written in a snippet (keeping its options when they fit)."""
        if self.kind == "memory":
            return f"memory://{self.tag}"
        same_kind = _kind(snippet_url) == self.kind
        query = parse_qsl(urlsplit(snippet_url).query) if same_kind else []
        options = [(key, value) for key, value in query if key != "key_prefix"]
        if self.kind == "redis":
            options.append(("key_prefix", f"{self.tag}:"))
            return f"{self.base_url}?{urlencode(options)}"
        # ZooKeeper: the run's own chroot
        url = f"{self.base_url.split('?')[0]}/{self.tag}"
        return f"{url}?{urlencode(options)}" if options else url


@pytest.fixture
def target(request: pytest.FixtureRequest, snippet_target: str) -> Target:
    """The backend kind and server one snippet runs on."""
    fixture = TARGETS[snippet_target]
    if fixture is None:
        return Target("memory", "memory://")
    if snippet_target == "zookeeper":
        try:
            importlib.import_module("aiolocks.zookeeper")
        except ImportError as exc:
            pytest.skip(f"aiolocks.zookeeper does not import yet ({exc})")
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


@pytest.mark.asyncio
@pytest.mark.parametrize(("snippet", "snippet_target"), _params())
async def test_snippet_runs(
    snippet: Snippet,
    target: Target,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[aiolocks.Backend] = []
    real_connect = _connect.connect

    def connect(url: str = "memory://", **options: Any) -> Any:
        # Build the backend the URL names (no I/O): a bad URL or option still raises.
        _connect.backend_from_url(url, **options)
        if _kind(url) != target.kind:
            options = {}  # options of another kind of backend do not apply to the target
        connecting = real_connect(target.url_for(url), **options)
        opened.append(connecting._backend)
        return connecting

    monkeypatch.setattr(aiolocks, "connect", connect)
    namespace: dict[str, Any] = {"__name__": "__snippet__", "asyncio": asyncio}
    setup_backends: list[aiolocks.Backend] = []
    try:
        async with asyncio.timeout(60):
            for index, setup in enumerate(snippet.setup):
                await _run(setup, f"{snippet.page}:setup-{index}", namespace)
            setup_backends = list(opened)
            await _run(snippet.code, f"{snippet.page}:{snippet.line}", namespace)
        for _ in range(3):  # let background releases run
            await asyncio.sleep(0)
        left_open = [b for b in opened if not b.closed and b not in setup_backends]
        held = [f"{hold.kind} {hold.name!r}" for b in setup_backends for hold in b._holds]
    finally:
        for backend in opened:
            if not backend.closed:
                await backend.close()
    if not snippet.is_setup:
        assert not left_open, "the snippet left a backend open (close it, or use async with)"
    assert not held, f"the snippet left locks held: {held} (release in finally / use async with)"


async def _run(code: str, filename: str, namespace: dict[str, Any]) -> None:
    compiled = compile(code, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)
    if asyncio.iscoroutine(result):
        await result
