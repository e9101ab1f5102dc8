"""A throwaway PostgreSQL server and a pgbouncer in front of it, for tests.

Design note
-----------
Same recipe as every launcher (``aiolocks.testing._process``: free port below
the ephemeral range, private temporary folder, own process group, readiness
checked by protocol, stop by PID, ``atexit`` clean-up), with what PostgreSQL
needs on top:

* ``initdb`` and ``postgres`` refuse to run as root. When we are root they run
  as the ``postgres`` OS user (Debian's ``postgresql`` package creates it) and
  the temporary folder is handed to that user; otherwise they run as we are.
* The server is started as ``postgres -D ...`` directly rather than through
  ``pg_ctl``: ``pg_ctl`` daemonizes, and then the launcher would not own the
  process (no process group to signal, no death-with-parent). ``stop()`` sends
  SIGINT, PostgreSQL's "fast shutdown" (SIGTERM is its "smart shutdown", which
  waits for every client to leave); ``kill()`` is SIGKILL to the whole group,
  a crash followed by crash recovery at the next ``start()``.
* Settings chosen for tests: ``fsync=off`` and ``full_page_writes=off``, but
  ``synchronous_commit`` stays on: a commit still writes its WAL to the page
  cache before it answers (only the flush to disk is skipped), so a SIGKILL of
  the server, then a restart, keeps every committed row (a fencing epoch must
  survive a crash; with ``synchronous_commit=off`` the last commits sit in
  shared memory and die with the server). Trust
  authentication on 127.0.0.1, the Unix socket in the private folder,
  ``max_connections=200``.
* Readiness is a real login: a small standard-library client
  (:class:`PgWireConnection`) sends the startup message and waits for
  ``ReadyForQuery``; while the server is still starting or recovering it
  answers with an error instead. The same client runs the helper queries
  (``query()``, ``terminate_backends()``...) so that tests and the pytest
  plugin do not need a driver installed.

:class:`PgBouncer` runs ``pgbouncer`` (also as ``postgres`` when we are root)
with a generated ``pgbouncer.ini``: ``pool_mode = transaction`` by default,
trust authentication, every database forwarded to the given server, and the
``postgres`` user as admin, so that ``admin("SHOW POOLS")`` works.

Environment variables read here:

``AIOLOCKS_POSTGRES_BIN``
    the folder with ``initdb`` and ``postgres`` (default: the newest
    ``/usr/lib/postgresql/*/bin``, then ``pg_config --bindir``, then ``PATH``).
``AIOLOCKS_PGBOUNCER``
    the ``pgbouncer`` binary (default: ``PATH``, ``/usr/sbin``).
``AIOLOCKS_POSTGRES_OS_USER``
    the OS user that runs the servers when we are root (default ``postgres``).
"""

from __future__ import annotations

import base64
import contextlib
import glob
import hashlib
import hmac
import os
import pwd
import secrets
import shutil
import signal
import socket
import struct
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Self, final
from urllib.parse import unquote, urlsplit

from ._process import (
    INSTALL_HINT,
    LOCALHOST,
    ServerCommandError,
    ServerError,
    ServerNotInstalledError,
    _find_binary,
    _popen,
    _ServerProcess,
)

__all__ = [
    "PgBouncer",
    "PgWireConnection",
    "PostgresCommandError",
    "PostgresServer",
]

_PROTOCOL_VERSION: Final = 196608  # 3.0
_SUPERUSER: Final = "postgres"


class PostgresCommandError(ServerCommandError):
    """The server answered a query with an ``ErrorResponse``.

    ``sqlstate`` is the five-character SQLSTATE code (for example ``"57P01"``).
    """

    def __init__(self, message: str, *, sqlstate: str) -> None:
        super().__init__(f"{message} (SQLSTATE {sqlstate})")
        self.sqlstate = sqlstate


# --------------------------------------------------------------------------- wire client


def _cstring(text: str) -> bytes:
    return text.encode() + b"\0"


