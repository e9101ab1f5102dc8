"""The process handling every launcher of :mod:`aiolocks.testing` shares.

Every launcher (ZooKeeper and Redis in :mod:`aiolocks.testing.servers`,
PostgreSQL and pgbouncer in ``_postgres``, etcd in ``_etcd``) follows one
recipe, implemented once here:

1. Pick a free port *below* the kernel's ephemeral range (so that a client
   socket can never grab it while a server is stopped for a restart test), and
   check that it binds on the server's address, 127.0.0.1 unless the
   launcher was given another (``host=``) (:func:`free_port`).
2. Make a private temporary folder, write the configuration there
   (``_prepare``) and start the binary (``_command``) in its own process group
   with stdout/stderr captured to a log file in that folder, optionally as
   another OS user (``_spawn_user``).
3. Wait for readiness *by protocol* (``_probe``). A server that exits or
   does not get ready raises :class:`ServerStartError` carrying the tail of
   its logs. A first start that loses its port to another process ("Address
   already in use") retries on a new port.
4. Stop by PID: SIGTERM (``_stop_signal``) to the process group, SIGKILL after
   a short grace, always reap (no zombies). ``kill()`` is SIGKILL at once, for
   crash tests. An ``atexit`` hook (registered when the first server or folder
   appears, never at import) kills whatever is still running and removes the
   folders; on Linux, servers started from the main thread also get
   ``PR_SET_PDEATHSIG`` so they die when the test runner is killed.

``stop()`` keeps the folder and the port, so ``start()`` brings the same
server back on the same port with the same data. ``close()`` (and leaving the
``with`` block) stops and removes the folder. A process described by an
``external(...)`` constructor has ``managed == False`` and its process
controls raise :class:`ServerNotManagedError`.

:class:`_Ensemble` is the shared shape of the replicated launchers (a
ZooKeeper ensemble, an etcd cluster): members made on the first start, all
spawned before any is waited for (none serves before a quorum runs), then a
wait for exactly one leader.

Environment variables read here:

``AIOLOCKS_SERVERS_DIR``
    where the temporary folders are made (default: the system temp dir).
``AIOLOCKS_KEEP_SERVER_DIRS=1``
    keep the folders (configs, data, logs) after the servers stop.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Final, Generic, Self, TypeVar

#: The address every managed server binds to unless given another (``host=``).
LOCALHOST: Final = "127.0.0.1"


def _check_host(host: object) -> str:
    """``host`` if it is an IPv4 address literal (``"127.0.0.21"``), else :class:`ValueError`.

    Launchers take addresses, not names: a server binds to it, advertises it
    to its peers and writes it into their configurations, where a name could
    resolve differently. On Linux every ``127.x.y.z`` is on the loopback
    interface without any setup, so each member of a cluster can have its own.
    """
    if not isinstance(host, str):
        raise ValueError(f"host must be an IPv4 address literal such as '127.0.0.21', not {host!r}")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(
            f"host must be an IPv4 address literal such as '127.0.0.21', not {host!r}"
        ) from None
    return host


def _hosts_for(host: str | Sequence[str], count: int, what: str) -> list[str]:
    """One checked address per process: ``host`` for all, or a sequence of ``count`` of them."""
    if isinstance(host, str) or not isinstance(host, Sequence):
        return [_check_host(host)] * count
    hosts = [_check_host(item) for item in host]
    if len(hosts) != count:
        raise ValueError(f"host: expected one address per {what} ({count}), got {len(hosts)}")
    return hosts


_POLL_INTERVAL: Final = 0.05
_LOG_TAIL_LINES: Final = 40


# --------------------------------------------------------------------------- errors


class ServerError(RuntimeError):
    """Base class of the errors raised by :mod:`aiolocks.testing` launchers."""


#: How to install the servers, for error messages (pip installs ship no install script).
INSTALL_HINT = (
    "install the servers with the system package manager: "
    "'apt-get install zookeeper redis-server redis-sentinel default-jre-headless "
    "postgresql pgbouncer' on Debian/Ubuntu, 'brew install zookeeper redis postgresql "
    "pgbouncer' on macOS"
)


class ServerNotInstalledError(ServerError):
    """A binary or jar the launcher needs is not installed.

    The message names what is missing and the packages that provide it
    (``apt-get`` on Debian/Ubuntu, ``brew`` on macOS).
    """


class ServerStartError(ServerError):
    """A server exited during startup or did not become ready in time.

    ``log_tail`` holds the last lines of its log (also part of the message)
    and ``log_path`` the full log.
    """

    def __init__(self, message: str, *, log_path: Path | None, log_tail: str) -> None:
        super().__init__(f"{message}\n--- last lines of {log_path} ---\n{log_tail}")
        self.log_path = log_path
        self.log_tail = log_tail


class ServerNotManagedError(ServerError):
    """The server is external (given by address), so it cannot be started or stopped."""


class ServerCommandError(ServerError):
    """A server answered a command with an error reply (RESP ``-ERR ...``)."""


# --------------------------------------------------------------------------- ports


_handed_out_ports: set[int] = set()


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_binds(port: int, host: str) -> bool:
    # No SO_REUSEADDR: a port in TIME_WAIT or bound to 0.0.0.0 counts as busy.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port on ``host`` that nothing is bound to right now.

    Ports are taken below the kernel's ephemeral range, so that outgoing
    client connections cannot occupy a port while its server is stopped for a
    restart test. A port is never handed out twice by one process.

    >>> port = free_port()
    """
    low = min(_ephemeral_low(), 32768)
    if low > 12000:
        for _ in range(500):
            port = random.randint(10000, low - 1)
            if port not in _handed_out_ports and _port_binds(port, host):
                _handed_out_ports.add(port)
                return port
    # Fallback: let the kernel choose (an ephemeral port).
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out_ports:
            _handed_out_ports.add(port)
            return port
    raise ServerError("no free TCP port found")  # pragma: no cover


