"""What the snippet test types into ``python -m asyncio`` around a pasted block.

The pasted block itself is the page's text, unchanged. Around it the test
types three lines of its own, each a single statement:

* before: ``import tests.docs._repl as _repl; _repl.install(kind, base_url, tag)``,
  which points :func:`aiolocks.connect` at the test's server (see
  :class:`Target`) and records every error the REPL shows;
* after the page's setup blocks: ``_repl.setup_done()``;
* after the block: ``await _repl.check()``, which prints one line
  ``@@RESULT@@{json}@@``: the errors shown, the backends the block left
  open and the locks left held, then closes every backend (as closing the
  REPL would).

This module is also imported by the test itself, for :class:`Target`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiolocks
from aiolocks import _connect

REDIS_SCHEMES = frozenset({"redis", "rediss", "redis+sentinel", "redis+cluster", "redlock"})
RESULT = "@@RESULT@@"


def kind_of(url: str) -> str:
    """``zookeeper``, ``redis`` or ``memory`` (any other scheme) for a URL in a snippet."""
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
        """The target URL for a URL written in a snippet (keeping its options when they fit).

        The URL's query options are kept when it names the target's kind of
        server (``zk://`` on ZooKeeper, any Redis scheme on Redis), so
        ``session_timeout`` or ``lease_time`` still reach the backend; each
        run gets its own key prefix (Redis), chroot (ZooKeeper) or
        ``memory://`` name space.
        """
        if self.kind == "memory":
            return f"memory://{self.tag}"
        same_kind = kind_of(snippet_url) == self.kind
        query = parse_qsl(urlsplit(snippet_url).query) if same_kind else []
        options = [(key, value) for key, value in query if key != "key_prefix"]
        if self.kind == "redis":
            options.append(("key_prefix", f"{self.tag}:"))
            return f"{self.base_url}?{urlencode(options)}"
        url = f"{self.base_url.split('?')[0]}/{self.tag}"
        return f"{url}?{urlencode(options)}" if options else url


_opened: list[aiolocks.Backend] = []
_setup: list[aiolocks.Backend] = []
_errors: list[str] = []


def redirect(kind: str, base_url: str, tag: str) -> None:
    """Point ``aiolocks.connect`` at the target (:meth:`Target.url_for`)."""
    target = Target(kind, base_url, tag)
    real_connect = _connect.connect

    def connect(url: str = "memory://", **options: Any) -> Any:
        # Build the backend the URL names (no I/O): a bad URL or option still raises.
        _connect.backend_from_url(url, **options)
        if kind_of(url) != target.kind:
            options = {}  # options of another kind of backend do not apply to the target
        connecting = real_connect(target.url_for(url), **options)
        _opened.append(connecting._backend)
        return connecting

    aiolocks.connect = connect


def install(kind: str, base_url: str, tag: str) -> None:
    """:func:`redirect`, and record the errors the REPL shows."""
    redirect(kind, base_url, tag)
    shown = sys.excepthook

    def record(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        # the REPL hands every traceback and syntax error it shows to sys.excepthook
        message = "".join(traceback.format_exception_only(kind, error))
        _errors.append(message.strip())
        if issubclass(kind, SyntaxError):  # as the REPL shows it: no frames of its compiler
            sys.stderr.write(message)
        else:
            shown(kind, error, tb)

    sys.excepthook = record
    loop = asyncio.get_running_loop()

    def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        _errors.append(f"event loop: {context.get('message')}: {context.get('exception')!r}")
        loop.default_exception_handler(context)

    loop.set_exception_handler(on_loop_error)


def setup_done() -> None:
    """The backends opened so far belong to the page's setup blocks."""
    _setup.extend(_opened)


async def check() -> None:
    """Print the result line, then close every backend."""
    for _ in range(3):  # let background releases run
        await asyncio.sleep(0)
    result = {
        "errors": list(_errors),
        "left_open": [b.url for b in _opened if not b.closed and b not in _setup],
        "held": [f"{hold.kind} {hold.name!r}" for b in _setup for hold in b._holds],
    }
    for backend in _opened:
        if not backend.closed:
            await backend.close()
    print(RESULT + json.dumps(result) + "@@", flush=True)
