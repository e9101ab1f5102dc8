"""The Redis client layer: the redis-py clients aiolocks builds, and the calls the recipe makes.

Layers: the lock recipe (``_driver.py`` with ``_pubsub.py``, ``_records.py``,
``_redlock.py``, ``_watchdog.py`` and ``_access.py``) -> this module ->
redis-py (``redis.asyncio``). ``_backend.py`` checks a URL's options without
I/O and calls the builders here; the recipe then uses the client through
:class:`RedisCommands` only.

The narrow interface
--------------------
:class:`RedisCommands` names every client call the recipe makes:
``EVALSHA`` (every lock and record script), ``EVAL`` (after ``NOSCRIPT``
on a single command), ``SCRIPT LOAD`` (at ``open()``, and after ``NOSCRIPT``
in a pipeline), ``register_script`` (only for each script's SHA1),
``HGET`` (a hold or record checked after a keyspace event), ``CONFIG GET`` /
``CONFIG SET`` of ``notify-keyspace-events`` (``keyspace_events=auto``),
a non-transactional ``pipeline`` (:class:`RedisPipeline`: ``EVALSHA`` then
``WAIT`` for ``min_replicas``, renewals batched, ``RPUSHX`` + ``PEXPIRE``
for a queue join), ``pubsub`` (:class:`RedisPubSub`: ``SUBSCRIBE``,
``UNSUBSCRIBE``, one reader) and ``aclose``. (``_redlock.py``,
``_watchdog.py`` and ``_access.py`` make no call of their own: Redlock goes
through each master's ``RedisNode``, the watchdog through the renewal
function it is given, ``_access.py`` maps errors.) The recipe needs more in two
places, named by two extensions rather than by widening it:
:class:`RedisClusterCommands` (a cluster client: ``initialize``, its nodes,
the node owning a key, and ``pubsub(node=...)`` on that node) and
:class:`RedisServerCommands` (a single server or Sentinel master: the
connection keywords, for the ``db`` of its keyspace channels). redis-py's
asyncio ``Redis`` and ``RedisCluster`` satisfy them as they are:
``tests/redis/test_client.py`` checks every method of these protocols on
the plain, Sentinel, Cluster and Redlock clients aiolocks builds (present,
parameters that take the recipe's calls), so a renamed or reshaped redis-py
method fails there, not in production. redis-py types its command methods
for its sync and asyncio clients at once (``X | Awaitable[X]``), so
``mypy`` cannot prove the match; the protocols are the recipe's static view.
Operations tools (``_admin.py``: ``SCAN``, ``EVAL``; ``_doctor*.py``:
``INFO``, ``CONFIG GET`` and more through ``execute_command``, the
connection keywords) are not the recipe and use the client as redis-py
documents it.

What a client built from a URL adds over redis-py
-------------------------------------------------
A single server's client (``redis://``, each ``redlock://`` master) gets
all of the following. A Sentinel master's gets the same connections and
retry, on redis-py's Sentinel pool of ``10 * POOL_SIZE`` connections (that
pool cannot wait). A cluster client is redis-py's ``RedisCluster`` with the
credentials and timeouts set, and one change to its connections: a write
into a connection redis-py closed under it raises redis-py's
``ConnectionError`` (:class:`_ClosedUnderWrite`; redis-py let an
``AttributeError`` out). A client the application passes to
``RedisBackend`` is used as it is.

* **hiredis packs commands** (:meth:`_BoundedCommands.pack_command`):
  redis-py's asyncio client packs in Python, and uses hiredis's C packer
  only in its synchronous client. Arguments hiredis does not take
  (``bool``, ``memoryview``, another encoding) go through redis-py's path,
  byte for byte the same (tested).
* **Writes and replies bounded by an ``asyncio.timeout`` block**
  (:class:`_BoundedCommands`, bound = ``connect_timeout``) instead of
  redis-py's ``socket_timeout``, whose write bound is ``asyncio.wait_for``:
  on Python 3.11 that runs every write in a task of its own, two extra
  tasks per lock cycle (with the other changes of that round, tasks per
  uncontended cycle went from 7 to 2). A write of at most 16 KiB takes no
  timer at all (it cannot wait: see the class).
* **A pool that keeps its connections and waits**
  (:func:`_waiting_pool_class`): redis-py's ``get_connection``/``release``
  take the pool's lock, record OpenTelemetry counters and dispatch an event
  on every command, which costs more than the rest of a lock's round trip
  on the client; this pool asks redis-py's only to grow and keeps the rest
  in a plain idle list. Past :data:`POOL_SIZE` busy connections a command
  waits (oldest first, up to ``connect_timeout``) instead of failing with
  ``MaxConnectionsError``: a burst of thousands of renewals queues instead
  of losing holds.
* **Sentinel: the master is asked for on every connect**
  (:func:`_sentinel_connection_class`), including the reconnect inside a
  command's own retry (redis-py issue #3874; seen as holds on two masters in
  the chaos suite).
* **One quick retry** (:func:`client_kwargs`): every script is safe to
  resend, and redis-py's default retry backs off for seconds; Redlock
  masters get none (a dead master costs one refused connection).

``docs/redis.md`` ("The client aiolocks builds") tells users the same;
``python -m benchmarks`` measures a lock cycle with all of it.

The redis-py API it relies on
-----------------------------
Public names only; no private (``_``) attribute of redis-py is read or
written, so nothing here needs a version gate beyond two ``hasattr``
checks and the layout check of a cluster client's connection keywords
(below). Constructors: ``redis.asyncio.Redis(...)``, ``Redis.from_pool``,
``redis.asyncio.sentinel.Sentinel(...)``, its ``sentinels`` and
``master_for``, ``redis.asyncio.cluster.RedisCluster`` and ``ClusterNode``,
``redis.asyncio.retry.Retry``, ``redis.backoff.ExponentialBackoff``.
Connections: ``send_packed_command``, ``read_response``, ``pack_command``,
``encoder.encoding``/``encoding_errors``; for Sentinel
``SentinelManagedConnection``/``SentinelManagedSSLConnection``,
``connect_check_health``, ``is_connected``, ``host``, ``port``,
``connection_pool.is_master`` and ``get_master_address()``
(redis-py 5.0.8 has no ``connect_check_health``: there a reconnect goes
through ``connect()``, which already asks the sentinels, and the override
is never called). Pool: ``ConnectionPool(connection_class=,
max_connections=, **connection_kwargs)``, ``connection_class``,
``connection_kwargs``, ``can_get_connection``, ``get_connection``,
``ensure_connection``, ``release``; asked for with ``hasattr`` on the
connection class: ``should_reconnect`` (redis-py 7.0+) and ``re_auth``
(5.3+).
Cluster: ``RedisCluster.connection_kwargs`` (its ``connection_class``),
``nodes_manager.connection_kwargs`` and ``nodes_manager.startup_nodes``,
``ClusterNode.connection_class``, each checked before it is changed
(:func:`_guard_cluster_writes`: otherwise redis-py's connections are kept).
``hiredis.pack_command`` is looked up with ``getattr`` (absent: redis-py
packs). :func:`describe_client` reads ``get_nodes``,
``nodes_manager.startup_nodes``, ``connection_pool.connection_kwargs`` and
``service_name``, each with a default.

Where TLS and credentials are applied
-------------------------------------
``_backend.py`` turns the URL into redis-py keywords and refuses bad ones
before any I/O (``_tls_kwargs``: ``ssl=True``, ``ssl_cert_reqs="required"``,
``ssl_check_hostname`` (default true), ``ssl_ca_certs``/``certfile``/
``keyfile``); :func:`client_kwargs` adds the ACL user, password, timeouts
and retry. The builders here hand them to redis-py: :func:`plain_client`
to ``Redis(...)``, whose pool's keywords and (TLS) connection class our
pool copies; :func:`sentinel_set` TLS to both the sentinels
(``sentinel_kwargs``, with the Sentinels' own user and password) and the
master's connections, :func:`sentinel_master` the ACL user to
``master_for``; :func:`cluster_client` all of them to ``RedisCluster``.
Refusals are told from outages in ``_access.py`` and ``_tls_probe.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._core.urls import HostPort, ParsedURL

if TYPE_CHECKING:
    import redis.asyncio
    import redis.asyncio.cluster

__all__ = [
    "POOL_SIZE",
    "RedisClusterCommands",
    "RedisCommands",
    "RedisPipeline",
    "RedisPubSub",
    "RedisScript",
    "RedisServerCommands",
    "client_kwargs",
    "cluster_client",
    "describe_client",
    "plain_client",
    "sentinel_master",
    "sentinel_set",
]


# -- the narrow interface of the recipe ------------------------------------------


class RedisScript(Protocol):
    """What the recipe reads of redis-py's ``AsyncScript`` (``register_script``)."""

    #: SHA1 of the script's text, sent with ``EVALSHA``
    sha: str


