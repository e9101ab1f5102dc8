"""Bad input: each a clear error, naming the problem, before any network I/O.

Proof of "before any network I/O": the backends talk to their server through
a :class:`~aiolocks.testing.TcpProxy` that counts connections. Bad URLs must
fail with the proxy never contacted. For bad names, options and timeouts the
backend is opened first and the proxy is then *stalled* (a partition: any
request would hang until ``connect_timeout`` = 60 s): each call must still
fail at once (well within a generous 20 s guard), and no new connection may
appear.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

import aiolocks
from aiolocks.testing import TcpProxy

GUARD = 20.0  # generous: a request through the stalled proxy would hang for 60 s


@pytest_asyncio.fixture(params=["memory", "redis", "zookeeper"])
async def proxied(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, TcpProxy | None]]:
    """``(url, proxy)``: a backend URL through a counting proxy (memory: no proxy)."""
    kind: str = request.param
    if kind == "memory":
        yield f"memory://bad-input-{uuid.uuid4().hex[:8]}", None
        return
    if kind == "zookeeper":
        server = request.getfixturevalue("zookeeper_server")
    else:
        server = request.getfixturevalue("redis_server")
    async with TcpProxy(server.host, server.port) as proxy:
        if kind == "zookeeper":
            url = f"zk://{proxy.netloc}/chaos-bad-{uuid.uuid4().hex[:8]}?connect_timeout=60"
        else:
            url = f"redis://{proxy.netloc}?key_prefix=chaos-bad-{uuid.uuid4().hex[:8]}:"
            url += "&connect_timeout=60"
        yield url, proxy


def _scheme_host(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.partition('/')[0].partition('?')[0]}"


# (URL suffix or whole URL, text the message must contain); ``{base}`` is the proxied base
BAD_URLS: list[tuple[str, str]] = [
    ("", "scheme"),
    ("nonsense", "nonsense"),
    ("ftp://127.0.0.1:1", "'ftp'"),
    ("redis://", "no host"),
    ("redis://127.0.0.1:99999", "99999"),
    ("redis://127.0.0.1:abc", "'abc'"),
    ("redis://127.0.0.1:0", "port 0"),
    ("redis://127.0.0.1:1/notadb", "'notadb'"),
    ("redis://127.0.0.1:1#frag", "fragment"),
    ("redis://a:1,b:2", "one host"),
    ("redis+sentinel://127.0.0.1:1", "service"),
    ("redis+cluster://127.0.0.1:1/3", "path"),
    ("redlock://127.0.0.1:1?min_replicas=1", "min_replicas"),
    ("zk://127.0.0.1:1/bad//chroot", "chroot"),
    ("zk://127.0.0.1:1/chroot/", "chroot"),
    ("zk://127.0.0.1:1/ch\x00root", "control character"),
    ("zk://user@127.0.0.1:1", "without a password"),
    ("zk://127.0.0.1:1?acl=creator", "needs credentials"),
    ("zk://u:p@127.0.0.1:1?acl=bogus", "acl must be one of"),
    ("zk://127.0.0.1:1?suspended_is_lost=maybe", "suspended_is_lost"),
    ("memory://a/b", "'a/b'"),
    ("memory://?x=1", "'x'"),
    ("redis://127.0.0.1 :1", "' '"),
]

# query options appended to the proxied URL of the matching scheme
BAD_OPTIONS: dict[str, list[tuple[str, str]]] = {
    "redis": [
        ("lease_time=-1", "lease_time"),
        ("lease_time=nan", "lease_time"),
        ("lease_time=inf", "lease_time"),
        ("lease_time=abc", "lease_time"),
        ("lease_time=1&lease_time=2", "twice"),
        ("connect_timeout=-5", "connect_timeout"),
        ("bogus=1", "'bogus'"),
        ("key_prefix={x}", "key_prefix"),
        ("min_replicas=-1", "min_replicas"),
    ],
    "zk": [
        ("session_timeout=0", "session_timeout"),
        ("session_timeout=nan", "session_timeout"),
        ("session_timeout=1e400", "session_timeout"),
        ("connect_timeout=-1", "connect_timeout"),
        ("nope=1", "'nope'"),
    ],
    "memory": [("x=1", "'x'")],
}

BAD_KEYWORDS: dict[str, list[tuple[dict[str, Any], str]]] = {
    "redis": [
        ({"lease_time": -1}, "lease_time"),
        ({"lease_time": math.nan}, "lease_time"),
        ({"lease_time": "1"}, "lease_time"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"key_prefix": 5}, "key_prefix"),
        ({"bogus": 1}, "'bogus'"),
    ],
    "zk": [
        ({"session_timeout": -1}, "session_timeout"),
        ({"session_timeout": math.nan}, "session_timeout"),
        # text is for the URL query; a keyword must be typed (as on redis://)
        ({"connect_timeout": "5"}, "connect_timeout must be a number of seconds, got '5'"),
        ({"suspended_is_lost": "true"}, "suspended_is_lost must be True or False"),
        ({"suspended_is_lost": 1}, "suspended_is_lost"),
        ({"bogus": 1}, "'bogus'"),
    ],
    "memory": [({"bogus": 1}, "bogus")],
}


@pytest.mark.asyncio
async def test_bad_urls_and_options_fail_before_any_connection(
    proxied: tuple[str, TcpProxy | None],
) -> None:
    """Malformed URLs, unknown or bad options: ValueError naming the part, proxy untouched."""
    url, proxy = proxied
    scheme = url.partition("://")[0]
    checked = 0
    cases = [(u, f) for u, f in BAD_URLS]
    sep = "&" if "?" in url else "?"
    cases += [(url + sep + option, fragment) for option, fragment in BAD_OPTIONS[scheme]]
    for bad, fragment in cases:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            aiolocks.connect(bad)
        checked += 1
    for keywords, fragment in BAD_KEYWORDS[scheme]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            aiolocks.connect(url, **keywords)
        checked += 1
    with pytest.raises(ValueError, match="str"):
        aiolocks.connect(123)  # type: ignore[arg-type]
    assert checked > 20
    if proxy is not None:
        assert proxy.connections_total == 0, "a bad URL or option opened a connection"


@pytest.mark.parametrize("url", ["zk://[::1:1", "redis://[::1:1", "zk://h:1,[::1"])
def test_unclosed_ipv6_bracket_is_named(url: str) -> None:
    """The error names the offending host, like every other URL error."""
    with pytest.raises(ValueError) as info:  # noqa: PT011 - the message is checked below
        aiolocks.connect(url)
    assert "[::1" in str(info.value), str(info.value)


BAD_NAMES: list[tuple[object, str]] = [
    ("", "empty"),
    ("/", "no segments"),
    ("a//b", "empty segment"),
    ("a/./b", "'.'"),
    ("a/../b", "'..'"),
    ("a/", "end with '/'"),
    ("a\x00b", "U+0000"),
    ("a\nb", "U+000A"),
    ("a\x7fb", "U+007F"),
    ("a\x85b", "U+0085"),
    ("a\u2028b", "U+2028"),  # line separator
    ("\ufeffbom", "U+FEFF"),  # format (zero-width no-break space)
    ("a\u202eb", "U+202E"),  # bidi override: output could be spoofed
    ("tag\U000e0001", "U+E0001"),  # format (language tag)
    ("x" * 1025, "1025 bytes"),
    ("é" * 513, "1026 bytes"),  # 513 characters, but 1026 bytes in UTF-8
    ("🔒" * 257, "1028 bytes"),
    ("\ud800", "surrogate"),
    (123, "int"),
    (None, "NoneType"),
    (b"locks/a", "bytes"),
]


async def _immediate(call: Callable[[], Awaitable[object]]) -> BaseException:
    """Run ``call`` under the guard; return what it raised (it must raise)."""
    try:
        async with asyncio.timeout(GUARD):
            await call()
    except TimeoutError:
        raise AssertionError("the call waited: it reached the (stalled) network") from None
    except Exception as exc:
        return exc
    raise AssertionError("the call did not raise")


@pytest.mark.asyncio
async def test_bad_names_options_and_timeouts_fail_at_once(
    proxied: tuple[str, TcpProxy | None],
) -> None:
    """On an open backend behind a stalled proxy: every bad call raises at once, no I/O."""
    url, proxy = proxied
    async with aiolocks.connect(url) as backend:
        if proxy is not None:
            before = proxy.connections_total
            proxy.stall()
        factories: list[Callable[[object], object]] = [
            lambda n: backend.mutex(n),  # type: ignore[arg-type]
            lambda n: backend.semaphore_mutex(n),  # type: ignore[arg-type]
            lambda n: backend.semaphore(n, 2),  # type: ignore[arg-type]
            lambda n: backend.read_write_lock(n),  # type: ignore[arg-type]
            lambda n: backend.leader_latch(n),  # type: ignore[arg-type]
        ]
        for name, fragment in BAD_NAMES:
            for factory in factories:
                with pytest.raises(aiolocks.InvalidLockNameError) as info:
                    factory(name)
                assert fragment in str(info.value), f"{name!r}: {info.value}"
                assert isinstance(info.value, ValueError)

        # Per-lock options: unknown ones are refused by every backend.
        with pytest.raises(ValueError, match="bogus"):
            backend.mutex("ok/name", bogus=1)
        with pytest.raises(ValueError, match="max_leases"):
            backend.semaphore("ok/name", 0)
        with pytest.raises(TypeError, match="max_leases"):
            backend.semaphore("ok/name", 1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="participant_id"):
            backend.leader_latch("ok/name", participant_id="")
        with pytest.raises(ValueError, match="at least one"):
            aiolocks.MultiLock([])
        with pytest.raises(TypeError, match="str"):
            aiolocks.MultiLock(["ok/name"])  # type: ignore[list-item]

        lock = backend.mutex("ok/name")
        sem = backend.semaphore("ok/name", 2)
        latch = backend.leader_latch("ok/name")
        bad_timeouts: list[tuple[object, type[Exception], str]] = [
            (-1, ValueError, ">= 0"),
            (-0.001, ValueError, ">= 0"),
            (-math.inf, ValueError, ">= 0"),
            (math.nan, ValueError, "NaN"),
            ("5", TypeError, "str"),
            (True, TypeError, "bool"),
            ([], TypeError, "list"),
        ]
        calls: list[Callable[[Any], Awaitable[object]]] = [
            lambda t: lock.acquire(timeout=t),
            lambda t: sem.acquire(timeout=t),
            lambda t: sem.acquire_many(1, timeout=t),
            lambda t: latch.wait_for_leadership(timeout=t),
        ]
        for timeout, kind, fragment in bad_timeouts:
            with pytest.raises(kind, match=fragment):
                lock.hold(timeout=timeout)  # type: ignore[arg-type]
            for call in calls:
                exc = await _immediate(lambda c=call, t=timeout: c(t))  # type: ignore[misc]
                assert isinstance(exc, kind), f"timeout={timeout!r}: {exc!r}"
                assert fragment in str(exc), f"timeout={timeout!r}: {exc}"
                assert "timeout" in str(exc)
        for count, kind in [(0, ValueError), (3, ValueError), (-1, ValueError), (1.0, TypeError)]:
            exc = await _immediate(lambda n=count: sem.acquire_many(n))  # type: ignore[misc]
            assert isinstance(exc, kind) and "semaphore 'ok/name'" in str(exc), repr(exc)

        if proxy is not None:
            assert proxy.connections_total == before, "a bad call opened a connection"
            proxy.stall(False)
        # Nothing was taken by any of it.
        assert not backend._holds


# Names that are valid, however odd: each must work and be its own lock.
ODD_NAMES = [
    "ключ/锁/замок",
    "é" * 512,  # exactly 1024 bytes
    "percent%25/a%2Fb",
    "a/b%2Fc",
    "spaces in name/ and more ",
    "é",  # also 'e\u0301' (NFC: the same lock, see tests/security/test_names.py)
    "UPPER/lower",
    "upper/lower",
    "*?[]{}:|\\\"'<>",
]


@pytest.mark.asyncio
async def test_odd_but_valid_names_are_distinct_locks(
    proxied: tuple[str, TcpProxy | None],
) -> None:
    """Unicode, percent signs, maximum length: every name is its own lock, all held at once."""
    url, _ = proxied
    prefix = f"odd-{uuid.uuid4().hex[:6]}/"
    async with aiolocks.connect(url) as backend, contextlib.AsyncExitStack() as stack:
        for name in ODD_NAMES:
            full = name if len(name.encode()) >= 1000 else prefix + name
            # Not reentrant, so a clash shows either way: DeadlockError if two
            # names had one canonical form, False if they shared a server key.
            lock = backend.semaphore_mutex(full)
            assert await lock.acquire(timeout=0), f"{full!r} clashed with another name"
            stack.push_async_callback(lock.release)
            assert isinstance(lock.fencing_token, int)
            participants = await lock.participants()
            assert len(participants) == 1 and participants[0].is_holder, participants
        # A leading '/' names the same lock: it is taken.
        same = backend.semaphore_mutex("/" + prefix + ODD_NAMES[0])
        with pytest.raises(aiolocks.DeadlockError):
            await same.acquire(timeout=0)
        assert not await asyncio.create_task(same.acquire(timeout=0))
    # Everything was released at the end.
    async with aiolocks.connect(url) as backend:
        for name in ODD_NAMES:
            full = name if len(name.encode()) >= 1000 else prefix + name
            assert await backend.semaphore_mutex(full).participants() == []


#: characters outside the Basic Multilingual Plane (UTF-16 surrogate pairs in Java)
ASTRAL_NAMES = ["locks/🔒", "\U0010fffd", "cjk/\U00020000", "math/\U0001d538\U0001d539"]


@pytest.mark.asyncio
async def test_names_outside_the_bmp_work(proxied: tuple[str, TcpProxy | None]) -> None:
    """Emoji and other non-BMP characters are valid in names (only controls are not).

    ZooKeeper checks paths as UTF-16, where these are surrogate pairs: the
    driver must escape them (it once sent them raw and got BadArguments).
    """
    url, _ = proxied
    async with aiolocks.connect(url) as backend:
        for name in ASTRAL_NAMES:
            lock = backend.mutex(name)
            async with lock.hold(timeout=10):
                assert lock.fencing_token is not None
                assert [p.is_holder for p in await lock.participants()] == [True]
