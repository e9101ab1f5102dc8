"""Public Redis backends and ``from_url``: URL parsing without I/O, client construction."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from .._core.backend import Backend
from .._core.urls import HostPort, ParsedURL, parse_bool, parse_positive_float, parse_url
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


def _describe_client(client: Any) -> str:
    """``redis://host:port/db`` (no credentials) for a user-provided client."""
    if hasattr(client, "get_nodes"):
        # before initialize() only the startup nodes are known
        manager = getattr(client, "nodes_manager", None)
        known = client.get_nodes() or list(getattr(manager, "startup_nodes", {}).values())
        nodes = ",".join(f"{n.host}:{n.port}" for n in known)
        return f"redis+cluster://{nodes or 'unknown'}"
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) if pool is not None else {}
    service = getattr(pool, "service_name", None)
    if service is not None:
        return f"redis+sentinel://{service}/{kwargs.get('db', 0)}"
    host = kwargs.get("host", "localhost")
    port = kwargs.get("port", 6379)
    if "path" in kwargs:
        return f"redis+unix://{kwargs['path']}/{kwargs.get('db', 0)}"
    return f"redis://{HostPort(str(host), int(port))}/{kwargs.get('db', 0)}"


def _client_kwargs(url: ParsedURL, connect_timeout: float, retries: int) -> dict[str, Any]:
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    return {
        "username": url.username,
        "password": url.password,
        "socket_connect_timeout": connect_timeout,
        # Bounds a command on a stalled server (on the connections aiolocks
        # builds itself, the same bound is moved to ``command_timeout``).
        "socket_timeout": connect_timeout,
        # Every script is safe to resend (acquire.lua answers a resend with
        # the same grant, release/renew are compare-and-act), so one quick
        # retry is allowed; redis-py's default backs off for seconds.
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), retries),
    }


_CLUSTER_NEEDS = (
    "a Redis Cluster needs redis-py 8.0 or later (its asyncio cluster client has pub/sub "
    "from 8.0 on; waiters are woken by pub/sub)"
)

#: connections per Redis client built from a URL; more commands wait for one
POOL_SIZE = 100


#: a write of at most this many bytes into an empty transport buffer
#: cannot pause the stream (asyncio's high-water mark is 64 KiB)
_UNBLOCKED_WRITE = 16 * 1024


def _write_size(command: Any) -> int:
    """Bytes in ``command`` as redis-py's ``send_packed_command`` takes it."""
    if isinstance(command, bytes | str):
        return len(command)
    return sum(len(part) for part in command)


class _BoundedCommands:
    """Mixin: a redis-py connection whose writes and reads are bounded by ``command_timeout``.

    redis-py bounds them by ``socket_timeout``, but its write bound is
    ``asyncio.wait_for``, which on Python 3.11 runs every write in a task of
    its own (two extra tasks per lock cycle). Our connections are built with
    ``socket_timeout=None`` instead, and this mixin puts an
    ``asyncio.timeout`` block around redis-py's own read, and around any
    write that could wait. The outcome is redis-py's: a stuck write or read
    raises redis-py's ``TimeoutError``, and the connection is dropped
    (redis-py disconnects a connection whose write or read is interrupted,
    so a cancelled or timed out command never goes back to the pool with a
    half-sent request or an unread reply). A read given an explicit
    ``timeout`` (pub/sub polling) is left to redis-py. Only public redis-py
    methods are overridden; ``socket_timeout`` is never touched again.

    Which writes could wait: a write only waits when the stream's buffer
    goes past asyncio's high-water mark (64 KiB). A command's connection
    starts with an empty buffer: its previous reply was read, so the server
    had received every byte, and a connection whose write or read failed or
    was cancelled was dropped. So a write of at most ``_UNBLOCKED_WRITE``
    bytes needs no timer, and every longer one gets one. (Pub/sub writes do
    not read replies in between; the pub/sub hub bounds those itself.)

    :meth:`pack_command` packs with hiredis's C packer (redis-py uses it only
    for its synchronous client); arguments it does not take go through
    redis-py's own path unchanged.
    """

    encoder: Any

    def __init__(self, *, command_timeout: float | None = None, **kwargs: Any) -> None:
        #: seconds a write or a reply may take; None: unbounded
        self.command_timeout = command_timeout
        super().__init__(**kwargs)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.command_timeout
        if timeout is None or _write_size(command) <= _UNBLOCKED_WRITE:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except TimeoutError:
            from redis.exceptions import TimeoutError as RedisTimeoutError

            raise RedisTimeoutError("Timeout writing to socket") from None

    async def read_response(
        self, disable_decoding: bool = False, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        limit = self.command_timeout
        if timeout is not None or limit is None:
            return await super().read_response(  # type: ignore[misc]
                disable_decoding=disable_decoding, timeout=timeout, **kwargs
            )
        try:
            async with asyncio.timeout(limit):
                return await super().read_response(  # type: ignore[misc]
                    disable_decoding=disable_decoding, **kwargs
                )
        except TimeoutError:
            from redis.exceptions import TimeoutError as RedisTimeoutError

            # redis-py already disconnected (unless the caller asked it not to)
            raise RedisTimeoutError(f"Timeout reading from {self}") from None

    def pack_command(self, *args: Any) -> list[bytes]:
        """The RESP array for ``args``, packed by hiredis (redis-py packs in Python)."""
        pack = _hiredis_pack()
        name = args[0]
        encoder = self.encoder
        if (
            pack is None
            or type(name) is not str
            or encoder.encoding not in ("utf-8", "utf8")
            or encoder.encoding_errors != "strict"
        ):
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        if " " in name:  # 'SCRIPT LOAD' is two arguments, as in redis-py
            args = (*name.split(), *args[1:])
        try:
            return [pack(args)]
        except TypeError:  # bool, memoryview, ...: redis-py accepts or names the problem
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]