@final
class PgWireConnection:
    """A minimal, blocking PostgreSQL client (simple query protocol), standard library only.

    For launchers and test helpers, not for the library: text results only,
    trust, cleartext, MD5 and SCRAM-SHA-256 authentication, no TLS.

    >>> with PgWireConnection("127.0.0.1", 5432) as conn:  # doctest: +SKIP
    ...     conn.query("SELECT pg_backend_pid()")
    [('4242',)]
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        user: str = _SUPERUSER,
        password: str | None = None,
        database: str = "postgres",
        timeout: float = 5.0,
        application_name: str = "aiolocks.testing",
    ) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._received = b""
        #: ``pid`` half of the BackendKeyData the server (or a proxy) sent.
        self.backend_key_pid: int | None = None
        #: ParameterStatus values sent at login (``server_version``...).
        self.parameters: dict[str, str] = {}
        try:
            self._startup(user, password, database, application_name)
        except BaseException:
            self._sock.close()
            raise

    # -- framing

    def _send(self, kind: bytes, payload: bytes) -> None:
        self._sock.sendall(kind + struct.pack("!i", len(payload) + 4) + payload)

    def _read_exact(self, size: int) -> bytes:
        while len(self._received) < size:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("PostgreSQL closed the connection")
            self._received += chunk
        data, self._received = self._received[:size], self._received[size:]
        return data

    def _read_message(self) -> tuple[bytes, bytes]:
        header = self._read_exact(5)
        (length,) = struct.unpack("!i", header[1:])
        return header[:1], self._read_exact(length - 4)

    @staticmethod
    def _error(payload: bytes) -> PostgresCommandError:
        fields: dict[str, str] = {}
        for item in payload.split(b"\0"):
            if item:
                fields[chr(item[0])] = item[1:].decode("utf-8", "replace")
        return PostgresCommandError(
            f"{fields.get('S', 'ERROR')}: {fields.get('M', '?')}", sqlstate=fields.get("C", "?????")
        )

    # -- login

    def _startup(
        self, user: str, password: str | None, database: str, application_name: str
    ) -> None:
        body = struct.pack("!i", _PROTOCOL_VERSION)
        for key, value in (
            ("user", user),
            ("database", database),
            ("application_name", application_name),
        ):
            body += _cstring(key) + _cstring(value)
        body += b"\0"
        self._sock.sendall(struct.pack("!i", len(body) + 4) + body)
        scram: _Scram | None = None
        while True:
            kind, payload = self._read_message()
            if kind == b"E":
                raise self._error(payload)
            if kind == b"R":
                (code,) = struct.unpack("!i", payload[:4])
                if code == 0:
                    continue
                if password is None:
                    raise ServerCommandError(
                        f"the server wants a password (authentication code {code}), none was given"
                    )
                if code == 3:  # cleartext
                    self._send(b"p", _cstring(password))
                elif code == 5:  # md5
                    inner = hashlib.md5((password + user).encode()).hexdigest()
                    outer = hashlib.md5(inner.encode() + payload[4:8]).hexdigest()
                    self._send(b"p", _cstring("md5" + outer))
                elif code == 10:  # SASL
                    mechanisms = payload[4:].split(b"\0")
                    if b"SCRAM-SHA-256" not in mechanisms:
                        raise ServerCommandError(f"unsupported SASL mechanisms {mechanisms!r}")
                    scram = _Scram(password)
                    first = scram.client_first()
                    self._send(
                        b"p", _cstring("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first
                    )
                elif code == 11 and scram is not None:
                    self._send(b"p", scram.client_final(payload[4:]))
                elif code == 12 and scram is not None:
                    scram.verify(payload[4:])
                else:
                    raise ServerCommandError(f"unsupported authentication request {code}")
            elif kind == b"K":
                self.backend_key_pid = struct.unpack("!i", payload[:4])[0]
            elif kind == b"S":
                param, setting, _ = payload.split(b"\0", 2)
                self.parameters[param.decode()] = setting.decode()
            elif kind == b"Z":
                return

    # -- queries

    def query(self, sql: str) -> list[tuple[str | None, ...]]:
        """Run ``sql`` (simple query protocol) and return the rows of its last result as text.

        :raises PostgresCommandError: the server answered with an error.
        """
        self._send(b"Q", _cstring(sql))
        rows: list[tuple[str | None, ...]] = []
        error: PostgresCommandError | None = None
        while True:
            kind, payload = self._read_message()
            if kind == b"T":
                rows = []
            elif kind == b"D":
                (count,) = struct.unpack("!h", payload[:2])
                offset = 2
                row: list[str | None] = []
                for _ in range(count):
                    (size,) = struct.unpack("!i", payload[offset : offset + 4])
                    offset += 4
                    if size < 0:
                        row.append(None)
                    else:
                        row.append(payload[offset : offset + size].decode("utf-8", "replace"))
                        offset += size
                rows.append(tuple(row))
            elif kind == b"E":
                error = self._error(payload)
            elif kind == b"Z":
                if error is not None:
                    raise error
                return rows

    def close(self) -> None:
        """Send ``Terminate`` and close the socket (never raises)."""
        with contextlib.suppress(OSError):
            self._send(b"X", b"")
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Scram:
    """Client side of SCRAM-SHA-256 (RFC 7677) without channel binding."""

    def __init__(self, password: str) -> None:
        self._password = password.encode()
        self._nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        self._first_bare = f"n=,r={self._nonce}"
        self._server_signature = b""

    def client_first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def client_final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = dict(item.split("=", 1) for item in text.split(","))
        if not attrs["r"].startswith(self._nonce):
            raise ServerCommandError("SCRAM: the server's nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac(
            "sha256", self._password, base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, "sha256")
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", "sha256")
        self._server_signature = hmac.digest(server_key, auth_message, "sha256")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = dict(item.split("=", 1) for item in server_final.decode().split(","))
        if base64.b64decode(attrs.get("v", "")) != self._server_signature:
            raise ServerCommandError("SCRAM: the server's signature does not match")


# --------------------------------------------------------------------------- helpers


def _postgres_bin_dir() -> Path:
    override = os.environ.get("AIOLOCKS_POSTGRES_BIN")
    if override:
        folder = Path(override)
        if not (folder / "postgres").is_file():
            raise ServerNotInstalledError(
                f"AIOLOCKS_POSTGRES_BIN={override} has no 'postgres' binary"
            )
        return folder

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for candidate in candidates:
        if os.access(os.path.join(candidate, "postgres"), os.X_OK):
            return Path(candidate)
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
            if found and os.access(os.path.join(found, "postgres"), os.X_OK):
                return Path(found)
    on_path = shutil.which("postgres")
    if on_path is not None:
        return Path(on_path).parent
    raise ServerNotInstalledError(
        "PostgreSQL was not found (Debian package 'postgresql'; set AIOLOCKS_POSTGRES_BIN to "
        f"the folder with initdb and postgres); {INSTALL_HINT}"
    )


def _run_as() -> pwd.struct_passwd | None:
    """The OS user that runs the servers: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("AIOLOCKS_POSTGRES_OS_USER", "postgres")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ServerNotInstalledError(
            f"PostgreSQL refuses to run as root and there is no OS user {name!r} to run it as "
            "(the Debian package 'postgresql' creates 'postgres'; set AIOLOCKS_POSTGRES_OS_USER)"
        ) from None