class RedisPipeline(Protocol):
    """A non-transactional pipeline: commands queued, sent in one round trip by :meth:`execute`."""

    def evalsha(self, sha: str, numkeys: int, /, *keys_and_args: Any) -> object:
        """Queue ``EVALSHA``."""

    def execute_command(self, *args: Any) -> object:
        """Queue any command (the recipe queues ``WAIT numreplicas timeout``)."""

    def rpushx(self, name: str, /, *values: Any) -> object:
        """Queue ``RPUSHX`` (push only onto an existing list)."""

    def pexpire(self, name: str, time: int, /) -> object:
        """Queue ``PEXPIRE`` (milliseconds)."""

    def execute(self, raise_on_error: bool = True) -> Awaitable[list[Any]]:
        """Send the queue; ``raise_on_error=False``: errors come back as values."""


class RedisPubSub(Protocol):
    """One pub/sub connection (redis-py's ``PubSub``, or ``ClusterPubSub`` on one node)."""

    def subscribe(self, *channels: str) -> Awaitable[Any]:
        """Send ``SUBSCRIBE`` (the confirmations arrive as messages)."""

    def unsubscribe(self, *channels: str) -> Awaitable[Any]:
        """Send ``UNSUBSCRIBE``."""

    def get_message(self, *, timeout: float | None) -> Awaitable[Mapping[str, Any] | None]:
        """The next message (``timeout=None``: wait for one); redis-py reconnects and
        subscribes again after a connection error."""

    def aclose(self) -> Awaitable[Any]:
        """Close the connection."""


