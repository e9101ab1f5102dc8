"""Real ZooKeeper and Redis servers, started from the installed binaries.

Design note
-----------
Backend tests talk to real servers, never to fakes or mocked clients.
Every launcher follows one recipe, implemented once in
``aiolocks.testing._process`` (and shared with the PostgreSQL and etcd
launchers): a free port below the kernel's ephemeral range, a private
temporary folder, the binary in its own process group with its output in a
log file, readiness checked *by protocol* (ZooKeeper must answer the ``srvr``
four-letter word with a ``Mode:`` line, Redis must answer ``PING``; else
:class:`ServerStartError` with the tail of the log), stop by PID (SIGTERM,
SIGKILL after a grace, always reaped; ``kill()`` is SIGKILL at once), and an
``atexit`` clean-up registered when the first server starts, never at import.

``stop()`` keeps the folder and the port, so ``start()`` brings the same
server back on the same port with the same data (ZooKeeper keeps its
snapshots, so sessions survive a restart; Redis runs without persistence).
``close()`` (and leaving the ``with`` block) stops and removes the folder.

Every top-level launcher also has an ``external(...)`` constructor describing
a server that somebody else runs (``docker-compose.yml``, CI services). Such
an object has the same addresses but ``managed`` is ``False`` and the process
controls raise :class:`ServerNotManagedError`.

ZooKeeper is started as ``java -cp ... ZooKeeperServerMain`` (single server)
or ``QuorumPeerMain`` (ensemble members) rather than through ``zkServer.sh``:
that is the fastest start (well under a second for a single server here).
Settings chosen for tests: ``tickTime=200`` (so ``minSessionTimeout=400`` ms
is allowed), ``maxSessionTimeout=60000``, the four-letter words aiozk and the
tests need, no AdminServer, container nodes reaped every 500 ms and no fsync
(data still reaches the page cache, which survives a SIGKILL),
``maxClientCnxns=0`` (no per-IP connection limit). Redis runs with
``--repl-diskless-sync-delay 0`` (replicas sync at once) and
``--enable-debug-command local``.

Environment variables read here:

``AIOLOCKS_JAVA``, ``JAVA_HOME``
    the Java runtime (default: ``java`` on ``PATH``).
``AIOLOCKS_ZK_CLASSPATH``, ``ZOOKEEPER_HOME``
    where the ZooKeeper jars are (default: ``$ZOOKEEPER_HOME/lib``, then
    ``/usr/share/zookeeper/lib``, then the Debian package's
    ``/usr/share/java/zookeeper.jar`` plus ``slf4j-simple.jar`` for the log).
``AIOLOCKS_REDIS_SERVER``, ``AIOLOCKS_REDIS_SENTINEL``
    the Redis binaries (default: ``redis-server``/``redis-sentinel`` on
    ``PATH`` or in ``/usr/bin``, ``/usr/local/bin``).
``AIOLOCKS_SERVERS_DIR``
    where the temporary folders are made (default: the system temp dir).
``AIOLOCKS_KEEP_SERVER_DIRS=1``
    keep the folders (configs, data, logs) after the servers stop.
"""

from __future__ import annotations

import glob
import os
import secrets
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final, Self, TypeAlias, final
from urllib.parse import unquote, urlsplit

from ._process import (
    INSTALL_HINT,
    LOCALHOST,
    ServerCommandError,
    ServerError,
    ServerNotInstalledError,
    ServerNotManagedError,
    ServerStartError,
    _check_host,
    _Ensemble,
    _find_binary,
    _hosts_for,
    _join_hosts,
    _Launcher,
    _make_dir,
    _read_all,
    _ServerProcess,
    _split_hosts,
    _wait_until,
    free_port,
)

# The process handling every launcher shares (ports, folders, start, stop,
# clean-up at exit, ensembles) lives in ._process.
from .tls import TlsFiles

__all__ = [
    "LOCALHOST",
    "RedisCluster",
    "RedisSentinel",
    "RedisSentinelSet",
    "RedisServer",
    "RedisServerGroup",
    "RespValue",
    "ServerCommandError",
    "ServerError",
    "ServerNotInstalledError",
    "ServerNotManagedError",
    "ServerStartError",
    "ZOOKEEPER_FOUR_LETTER_WORDS",
    "ZooKeeperEnsemble",
    "ZooKeeperEnsembleMember",
    "ZooKeeperServer",
    "free_port",
]

#: The address every managed server binds to.
#: The four-letter words enabled on every ZooKeeper we start. aiozk cannot
#: connect without ``srvr`` (it probes read-only mode with it); tests read
#: ``wchs``/``mntr``/``cons``.
ZOOKEEPER_FOUR_LETTER_WORDS: Final = "srvr,mntr,wchs,wchc,cons,stat,ruok,conf,dump"

#: A decoded RESP2 reply: simple and bulk strings become ``str``, integers
#: ``int``, nil ``None``, arrays ``list``. Error replies raise
#: :class:`ServerCommandError`.
RespValue: TypeAlias = str | int | list["RespValue"] | None


# --------------------------------------------------------------------------- tiny clients


def _four_letter(host: str, port: int, command: str, timeout: float) -> str:
    if len(command) != 4:
        raise ValueError(f"four-letter words have four letters, not {command!r}")
    return _read_all(host, port, command.encode("ascii"), timeout).decode("utf-8", "replace")