def _give_to(path: Path, user: pwd.struct_passwd | None) -> None:
    if user is None:
        return
    for root, dirs, files in os.walk(path):
        os.chown(root, user.pw_uid, user.pw_gid)
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(root, name), user.pw_uid, user.pw_gid, follow_symlinks=False)


def _quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _parse_external(url: str, default_port: int) -> tuple[str, int, str, str | None, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValueError(f"expected a postgresql://user@host:port/database URL, got {url!r}")
    user = unquote(parts.username) if parts.username else _SUPERUSER
    password = unquote(parts.password) if parts.password is not None else None
    database = unquote(parts.path.lstrip("/")) or user
    return parts.hostname, parts.port or default_port, user, password, database


# --------------------------------------------------------------------------- PostgreSQL


class _PgProcess(_ServerProcess):
    """What the PostgreSQL server and pgbouncer share: login, queries, spawn as ``postgres``."""

    _user: str = _SUPERUSER
    _password: str | None = None
    _database: str = "postgres"
    _external_url: str | None = None

    @property
    def user(self) -> str:
        """The database role the helpers log in as (``postgres``, a superuser, when managed)."""
        return self._user

    @property
    def database(self) -> str:
        """The database the URL names (``postgres`` when managed)."""
        return self._database

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres`` (or the external URL as given)."""
        if self._external_url is not None:
            return self._external_url
        return f"postgresql://{self._user}@{self._host}:{self._port}/{self._database}"

    def connect_wire(
        self,
        *,
        database: str | None = None,
        timeout: float = 5.0,
        application_name: str = "aiolocks.testing",
    ) -> PgWireConnection:
        """Open a :class:`PgWireConnection` to this server (the caller closes it)."""
        return PgWireConnection(
            self._host,
            self._port,
            user=self._user,
            password=self._password,
            database=database or self._database,
            timeout=timeout,
            application_name=application_name,
        )

    def query(
        self, sql: str, *, database: str | None = None, timeout: float = 5.0
    ) -> list[tuple[str | None, ...]]:
        """Run ``sql`` over a fresh connection; the rows of the last result, as text.

        >>> postgres_server.query("SELECT 1")  # doctest: +SKIP
        [('1',)]

        :raises PostgresCommandError: the server answered with an error.
        """
        with self.connect_wire(database=database, timeout=timeout) as conn:
            return conn.query(sql)

    def _probe(self) -> bool:
        with self.connect_wire(timeout=2.0) as conn:
            conn.query("SELECT 1")
        return True

    def _spawn_user(self) -> pwd.struct_passwd | None:
        return _run_as()


@final
class PostgresServer(_PgProcess):
    """A throwaway PostgreSQL on a free port in a temporary folder (``fsync=off``).

    ::

        with PostgresServer() as pg:
            conn = await asyncpg.connect(pg.url)
            ...
            pg.terminate_backends(application_name="victim")
            pg.restart()        # same port, same data (committed rows survive)

    ``initdb`` runs at the first ``start()``; ``settings`` adds ``-c name=value``
    server settings (for example ``{"idle_session_timeout": "500ms"}``).

    With ``standby_of=primary`` the first ``start()`` runs ``pg_basebackup -R``
    from that (running) server instead of ``initdb``: a streaming standby
    (asynchronous replication, hot standby). :meth:`promote` turns it into a
    primary (``pg_ctl promote``); :meth:`rebuild_as_standby` wipes a server's
    data and makes it a standby of another (the old primary after a failover).

    ``host`` is the address it listens on (``listen_addresses``; default
    ``127.0.0.1``, an IPv4 literal such as ``127.0.0.21`` otherwise). A
    standby's ``primary_conninfo`` names its primary's :attr:`host`. Clients
    on the same machine still come from ``127.0.0.1`` (the kernel's source
    address on loopback), which the ``trust`` rules of ``initdb`` admit.

    :raises ServerNotInstalledError: from ``start()`` when PostgreSQL is missing.
    :raises ServerStartError: from ``start()`` when it does not accept a login in time.
    """

    kind = "postgres"

    def __init__(
        self,
        *,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        startup_timeout: float = 60.0,
        standby_of: PostgresServer | None = None,
        host: str = LOCALHOST,
    ) -> None:
        super().__init__(port=port, base_dir=base_dir, startup_timeout=startup_timeout, host=host)
        self._settings = dict(settings or {})
        self._standby_of = standby_of

    @classmethod
    def external(cls, url: str) -> PostgresServer:
        """Describe a PostgreSQL that runs elsewhere (``"postgresql://user[:pw]@host:port/db"``).

        ``query()`` and the helpers work on it with the URL's credentials;
        ``managed`` is ``False`` and start/stop/kill raise :class:`ServerNotManagedError`.
        """
        host, port, user, password, database = _parse_external(url, 5432)
        server = cls.__new__(cls)
        _PgProcess.__init__(
            server, port=port, base_dir=None, startup_timeout=0.0, managed=False, host=host
        )
        server._settings = {}
        server._standby_of = None
        server._user, server._password, server._database = user, password, database
        server._external_url = url
        return server

    @property
    def data_dir(self) -> Path | None:
        """The cluster's data folder (``PGDATA``), once started."""
        return None if self._dir is None else self._dir / "data"

    def _prepare(self, directory: Path) -> None:
        user = _run_as()
        _give_to(directory, user)
        data = directory / "data"
        if (data / "PG_VERSION").exists():
            return
        if self._standby_of is not None:
            self._base_backup(directory, user)
            return
        initdb = str(_postgres_bin_dir() / "initdb")
        log_path = directory / "initdb.log"
        proc = _popen(
            [
                initdb,
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                _SUPERUSER,
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=directory,
            log_path=log_path,
            user=user,
        )
        if proc.wait() != 0:
            raise self._start_error(f"initdb exited with code {proc.returncode}")

    def _base_backup(self, directory: Path, user: pwd.struct_passwd | None) -> None:
        primary = self._standby_of
        assert primary is not None
        proc = _popen(
            [
                str(_postgres_bin_dir() / "pg_basebackup"),
                "-D", "data",
                "-h", primary.host,
                "-p", str(primary.port),
                "-U", primary.user,
                "-R",  # standby.signal and primary_conninfo: a streaming standby
                "-X", "stream",
                "-c", "fast",
                "--no-sync",
            ],
            cwd=directory,
            log_path=directory / "initdb.log",
            user=user,
        )  # fmt: skip
        if proc.wait() != 0:
            raise self._start_error(f"pg_basebackup exited with code {proc.returncode}")

    @property
    def standby_of(self) -> PostgresServer | None:
        """The primary this server was made a standby of (``None``: made by ``initdb``)."""
        return self._standby_of

    def in_recovery(self) -> bool:
        """``pg_is_in_recovery()``: whether the server runs as a standby right now."""
        return self.query("SELECT pg_is_in_recovery()") == [("t",)]

    def promote(self, *, timeout: float = 60.0) -> None:
        """``pg_ctl promote``: the standby ends recovery and accepts writes (waits for that)."""
        self._require_managed()
        if self._dir is None or not self.running:
            raise ServerError(f"{self._describe()} is not running")
        proc = _popen(
            [str(_postgres_bin_dir() / "pg_ctl"), "promote", "-w", "-t", str(int(timeout)),
             "-D", "data"],
            cwd=self._dir,
            log_path=self._dir / "promote.log",
            user=_run_as(),
        )  # fmt: skip
        if proc.wait() != 0:
            raise ServerCommandError(f"pg_ctl promote of {self._describe()} failed")
        self._standby_of = None

    def rebuild_as_standby(self, primary: PostgresServer) -> None:
        """Stop, wipe the data folder, ``pg_basebackup`` from ``primary`` and start as its standby.

        What an operator does with a failed-over primary (no ``pg_rewind``): its
        last writes that never reached the standby are thrown away.
        """
        self._require_managed()
        if self.running:
            self.kill()
        if self._dir is not None:
            shutil.rmtree(self._dir / "data", ignore_errors=True)
        self._standby_of = primary
        self.start()

    def _log_files(self) -> list[Path]:
        if self._dir is None:
            return []
        return [self._dir / "initdb.log", self._output_path(self._dir)]

    def _command(self) -> list[str]:
        binary = str(_postgres_bin_dir() / "postgres")  # raises before any side effect
        settings = {
            "listen_addresses": self._host,
            "port": str(self._port),
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "shared_buffers": "16MB",
            **self._settings,
        }
        command = [binary, "-D", "data", "-k", "."]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        return command

    def _send_stop_signal(self, proc: subprocess.Popen[bytes]) -> None:
        # Fast shutdown: SIGINT ends the sessions (SIGTERM would wait for them).
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)

    # -- helpers for fault tests

    def backend_pids(self, *, application_name: str | None = None) -> list[int]:
        """The pids of the client sessions (optionally only those with ``application_name``)."""
        sql = (
            "SELECT pid FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        if application_name is not None:
            sql += f" AND application_name = {_quote_literal(application_name)}"
        return [int(str(row[0])) for row in self.query(sql + " ORDER BY pid")]

    def terminate_backend(self, pid: int) -> bool:
        """``pg_terminate_backend(pid)``: end one session as an admin would; ``True`` if done."""
        rows = self.query(f"SELECT pg_terminate_backend({int(pid)})")
        return rows == [("t",)]

    def terminate_backends(self, *, application_name: str | None = None) -> int:
        """End every client session (or those with ``application_name``); returns how many."""
        return sum(
            self.terminate_backend(pid)
            for pid in self.backend_pids(application_name=application_name)
        )

    def advisory_locks(self) -> list[tuple[int, int, str, bool]]:
        """Every advisory lock of the server as ``(pid, 64-bit key, mode, granted)``.

        The key is rebuilt from ``classid``/``objid`` as the signed ``bigint`` given
        to ``pg_advisory_lock``; ``(int4, int4)`` keys (``objsubid = 2``) are left out.
        """
        rows = self.query(
            "SELECT pid, (classid::int8 << 32) | objid::int8, mode, granted FROM pg_locks "
            "WHERE locktype = 'advisory' AND objsubid = 1 ORDER BY pid"
        )
        return [(int(str(p)), int(str(k)), str(m), g == "t") for p, k, m, g in rows]

    def set_setting(self, name: str, value: str) -> None:
        """``ALTER SYSTEM SET name = value`` and reload (``idle_session_timeout`` for a test)."""
        if not name.replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"invalid setting name {name!r}")
        self.query(f"ALTER SYSTEM SET {name} = {_quote_literal(value)}")
        self.query("SELECT pg_reload_conf()")

    def reset_setting(self, name: str) -> None:
        """``ALTER SYSTEM RESET name`` and reload."""
        if not name.replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"invalid setting name {name!r}")
        self.query(f"ALTER SYSTEM RESET {name}")
        self.query("SELECT pg_reload_conf()")


