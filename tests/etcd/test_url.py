"""``etcd://`` URL parsing: checked options, and a ValueError naming the bad part."""

from __future__ import annotations

import pytest

from aiolocks.etcd._url import EtcdOptions, parse_etcd_url


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
        ("etcd://user:pw@h", "credentials"),
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
def test_bad_urls_name_the_bad_part(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_etcd_url(url)


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
