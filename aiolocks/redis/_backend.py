"""Public Redis backends and ``from_url``: URL parsing without I/O, one topology plan per scheme.

The redis-py clients themselves are built by the client layer
(:mod:`._client`), which the plans here call with the keywords they checked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from .._core.backend import Backend
from .._core.urls import HostPort, ParsedURL, parse_bool, parse_positive_float, parse_url
from ._client import (
    client_kwargs,
    cluster_client,
    describe_client,
    plain_client,
    sentinel_master,
    sentinel_set,
)
from ._driver import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_KEY_PREFIX,
    DEFAULT_LEASE_TIME,
    RedisDriver,
    RedisNode,
    validate_key_prefix,
    validate_keyspace_events,
    validate_lease_time,
)
from ._redlock import RedlockDriver

if TYPE_CHECKING:
    import redis.asyncio
    import redis.asyncio.cluster

__all__ = ["RedisBackend", "RedlockBackend", "from_url"]

SCHEMES = ("redis", "rediss", "redis+sentinel", "redis+cluster", "redlock")


def _parse_nonnegative_int(name: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"option {name}={text!r} must be an integer >= 0")
    return int(text)


def _parse_text(name: str, text: str) -> str:
    return text


URL_OPTIONS = {
    "lease_time": parse_positive_float,
    "key_prefix": _parse_text,
    "min_replicas": _parse_nonnegative_int,
    "connect_timeout": parse_positive_float,
    "keyspace_events": _parse_text,
    "ssl": parse_bool,
    "ssl_ca_certs": _parse_text,
    "ssl_certfile": _parse_text,
    "ssl_keyfile": _parse_text,
    "ssl_check_hostname": parse_bool,
    "sentinel_username": _parse_text,
    "sentinel_password": _parse_text,
}

#: options of a URL (or keywords) that configure the connection, not the locks
CONNECTION_OPTIONS = frozenset(
    {
        "ssl",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
        "sentinel_username",
        "sentinel_password",
    }
)


def _check_file(name: str, value: object) -> str:
    """A readable file named by an ``ssl_*`` option (checked now, not at the first connect)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be the path of a PEM file, got {type(value).__name__}")
    if not os.path.isfile(value) or not os.access(value, os.R_OK):
        raise ValueError(f"{name}={value!r}: no such readable file")
    return value


def _check_connection_option(key: str, value: object) -> object:
    if key in ("ssl", "ssl_check_hostname"):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {type(value).__name__}")
        return value
    if key.startswith("ssl_"):
        return _check_file(key, value)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a str, got {type(value).__name__}")
    return value