# --------------------------------------------------------------------------- pgbouncer


@final
class PgBouncer(_PgProcess):
    """A ``pgbouncer`` in front of a :class:`PostgresServer`, transaction pooling by default.

    ::

        with PostgresServer() as pg, PgBouncer(pg) as bouncer:
            conn = await asyncpg.connect(bouncer.url, statement_cache_size=0)

    Every database of the server is reachable under its own name; the
    ``postgres`` role is pgbouncer's admin (``admin("SHOW POOLS")``). In
    transaction mode two statements of one client connection may run on two
    different server sessions: what session-level advisory locks cannot
    survive, and what the lease mode is for.
    """

    kind = "pgbouncer"

    def __init__(
        self,
        server: PostgresServer,
        *,
        port: int | None = None,
        pool_mode: str = "transaction",
        pool_size: int = 4,
        base_dir: Path | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        if pool_mode not in ("session", "transaction", "statement"):
            raise ValueError(
                f"pool_mode must be session, transaction or statement, got {pool_mode!r}"
            )
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size!r}")
        super().__init__(port=port, base_dir=base_dir, startup_timeout=startup_timeout)
        self._server = server
        self._pool_mode = pool_mode
        self._pool_size = pool_size
        self._user, self._password = server.user, server._password
        self._database = server.database

    @classmethod
    def external(cls, url: str, server: PostgresServer | None = None) -> PgBouncer:
        """Describe a pgbouncer that runs elsewhere (``"postgresql://user@host:port/db"``)."""
        host, port, user, password, database = _parse_external(url, 6432)
        bouncer = cls.__new__(cls)
        _PgProcess.__init__(
            bouncer, port=port, base_dir=None, startup_timeout=0.0, managed=False, host=host
        )
        bouncer._server = server if server is not None else PostgresServer.external(url)
        bouncer._pool_mode = "transaction"
        bouncer._pool_size = 0
        bouncer._user, bouncer._password, bouncer._database = user, password, database
        bouncer._external_url = url
        return bouncer

    @property
    def server(self) -> PostgresServer:
        """The PostgreSQL server behind the bouncer."""
        return self._server

    @property
    def pool_mode(self) -> str:
        """``"transaction"`` (the default), ``"session"`` or ``"statement"``."""
        return self._pool_mode

    def admin(self, command: str) -> list[tuple[str | None, ...]]:
        """Run an admin console command (``"SHOW POOLS"``...) in the ``pgbouncer`` database."""
        return self.query(command, database="pgbouncer")

    def _prepare(self, directory: Path) -> None:
        server = self._server
        (directory / "userlist.txt").write_text(f'"{server.user}" ""\n')
        lines = [
            "[databases]",
            f"* = host={server.host} port={server.port}",
            "",
            "[pgbouncer]",
            f"listen_addr = {self._host}",
            f"listen_port = {self._port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {directory / 'userlist.txt'}",
            f"admin_users = {server.user}",
            f"pool_mode = {self._pool_mode}",
            f"default_pool_size = {self._pool_size}",
            "max_client_conn = 500",
            "server_login_retry = 1",
            # asyncpg sends these at login; pgbouncer would refuse an unknown one.
            "ignore_startup_parameters = extra_float_digits,search_path",
            "log_connections = 0",
            "log_disconnections = 0",
        ]
        (directory / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        _give_to(directory, _run_as())

    def _command(self) -> list[str]:
        binary = _find_binary("AIOLOCKS_PGBOUNCER", "pgbouncer", "pgbouncer")
        return [binary, "pgbouncer.ini"]  # it runs in its folder (cwd)

    def start(self, *, wait: bool = True) -> Self:
        """Start pgbouncer (the server must be running for the readiness login)."""
        if self._managed and self._server.managed and not self._server.running:
            raise ServerError(
                f"{self._server!r} is not running; start it before {self._describe()}"
            )
        return super().start(wait=wait)
