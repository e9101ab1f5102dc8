"""No error message, repr, log record or CLI output holds a URL password.

Every ``ValueError`` path of URL parsing, on every scheme, is driven with a
sentinel password (also passwords holding ``/ ? @ # :``), and the password
must appear nowhere: not in ``str``/``repr`` of the error, not in the
formatted traceback with its chain, not in the command line's output.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import traceback
from urllib.parse import quote

import pytest

import aiolocks
from aiolocks import cli
from aiolocks._connect import backend_from_url
from aiolocks._core.urls import parse_url, redact_url, scrub

#: the password the tests look for; every variant holds it whole
SENTINEL = "S3ntinelPw"
PASSWORDS = [
    SENTINEL,
    f"pa/{SENTINEL}",
    f"{SENTINEL}?x=1",
    f"p@{SENTINEL}@x",
    f"{SENTINEL}#frag",
    f"{SENTINEL}:colon",
    f"a/b?c@{SENTINEL}#d:e",
]

#: bad URLs, ``{pw}`` standing for the password (raw, as a user writes it)
BAD_URLS = [
    # _connect.py
    "nosuchscheme://u:{pw}@h:1/0",
    "u:{pw}@h:1",  # no '://'
    "://u:{pw}@h",
    "redis://u:{pw}@h:1/0?on_unavailable=maybe",
    "redis://u:{pw}@h:1/0?on_unavailable=local&on_unavailable=raise",
    # _core/urls.py
    "redis://u:{pw}@h:0/0",
    "redis://u:{pw}@h:99999/0",
    "redis://u:{pw}@h:port/0",
    "redis://u:{pw}@/0",
    "redis://u:{pw}@h:1,/0",
    "redis://u:{pw}@[::1/0",
    "redis://u:{pw}@::1:6379/0",
    "redis://u:{pw}@h:/0",
    "redis://u:{pw}@h:1/0#frag",
    "redis://u:{pw}@h:1/0?bogus=1",
    "redis://u:{pw}@h:1/0?lease_time=1&lease_time=2",
    "redis://u:{pw}@h:1/0?lease_time=abc",
    "redis://u:{pw}@h:1/0?lease_time=-1",
    "redis://u:{pw}@h:1/0?a",
    # redis/_backend.py
    "redis://u:{pw}@127.0.0.1:6398/x",
    "redis://u:{pw}@h1:1,h2:2/0",
    "rediss://u:{pw}@h:1/db",
    "redis+sentinel://u:{pw}@h:1",
    "redis+sentinel://u:{pw}@h:1/svc/x/y",
    "redis+sentinel://u:{pw}@h:1/svc/x",
    "redis+cluster://u:{pw}@h:1/0",
    "redis+cluster://u:{pw}@h:1?min_replicas=1",
    "redlock://u:{pw}@h:1,h:1/0",
    "redlock://u:{pw}@h:1/x",
    "redlock://u:{pw}@h:1/0?min_replicas=1",
    "redis://u:{pw}@h:1/0?key_prefix=a{{b}}",
    "redis://u:{pw}@h:1/0?keyspace_events=sometimes",
    "redis://u:{pw}@h:1/0?min_replicas=x",
    "rediss://u:{pw}@h:1/0?ssl=false",
    "redis://u:{pw}@h:1/0?ssl_ca_certs=/no/such/ca.pem",
    "rediss://u:{pw}@h:1/0?ssl_ca_certs=/no/such/ca.pem",
    # in an option value a password is percent-encoded ('@' would end the userinfo there)
    "redis://u:{pw}@h:1/0?sentinel_password={qpw}",
    "redis+sentinel://u:{pw}@h:1/svc?sentinel_password={qpw}&ssl=maybe",
    "redis://u:{pw}@h:1/0?lease_time=1e13",
    # other backends (their messages go through connect()'s redaction)
    "zk://u:{pw}@h:1/chroot/",
    "zk://u:{pw}@h:1/a//b",
    "zk://u:{pw}@h:1/?bogus=1",
    "etcd://u:{pw}@h:1/prefix/",
    "etcd://u:{pw}@h:1/?bogus=1",
    "postgresql://u:{pw}@h:1/db?bogus=1",
    "postgresql://u:{pw}@h:port/db",
    "postgres://u:{pw}@h:1/db?heartbeat=-1",
    "postgresql://u:{pw}@h:1/db?sslmode=verify-full&sslrootcert=/no/such/file",
    "postgresql://u:{pw}@h:1/db?sslcert=/etc/hostname",
    "memory://u:{pw}@x?bogus=1",
]


def _assert_clean(text: str, password: str) -> None:
    assert SENTINEL not in text, text
    assert password not in text, text
    assert quote(password, safe="") not in text, text


def _formatted(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("template", BAD_URLS)
def test_bad_url_never_prints_the_password(template: str, password: str) -> None:
    url = template.format(pw=password, qpw=quote(password, safe=""))
    with pytest.raises(ValueError, match=r".") as info:
        backend_from_url(url)
    _assert_clean(_formatted(info.value), password)


@pytest.mark.parametrize("password", PASSWORDS)
def test_percent_encoded_password_is_redacted(password: str) -> None:
    url = f"redis://u:{quote(password, safe='')}@h:1/x"
    with pytest.raises(ValueError, match="database") as info:
        backend_from_url(url)
    _assert_clean(_formatted(info.value), password)


@pytest.mark.parametrize("password", PASSWORDS)
def test_password_with_reserved_characters_parses(password: str) -> None:
    """The userinfo runs to the last '@': the host, path and options stay right."""
    parsed = parse_url(
        f"redis://user:{password}@h:7/3?x=1",
        schemes=("redis",),
        default_port=6379,
        options={"x": lambda name, text: text},
    )
    assert (parsed.username, parsed.password) == ("user", password)
    assert [str(h) for h in parsed.hosts] == ["h:7"]
    assert (parsed.path, dict(parsed.options)) == ("/3", {"x": "1"})
    _assert_clean(repr(parsed), password)
    assert parsed.redacted == "redis://user:***@h:7/3?x=1"


def test_secret_options_are_redacted() -> None:
    url = f"redis+sentinel://h:1/svc?sentinel_password={SENTINEL}&bogus=1"
    with pytest.raises(ValueError, match="option") as info:
        backend_from_url(url)
    _assert_clean(_formatted(info.value), SENTINEL)
    assert redact_url(url) == "redis+sentinel://h:1/svc?sentinel_password=***&bogus=1"


def test_scrub_replaces_url_and_bare_password() -> None:
    url = f"redis://u:{SENTINEL}@h:1/0"
    text = scrub(f"failed on {url}; AUTH {SENTINEL} refused", url)
    assert text == "failed on redis://u:***@h:1/0; AUTH *** refused"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.asyncio
@pytest.mark.parametrize("password", PASSWORDS)
async def test_unreachable_server_error_and_logs_are_clean(
    password: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = _closed_port()
    caplog.set_level(logging.DEBUG)
    url = f"redis://u:{password}@127.0.0.1:{port}/0?connect_timeout=2"
    with pytest.raises(aiolocks.BackendUnavailableError) as info:
        async with aiolocks.connect(url):
            pass
    _assert_clean(_formatted(info.value), password)
    _assert_clean("\n".join(r.getMessage() for r in caplog.records), password)


@pytest.mark.asyncio
async def test_backend_repr_is_clean() -> None:
    port = _closed_port()
    for url in (
        f"redis://u:{SENTINEL}@127.0.0.1:{port}/0",
        f"redlock://u:{SENTINEL}@127.0.0.1:{port},127.0.0.1:{port + 1},127.0.0.1:{port + 2}/0",
        f"redis+sentinel://u:{SENTINEL}@127.0.0.1:{port}/svc?sentinel_password={SENTINEL}",
        f"zk://u:{SENTINEL}@127.0.0.1:{port}",
        f"postgresql://u:{SENTINEL}@127.0.0.1:{port}/db",
        f"etcd://u:{SENTINEL}@127.0.0.1:{port}",
    ):
        with contextlib.suppress(ValueError):  # a scheme that does not take an option yet
            backend = backend_from_url(url)
            _assert_clean(repr(backend) + str(backend.url), SENTINEL)
            _assert_clean(repr(aiolocks.connect(url)), SENTINEL)


def _run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    status = cli.main(argv)
    return status, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize(
    "argv",
    [
        ["status", "redis://u:{pw}@127.0.0.1:6398/x", "foo"],
        ["status", "redis://u:{pw}@127.0.0.1:6398/0"],
        ["list", "redis://u:{pw}@127.0.0.1:6398/0", "a", "b"],
        ["break", "redis://u:{pw}@127.0.0.1:6398/0?bogus=1", "foo"],
        ["status", "redis://u:{pw}@127.0.0.1:{closed}/0?connect_timeout=1", "foo"],
        ["run", "-n", "redis://u:{pw}@127.0.0.1:6398/0?lease_time=x", "foo", "--", "true"],
    ],
)
def test_cli_output_is_clean(
    argv: list[str], password: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = _closed_port()
    args = [a.format(pw=password, closed=closed) for a in argv]
    status, output = _run_cli(args, monkeypatch)
    assert status in (cli.EXIT_USAGE, cli.EXIT_UNAVAILABLE), output
    assert output
    _assert_clean(output, password)


def test_cli_env_url_is_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.URL_ENV, f"redis://u:{SENTINEL}@127.0.0.1:6398/x")
    status, output = _run_cli(["status", "foo"], monkeypatch)
    assert status == cli.EXIT_USAGE
    assert "redis://u:***@127.0.0.1:6398/x" in output
    _assert_clean(output, SENTINEL)