def _encode_command(args: Sequence[str | int | bytes]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _RespConnection:
    """A blocking RESP2 connection: enough for PING, INFO, CONFIG and friends."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._received = bytearray()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def call(self, *args: str | int | bytes) -> RespValue:
        self._sock.sendall(_encode_command(args))
        return self._read_reply()

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._received += chunk

    def _read_line(self) -> bytes:
        while (end := self._received.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self._received[:end])
        del self._received[: end + 2]
        return line

    def _read_exact(self, size: int) -> bytes:
        while len(self._received) < size + 2:
            self._fill()
        data = bytes(self._received[:size])
        del self._received[: size + 2]
        return data

    def _read_reply(self) -> RespValue:
        line = self._read_line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode("utf-8", "surrogateescape")
        if kind == b"-":
            raise ServerCommandError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            return self._read_exact(size).decode("utf-8", "surrogateescape")
        if kind == b"*":
            count = int(rest)
            if count < 0:
                return None
            return [self._read_reply() for _ in range(count)]
        raise ServerError(f"unexpected RESP reply {line!r}")


def _parse_info(text: RespValue) -> dict[str, str]:
    if not isinstance(text, str):
        raise ServerError(f"INFO returned {text!r}")
    result: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            result[key] = value
    return result


def _pairs(value: RespValue) -> dict[str, RespValue]:
    """Turn a flat ``[k1, v1, k2, v2, ...]`` reply into a dict."""
    if not isinstance(value, list):
        raise ServerError(f"expected a list reply, got {value!r}")
    return {str(value[i]): value[i + 1] for i in range(0, len(value) - 1, 2)}


# --------------------------------------------------------------------------- ZooKeeper


def _find_java() -> str:
    override = os.environ.get("AIOLOCKS_JAVA")
    if override:
        return _find_binary("AIOLOCKS_JAVA", "java", "default-jre-headless")
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return _find_binary("AIOLOCKS_JAVA", "java", "default-jre-headless")


def _zookeeper_classpath() -> list[str]:
    override = os.environ.get("AIOLOCKS_ZK_CLASSPATH")
    if override:
        return [part for part in override.split(os.pathsep) if part]
    home = os.environ.get("ZOOKEEPER_HOME")
    homes = [Path(home)] if home else []
    homes.append(Path("/usr/share/zookeeper"))
    for folder in homes:
        # Upstream tarball layout: lib/*.jar with logback; conf/ holds logback.xml.
        jars = sorted(glob.glob(str(folder / "lib" / "*.jar")))
        if any(Path(jar).name.startswith("zookeeper-") for jar in jars):
            conf = folder / "conf"
            return ([str(conf)] if conf.is_dir() else []) + jars
    debian = Path("/usr/share/java/zookeeper.jar")
    if debian.is_file():
        # The Debian jar's manifest Class-Path lists its dependencies, but no
        # slf4j binding: add slf4j-simple (from libslf4j-java) to get a log.
        # Netty's codec and resolver are missing from it too; the Netty server
        # (serverCnxnFactory, needed for secureClientPort) loads them.
        extras = [
            Path("/usr/share/java") / name
            for name in ("slf4j-simple.jar", "netty-codec.jar", "netty-resolver.jar")
        ]
        return [str(debian)] + [str(jar) for jar in extras if jar.is_file()]
    raise ServerNotInstalledError(
        "the ZooKeeper jars were not found (Debian package 'zookeeper', or set "
        f"ZOOKEEPER_HOME / AIOLOCKS_ZK_CLASSPATH); {INSTALL_HINT}"
    )


class _ZooKeeperProcess(_ServerProcess):
    kind = "zookeeper"
    _main_class: ClassVar[str] = "org.apache.zookeeper.server.ZooKeeperServerMain"

    def __init__(
        self,
        *,
        port: int | None,
        base_dir: Path | None,
        startup_timeout: float,
        tick_time: int,
        min_session_timeout: int,
        max_session_timeout: int,
        container_check_interval: int,
        extra_config: dict[str, str] | None,
        jvm_options: Sequence[str],
        managed: bool = True,
        host: str = LOCALHOST,
    ) -> None:
        super().__init__(
            port=port,
            base_dir=base_dir,
            startup_timeout=startup_timeout,
            managed=managed,
            host=host,
        )
        self._tick_time = tick_time
        self._min_session_timeout = min_session_timeout
        self._max_session_timeout = max_session_timeout
        self._container_check_interval = container_check_interval
        self._extra_config = dict(extra_config or {})
        self._jvm_options = list(jvm_options)

    @property
    def hosts(self) -> str:
        """The connection string, ``"127.0.0.1:<port>"``."""
        return f"{self._host}:{self._port}"

    @property
    def url(self) -> str:
        """The aiolocks URL, ``"zk://127.0.0.1:<port>"``."""
        return f"zk://{self.hosts}"

    @property
    def data_dir(self) -> Path | None:
        """ZooKeeper's ``dataDir`` (kept across restarts), once started."""
        return None if self._dir is None else self._dir / "data"

    def four_letter(self, command: str, *, timeout: float = 5.0) -> str:
        """Send a four-letter word (``srvr``, ``mntr``, ``wchs``, ``cons``...), return the answer.

        >>> server.four_letter("srvr")  # doctest: +SKIP
        'Zookeeper version: 3.8.0 ...\\nMode: standalone\\n...'
        """
        return _four_letter(self._host, self._port, command, timeout)

    def mode(self) -> str | None:
        """``"standalone"``, ``"leader"`` or ``"follower"``; ``None`` when not serving."""
        try:
            answer = self.four_letter("srvr", timeout=2.0)
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.partition(":")[2].strip()
        return None

    def _probe(self) -> bool:
        return self.mode() is not None

    def _config_lines(self, data_dir: Path) -> list[str]:
        config = {
            "tickTime": str(self._tick_time),
            "initLimit": "20",
            "syncLimit": "10",
            "dataDir": str(data_dir),
            "clientPort": str(self._port),
            "clientPortAddress": self._host,
            "minSessionTimeout": str(self._min_session_timeout),
            "maxSessionTimeout": str(self._max_session_timeout),
            "maxClientCnxns": "0",
            "4lw.commands.whitelist": ZOOKEEPER_FOUR_LETTER_WORDS,
            "admin.enableServer": "false",
            # No fsync per transaction: much faster, and the data still
            # reaches the page cache, which survives kill -9 of the server.
            "forceSync": "no",
            "autopurge.purgeInterval": "0",
        }
        config.update(self._extra_config)
        return [f"{key}={value}" for key, value in config.items()]

    def _prepare(self, directory: Path) -> None:
        data_dir = directory / "data"
        data_dir.mkdir(exist_ok=True)
        lines = self._config_lines(data_dir)
        (directory / "zoo.cfg").write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        java = _find_java()
        classpath = _zookeeper_classpath()
        return [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.net.preferIPv4Stack=true",
            # A JVM system property, not a zoo.cfg key: how often empty
            # container nodes (lock parents) are reaped.
            f"-Dznode.container.checkIntervalMs={self._container_check_interval}",
            f"-Dzookeeper.4lw.commands.whitelist={ZOOKEEPER_FOUR_LETTER_WORDS}",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.logFile=System.out",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            "-Dzookeeper.console.threshold=INFO",
            *self._jvm_options,
            "-cp",
            os.pathsep.join(classpath),
            self._main_class,
            "zoo.cfg",
        ]


def _zookeeper_tls_config(tls: TlsFiles, port: int) -> dict[str, str]:
    """zoo.cfg lines for a ``secureClientPort`` with PEM files (ZooKeeper 3.6+, Netty)."""
    keystore = tls.server_cert.with_name("zookeeper-server.pem")
    keystore.write_text(tls.server_key.read_text() + tls.server_cert.read_text())
    return {
        "secureClientPort": str(port),
        "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
        "ssl.keyStore.location": str(keystore),
        "ssl.keyStore.type": "PEM",
        "ssl.trustStore.location": str(tls.ca_cert),
        "ssl.trustStore.type": "PEM",
        "ssl.clientAuth": "want",
    }


@final
class ZooKeeperServer(_ZooKeeperProcess):
    """A single (standalone) ZooKeeper server on a free port in a temporary folder.

    ::

        with ZooKeeperServer() as zk:
            client = aiozk.ZKClient(zk.hosts)
            ...
            zk.stop()    # same port and data dir on the next start()
            zk.start()

    Settings: ``tickTime=200`` ms, sessions between ``min_session_timeout``
    (400 ms) and ``max_session_timeout`` (60 s), empty container nodes reaped
    every 500 ms, four-letter words :data:`ZOOKEEPER_FOUR_LETTER_WORDS`. It
    listens on ``host`` (``clientPortAddress``; default ``127.0.0.1``, an
    IPv4 literal such as ``127.0.0.21`` otherwise).
    ``stop()`` then ``start()`` keeps port and data, so sessions survive a
    restart that is shorter than their timeout.

    :raises ServerNotInstalledError: from ``start()`` when Java or the ZooKeeper
        jars are missing.
    :raises ServerStartError: from ``start()`` when it does not get ready.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        tick_time: int = 200,
        min_session_timeout: int = 400,
        max_session_timeout: int = 60000,
        container_check_interval: int = 500,
        extra_config: dict[str, str] | None = None,
        jvm_options: Sequence[str] = (),
        base_dir: Path | None = None,
        startup_timeout: float = 30.0,
        tls: TlsFiles | None = None,
        host: str = LOCALHOST,
    ) -> None:
        """See the class doc; ``tls``: also serve TLS on :attr:`tls_port`.

        With ``tls`` the server listens on a ``secureClientPort`` (Netty) with
        ``tls.server_cert``, trusts ``tls.ca_cert`` and asks clients for a
        certificate (``ssl.clientAuth=want``: one signed by another authority
        is refused, none at all is accepted).
        """
        self.tls_port = free_port(_check_host(host)) if tls is not None else 0
        extra = dict(extra_config or {})
        if tls is not None:
            extra.update(_zookeeper_tls_config(tls, self.tls_port))
        super().__init__(
            port=port,
            base_dir=base_dir,
            startup_timeout=startup_timeout,
            tick_time=tick_time,
            min_session_timeout=min_session_timeout,
            max_session_timeout=max_session_timeout,
            container_check_interval=container_check_interval,
            extra_config=extra,
            jvm_options=jvm_options,
            host=host,
        )

    @classmethod
    def external(cls, hosts: str) -> ZooKeeperServer:
        """Describe a ZooKeeper that runs elsewhere (``"host:port"`` or ``"zk://host:port"``).

        ``hosts`` and ``url`` cover every address given; ``host``/``port`` are
        the first one. ``managed`` is ``False``; start/stop/kill raise
        :class:`ServerNotManagedError`.
        """
        addresses = _split_hosts(hosts, "zk")
        host, port = addresses[0]
        server = cls.__new__(cls)
        _ZooKeeperProcess.__init__(
            server,
            port=port,
            base_dir=None,
            startup_timeout=0.0,
            tick_time=0,
            min_session_timeout=0,
            max_session_timeout=0,
            container_check_interval=0,
            extra_config=None,
            jvm_options=(),
            managed=False,
            host=host,
        )
        server._external_hosts = _join_hosts(addresses)
        return server

    _external_hosts: str | None = None

    @property
    def hosts(self) -> str:
        """The connection string, ``"127.0.0.1:<port>"`` (or the external list)."""
        return self._external_hosts or f"{self._host}:{self._port}"


# An ensemble of one runs in standalone mode (standaloneEnabled=true).
_LEADING: Final = frozenset({"leader", "standalone"})


@final
class ZooKeeperEnsembleMember(_ZooKeeperProcess):
    """One server of a :class:`ZooKeeperEnsemble` (``QuorumPeerMain``).

    Stop, kill and start it individually to test leader loss and rejoining:
    ``ensemble.leader().kill()``. ``start()`` of a single member waits until
    it serves, which needs a quorum of running members.
    """

    _main_class = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

    def __init__(
        self,
        server_id: int,
        *,
        port: int,
        quorum_port: int,
        election_port: int,
        ensemble: ZooKeeperEnsemble,
        tick_time: int,
        min_session_timeout: int,
        max_session_timeout: int,
        container_check_interval: int,
        extra_config: dict[str, str] | None,
        jvm_options: Sequence[str],
        base_dir: Path,
        startup_timeout: float,
        host: str = LOCALHOST,
    ) -> None:
        super().__init__(
            port=port,
            base_dir=base_dir,
            startup_timeout=startup_timeout,
            tick_time=tick_time,
            min_session_timeout=min_session_timeout,
            max_session_timeout=max_session_timeout,
            container_check_interval=container_check_interval,
            extra_config=extra_config,
            jvm_options=jvm_options,
            host=host,
        )
        self.server_id: Final = server_id
        """The ``myid`` of this member (1-based)."""
        self.quorum_port: Final = quorum_port
        """The port followers use to talk to the leader."""
        self.election_port: Final = election_port
        """The leader-election port."""
        self._ensemble = ensemble

    def _describe(self) -> str:
        return f"zookeeper member {self.server_id} on {self._host}:{self._port}"

    def _config_lines(self, data_dir: Path) -> list[str]:
        lines = super()._config_lines(data_dir)
        route = self._ensemble.peer_route
        for member in self._ensemble.members:
            host, quorum, election = member.host, member.quorum_port, member.election_port
            if route is not None and member is not self:
                # how *this* member reaches that one (e.g. through a fault proxy)
                host, quorum = route(self.server_id, member.server_id, member.quorum_port)
                _, election = route(self.server_id, member.server_id, member.election_port)
            lines.append(f"server.{member.server_id}={host}:{quorum}:{election}")
        return lines

    def _prepare(self, directory: Path) -> None:
        super()._prepare(directory)
        (directory / "data" / "myid").write_text(f"{self.server_id}\n")

    def is_leader(self) -> bool:
        """Whether ``srvr`` says ``Mode: leader`` (or ``standalone`` in an ensemble of one)."""
        return self.mode() in _LEADING


@final
class ZooKeeperEnsemble(_Ensemble[ZooKeeperEnsembleMember]):
    """A ZooKeeper ensemble of ``size`` servers on localhost (default 3).

    ::

        with ZooKeeperEnsemble() as ensemble:
            client = aiozk.ZKClient(ensemble.hosts)
            ...
            ensemble.leader().kill()
            ensemble.wait_for_leader()

    ``start()`` returns once a quorum elected a leader and every member
    serves. Members share the single-server settings (``tickTime=200``,
    sessions 400 ms .. 60 s, ``initLimit=20``/``syncLimit=10`` ticks).

    ``peer_route(from_id, to_id, port)`` -> ``(host, port)``, when given, says
    where member ``from_id`` dials the quorum or election ``port`` of member
    ``to_id`` (each member has its own ``zoo.cfg``): put a
    :class:`~aiolocks.testing.TcpProxy` per ordered pair of members there and
    a partition between members is a proxy rule. It is called at every
    (re)start of a member and must answer the same each time.

    ``host`` is the address the members bind to (client port, and the quorum
    and election ports they list for themselves in ``server.N``): one IPv4
    literal for all (default ``127.0.0.1``) or one per member, in server-id
    order, e.g. ``["127.0.0.21", "127.0.0.22", "127.0.0.23"]``: each member
    on its own loopback address, as on separate machines.
    """

    _title = "ZooKeeper ensemble"
    _dir_kind = "zk-ensemble"

    def __init__(
        self,
        size: int = 3,
        *,
        tick_time: int = 200,
        min_session_timeout: int = 400,
        max_session_timeout: int = 60000,
        container_check_interval: int = 500,
        extra_config: dict[str, str] | None = None,
        jvm_options: Sequence[str] = (),
        base_dir: Path | None = None,
        startup_timeout: float = 60.0,
        peer_route: Callable[[int, int, int], tuple[str, int]] | None = None,
        host: str | Sequence[str] = LOCALHOST,
    ) -> None:
        if size < 1:
            raise ValueError(f"an ensemble needs at least one server, not {size}")
        self._hosts = _hosts_for(host, size, "member")
        self.peer_route: Final = peer_route
        """How members reach each other (``None``: directly); see the class docstring."""
        super().__init__(size, base_dir=base_dir, startup_timeout=startup_timeout)
        self._external_hosts: str | None = None
        self._settings = {
            "tick_time": tick_time,
            "min_session_timeout": min_session_timeout,
            "max_session_timeout": max_session_timeout,
            "container_check_interval": container_check_interval,
        }
        self._extra_config = extra_config
        self._jvm_options = tuple(jvm_options)

    @classmethod
    def external(cls, hosts: str) -> ZooKeeperEnsemble:
        """Describe an ensemble that runs elsewhere (``"h1:p1,h2:p2,h3:p3"`` or ``zk://...``).

        It has no members to control; ``managed`` is ``False``.
        """
        ensemble = cls(size=1)
        ensemble._managed = False
        ensemble._external_hosts = _join_hosts(_split_hosts(hosts, "zk"))
        return ensemble

    @property
    def members(self) -> Sequence[ZooKeeperEnsembleMember]:
        """The members, ordered by server id (empty for an external ensemble)."""
        return tuple(self._members)

    @property
    def hosts(self) -> str:
        """The connection string ``"127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"``."""
        if self._external_hosts is not None:
            return self._external_hosts
        return _join_hosts([(member.host, member.port) for member in self._members])

    @property
    def url(self) -> str:
        """The aiolocks URL, ``"zk://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"``."""
        return f"zk://{self.hosts}"

    def _address_text(self) -> str:
        return self.hosts

    def _make_members(self, directory: Path) -> list[ZooKeeperEnsembleMember]:
        return [
            ZooKeeperEnsembleMember(
                server_id,
                port=free_port(host),
                quorum_port=free_port(host),
                election_port=free_port(host),
                ensemble=self,
                extra_config=self._extra_config,
                jvm_options=self._jvm_options,
                base_dir=directory,
                startup_timeout=self._startup_timeout,
                host=host,
                **self._settings,
            )
            for server_id, host in enumerate(self._hosts, start=1)
        ]

    def _member_state(self, member: ZooKeeperEnsembleMember) -> bool | None:
        mode = member.mode()
        return None if mode is None else mode in _LEADING

    def _member_leads(self, member: ZooKeeperEnsembleMember) -> bool:
        return member.is_leader()

    def followers(self) -> list[ZooKeeperEnsembleMember]:
        """The running members whose ``srvr`` says ``Mode: follower``."""
        self._require_managed()
        return [m for m in self._members if m.running and m.mode() == "follower"]

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.hosts}>"


# --------------------------------------------------------------------------- Redis


class _RedisProcess(_ServerProcess):
    """Shared RESP helpers of Redis servers and sentinels."""

    _password: str | None = None
    _username: str | None = None
    _tls = False

    def command(self, *args: str | int | bytes, timeout: float = 5.0) -> RespValue:
        """Run one command on this server over a fresh connection and return the decoded reply.

        >>> server.command("CONFIG", "RESETSTAT")  # doctest: +SKIP
        'OK'

        :raises ServerCommandError: the server answered with an error.
        """
        if self._tls:
            raise ServerError(f"command() does not speak TLS ({self._describe()}); use a client")
        with _RespConnection(self._host, self._port, timeout) as conn:
            if self._password is not None:
                if self._username is not None:
                    conn.call("AUTH", self._username, self._password)
                else:
                    conn.call("AUTH", self._password)
            return conn.call(*args)

    def info(self, section: str | None = None, *, timeout: float = 5.0) -> dict[str, str]:
        """``INFO [section]`` parsed into ``{"field": "value"}`` (e.g. ``info("replication")``)."""
        reply = self.command("INFO", section, timeout=timeout) if section else self.command("INFO")
        return _parse_info(reply)

    def ping(self, *, timeout: float = 2.0) -> bool:
        """Whether the server answers ``PING`` with ``PONG`` right now."""
        try:
            return self.command("PING", timeout=timeout) == "PONG"
        except (OSError, ServerError):
            return False

    def _probe(self) -> bool:
        return self.command("PING", timeout=2.0) == "PONG"

    def _output_path(self, directory: Path) -> Path:
        return directory / f"{self.kind}.log"

    def _log_files(self) -> list[Path]:
        if self._dir is None:
            return []
        # stdout.log catches what the server prints before it opens its log.
        return [self._dir / "stdout.log", self._output_path(self._dir)]

    def _spawn_log_path(self, directory: Path) -> Path:
        return directory / "stdout.log"  # the server writes its own log file


@final
class RedisServer(_RedisProcess):
    """A ``redis-server`` on a free port in a temporary folder, without persistence.

    ::

        with RedisServer() as redis_server:
            client = redis.asyncio.Redis.from_url(redis_server.url)
            ...
            redis_server.kill()
            redis_server.start()   # same port, empty data

    Runs ``redis-server --port P --bind 127.0.0.1 --save "" --appendonly no
    --dir <tmp> --logfile <tmp>/redis.log --daemonize no`` plus ``extra_args``
    (e.g. ``("--replicaof", "127.0.0.1", "6379")``). A restart loses all data.
    With ``host="127.0.0.21"`` (an IPv4 literal) it binds that address
    instead and, as a replica, announces it to its primary
    (``--replica-announce-ip``): the primary would otherwise see the
    connection's source address, ``127.0.0.1``. With ``announce=(ip, port)``
    it announces that address instead (``--replica-announce-ip/-port``): the
    address of a :class:`~aiolocks.testing.TcpProxy` in front of it, which
    its primary, the Sentinels and so the clients then use.

    :raises ServerNotInstalledError: from ``start()`` when ``redis-server`` is missing.
    :raises ServerStartError: from ``start()`` when it does not answer ``PING``.
    """

    kind = "redis"

    def __init__(
        self,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        base_dir: Path | None = None,
        startup_timeout: float = 15.0,
        password: str | None = None,
        acl_users: Sequence[str] = (),
        tls: TlsFiles | None = None,
        host: str = LOCALHOST,
        announce: tuple[str, int] | None = None,
    ) -> None:
        """See the class docstring (``host``: the address it binds, ``announce``: the
        address it tells others, default its own); the security options:

        :param password: ``requirepass``: the ``default`` user's password
            (``command()`` and the start-up probe use it)
        :param acl_users: ACL rules, one user each (``"alice on >pw ~k:* &k:* +@all"``)
        :param tls: also listen with TLS on :attr:`tls_port`, with these
            certificates; clients must present a certificate of the same CA
        """
        super().__init__(port=port, base_dir=base_dir, startup_timeout=startup_timeout, host=host)
        if announce is not None:
            ip, announced_port = announce
            if not isinstance(announced_port, int) or not 0 < announced_port < 65536:
                raise ValueError(f"announce: the port must be 1-65535, not {announced_port!r}")
            announce = (_check_host(ip), announced_port)
        self._announce = announce
        self._extra_args = list(extra_args)
        self._external_url: str | None = None
        self._password = password
        self._acl_users = list(acl_users)
        self._tls_files = tls
        #: the TLS port (0: no TLS)
        self.tls_port = free_port(self._host) if tls is not None else 0

    @classmethod
    def external(cls, url: str) -> RedisServer:
        """Describe a Redis that runs elsewhere (``"redis://[[user]:password@]host:port[/db]"``).

        ``command()`` and ``info()`` work on it (with the URL's credentials; not over TLS);
        ``managed`` is ``False`` and start/stop/kill raise
        :class:`ServerNotManagedError`.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"expected a redis://host:port URL, got {url!r}")
        server = cls.__new__(cls)
        _RedisProcess.__init__(
            server,
            port=parts.port or 6379,
            base_dir=None,
            startup_timeout=0.0,
            managed=False,
            host=parts.hostname,
        )
        server._extra_args = []
        server._external_url = url
        server._tls = parts.scheme == "rediss"
        if parts.password is not None:
            server._password = unquote(parts.password)
            server._username = unquote(parts.username) if parts.username else None
        return server

    @property
    def url(self) -> str:
        """``"redis://127.0.0.1:<port>"`` (or the external URL as given)."""
        return self._external_url or f"redis://{self._host}:{self._port}"

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``."""
        return (self._host, self._port)

    @property
    def announced(self) -> tuple[str, int]:
        """Where others reach it: ``announce=`` if given, else its host and served port.

        The served port is the TLS port when it serves TLS, else :attr:`port`.
        """
        return self._announce or (self._host, _served_port(self))

    def _command(self) -> list[str]:
        binary = _find_binary("AIOLOCKS_REDIS_SERVER", "redis-server", "redis-server")
        return [binary, *self._base_args(), *self._security_args(), *self._extra_args]

    def _security_args(self) -> list[str]:
        args: list[str] = []
        if self._password is not None:
            args += ["--requirepass", self._password]
        for rule in self._acl_users:
            args += ["--user", *rule.split()]
        tls = self._tls_files
        if tls is not None:
            args += [
                "--tls-port", str(self.tls_port),
                "--tls-cert-file", str(tls.server_cert),
                "--tls-key-file", str(tls.server_key),
                "--tls-ca-cert-file", str(tls.ca_cert),
                "--tls-auth-clients", "yes",
                # what it presents when it dials (replication, cluster bus)
                "--tls-client-cert-file", str(tls.client_cert),
                "--tls-client-key-file", str(tls.client_key),
            ]  # fmt: skip
        return args

    def _base_args(self) -> list[str]:
        # on its own address: a primary must learn it (not the source address 127.0.0.1)
        announce = ["--replica-announce-ip", self._host] if self._host != LOCALHOST else []
        if self._announce is not None:
            ip, port = self._announce
            announce = ["--replica-announce-ip", ip, "--replica-announce-port", str(port)]
        return [
            *announce,
            "--port",
            str(self._port),
            "--bind",
            self._host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            ".",  # the process runs in its folder (cwd)
            "--logfile",
            "redis.log",
            "--daemonize",
            "no",
            # Replicas sync at once (the default waits 5 s for more replicas).
            "--repl-diskless-sync-delay",
            "0",
            # Tests may use DEBUG SLEEP and friends (Redis 7 blocks DEBUG by default).
            "--enable-debug-command",
            "local",
        ]


def _served_port(process: RedisServer | RedisSentinel) -> int:
    """The port clients are sent to: the TLS port when the process serves TLS."""
    return process.tls_port or process.port


@final
class RedisSentinel(_RedisProcess):
    """One ``redis-sentinel`` process of a :class:`RedisSentinelSet`.

    ``command()`` talks to the sentinel (``SENTINEL ...`` commands).
    """

    kind = "sentinel"

    def __init__(
        self,
        *,
        service_name: str,
        master: RedisServer,
        quorum: int,
        down_after_ms: int,
        failover_timeout_ms: int,
        base_dir: Path,
        startup_timeout: float,
        password: str | None = None,
        auth_pass: str | None = None,
        tls: TlsFiles | None = None,
        host: str = LOCALHOST,
    ) -> None:
        super().__init__(port=None, base_dir=base_dir, startup_timeout=startup_timeout, host=host)
        self._tls_files = tls
        #: the TLS port (0: no TLS); with TLS, the port it announces and monitors by
        self.tls_port = free_port(self._host) if tls is not None else 0
        #: the sentinels' own password (requirepass; they use it between them too)
        self._password = password
        #: the data servers' password
        self._auth_pass = auth_pass
        self._service_name = service_name
        self._master = master
        self._quorum = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self.run_id: Final = secrets.token_hex(20)
        """The sentinel's ``myid``, fixed up front so peers can be pre-announced."""
        self._peers: list[RedisSentinel] = []
        self._known_replicas: list[RedisServer] = []

    def _prepare(self, directory: Path) -> None:
        config = directory / "sentinel.conf"
        if config.exists() and self._started_once:
            return  # the sentinel rewrote it with what it learned; keep that on restart
        name = self._service_name
        lines = [
            f"port {self._port}",
            f"bind {self._host}",
            "daemonize no",
            f"dir {directory}",
            "logfile sentinel.log",
            f"sentinel myid {self.run_id}",
            # on its own address: its peers must learn it, not the source address
            *([f"sentinel announce-ip {self._host}"] if self._host != LOCALHOST else []),
            *self._tls_lines(),
            "sentinel monitor {} {} {} {}".format(name, *self._master.announced, self._quorum),
            f"sentinel down-after-milliseconds {name} {self._down_after_ms}",
            f"sentinel failover-timeout {name} {self._failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self._auth_pass is not None:
            lines.append(f"sentinel auth-pass {name} {self._auth_pass}")
        if self._password is not None:
            lines += [f"requirepass {self._password}", f"sentinel sentinel-pass {self._password}"]
        # Pre-announce the replica and the other sentinels (the lines a
        # sentinel itself writes on CONFIG REWRITE): otherwise discovery
        # waits for INFO and hello rounds, several seconds.
        lines.extend(
            "sentinel known-replica {} {} {}".format(name, *replica.announced)
            for replica in self._known_replicas
        )
        lines.extend(
            f"sentinel known-sentinel {name} {peer.host} {_served_port(peer)} {peer.run_id}"
            for peer in self._peers
        )
        config.write_text("\n".join(lines) + "\n")

    def _tls_lines(self) -> list[str]:
        tls = self._tls_files
        if tls is None:
            return []
        # tls-replication: it talks TLS to the data servers and to its peers,
        # and announces its TLS port to them.
        return [
            f"tls-port {self.tls_port}",
            f"tls-cert-file {tls.server_cert}",
            f"tls-key-file {tls.server_key}",
            f"tls-client-cert-file {tls.client_cert}",
            f"tls-client-key-file {tls.client_key}",
            f"tls-ca-cert-file {tls.ca_cert}",
            "tls-auth-clients yes",
            "tls-replication yes",
        ]

    def _command(self) -> list[str]:
        binary = _find_binary("AIOLOCKS_REDIS_SENTINEL", "redis-sentinel", "redis-sentinel")
        return [binary, "sentinel.conf"]

    def master_address(self) -> tuple[str, int] | None:
        """``SENTINEL GET-MASTER-ADDR-BY-NAME``: what this sentinel thinks the master is."""
        reply = self.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._service_name)
        if isinstance(reply, list) and len(reply) == 2:
            return (str(reply[0]), int(str(reply[1])))
        return None

    def master_state(self) -> dict[str, RespValue]:
        """``SENTINEL MASTER <name>`` as a dict (``flags``, ``num-slaves``, ...)."""
        return _pairs(self.command("SENTINEL", "MASTER", self._service_name))


@final
class RedisSentinelSet(_Launcher):
    """A Redis master, one replica and three sentinels watching them.

    ::

        with RedisSentinelSet() as sentinel_set:
            backend_url = sentinel_set.url   # redis+sentinel://127.0.0.1:s1,.../mymaster
            ...
            new_master = sentinel_set.kill_master()

    Sentinels use quorum 2, ``down-after-milliseconds`` 1000 and
    ``failover-timeout`` 3000. ``start()`` returns once the replica is in sync
    and every sentinel knows the master, the replica and the other sentinels
    (which failover needs).

    With ``tls`` every process also serves TLS (``tls-replication yes``: the
    replica and the sentinels talk TLS to the master and to each other) and
    :attr:`url`, :attr:`sentinel_addresses` and what the sentinels report
    name the TLS ports; add the ``ssl=true&ssl_ca_certs=...`` options to the
    URL. The plain ports stay open for the launcher's own probes
    (``command()`` speaks plain RESP only).

    ``host`` is the address the processes bind to: one IPv4 literal for all
    (default ``127.0.0.1``) or one per process, in the order master,
    replica, then each sentinel (``2 + sentinels`` addresses). A process on
    an address other than ``127.0.0.1`` announces it (``replica-announce-ip``,
    ``sentinel announce-ip``), so what the sentinels report names it.

    ``route(index, host, port)`` -> ``(host, port)``, when given, says where
    the sentinels, the replica and the clients reach data server ``index``
    (0: the first master, 1: the first replica), e.g. a
    :class:`~aiolocks.testing.TcpProxy` in front of it: the data servers
    announce that address, the sentinels monitor it and report it, so every
    path to a data server is a proxy rule. It is called once per data server,
    before that server starts.
    """

    def __init__(
        self,
        service_name: str = "mymaster",
        *,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        base_dir: Path | None = None,
        startup_timeout: float = 30.0,
        password: str | None = None,
        sentinel_password: str | None = None,
        tls: TlsFiles | None = None,
        host: str | Sequence[str] = LOCALHOST,
        route: Callable[[int, str, int], tuple[str, int]] | None = None,
    ) -> None:
        """See the class docstring; ``password`` is the master's and the replica's
        (``requirepass``/``masterauth``), ``sentinel_password`` the sentinels' own,
        ``tls`` the certificates of every process (clients must present one of its CA),
        ``host`` the address of each process, ``route`` how the data servers are reached."""
        self._hosts = _hosts_for(host, 2 + sentinels, "process (master, replica, sentinels)")
        if route is not None and tls is not None:
            raise ValueError("route and tls cannot be combined (the route names a plain port)")
        self._route = route
        self._password = password
        self._tls = tls
        self._sentinel_password = sentinel_password
        self.service_name: Final = service_name
        """The monitored service name (``"mymaster"``)."""
        self._count = sentinels
        self._quorum = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._base_dir = base_dir
        self._startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._master: RedisServer | None = None
        self._replica: RedisServer | None = None
        self._sentinels: list[RedisSentinel] = []
        self._external_url: str | None = None

    @classmethod
    def external(cls, url: str) -> RedisSentinelSet:
        """Describe sentinels that run elsewhere (``"redis+sentinel://h:p,h:p/name"``).

        Only ``url``, ``service_name`` and ``sentinel_addresses`` are meaningful.
        """
        rest = url.partition("://")[2]
        name = rest.partition("/")[2] or "mymaster"
        _split_hosts(url, "redis+sentinel")  # validates
        sentinel_set = cls(name)
        sentinel_set._external_url = url
        return sentinel_set

    @property
    def managed(self) -> bool:
        """``True`` when we run the processes, ``False`` for external sentinels."""
        return self._external_url is None

    def _require_managed(self) -> None:
        if self._external_url is not None:
            raise ServerNotManagedError(
                f"the sentinels at {self._external_url} are external; they cannot be controlled"
            )

    def _require_started(self) -> tuple[RedisServer, RedisServer]:
        self._require_managed()
        if self._master is None or self._replica is None:
            raise ServerError("the sentinel set was not started")
        return self._master, self._replica

    @property
    def master(self) -> RedisServer:
        """The current master (after :meth:`kill_master` it is the former replica)."""
        return self._require_started()[0]

    @property
    def replica(self) -> RedisServer:
        """The current replica (after :meth:`kill_master`, the dead former master)."""
        return self._require_started()[1]

    @property
    def sentinels(self) -> Sequence[RedisSentinel]:
        """The sentinel processes."""
        return tuple(self._sentinels)

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """``[(host, port), ...]`` of the sentinels."""
        if self._external_url is not None:
            return _split_hosts(self._external_url, "redis+sentinel")
        return [(sentinel.host, _served_port(sentinel)) for sentinel in self._sentinels]

    @property
    def url(self) -> str:
        """``"redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/mymaster"``."""
        if self._external_url is not None:
            return self._external_url
        return f"redis+sentinel://{_join_hosts(self.sentinel_addresses)}/{self.service_name}"

    def start(self) -> Self:
        """Start master, replica and sentinels; wait until the sentinels see everything.

        :raises ServerNotInstalledError: ``redis-server`` or ``redis-sentinel`` is missing.
        :raises ServerStartError: a process did not start.
        :raises TimeoutError: the sentinels did not discover the set in time.
        """
        self._require_managed()
        if self._master is not None:
            # Restart after stop(): data servers first, then the sentinels,
            # which kept what they learned in their rewritten configs.
            for process in [self._master, self._replica, *self._sentinels]:
                if process is not None:
                    process.start()
            _wait_until("the sentinels know the whole set", self._settled, self._startup_timeout)
            return self
        self._dir = _make_dir("sentinel-set", self._base_dir)
        try:
            auth = self._password
            common = [
                *(("--masterauth", auth) if auth else ()),
                *(("--tls-replication", "yes") if self._tls else ()),
            ]
            master = RedisServer(
                base_dir=self._dir,
                startup_timeout=self._startup_timeout,
                password=auth,
                extra_args=common,
                tls=self._tls,
                **self._placed(0),
            )
            self._master = master
            master.start()
            replica = RedisServer(
                extra_args=("--replicaof", *map(str, master.announced), *common),
                base_dir=self._dir,
                startup_timeout=self._startup_timeout,
                password=auth,
                tls=self._tls,
                **self._placed(1),
            )
            self._replica = replica
            replica.start()
            _wait_until(
                "the replica is in sync",
                lambda: replica.info("replication").get("master_link_status") == "up",
                self._startup_timeout,
            )
            self._sentinels = [
                RedisSentinel(
                    service_name=self.service_name,
                    master=master,
                    quorum=self._quorum,
                    down_after_ms=self._down_after_ms,
                    failover_timeout_ms=self._failover_timeout_ms,
                    base_dir=self._dir,
                    startup_timeout=self._startup_timeout,
                    password=self._sentinel_password,
                    auth_pass=auth,
                    tls=self._tls,
                    host=host,
                )
                for host in self._hosts[2:]
            ]
            for sentinel in self._sentinels:
                sentinel._peers = [peer for peer in self._sentinels if peer is not sentinel]
                sentinel._known_replicas = [replica]
            for sentinel in self._sentinels:
                sentinel.start(wait=False)
            for sentinel in self._sentinels:
                sentinel.wait_ready()
            _wait_until("the sentinels know the whole set", self._settled, self._startup_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _placed(self, index: int) -> dict[str, Any]:
        """``host``, and with a route ``port`` and ``announce``, of data server ``index``."""
        host = self._hosts[index]
        if self._route is None:
            return {"host": host}
        port = free_port(host)
        return {"host": host, "port": port, "announce": self._route(index, host, port)}

    def _settled(self) -> bool:
        master = self._master
        assert master is not None
        for sentinel in self._sentinels:
            state = sentinel.master_state()
            if state.get("port") != str(master.announced[1]) or state.get("flags") != "master":
                return False
            if int(str(state.get("num-slaves", 0))) < 1:
                return False
            if int(str(state.get("num-other-sentinels", 0))) < len(self._sentinels) - 1:
                return False
        return True

    def kill_master(self, *, timeout: float = 30.0) -> RedisServer:
        """SIGKILL the master and wait until every sentinel reports the replica as master.

        Afterwards :attr:`master` is the promoted server and :attr:`replica` the
        dead one (``replica.start()`` brings it back; the sentinels then turn
        it into a replica of the new master).

        :returns: the new master.
        :raises TimeoutError: no failover within ``timeout`` seconds.
        """
        old_master, new_master = self._require_started()
        old_master.kill()
        expected = new_master.announced

        def failed_over() -> bool:
            if any(s.master_address() != expected for s in self._sentinels if s.running):
                return False
            return new_master.info("replication").get("role") == "master"

        _wait_until("the sentinels promoted the replica", failed_over, timeout, interval=0.1)
        self._master, self._replica = new_master, old_master
        return new_master

    def _processes(self) -> list[_ServerProcess]:
        return [p for p in (*self._sentinels, self._replica, self._master) if p is not None]

    def __repr__(self) -> str:
        return f"<RedisSentinelSet {self.url}>"


_CLUSTER_SLOTS: Final = 16384


@final
class RedisCluster(_Launcher):
    """A Redis Cluster of ``masters`` nodes (default 3) on localhost, each with ``replicas``.

    ::

        with RedisCluster() as cluster:
            backend_url = cluster.url   # redis+cluster://127.0.0.1:p1,...

    Slots are split evenly; the nodes are introduced with ``CLUSTER MEET``
    (no ``redis-cli`` needed). ``start()`` returns once every node reports
    ``cluster_state:ok`` and knows every other node. Nodes use
    ``cluster-node-timeout`` 2000 ms and an explicit ``--cluster-port``.

    With ``replicas=n`` each master gets ``n`` replicas (``CLUSTER
    REPLICATE``; asynchronous replication): :attr:`nodes` lists the masters
    first, then the replicas of the first master, of the second, and so on.
    ``start()`` then also waits until every replica's link is up. Roles change
    on failover: ask a node (``node.info("replication")["role"]``).

    With ``tls`` the nodes also serve TLS and speak it on the cluster bus
    (``--tls-cluster yes``); they announce their TLS ports, which
    :attr:`url` and :attr:`addresses` name (add the ``ssl=true&...``
    options). The plain ports stay open for the launcher's own probes.

    ``host`` is the address the nodes bind to: one IPv4 literal for all
    (default ``127.0.0.1``) or one per node, in the order of :attr:`nodes`.
    A node on an address other than ``127.0.0.1`` announces it
    (``--cluster-announce-ip``, ``--replica-announce-ip``): its peers would
    otherwise record the connection's source address, ``127.0.0.1``.

    ``route(index, host, port)`` -> ``(host, port)``, when given, says where
    node ``index`` is reached at its client ``port`` and at its cluster bus
    port (it is called for each, before the node starts; both answers must
    name the same address, since a node announces one): e.g. two
    :class:`~aiolocks.testing.TcpProxy` in front of it. The node announces
    them (``--cluster-announce-ip/-port/-bus-port``), so clients, replicas
    and the other nodes all reach it through them; :attr:`addresses` names
    them. Not with ``tls``.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 2000,
        base_dir: Path | None = None,
        startup_timeout: float = 30.0,
        tls: TlsFiles | None = None,
        host: str | Sequence[str] = LOCALHOST,
        route: Callable[[int, str, int], tuple[str, int]] | None = None,
    ) -> None:
        """See the class docstring; ``tls``: the nodes' certificates (clients
        must present one of the same CA); ``host``: the nodes' addresses;
        ``route``: where each node is reached."""
        if route is not None and tls is not None:
            raise ValueError("route and tls cannot be combined (the route names a plain port)")
        self._route = route
        self._bus_ports: list[int] = []
        if masters < 1:
            raise ValueError(f"a cluster needs at least one master, not {masters}")
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, not {replicas}")
        self._hosts = _hosts_for(host, masters * (1 + replicas), "node")
        self._count = masters
        self._replicas = replicas
        self._tls = tls
        self._node_timeout_ms = node_timeout_ms
        self._base_dir = base_dir
        self._startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._nodes: list[RedisServer] = []
        self._external_url: str | None = None

    @classmethod
    def external(cls, url: str) -> RedisCluster:
        """Describe a cluster that runs elsewhere (``"redis+cluster://h:p,h:p,h:p"``)."""
        _split_hosts(url, "redis+cluster")  # validates
        cluster = cls()
        cluster._external_url = url
        return cluster

    @property
    def managed(self) -> bool:
        """``True`` when we run the nodes, ``False`` for an external cluster."""
        return self._external_url is None

    @property
    def nodes(self) -> Sequence[RedisServer]:
        """The node servers (empty for an external cluster)."""
        return tuple(self._nodes)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``[(host, port), ...]`` of the nodes."""
        if self._external_url is not None:
            return _split_hosts(self._external_url, "redis+cluster")
        return [node.announced for node in self._nodes]

    @property
    def url(self) -> str:
        """``"redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"``."""
        return self._external_url or f"redis+cluster://{_join_hosts(self.addresses)}"

    def start(self) -> Self:
        """Start the nodes, assign slots, join them and wait for ``cluster_state:ok``.

        :raises ServerNotInstalledError: ``redis-server`` is missing.
        :raises ServerStartError: a node did not start.
        :raises TimeoutError: the cluster did not reach ``cluster_state:ok`` in time.
        """
        if self._external_url is not None:
            raise ServerNotManagedError(f"the cluster at {self._external_url} is external")
        if self._nodes:
            for node in self._nodes:
                node.start()
            self._wait_ok()
            return self
        self._dir = _make_dir("cluster", self._base_dir)
        self._bus_ports = []
        try:
            self._nodes = [self._make_node(index, host) for index, host in enumerate(self._hosts)]
            for node in self._nodes:
                node.start(wait=False)
            for node in self._nodes:
                node.wait_ready()
            # What `redis-cli --cluster create` does: distinct config epochs
            # (no epoch-collision round), slots in even ranges, then MEET.
            bounds = [_CLUSTER_SLOTS * i // self._count for i in range(self._count + 1)]
            for index, node in enumerate(self._nodes[: self._count]):
                node.command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                node.command("CLUSTER", "ADDSLOTS", *range(bounds[index], bounds[index + 1]))
            first = self._nodes[0]
            for node, bus_port in zip(self._nodes[1:], self._bus_ports[1:], strict=True):
                first.command("CLUSTER", "MEET", *node.announced, bus_port)
            self._attach_replicas()
            self._wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def _make_node(self, index: int, host: str) -> RedisServer:
        """Node ``index`` (not started); its bus port, as peers reach it, goes to ``_bus_ports``."""
        assert self._dir is not None
        # The cluster bus gets its own free port (not port + 10000, which
        # might be taken or above 65535); MEET must then name it.
        bus_port = free_port(host)
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self._node_timeout_ms),
            "--cluster-port", str(bus_port),
        ]  # fmt: skip
        if self._tls:
            args += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        common: dict[str, Any] = {
            "base_dir": self._dir,
            "startup_timeout": self._startup_timeout,
            "tls": self._tls,
            "host": host,
        }
        if self._route is None:
            if host != LOCALHOST:
                args += ["--cluster-announce-ip", host]
            self._bus_ports.append(bus_port)
            return RedisServer(extra_args=args, **common)
        port = free_port(host)
        ip, announced_port = self._route(index, host, port)
        bus_ip, announced_bus = self._route(index, host, bus_port)
        if bus_ip != ip:
            raise ValueError(
                f"route: node {index}'s ports must be on one address, not {ip} and {bus_ip}"
            )
        args += [
            "--cluster-announce-ip", ip,
            "--cluster-announce-port", str(announced_port),
            "--cluster-announce-bus-port", str(announced_bus),
        ]  # fmt: skip
        self._bus_ports.append(announced_bus)
        return RedisServer(extra_args=args, port=port, announce=(ip, announced_port), **common)

    def _attach_replicas(self) -> None:
        """``CLUSTER REPLICATE`` each replica to its master, once it knows that master."""
        if not self._replicas:
            return
        masters = self._nodes[: self._count]
        ids = [str(master.command("CLUSTER", "MYID")) for master in masters]
        for index, node in enumerate(self._nodes[self._count :]):
            master_id = ids[index // self._replicas]

            def knows(node: RedisServer = node, master_id: str = master_id) -> bool:
                return master_id in str(node.command("CLUSTER", "NODES"))

            _wait_until("a replica knows its master", knows, self._startup_timeout)
            node.command("CLUSTER", "REPLICATE", master_id)

        def linked() -> bool:
            return all(
                node.info("replication").get("master_link_status") == "up"
                for node in self._nodes[self._count :]
            )

        _wait_until("every replica is in sync", linked, self._startup_timeout)

    def _wait_ok(self) -> None:
        def healthy() -> bool:
            for node in self._nodes:
                info = _parse_info(node.command("CLUSTER", "INFO"))
                if info.get("cluster_state") != "ok":
                    return False
                if int(info.get("cluster_known_nodes", "0")) != len(self._nodes):
                    return False
                if int(info.get("cluster_slots_ok", "0")) != _CLUSTER_SLOTS:
                    return False
            return True

        _wait_until("every cluster node says cluster_state:ok", healthy, self._startup_timeout)

    def _processes(self) -> list[_ServerProcess]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"<RedisCluster {self.url}>"


@final
class RedisServerGroup(_Launcher):
    """``count`` independent Redis servers (default 5), e.g. the masters of Redlock.

    ::

        with RedisServerGroup(5) as group:
            backend_urls = group.urls
    """

    def __init__(
        self,
        count: int = 5,
        *,
        base_dir: Path | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        self._count = count
        self._base_dir = base_dir
        self._startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._servers: list[RedisServer] = []
        self._external = False

    @classmethod
    def external(cls, urls: Sequence[str]) -> RedisServerGroup:
        """Describe independent servers that run elsewhere (``redis://`` URLs)."""
        group = cls(len(urls))
        group._servers = [RedisServer.external(url) for url in urls]
        group._external = True
        return group

    @property
    def managed(self) -> bool:
        """``True`` when we run the servers, ``False`` for external ones."""
        return not self._external

    @property
    def servers(self) -> Sequence[RedisServer]:
        """The servers."""
        return tuple(self._servers)

    @property
    def urls(self) -> list[str]:
        """``["redis://127.0.0.1:p1", ...]``."""
        return [server.url for server in self._servers]

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self._servers)

    def __len__(self) -> int:
        return len(self._servers)

    def __getitem__(self, index: int) -> RedisServer:
        return self._servers[index]

    def start(self) -> Self:
        """Start every server (in parallel) and wait until each answers ``PING``."""
        if self._external:
            raise ServerNotManagedError("these Redis servers are external")
        if not self._servers:
            self._dir = _make_dir("redis-group", self._base_dir)
            self._servers = [
                RedisServer(base_dir=self._dir, startup_timeout=self._startup_timeout)
                for _ in range(self._count)
            ]
        try:
            for server in self._servers:
                server.start(wait=False)
            for server in self._servers:
                server.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _processes(self) -> list[_ServerProcess]:
        return list(self._servers)

    def __repr__(self) -> str:
        return f"<RedisServerGroup {self.urls}>"
