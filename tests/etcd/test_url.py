"""``etcd://`` URL parsing: checked options, and a ValueError naming the bad part."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiolocks.etcd._url import EtcdOptions, EtcdTLS, parse_etcd_url


def test_defaults_and_every_part() -> None:
    options = parse_etcd_url("etcd://h1")
    assert options == EtcdOptions(
        endpoints=("h1:2379",),
        prefix="",
        lease_ttl=10,
        connect_timeout=5.0,
        request_timeout=5.0,
    )
    full = parse_etcd_url(
        "etcd://h1:2379,h2:22379,[::1]:3379/app/locks"
        "?lease_ttl=7&connect_timeout=2.5&request_timeout=1"
    )
    assert full.endpoints == ("h1:2379", "h2:22379", "[::1]:3379")
    assert full.prefix == "app/locks"
    assert (full.lease_ttl, full.connect_timeout, full.request_timeout) == (7, 2.5, 1.0)
    assert full.description == "etcd://h1:2379,h2:22379,[::1]:3379/app/locks"
    assert parse_etcd_url("etcd://h/").prefix == ""


def test_keywords_win_over_the_query() -> None:
    options = parse_etcd_url("etcd://h?lease_ttl=7", lease_ttl=3, connect_timeout=1)
    assert (options.lease_ttl, options.connect_timeout) == (3, 1.0)
    assert parse_etcd_url("etcd://h", lease_ttl=4.0).lease_ttl == 4


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("zk://h:2181", "scheme 'zk'"),
        ("etcd://", "names no host"),
        ("etcd://h:0", "invalid port 0"),
        ("etcd://h:99999", "invalid port 99999"),
        ("etcd://h:abc", "invalid port 'abc'"),
        ("etcd://h1,,h2", "empty host"),
        ("etcd://::1", "IPv6"),
        ("etcd://user@h", "needs a password"),
        ("etcd://:pw@h", "needs the user name"),
        ("etcd://h?ssl_ca_certs={ca}", "ssl_ca_certs needs TLS"),
        ("etcd://h?tls=false&ssl_certfile={ca}", "ssl_certfile needs TLS"),
        ("etcds://h?tls=false", "contradicts"),
        ("etcd://h?tls=maybe", "true or false"),
        ("etcds://h?ssl_ca_certs=/no/such/file.pem", "no such readable file"),
        ("etcds://h?ssl_keyfile={ca}", "ssl_keyfile needs ssl_certfile"),
        ("etcd://h/app/", "must not end with '/'"),
        ("etcd://h/a//b", "invalid segment ''"),
        ("etcd://h/a/../b", "invalid segment '..'"),
        ("etcd://h/a\x01", "control character"),
        ("etcd://h?lease_ttl=0", "lease_ttl=0"),
        ("etcd://h?lease_ttl=1.5", "lease_ttl='1.5'"),
        ("etcd://h?lease_ttl=999999", "between 1 and 86400"),
        ("etcd://h?connect_timeout=-1", "connect_timeout='-1'"),
        ("etcd://h?request_timeout=nan", "request_timeout='nan'"),
        ("etcd://h?lease_ttl=5&lease_ttl=6", "given twice"),
        ("etcd://h?session_timeout=5", "unknown option 'session_timeout'"),
        ("etcd://h#frag", "fragment"),
    ],
)
def test_bad_urls_name_the_bad_part(url: str, message: str, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked before a connection\n")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_etcd_url(url.format(ca=ca))


def test_credentials_and_tls(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert, key):
        path.write_text("pem\n")
    options = parse_etcd_url(
        f"etcds://app%40x:p%2Fw%40rd@h1,h2/locks?ssl_ca_certs={ca}"
        f"&ssl_certfile={cert}&ssl_keyfile={key}"
    )
    assert (options.username, options.password) == ("app@x", "p/w@rd")
    assert options.tls == EtcdTLS(str(ca), str(cert), str(key))
    assert options.description == "etcds://app@x@h1:2379,h2:2379/locks"
    assert "p/w@rd" not in repr(options)
    assert parse_etcd_url("etcd://h?tls=true").tls == EtcdTLS()
    assert parse_etcd_url("etcd://h?tls=false").tls is None
    assert parse_etcd_url("etcd://h", tls=True, ssl_ca_certs=str(ca)).tls == EtcdTLS(str(ca))


def test_messages_never_hold_the_password() -> None:
    for url in (
        "etcd://u:Secr3t-pw@h/a//b",
        "etcd://u:Secr3t-pw@h?ssl_ca_certs=/x",
        "etcd://u:Secr3t-pw@h?bogus=1",
        "etcd://u:Secr3t-pw@h/app/",
    ):
        with pytest.raises(ValueError) as info:  # noqa: PT011 (any message: the point is redaction)
            parse_etcd_url(url)
        assert "Secr3t-pw" not in str(info.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lease_ttl": "10"}, "lease_ttl must be a whole number"),
        ({"lease_ttl": True}, "lease_ttl must be a whole number"),
        ({"lease_ttl": 2.5}, "lease_ttl must be a whole number"),
        ({"connect_timeout": "5"}, "connect_timeout must be a number"),
        ({"request_timeout": 0}, "request_timeout=0"),
        ({"request_timeout": float("inf")}, "request_timeout=inf"),
        ({"lease_time": 5}, "unknown option 'lease_time'"),
    ],
)
def test_bad_keywords_name_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_etcd_url("etcd://h", **options)