class RedisCommands(Protocol):
    """Every client call of the Redis lock recipe (see the module docstring)."""

    def evalsha(self, sha: str, numkeys: int, /, *keys_and_args: Any) -> Awaitable[Any]:
        """``EVALSHA``: run a loaded script; ``NoScriptError`` when the server lost it."""

    def eval(self, script: str, numkeys: int, /, *keys_and_args: Any) -> Awaitable[Any]:
        """``EVAL``: run a script sent whole (after ``NOSCRIPT``), cached where it ran."""

    def script_load(self, script: str, /) -> Awaitable[Any]:
        """``SCRIPT LOAD`` (on every primary of a cluster)."""

    def register_script(self, script: str, /) -> RedisScript:
        """A script object; the recipe reads only its ``sha`` (no I/O)."""

    def hget(self, name: str, key: str, /) -> Awaitable[Any]:
        """``HGET``: one field of a hash, or None."""

    def config_get(self, pattern: str, /, **target: Any) -> Awaitable[Mapping[Any, Any]]:
        """``CONFIG GET`` (a cluster takes ``target_nodes=``)."""

    def config_set(self, name: str, value: str, /, **target: Any) -> Awaitable[Any]:
        """``CONFIG SET`` (a cluster takes ``target_nodes=``)."""

    def pipeline(self, *, transaction: bool) -> RedisPipeline:
        """A pipeline; the recipe always asks for ``transaction=False``."""

    def pubsub(self, **target: Any) -> RedisPubSub:
        """A pub/sub connection (no I/O until its first command)."""

    def aclose(self) -> Awaitable[Any]:
        """Close the client and its connections."""


class RedisClusterCommands(RedisCommands, Protocol):
    """What the recipe needs of a cluster client besides :class:`RedisCommands`."""

    def initialize(self) -> Awaitable[Any]:
        """Read the cluster's slot map (at ``open()``)."""

    def get_nodes(self) -> Sequence[Any]:
        """Every node the slot map knows (each with ``name``, ``host``, ``port``)."""

    def get_node_from_key(self, key: str, /) -> Any:
        """The master owning ``key``'s slot, or None (its ``name``; given to
        ``pubsub(node=...)`` and ``target_nodes=``)."""