@functools.cache
def _hiredis_pack() -> Callable[[tuple[Any, ...]], bytes] | None:
    """``hiredis.pack_command`` (str, bytes, int and float, as redis-py encodes them)."""
    try:
        import hiredis
    except ImportError:
        return None
    pack: Callable[[tuple[Any, ...]], bytes] | None = getattr(hiredis, "pack_command", None)
    return pack


def _bounded_class(cls: type[Any]) -> type[Any]:
    """``cls`` (a redis-py connection class) with :class:`_BoundedCommands` mixed in."""
    if issubclass(cls, _BoundedCommands):
        return cls
    return type(f"Bounded{cls.__name__}", (_BoundedCommands, cls), {})


@functools.cache
def _sentinel_connection_class(tls: bool = False) -> type[Any]:
    """redis-py's Sentinel-managed connection, asking the sentinels again on *every* connect.

    redis-py asks the sentinels for the master's address only in
    ``connect()``; a connection that dropped and is reconnected by a
    command's own retry (``send_packed_command`` -> ``connect_check_health``)
    goes back to the address it had (redis-py issue #3874). After a failover
    that is the old master, and if it has come back and not yet been turned
    into a replica, it takes writes: our holds would then live on two
    masters. Seen in the chaos suite (seed 4242): a worker whose event loop
    was blocked across a failover kept acquiring on the restarted old master.
    ``tls``: built on redis-py's TLS connection (``ssl=true``).
    """
    from redis.asyncio.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

    base = SentinelManagedSSLConnection if tls else SentinelManagedConnection

    class RediscoveringSentinelConnection(_BoundedCommands, base):  # type: ignore[valid-type,misc]
        """``SentinelManagedConnection`` that resolves the master before each socket connect."""

        async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            if not self.is_connected and self.connection_pool.is_master:
                self.host, self.port = await self.connection_pool.get_master_address()
            await super().connect_check_health(*args, **kwargs)

    return RediscoveringSentinelConnection


async def _wait_for_release(pool: Any) -> None:
    """Queue for a connection of ``pool`` (``_waiting_pool_class``'s), oldest first.

    Fails as redis-py's own pool does once ``pool.wait_timeout`` passed.
    """
    waiter = asyncio.get_running_loop().create_future()
    pool.waiters.append(waiter)
    try:
        async with asyncio.timeout(pool.wait_timeout):
            await waiter
    except BaseException as exc:
        if waiter.done() and not waiter.cancelled():
            _wake_one(pool.waiters)  # woken, but leaving: pass the turn on
        if isinstance(exc, TimeoutError):
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError("No connection available.") from None
        raise
    finally:
        if not waiter.done():
            waiter.cancel()
        with contextlib.suppress(ValueError):
            pool.waiters.remove(waiter)


def _wake_one(waiters: collections.deque[asyncio.Future[None]]) -> None:
    """Wake the oldest of ``waiters`` still waiting (a connection came back)."""
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            break