# --------------------------------------------------------------------------- helpers


def _read_all(host: str, port: int, payload: bytes, timeout: float) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(payload)
        chunks: list[bytes] = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _wait_until(
    condition: str, check: Callable[[], bool], timeout: float, *, interval: float = _POLL_INTERVAL
) -> None:
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            if check():
                return
        except (OSError, ServerError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting until {condition}{detail}")
        time.sleep(interval)


# --------------------------------------------------------------------------- processes


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _make_dir(kind: str, base_dir: Path | None) -> Path:
    parent = base_dir or (
        Path(os.environ["AIOLOCKS_SERVERS_DIR"]) if os.environ.get("AIOLOCKS_SERVERS_DIR") else None
    )
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"aiolocks-{kind}-", dir=parent))
    _track_for_exit()
    _owned_dirs.add(path)
    return path


def _remove_dir(path: Path) -> None:
    _owned_dirs.discard(path)
    if not _env_flag("AIOLOCKS_KEEP_SERVER_DIRS"):
        shutil.rmtree(path, ignore_errors=True)


def _tail(path: Path | None, lines: int = _LOG_TAIL_LINES) -> str:
    if path is None:
        return "(no log)"
    try:
        text = path.read_text("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read log: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The child leads its own process group (start_new_session=True), so the
    # group id is its pid; signalling the group also reaches any child it forked.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _wait_stopped(pid: int, *, timeout: float = 5.0) -> None:
    # SIGSTOP is delivered asynchronously: a multi-threaded server (etcd is a
    # Go program) may still answer a request until every one of its threads
    # has stopped. Wait for that, so a caller's "paused" really means frozen.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [_thread_state(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")]
        except FileNotFoundError:
            return  # gone (or no procfs): nothing left to wait for
        if all(state in ("T", "t", "X", "Z", "") for state in states):
            return
        time.sleep(0.005)


def _thread_state(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as stat:
            # "pid (comm) S ...": the state follows the last ')' (comm may hold spaces)
            return stat.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the server die with us (Linux only), or ``None``.

    ``atexit`` does not run when the test runner is killed by a signal (a CI
    timeout, ``kill``); ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the
    server then. The signal fires when the *thread* that started the server
    exits, so it is only armed from the main thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    import ctypes  # here, not at the top: the pytest plugin imports this module in every run

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: follow it now
            os._exit(1)

    return arm


def _popen(
    command: list[str], *, cwd: Path, log_path: Path, user: pwd.struct_passwd | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own process group, output appended to ``log_path``.

    With ``user`` (we are root) it runs as that OS user, with its ``HOME``.
    """
    with log_path.open("ab") as log:
        log.write(f"\n=== aiolocks.testing: starting {' '.join(command)}\n".encode())
        log.flush()
        extra: dict[str, object] = {}
        env: dict[str, str] | None = None
        if user is not None:
            extra = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            env = dict(os.environ, HOME=user.pw_dir, USER=user.pw_name, LOGNAME=user.pw_name)
        return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent_hook(),
            **extra,
        )


def _find_binary(env_var: str, name: str, package: str) -> str:
    override = os.environ.get(env_var)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise ServerNotInstalledError(f"{env_var}={override} is not an executable file")
        return override
    found = shutil.which(name)
    if found is None:
        for folder in ("/usr/bin", "/usr/local/bin", "/usr/sbin"):
            candidate = os.path.join(folder, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                found = candidate
                break
    if found is None:
        raise ServerNotInstalledError(
            f"{name!r} was not found (Debian package {package!r}; set {env_var} to use another "
            f"binary); {INSTALL_HINT}"
        )
    return found


_running: set[_ServerProcess] = set()
_owned_dirs: set[Path] = set()
_exit_hook_registered = False


def _track_for_exit() -> None:
    """Register the ``atexit`` clean-up once, when the first server or folder appears.

    Never at import: importing this module must not change the process.
    """
    global _exit_hook_registered
    if not _exit_hook_registered:
        _exit_hook_registered = True
        atexit.register(_kill_everything_at_exit)


class _Launcher:
    """What every launcher shares: ``close()`` (stop, then remove the folders) and ``with``.

    A single server has no sub-processes; a group lists its members in
    :meth:`_processes` and is stopped by signalling them all first.
    """

    _dir: Path | None

    @property
    def managed(self) -> bool:
        """``True`` when we run the processes, ``False`` for external servers."""
        raise NotImplementedError

    def _processes(self) -> list[_ServerProcess]:
        return []

    def start(self) -> Self:
        """Start every process and wait until the group is usable."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process (folders kept: ``start()`` brings the group back)."""
        if not self.managed:
            return
        processes = self._processes()
        for process in processes:
            process._terminate()  # signal them all first: they stop in parallel
        for process in processes:
            process.stop()

    def close(self) -> None:
        """Stop every process and remove the folders."""
        if not self.managed:
            return
        self.stop()
        for process in self._processes():
            process.close()
        if self._dir is not None:
            _remove_dir(self._dir)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _ServerProcess(_Launcher):
    """One server process: folder, log, spawn, readiness, stop, kill."""

    kind: ClassVar[str] = "server"
    _stop_grace: ClassVar[float] = 5.0

    def __init__(
        self,
        *,
        port: int | None,
        base_dir: Path | None,
        startup_timeout: float,
        managed: bool = True,
        host: str = LOCALHOST,
    ) -> None:
        self._host = _check_host(host) if managed else host
        self._port_auto = port is None and managed
        self._port = port if port is not None else (free_port(host) if managed else 0)
        self._base_dir = base_dir
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._startup_timeout = startup_timeout
        self._managed = managed
        self._started_once = False

    # -- subclass hooks

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self, directory: Path) -> None:
        """Write configuration files before every start (default: nothing)."""

    def _probe(self) -> bool:
        raise NotImplementedError

    def _output_path(self, directory: Path) -> Path:
        return directory / f"{self.kind}.log"

    def _log_files(self) -> list[Path]:
        return [self.log_path] if self.log_path is not None else []

    def _spawn_log_path(self, directory: Path) -> Path:
        """Where the process's stdout and stderr go (default: its log file)."""
        return self._output_path(directory)

    def _spawn_user(self) -> pwd.struct_passwd | None:
        """The OS user to run the process as (default ``None``: ourselves)."""
        return None

    def _send_stop_signal(self, proc: subprocess.Popen[bytes]) -> None:
        """Ask the process to shut down (default: SIGTERM to its process group)."""
        _signal_group(proc, signal.SIGTERM)

    # -- public surface

    @property
    def host(self) -> str:
        """The address the server listens on (``127.0.0.1`` unless the launcher got ``host=``)."""
        return self._host

    @property
    def port(self) -> int:
        """The client port; it stays the same across ``stop()``/``start()``."""
        return self._port

    @property
    def managed(self) -> bool:
        """``True`` when this process is started and stopped by us, ``False`` for external."""
        return self._managed

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else ``None``."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        """Whether the process is alive (not whether it is ready)."""
        return self.pid is not None

    @property
    def directory(self) -> Path | None:
        """The private temporary folder (config, data, logs), once started."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        """The server's log file, once started."""
        return None if self._dir is None else self._output_path(self._dir)

    def _describe(self) -> str:
        return f"{self.kind} on {self._host}:{self._port}"

    def _require_managed(self) -> None:
        if not self._managed:
            raise ServerNotManagedError(
                f"{self._describe()} is an external server; it cannot be started or stopped here"
            )

    def start(self, *, wait: bool = True) -> Self:
        """Start the server (a no-op if it runs) and, unless ``wait=False``, wait until ready.

        :raises ServerNotInstalledError: the binary is missing.
        :raises ServerStartError: the server exited or was not ready in time.
        """
        self._require_managed()
        if self.running:
            return self
        attempts = 3 if self._port_auto and not self._started_once else 1
        for attempt in range(attempts):
            command = self._command()  # raises ServerNotInstalledError before any side effect
            self._spawn(command)
            if not wait:
                break
            try:
                self.wait_ready()
            except ServerStartError as exc:
                # Another process took the port between our probe and the
                # server's bind: take a new port, but only before the first
                # successful start (a restart must keep its port).
                if attempt + 1 < attempts and "Address already in use" in exc.log_tail:
                    self._port = free_port(self._host)
                    continue
                raise
            break
        self._started_once = True
        return self

    def _spawn(self, command: list[str]) -> None:
        if self._dir is None:
            self._dir = _make_dir(self.kind, self._base_dir)
        self._prepare(self._dir)
        self._proc = _popen(
            command,
            cwd=self._dir,
            log_path=self._spawn_log_path(self._dir),
            user=self._spawn_user(),
        )
        _track_for_exit()
        _running.add(self)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the server answers its readiness probe.

        :raises ServerStartError: it exited, or was not ready within ``timeout``
            (default: the ``startup_timeout`` given to the constructor); the
            process is killed in that case.
        """
        self._require_managed()
        proc = self._proc
        if proc is None:
            raise ServerError(f"{self._describe()} was not started")
        deadline = time.monotonic() + (self._startup_timeout if timeout is None else timeout)
        while True:
            code = proc.poll()
            if code is not None:
                self._reap()
                raise self._start_error(
                    f"{self._describe()} exited with code {code} while starting"
                )
            try:
                if self._probe():
                    return
            except (OSError, ServerError):
                pass
            if time.monotonic() >= deadline:
                self.kill()
                raise self._start_error(f"{self._describe()} was not ready in time")
            time.sleep(_POLL_INTERVAL)

    def _start_error(self, message: str) -> ServerStartError:
        tails = [f"[{path.name}]\n{_tail(path)}" for path in self._log_files()]
        return ServerStartError(message, log_path=self.log_path, log_tail="\n".join(tails))

    def stop(self, *, timeout: float | None = None) -> None:
        """Stop: SIGTERM (PostgreSQL: SIGINT), SIGKILL after a grace. Keeps folder and port."""
        self._require_managed()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._send_stop_signal(proc)
            try:
                proc.wait(self._stop_grace if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
        self._reap()

    def _terminate(self) -> None:
        """Send the stop signal without waiting, so that a group of servers stops in parallel."""
        proc = self._proc
        if self._managed and proc is not None and proc.poll() is None:
            self._send_stop_signal(proc)

    def kill(self) -> None:
        """Kill the server with SIGKILL (a crash) and reap it. Keeps folder and port."""
        self._require_managed()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            # Wait for the exit but leave the zombie: while it is not reaped
            # its pid cannot be reused, so signalling the group is safe. Then
            # anything the server forked (same group) goes with it.
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()  # reap: no zombie is left behind
        self._proc = None
        _running.discard(self)

    def restart(self) -> None:
        """``stop()`` then ``start()`` on the same port with the same folder."""
        self.stop()
        self.start()

    def __repr__(self) -> str:
        state = "external" if not self._managed else f"pid={self.pid}"
        return f"<{type(self).__name__} {self._host}:{self._port} {state}>"


def _kill_everything_at_exit() -> None:
    # Last line of defence: a test run that crashed or forgot close() must not
    # leave servers behind.
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.kill()
    for path in list(_owned_dirs):
        _remove_dir(path)


def _split_hosts(hosts: str, scheme: str, *also: str) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` or ``"<scheme>://h1:p1,h2:p2[/...]"`` as ``[(host, port), ...]``.

    ``also`` names more schemes that are accepted; a path or query is ignored.
    """
    text = hosts.strip()
    if "://" in text:
        found_scheme, _, text = text.partition("://")
        if found_scheme not in (scheme, *also):
            raise ValueError(f"expected host:port[,host:port...] or {scheme}://..., got {hosts!r}")
    text = text.split("/", 1)[0].split("?", 1)[0]
    result: list[tuple[str, int]] = []
    for item in text.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected host:port[,host:port...], got {hosts!r}")
        result.append((host, int(port)))
    return result


def _join_hosts(addresses: Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{host}:{port}" for host, port in addresses)


# --------------------------------------------------------------------------- ensembles


_M = TypeVar("_M", bound=_ServerProcess)


class _Ensemble(_Launcher, Generic[_M]):
    """A replicated server of ``size`` members on localhost that elects one leader.

    Subclasses make the members (:meth:`_make_members`), say what a member
    answers (:meth:`_member_state`) and how the ensemble is named in messages
    (``_title``, :meth:`_address_text`). External ensembles have no members.
    """

    _title: ClassVar[str] = "ensemble"
    _dir_kind: ClassVar[str] = "ensemble"

    def __init__(self, size: int, *, base_dir: Path | None, startup_timeout: float) -> None:
        self._size = size
        self._managed = True
        self._base_dir = base_dir
        self._startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._members: list[_M] = []

    # -- subclass hooks

    def _make_members(self, directory: Path) -> list[_M]:
        raise NotImplementedError

    def _member_state(self, member: _M) -> bool | None:
        """``True`` for the leader, ``False`` for a serving follower, ``None`` when not serving."""
        raise NotImplementedError

    def _member_leads(self, member: _M) -> bool:
        """Whether ``member`` says it leads right now (``False`` when it cannot answer)."""
        raise NotImplementedError

    def _live(self, member: _M) -> bool:
        """Whether ``member`` is expected to answer (running; etcd: and not paused)."""
        return member.running

    def _address_text(self) -> str:
        raise NotImplementedError

    # -- shared behaviour

    @property
    def managed(self) -> bool:
        """``True`` when we run the members, ``False`` for an external ensemble."""
        return self._managed

    def _require_managed(self) -> None:
        if not self._managed:
            raise ServerNotManagedError(
                f"the {self._title} {self._address_text()} is external; "
                "its members cannot be controlled"
            )

    def start(self) -> Self:
        """Start every member and wait until a leader is elected and all serve.

        :raises ServerNotInstalledError: a binary is missing.
        :raises ServerStartError: a member exited or the quorum did not form in time.
        """
        self._require_managed()
        if not self._members:
            self._dir = _make_dir(self._dir_kind, self._base_dir)
            self._members = self._make_members(self._dir)
        try:
            # Spawn all first: no member can serve before a quorum runs.
            for member in self._members:
                member.start(wait=False)
            for member in self._members:
                member.wait_ready()
            self.wait_for_leader(timeout=self._startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_leader(self, timeout: float = 30.0) -> _M:
        """Wait until exactly one running member is leader and every running member serves.

        :raises TimeoutError: no stable leader within ``timeout`` seconds.
        """
        self._require_managed()
        found: list[_M] = []

        def settled() -> bool:
            live = [member for member in self._members if self._live(member)]
            states = [self._member_state(member) for member in live]
            if any(state is None for state in states):
                return False
            leaders = [member for member, state in zip(live, states, strict=True) if state]
            if len(leaders) == 1:
                found[:] = leaders
                return True
            return False

        _wait_until(f"the {self._title} has a leader", settled, timeout)
        return found[0]

    def leader(self) -> _M:
        """The member that is leader right now.

        :raises ServerError: no running member says it is leader.
        """
        self._require_managed()
        for member in self._members:
            if self._live(member) and self._member_leads(member):
                return member
        raise ServerError(f"no member of the {self._title} is leader right now")

    def _processes(self) -> list[_ServerProcess]:
        return list(self._members)
