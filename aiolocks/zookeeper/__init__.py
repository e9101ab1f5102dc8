"""The ZooKeeper backend (``zk://``): Apache Curator's lock recipes on asyncio.

>>> url = "zk://127.0.0.1:2181/myapp?session_timeout=10"
>>> secured = "zk://app:s3cret@zk1:2181,zk2:2181/myapp"  # digest auth, creator-only ACLs
>>> async with aiolocks.connect(url) as backend:  # doctest: +SKIP
...     async with backend.mutex("orders/42") as lock:
...         print(lock.fencing_token)      # czxid of our lock node

Or on the session of an ``aiozk.ZKClient`` the application already has
(started by the application; its authentication and chroot apply, and the
process keeps one session; closing the backend leaves the client open)::

    client = aiozk.ZKClient("zk1:2181,zk2:2181")
    await client.start()
    backend = ZooKeeperBackend(client)

One ZooKeeper session per backend, shared by every lock and task. Holds live
as long as the session: when it expires (or when we have been disconnected for
a whole session timeout), every hold is lost (``LockLostError`` in its
``async with`` body) while tasks still waiting keep waiting and queue again in
the new session. A URL-built backend's session and connections are
aiolocks' own (``_connection.py``, reached through ``_client.py``); aiozk
supplies the wire types and serializers. See
``docs/zookeeper.md`` for the recipe, the node layout, the connection-state
policy and the session layer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Final, cast, final

from .._core.backend import Backend
from .._core.names import has_control_character
from .._core.timeouts import SETTING_RANGE, check_seconds
from .._core.urls import ParsedURL, parse_bool, parse_positive_float, parse_url
from ._auth import ACL_MODES, check_user, creator_acl, digest_credential, tls_context
from ._client import AiozkLink, ZooKeeperClient
from ._driver import ZooKeeperDriver, lock_path
from ._layout import DEFAULT_LAYOUT, parse_layout
from ._session import AmbiguousResult, ConnectionState

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SESSION_TIMEOUT",
    "AmbiguousResult",
    "ConnectionState",
    "ZooKeeperBackend",
    "ZooKeeperClient",
    "from_url",
    "lock_path",
]

DEFAULT_SESSION_TIMEOUT: Final = 10.0
DEFAULT_CONNECT_TIMEOUT: Final = 10.0

_URL_OPTIONS: Final = {
    "session_timeout": parse_positive_float,
    "connect_timeout": parse_positive_float,
    "suspended_is_lost": parse_bool,
    "layout": lambda _name, text: parse_layout(text),
    "acl": lambda _name, text: _check_acl(text),
    "tls": parse_bool,
    "ssl_ca_certs": lambda _name, text: text,
    "ssl_certfile": lambda _name, text: text,
    "ssl_keyfile": lambda _name, text: text,
    "ssl_check_hostname": parse_bool,
}


@final
class ZooKeeperBackend(Backend):
    """A ZooKeeper lock backend on the session of an ``aiozk.ZKClient`` you already have.

    >>> await client.start()                # doctest: +SKIP
    >>> backend = ZooKeeperBackend(client)  # doctest: +SKIP
    >>> async with backend:                 # opens; close() leaves `client` open
    ...     async with backend.mutex("orders/42"):
    ...         ...

    :param client: a started ``aiozk.ZKClient``. Lock nodes are created in
        its session, below its chroot, with its default ACL, so the
        authentication the application sent through it applies and the
        process keeps one session. The backend never starts or closes the
        client: ``open()`` waits up to ``connect_timeout`` for it to be
        connected, ``close()`` leaves it open. Reconnection, pings and watch
        re-arming are aiozk's; the backend follows aiozk's session states
        (see ``docs/zookeeper.md``).
    :param connect_timeout: seconds ``open()`` and any request may wait for a
        connection before :class:`aiolocks.BackendUnavailableError` (default 10)
    :param suspended_is_lost: treat a suspended connection as the loss of
        every hold (Curator's ``StandardConnectionStateErrorPolicy``). Default
        ``False``: holds are lost when the session expires, or after a whole
        session timeout without contact (client-side expiry).
    :param layout: ``"aiolocks"`` (the default: nodes below
        ``/aiolocks/<family>/``) or ``"curator"`` (a name is the path Apache
        Curator's recipes use), as the ``layout=`` URL option.

    Build one from a URL with :func:`aiolocks.connect` (``zk://...``).
    """

    def __init__(
        self,
        client: Any,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        suspended_is_lost: bool = False,
        layout: str = DEFAULT_LAYOUT,
    ) -> None:
        connect_timeout = _check_seconds("connect_timeout", connect_timeout)
        suspended_is_lost = _check_bool("suspended_is_lost", suspended_is_lost)
        layout = parse_layout(layout)
        link = AiozkLink(client)
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in link.hosts)
        chroot = link.chroot or ""
        driver = ZooKeeperDriver(
            given=link,
            servers=hosts,
            chroot=link.chroot,
            session_timeout=link.timeout,
            connect_timeout=connect_timeout,
            suspended_is_lost=suspended_is_lost,
            description=f"zk://{hosts}{chroot}",
            layout=layout,
        )
        super().__init__(driver)

    @property
    def _zk(self) -> ZooKeeperDriver:
        return cast(ZooKeeperDriver, self._engine.driver)

    @property
    def client(self) -> Any:
        """The ``aiozk.ZKClient`` this backend was built on; for a URL-built one, its own client.

        A URL-built backend's client is a :class:`ZooKeeperClient` (``None``
        before ``open()``): node operations in the backend's session.
        """
        return self._zk.client

    @property
    def session_id(self) -> int | None:
        """The id of the ZooKeeper session the locks live in (``None`` before ``open()``)."""
        link = self._zk.link
        return None if link is None else link.session_id

    @property
    def connection_state(self) -> ConnectionState | None:
        """The last connection state reported (``None`` before ``open()``)."""
        monitor = self._zk._monitor
        return None if monitor is None else monitor.state

    def add_connection_listener(
        self, listener: Callable[[ConnectionState], object]
    ) -> Callable[[], None]:
        """Call ``listener(state)`` on every connection-state change; returns a remover.

        The listener runs in the event loop and must not block. It may be
        added before ``open()``, and then also sees the first ``CONNECTED``.
        """
        return self._zk.add_listener(listener)

    def connection_states(self) -> AsyncIterator[ConnectionState]:
        """Iterate over connection-state changes from now on, until the backend closes.

        >>> async for state in backend.connection_states():  # doctest: +SKIP
        ...     if state is ConnectionState.LOST: ...
        """
        return self._zk.states()


def _check_seconds(name: str, value: object) -> float:
    """A keyword (or already parsed query) value in seconds, in :data:`SETTING_RANGE`."""
    return check_seconds(value, name, SETTING_RANGE)


def _check_bool(name: str, value: object) -> bool:
    """A keyword (or already parsed query) flag; text is for the URL query only."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _check_acl(value: object) -> str:
    """``creator`` or ``open`` (the ``acl`` option)."""
    if value not in ACL_MODES:
        raise ValueError(f"acl must be one of {', '.join(ACL_MODES)}, got {value!r}")
    return str(value)


def _security(parsed: ParsedURL, values: dict[str, object]) -> dict[str, Any]:
    """The driver's ``credentials`` and ``acl`` for the URL's user, password and ``acl=``.

    Messages name the user, never the password.
    """
    user, password = parsed.username, parsed.password
    if user is None and password is None:
        if _check_acl(values.get("acl", "open")) == "creator":
            raise ValueError(
                "acl=creator needs credentials in the zk:// URL (zk://user:password@...)"
            )
        return {}
    if password is None:
        raise ValueError(
            f"the zk:// URL names the user {user!r} without a password "
            "(digest authentication needs zk://user:password@...)"
        )
    user = check_user(user or "")
    acl = _check_acl(values.get("acl", "creator"))
    return {
        "credentials": (digest_credential(user, password),),
        "acl": creator_acl(user, password) if acl == "creator" else None,
    }


def from_url(url: str, **options: object) -> ZooKeeperBackend:
    """Build (without I/O) a backend for ``zk://host:port[,host:port...][/chroot][?options]``.

    ``zk://user:password@hosts/...`` authenticates every connection with
    ZooKeeper's digest scheme (the password may hold ``/ ? @ #``); the nodes
    the backend creates are then writable by that identity only and readable
    by anyone (``acl=creator``, the default with credentials; ``acl=open``
    leaves them world-writable). ``tls=true`` connects with TLS (to the
    ensemble's ``secureClientPort``): ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_check_hostname`` (default true). See
    ``docs/zookeeper.md``, "Security".

    Options (in the query or as keywords; keywords win): ``session_timeout``
    (seconds, default 10; the server clamps it to its min/max),
    ``connect_timeout`` (seconds, default 10), ``suspended_is_lost`` (bool,
    default false), ``layout`` (``aiolocks``, the default: names below
    ``/aiolocks/<family>/``; ``curator``: a name is the ZooKeeper path
    Apache Curator uses, see ``docs/zookeeper.md``).

    :raises ValueError: naming the bad part (scheme, host, port, chroot,
        credentials, unknown option or bad value).
    """
    parsed = parse_url(url, schemes=("zk",), default_port=2181, options=_URL_OPTIONS)
    chroot = parsed.path
    if chroot in ("", "/"):
        chroot = ""
    else:
        shown = parsed.redacted
        body = chroot[1:]
        if body.endswith("/"):
            raise ValueError(f"chroot {chroot!r} in {shown!r} must not end with '/'")
        for segment in body.split("/"):
            if segment in ("", ".", ".."):
                raise ValueError(
                    f"chroot {chroot!r} in {shown!r} has an invalid segment {segment!r}"
                )
            if has_control_character(segment):
                raise ValueError(f"chroot {chroot!r} in {shown!r} contains a control character")
    values: dict[str, object] = dict(parsed.options)
    for key, value in options.items():
        if key not in _URL_OPTIONS:
            raise ValueError(
                f"unknown option {key!r} for zk:// (allowed: {', '.join(sorted(_URL_OPTIONS))})"
            )
        values[key] = value
    session_timeout = _check_seconds(
        "session_timeout", values.get("session_timeout", DEFAULT_SESSION_TIMEOUT)
    )
    connect_timeout = _check_seconds(
        "connect_timeout", values.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    )
    suspended_is_lost = _check_bool("suspended_is_lost", values.get("suspended_is_lost", False))
    layout = parse_layout(values.get("layout", DEFAULT_LAYOUT))
    security = _security(parsed, values)
    context = tls_context(values)
    if context is not None:
        security["ssl_context"] = context
    servers = ",".join(str(h) for h in parsed.hosts)
    user = f"{parsed.username}@" if "credentials" in security else ""
    driver = ZooKeeperDriver(
        given=None,
        servers=servers,
        chroot=chroot or None,
        session_timeout=session_timeout,
        connect_timeout=connect_timeout,
        suspended_is_lost=suspended_is_lost,
        description=f"zk://{user}{servers}{chroot}",
        layout=layout,
        **security,
    )
    return ZooKeeperBackend._around(driver)