@functools.cache
def _waiting_pool_class() -> type[Any]:
    """redis-py's plain pool, with a cheap idle list in front and waiting instead of raising."""

    import redis.asyncio
    from redis.exceptions import MaxConnectionsError

    class WaitingConnectionPool(redis.asyncio.ConnectionPool):
        """``ConnectionPool`` that keeps its connections and waits when every one is busy.

        redis-py's ``get_connection``/``release`` take the pool's lock, record
        OpenTelemetry counters and dispatch a release event on every command,
        which costs more than the rest of a lock's round trip on the client.
        This pool takes a connection from redis-py's pool only to grow: a
        connection it has handed out stays checked out of redis-py's pool for
        good, and coming back it goes to :attr:`idle`, a plain list, from
        where the next command takes it again. redis-py's own bookkeeping
        stays right (it sees those connections as in use), so
        ``disconnect()``/``aclose()``, ``set_retry()`` and marking
        connections for reconnect reach every connection, idle or busy; and
        what redis-py's release listener does (re-authenticate with a
        refreshed token) is done here directly.

        When every connection (``max_connections``) is busy, a command waits
        up to ``timeout`` seconds for one to come back, oldest first, instead
        of failing with ``MaxConnectionsError``: a burst of renewals (thousands
        of holds) queues instead of losing holds.
        """

        def __init__(self, *, timeout: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            #: seconds a command waits for a connection when all are busy
            self.wait_timeout = timeout
            #: connections handed out before and given back, ready for reuse
            self.idle: list[Any] = []
            self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
            # redis-py before 7.0 has no reconnect marks, before 5.3 no re-auth
            self.has_reconnect_marks = hasattr(self.connection_class, "should_reconnect")
            self.has_re_auth = hasattr(self.connection_class, "re_auth")

        def can_get_connection(self) -> bool:
            """True if a connection is idle here or redis-py's pool may still make one."""
            return bool(self.idle) or bool(super().can_get_connection())

        async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
            """A connected connection; waits up to ``timeout`` while every one is busy."""
            while True:
                while not self.can_get_connection():
                    await _wait_for_release(self)
                if not self.idle:
                    try:
                        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
                    except MaxConnectionsError:
                        continue  # another task took the last one meanwhile
                connection = self.idle.pop()
                try:
                    if self.has_reconnect_marks and connection.should_reconnect():
                        await connection.disconnect()
                    await self.ensure_connection(connection)
                except BaseException:
                    await self.release(connection)
                    raise
                return connection

        async def release(self, connection: Any) -> None:
            """Take ``connection`` back for the next command and wake the oldest waiter."""
            self.idle.append(connection)
            _wake_one(self.waiters)
            if self.has_re_auth:
                await connection.re_auth()  # what redis-py's release listener does

    return WaitingConnectionPool


def _bounded_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Connection keywords with the ``socket_timeout`` bound moved to ``command_timeout``."""
    out = dict(kwargs)
    out["command_timeout"] = out.pop("socket_timeout", None)
    out["socket_timeout"] = None
    return out


def _pooled(client: Any, connect_timeout: float) -> Any:
    """``client`` rebuilt on a waiting pool of :data:`POOL_SIZE` connections.

    redis-py's default asyncio pool *raises* ``MaxConnectionsError`` past its
    limit instead of waiting: a burst of watchdog renewals (thousands of
    holds) would then fail and their holds be lost. A blocking pool makes
    the burst queue for a connection, bounded by ``connect_timeout``.
    """
    import redis.asyncio

    pool = client.connection_pool
    blocking = _waiting_pool_class()(
        connection_class=_bounded_class(pool.connection_class),
        max_connections=POOL_SIZE,
        timeout=connect_timeout,
        **_bounded_kwargs(pool.connection_kwargs),
    )
    return redis.asyncio.Redis.from_pool(blocking)


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
            describe=_describe_client(client),
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
        kwargs=_client_kwargs(parsed, connect_timeout, retries=1),
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
        import redis.asyncio

        client = redis.asyncio.Redis(
            host=host.host, port=host.port, db=db, **plan.tls, **plan.kwargs
        )
        return _pooled(client, plan.connect_timeout)

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
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [(h.host, h.port) for h in hosts],
            sentinel_kwargs={
                "socket_connect_timeout": plan.connect_timeout,
                "socket_timeout": plan.connect_timeout,
                "username": plan.opts.get("sentinel_username"),
                "password": plan.opts.get("sentinel_password"),
                **tls,
            },
            **_bounded_kwargs(
                {k: v for k, v in plan.kwargs.items() if k not in ("username", "password")}
            ),
            **tls,
        )
        closers.extend(sentinel.sentinels)
        # The sentinel pool cannot block; lift redis-py's default cap of
        # 100 connections so a burst of renewals does not fail.
        return sentinel.master_for(
            service,
            db=db,
            username=parsed.username,
            password=parsed.password,
            max_connections=10 * POOL_SIZE,
            connection_class=_sentinel_connection_class(bool(tls)),
        )

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
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        return RedisCluster(
            startup_nodes=[ClusterNode(h.host, h.port) for h in hosts],
            username=parsed.username,
            password=parsed.password,
            socket_connect_timeout=plan.connect_timeout,
            socket_timeout=plan.connect_timeout,
            **plan.tls,
        )

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
    node_kwargs = _client_kwargs(parsed, plan.connect_timeout, retries=0)
    for host in hosts:

        def make_node(host: HostPort = host) -> Any:
            import redis.asyncio

            client = redis.asyncio.Redis(
                host=host.host, port=host.port, db=db, **plan.tls, **node_kwargs
            )
            return _pooled(client, plan.connect_timeout)

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