class _ConnectionKeywords(Protocol):
    #: keywords each connection of the pool is made with (``db`` among them)
    connection_kwargs: dict[str, Any]


class RedisServerCommands(RedisCommands, Protocol):
    """What the recipe needs of a single server's or Sentinel master's client besides
    :class:`RedisCommands`: the ``db`` its keyspace channels are named after."""

    @property
    def connection_pool(self) -> _ConnectionKeywords:
        """The client's pool (only ``connection_kwargs`` is read)."""


# -- redis-py clients built from a URL -------------------------------------------


def describe_client(client: Any) -> str:
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


def client_kwargs(url: ParsedURL, connect_timeout: float, retries: int) -> dict[str, Any]:
    """redis-py's keywords for ``url``'s ACL user and password, the timeouts and the retry.

    ``retries``: quick retries of a failed command (0 for a Redlock master).
    """
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


def _pooled(client: Any, connect_timeout: float) -> redis.asyncio.Redis:
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


def plain_client(
    host: HostPort,
    db: int,
    *,
    tls: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    connect_timeout: float,
) -> redis.asyncio.Redis:
    """``redis.asyncio.Redis`` for one server, on a waiting pool of bounded connections.

    ``tls``: redis-py's TLS keywords (empty without TLS); ``kwargs``: those
    of :func:`client_kwargs`. No I/O.
    """
    import redis.asyncio

    client = redis.asyncio.Redis(host=host.host, port=host.port, db=db, **tls, **kwargs)
    return _pooled(client, connect_timeout)


def sentinel_set(
    hosts: Sequence[HostPort],
    *,
    sentinel_credentials: Mapping[str, Any],
    tls: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    connect_timeout: float,
) -> Any:
    """redis-py's ``Sentinel`` over ``hosts`` (its ``sentinels``: the caller closes them). No I/O.

    ``sentinel_credentials``: ``username``/``password`` of the sentinels
    themselves; ``tls`` applies to the sentinels and to the master's
    connections; ``kwargs`` (of :func:`client_kwargs`, without the ACL user,
    which :func:`sentinel_master` gives) to the master's connections.
    """
    from redis.asyncio.sentinel import Sentinel

    return Sentinel(  # type: ignore[no-untyped-call]
        [(h.host, h.port) for h in hosts],
        sentinel_kwargs={
            "socket_connect_timeout": connect_timeout,
            "socket_timeout": connect_timeout,
            "retry": _sentinel_retry(),
            **sentinel_credentials,
            **tls,
        },
        **_bounded_kwargs({k: v for k, v in kwargs.items() if k not in ("username", "password")}),
        **tls,
    )


def sentinel_master(
    sentinel: Any, service: str, db: int, *, url: ParsedURL, tls: bool
) -> redis.asyncio.Redis:
    """The master of ``service`` as ``sentinel`` names it, found again on every connect.

    ``url``: its ACL user and password go to the master's connections;
    ``tls``: connections over TLS. No I/O.
    """
    # The sentinel pool cannot block; lift redis-py's default cap of
    # 100 connections so a burst of renewals does not fail.
    client: redis.asyncio.Redis = sentinel.master_for(
        service,
        db=db,
        username=url.username,
        password=url.password,
        max_connections=10 * POOL_SIZE,
        connection_class=_sentinel_connection_class(tls),
    )
    return client


def _sentinel_retry() -> Any:
    """The retry of each Sentinel's own client: one quick retry, none for a refusal.

    The next Sentinel is the real retry. redis-py's default backs off for
    seconds and, as a refused password or certificate is a redis-py
    ``ConnectionError``, retried refusals until ``connect_timeout`` ran out.
    A refusal is raised as :class:`~._access.SentinelRefused` instead, which
    neither this retry nor redis-py's Sentinel discovery catches.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    from ._access import SentinelRefused, is_refusal

    class RefusalIsFinal(Retry):
        """redis-py's ``Retry`` that lets a refusal through at once."""

        async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
            async def once() -> Any:
                try:
                    return await do()
                except RedisConnectionError as exc:
                    if is_refusal(exc):
                        raise SentinelRefused(f"a Sentinel refused us: {exc}") from exc
                    raise

            return await super().call_with_retry(once, fail, *args, **kwargs)

    return RefusalIsFinal(ExponentialBackoff(cap=0.2, base=0.02), 1)