def _check_options(options: Mapping[str, object]) -> dict[str, Any]:
    """Validate backend options given as keywords or parsed from the query string."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in CONNECTION_OPTIONS:
            out[key] = _check_connection_option(key, value)
        elif key == "lease_time":
            out[key] = validate_lease_time(value)
        elif key == "key_prefix":
            out[key] = validate_key_prefix(value)
        elif key == "min_replicas":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"min_replicas must be an integer >= 0, got {value!r}")
            out[key] = value
        elif key == "connect_timeout":
            out[key] = validate_lease_time(value, "connect_timeout")
        elif key == "keyspace_events":
            out[key] = validate_keyspace_events(value)
        else:
            raise ValueError(
                f"unknown option {key!r} for a Redis backend "
                f"(allowed: {', '.join(sorted(URL_OPTIONS))})"
            )
    return out


_CLUSTER_NEEDS = (
    "a Redis Cluster needs redis-py 8.0 or later (its asyncio cluster client has pub/sub "
    "from 8.0 on; waiters are woken by pub/sub)"
)


def _db(url: ParsedURL, text: str) -> int:
    if text == "":
        return 0
    if not text.isdigit():
        raise ValueError(f"invalid database {text!r} in {url.redacted!r}: expected /<number>")
    return int(text)


@final
class RedisBackend(Backend):
    """Redis locks in the manner of Redisson, on ``redis.asyncio`` (or a Sentinel / Cluster client).

    >>> client = redis.asyncio.Redis()                     # doctest: +SKIP
    >>> backend = RedisBackend(client, lease_time=10)      # doctest: +SKIP
    >>> async with backend, backend.mutex("orders/42"):    # doctest: +SKIP
    ...     ...

    Every lock is one hash with a lease (``lease_time``, default 30 s) that a
    watchdog renews every third of the lease while held; a renewal that
    finds the hold gone, or cannot reach Redis before the lease runs out,
    marks the hold lost (the ``async with`` body is cancelled and gets
    ``LockLostError``). Waiters are woken by pub/sub and never wait longer
    than the holder's remaining lease. ``mutex(name, fair=True)`` queues in
    FIFO order. Closing a backend built on your client does not close it.

    :param client: a ``redis.asyncio.Redis`` (plain or from ``Sentinel.master_for``)
        or ``redis.asyncio.cluster.RedisCluster``
    :param lease_time: default lease of every hold, seconds
    :param key_prefix: prefix of every key (no braces), default ``"aiolocks:"``
    :param min_replicas: after a lock write, ``WAIT`` for this many replicas
        and fail the acquire if fewer acknowledged (not on Cluster)
    :param connect_timeout: seconds to wait for Redis when opening
    :param keyspace_events: how a hold deleted or overwritten behind our back
        is noticed at once: ``"auto"`` (default) turns the server's keyspace
        notifications on with ``CONFIG SET`` where they are off, ``"listen"``
        listens to them as the server is configured (no ``CONFIG`` call),
        ``"off"`` neither (loss is noticed at the next renewal)
    """

    def __init__(
        self,
        client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster,
        *,
        lease_time: float = DEFAULT_LEASE_TIME,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        min_replicas: int = 0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        keyspace_events: str = "auto",
    ) -> None:
        opts = _check_options(
            {
                "lease_time": lease_time,
                "key_prefix": key_prefix,
                "min_replicas": min_replicas,
                "connect_timeout": connect_timeout,
                "keyspace_events": keyspace_events,
            }
        )
        cluster = hasattr(client, "get_nodes")
        if cluster and not hasattr(client, "pubsub"):
            raise ValueError(_CLUSTER_NEEDS)
        if cluster and opts["min_replicas"]:
            raise ValueError("min_replicas is not supported on a Redis Cluster client")
        node = RedisNode(
            lambda: client,
            owns_client=False,
            describe=describe_client(client),
            connect_timeout=opts["connect_timeout"],
            min_replicas=opts["min_replicas"],
            cluster=cluster,
            keyspace_events=opts["keyspace_events"],
        )
        super().__init__(
            RedisDriver(node, lease_time=opts["lease_time"], key_prefix=opts["key_prefix"])
        )


@final
class RedlockBackend(Backend):
    """Redlock: a mutex taken on a majority of N independent Redis masters.

    >>> backend = await aiolocks.connect("redlock://h1:6379,h2:6379,h3:6379")  # doctest: +SKIP
    >>> async with backend.mutex("orders/42"):                                  # doctest: +SKIP
    ...     ...

    A hold needs ``N // 2 + 1`` masters, and is trusted only for ``lease -
    elapsed - drift``; the watchdog renews it on every master and declares it
    lost when a majority cannot be renewed in time. Redlock cannot protect
    against clock jumps or process pauses longer than the lease; use the
    fencing token where the protected resource can check it (see
    ``docs/redis.md``). Supports ``mutex``, ``semaphore_mutex`` and
    ``leader_latch``. Built with :func:`from_url`.
    """


_TLS_ONLY = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


def _tls_kwargs(scheme: str, opts: Mapping[str, Any]) -> dict[str, Any]:
    """redis-py's TLS keywords from ``rediss://``/``ssl=true`` and the ``ssl_*`` options.

    The server's certificate is always verified, and its host name checked
    unless ``ssl_check_hostname=false`` (redis-py 5 does not check it by
    default). An ``ssl_*`` option without TLS is a mistake, not ignored.
    """
    tls = opts.get("ssl")
    if scheme == "rediss":
        if tls is False:
            raise ValueError("rediss:// means TLS: ssl=false contradicts it")
        tls = True
    if not tls:
        given = [key for key in _TLS_ONLY if key in opts]
        if given:
            raise ValueError(f"{given[0]} needs TLS: use rediss:// or ssl=true")
        return {}
    if "ssl_keyfile" in opts and "ssl_certfile" not in opts:
        raise ValueError("ssl_keyfile needs ssl_certfile (the client certificate)")
    return {
        "ssl": True,
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": opts.get("ssl_check_hostname", True),
        "ssl_ca_certs": opts.get("ssl_ca_certs"),
        "ssl_certfile": opts.get("ssl_certfile"),
        "ssl_keyfile": opts.get("ssl_keyfile"),
    }


def from_url(url: str, **options: object) -> Backend:
    """Build a Redis backend from a URL without any I/O; ``ValueError`` names a bad part.

    Schemes: ``redis://[user:pass@]host[:port][/db]``, ``rediss://`` (TLS),
    ``redis+sentinel://h1:26379,h2/<service>[/db]``,
    ``redis+cluster://h1:7000,h2:7001``, ``redlock://h1:6379,h2:6380,h3:6381[/db]``.
    Query options and keywords: ``lease_time``, ``key_prefix``,
    ``min_replicas``, ``connect_timeout``, ``keyspace_events``
    (``auto``/``listen``/``off``); on every scheme TLS with ``ssl=true``
    (or ``rediss://``), ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``
    and ``ssl_check_hostname`` (default true); on ``redis+sentinel://``
    the Sentinels' own ``sentinel_username`` and ``sentinel_password``.
    """
    scheme = url.partition("://")[0] if isinstance(url, str) else ""
    default_port = 26379 if scheme == "redis+sentinel" else 6379
    parsed = parse_url(url, schemes=SCHEMES, default_port=default_port, options=URL_OPTIONS)
    opts = _check_options({**parsed.options, **options})
    if scheme != "redis+sentinel" and ("sentinel_username" in opts or "sentinel_password" in opts):
        raise ValueError("sentinel_username/sentinel_password are options of redis+sentinel://")
    connect_timeout = opts.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    plan = _Plan(
        scheme=scheme,
        url=parsed,
        opts=opts,
        path=parsed.path.lstrip("/"),
        connect_timeout=connect_timeout,
        min_replicas=opts.get("min_replicas", 0),
        keyspace_events=opts.get("keyspace_events", "auto"),
        kwargs=client_kwargs(parsed, connect_timeout, retries=1),
        tls=_tls_kwargs(scheme, opts),
    )
    if scheme in ("redis", "rediss"):
        return _plain(plan)
    if scheme == "redis+sentinel":
        return _sentinel(plan)
    if scheme == "redis+cluster":
        return _cluster(plan)
    return _redlock(plan)


@final
@dataclass(frozen=True, slots=True)
class _Plan:
    """What :func:`from_url` checked, for the builder of one scheme."""

    scheme: str
    url: ParsedURL
    opts: Mapping[str, Any]
    path: str
    connect_timeout: float
    min_replicas: int
    keyspace_events: str
    #: redis-py keywords: credentials, timeouts, retry
    kwargs: Mapping[str, Any]
    #: redis-py's TLS keywords (empty without TLS)
    tls: Mapping[str, Any]

    def backend(self, node: RedisNode) -> Backend:
        """A :class:`RedisBackend` on ``node`` with the URL's lease and prefix."""
        return RedisBackend._around(
            RedisDriver(
                node,
                lease_time=self.opts.get("lease_time", DEFAULT_LEASE_TIME),
                key_prefix=self.opts.get("key_prefix", DEFAULT_KEY_PREFIX),
            )
        )


def _plain(plan: _Plan) -> Backend:
    """``redis://`` / ``rediss://``: one server."""
    parsed, hosts = plan.url, plan.url.hosts
    if len(hosts) != 1:
        raise ValueError(
            f"{plan.scheme}:// takes one host, got {len(hosts)} in {parsed.redacted!r} "
            "(use redis+sentinel://, redis+cluster:// or redlock:// for several)"
        )
    db = _db(parsed, plan.path)
    host = hosts[0]

    def make_plain() -> Any:
        return plain_client(
            host, db, tls=plan.tls, kwargs=plan.kwargs, connect_timeout=plan.connect_timeout
        )

    node = RedisNode(
        make_plain,
        owns_client=True,
        describe=f"{plan.scheme}://{host}/{db}",
        connect_timeout=plan.connect_timeout,
        min_replicas=plan.min_replicas,
        keyspace_events=plan.keyspace_events,
    )
    return plan.backend(node)


def _sentinel(plan: _Plan) -> Backend:
    """``redis+sentinel://``: the master a set of Sentinels names, followed across failovers."""
    parsed, hosts, tls = plan.url, plan.url.hosts, plan.tls
    service, _, db_text = plan.path.partition("/")
    if not service:
        raise ValueError(
            f"redis+sentinel:// URL {parsed.redacted!r} needs /<service name> after the hosts"
        )
    if "/" in db_text:
        raise ValueError(
            f"invalid path {parsed.path!r} in {parsed.redacted!r}: expected /<service>[/db]"
        )
    db = _db(parsed, db_text)
    closers: list[Any] = []

    def make_sentinel() -> Any:
        sentinel = sentinel_set(
            hosts,
            sentinel_credentials={
                "username": plan.opts.get("sentinel_username"),
                "password": plan.opts.get("sentinel_password"),
            },
            tls=tls,
            kwargs=plan.kwargs,
            connect_timeout=plan.connect_timeout,
        )
        closers.extend(sentinel.sentinels)
        return sentinel_master(sentinel, service, db, url=parsed, tls=bool(tls))

    async def close_sentinels() -> None:
        for client in closers:
            with contextlib.suppress(Exception):
                await client.aclose()

    node = RedisNode(
        make_sentinel,
        owns_client=True,
        describe=f"redis+sentinel://{','.join(map(str, hosts))}/{service}/{db}",
        connect_timeout=plan.connect_timeout,
        min_replicas=plan.min_replicas,
        on_close=close_sentinels,
        keyspace_events=plan.keyspace_events,
    )
    return plan.backend(node)


def _cluster(plan: _Plan) -> Backend:
    """``redis+cluster://``: a Redis Cluster (every lock's keys in one slot)."""
    parsed, hosts = plan.url, plan.url.hosts
    if plan.path:
        raise ValueError(
            f"redis+cluster:// URL {parsed.redacted!r} must not have a path "
            "(a cluster has only db 0)"
        )
    if plan.min_replicas:
        raise ValueError("min_replicas is not supported on redis+cluster://")
    from redis.asyncio.cluster import RedisCluster

    if not hasattr(RedisCluster, "pubsub"):
        raise ValueError(_CLUSTER_NEEDS)

    def make_cluster() -> Any:
        return cluster_client(hosts, url=parsed, tls=plan.tls, connect_timeout=plan.connect_timeout)

    node = RedisNode(
        make_cluster,
        owns_client=True,
        describe=f"redis+cluster://{','.join(map(str, hosts))}",
        connect_timeout=plan.connect_timeout,
        cluster=True,
        keyspace_events=plan.keyspace_events,
    )
    return plan.backend(node)


def _redlock(plan: _Plan) -> Backend:
    """``redlock://``: a mutex on a majority of independent masters."""
    parsed, hosts = plan.url, plan.url.hosts
    if plan.min_replicas:
        raise ValueError("min_replicas is not supported on redlock:// (independent masters)")
    db = _db(parsed, plan.path)
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"redlock:// URL {parsed.redacted!r} names a host twice")
    nodes = []
    # Independent masters: no retries, so a dead master costs one refused
    # connection, not a backoff (Redlock needs answers well within the lease).
    node_kwargs = client_kwargs(parsed, plan.connect_timeout, retries=0)
    for host in hosts:

        def make_node(host: HostPort = host) -> Any:
            return plain_client(
                host, db, tls=plan.tls, kwargs=node_kwargs, connect_timeout=plan.connect_timeout
            )

        nodes.append(
            RedisNode(
                make_node,
                owns_client=True,
                describe=f"redis://{host}/{db}",
                connect_timeout=plan.connect_timeout,
                keyspace_events=plan.keyspace_events,
            )
        )
    return RedlockBackend._around(
        RedlockDriver(
            nodes,
            describe=f"redlock://{','.join(map(str, hosts))}/{db}",
            lease_time=plan.opts.get("lease_time", DEFAULT_LEASE_TIME),
            key_prefix=plan.opts.get("key_prefix", DEFAULT_KEY_PREFIX),
        )
    )