class _ClosedUnderWrite:
    """Mixin: a write into a connection closed under it raises redis-py's ``ConnectionError``.

    redis-py's ``send_packed_command`` checks that the connection is open,
    then (with ``socket_timeout`` set, on Python 3.11) runs the write in a
    task of its own through ``asyncio.wait_for``. In between, another task
    may close the connection: the asyncio cluster client disconnects every
    connection of every node, those in use included, when a command meets
    ``CLUSTERDOWN`` (as during a primary's ``kill -9``). The write then finds
    no stream and raises ``AttributeError: 'NoneType' object has no
    attribute 'writelines'`` (on Python 3.12+ a write into a transport the
    peer closed raises ``TypeError``/``AttributeError`` naming ``NoneType``,
    redis-py issue #4287). Neither is a redis-py error, so neither redis-py's
    cluster retry nor aiolocks' handling of an unreachable server saw it: it
    escaped ``hold()`` and killed a hold's background check. Found by the
    cluster fault runs (redis-py 8.1.0).

    Raised as redis-py's own ``ConnectionError`` instead (exactly that type:
    the cluster client retries ``type(e) in ERRORS_ALLOW_RETRY``); redis-py
    has already dropped the connection, which reconnects on its next use.
    Only errors naming ``NoneType`` are translated: a write that reaches no
    stream; anything else goes through unchanged. redis-py's own fix (PR
    #4288: the write checks its stream and raises ``ConnectionError``) is
    merged but in no release as of 8.1.0; with it this never triggers.
    """

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except (AttributeError, TypeError) as exc:
            if "NoneType" not in str(exc):
                raise
            from redis.exceptions import ConnectionError as RedisConnectionError

            raise RedisConnectionError(
                f"connection closed while a command was written to it ({exc})"
            ) from exc


@functools.cache
def _closed_under_write_class(cls: type[Any]) -> type[Any]:
    """``cls`` (a redis-py connection class) with :class:`_ClosedUnderWrite` mixed in."""
    if issubclass(cls, _ClosedUnderWrite):
        return cls
    return type(f"Guarded{cls.__name__}", (_ClosedUnderWrite, cls), {})


def _guard_cluster_writes(client: Any) -> bool:
    """Give ``client``'s nodes connections of :func:`_closed_under_write_class`. No I/O.

    ``RedisCluster`` takes no ``connection_class``: it puts its own in the
    keywords every ``ClusterNode`` is built from (public ``connection_kwargs``,
    shared with ``nodes_manager``) and builds the start-up nodes with it. Both
    are set here, before any connection exists. Version gate: on a redis-py
    laid out otherwise (no such dict, no start-up nodes map) the client keeps
    redis-py's connections, and returns False.
    """
    found: object = getattr(client, "connection_kwargs", None)
    manager = getattr(client, "nodes_manager", None)
    nodes = getattr(manager, "startup_nodes", None)
    if not isinstance(found, dict):
        return False
    kwargs: dict[str, Any] = found
    shared: object = getattr(manager, "connection_kwargs", None)
    if (
        shared is not kwargs
        or not isinstance(kwargs.get("connection_class"), type)
        or not isinstance(nodes, dict)
        or not all(isinstance(getattr(n, "connection_class", None), type) for n in nodes.values())
    ):
        return False
    guarded = _closed_under_write_class(kwargs["connection_class"])
    kwargs["connection_class"] = guarded
    for node in nodes.values():
        node.connection_class = _closed_under_write_class(node.connection_class)
    return True


def cluster_client(
    hosts: Sequence[HostPort],
    *,
    url: ParsedURL,
    tls: Mapping[str, Any],
    connect_timeout: float,
) -> redis.asyncio.cluster.RedisCluster:
    """redis-py's ``RedisCluster`` starting from ``hosts`` (``url``'s ACL user). No I/O.

    Its connections translate a write into a connection closed under it
    (:class:`_ClosedUnderWrite`).
    """
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    client = RedisCluster(
        startup_nodes=[ClusterNode(h.host, h.port) for h in hosts],
        username=url.username,
        password=url.password,
        socket_connect_timeout=connect_timeout,
        socket_timeout=connect_timeout,
        **tls,
    )
    _guard_cluster_writes(client)
    return client
