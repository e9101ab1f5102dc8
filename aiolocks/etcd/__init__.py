"""The etcd v3 backend (``etcd://``): one lease per backend is the session.

Build it with :func:`aiolocks.connect` (which calls :func:`from_url`), or
around an :class:`EtcdClient` you already have with :class:`EtcdBackend`.
See ``docs/etcd.md`` for the recipe, its guarantees and its limits.

Importing this package does not import ``grpc``: the client is loaded when a
backend is built (or when ``aiolocks.etcd.EtcdClient`` is first used).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, final

from .._core.backend import Backend
from ._state import ConnectionState
from ._url import DEFAULT_LEASE_TTL, EtcdOptions, parse_etcd_url

if TYPE_CHECKING:
    from ._client import EtcdClient

__all__ = ["ConnectionState", "EtcdBackend", "EtcdClient", "from_url"]


def _load_client() -> Any:
    try:
        from . import _client
    except ImportError as exc:
        raise ImportError(
            f"the etcd backend needs grpcio and aetcd ({exc}); "
            'install them with: pip install "aiolocks[etcd]"'
        ) from exc
    return _client


def __getattr__(name: str) -> Any:
    if name == "EtcdClient":
        return _load_client().EtcdClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix:
        return ""
    # The URL parser owns the rules for a prefix; reuse it on a dummy URL.
    return parse_etcd_url(f"etcd://127.0.0.1/{prefix.strip('/')}").prefix


@final
class EtcdBackend(Backend):
    """The etcd backend, built from a URL or around a client you already have.

    ::

        backend = EtcdBackend("etcd://10.0.0.1,10.0.0.2/app?lease_ttl=10")
        client = aiolocks.etcd.EtcdClient(["10.0.0.1:2379", "10.0.0.2:2379"])
        backend = EtcdBackend(client, prefix="app", lease_ttl=10)

    A backend's session is one lease of ``lease_ttl`` seconds, kept alive in
    the background; when it expires or is revoked every hold of the backend
    is lost, while acquires still waiting go on waiting in a new lease. A
    client you pass in is connected by ``open()`` if needed but never closed
    by the backend.

    :param prefix: every key the backend writes lives under ``prefix/``
        (client form only; the URL form takes it from the path).
    :param lease_ttl: the session lease's TTL in whole seconds (client form
        only; the URL form takes ``?lease_ttl=``).
    """

    def __init__(
        self,
        target: str | EtcdClient,
        *,
        prefix: str = "",
        lease_ttl: int = DEFAULT_LEASE_TTL,
    ) -> None:
        client_class = _load_client().EtcdClient
        from ._driver import EtcdDriver

        if isinstance(target, str):
            if prefix or lease_ttl != DEFAULT_LEASE_TTL:
                raise ValueError(
                    "EtcdBackend(url) takes the prefix and lease_ttl from the URL "
                    "(etcd://host/prefix?lease_ttl=N), not as keywords"
                )
            options = parse_etcd_url(target)
            super().__init__(EtcdDriver(options))
            return
        if not isinstance(target, client_class):
            raise TypeError(
                "EtcdBackend takes an etcd:// URL or an aiolocks.etcd.EtcdClient, "
                f"got {type(target).__name__}"
            )
        checked = parse_etcd_url("etcd://127.0.0.1", lease_ttl=lease_ttl)
        options = EtcdOptions(
            endpoints=target.endpoints,
            prefix=_check_prefix(prefix),
            lease_ttl=checked.lease_ttl,
            connect_timeout=target.connect_timeout,
            request_timeout=target.request_timeout,
        )
        super().__init__(EtcdDriver(options, client=target))

    @property
    def client(self) -> EtcdClient:
        """The etcd client this backend talks through (its own, or the one passed in)."""
        client: EtcdClient = self._driver.client
        return client

    @property
    def connection_state(self) -> ConnectionState | None:
        """The last connection state of the session lease (``None`` before ``open()``).

        ``CONNECTED``, ``SUSPENDED`` (keep-alive failing, deadline not passed),
        ``RECONNECTED`` or ``LOST`` (the lease ended: every hold is lost); see
        :class:`ConnectionState`.
        """
        state: ConnectionState | None = self._driver.connection_state
        return state

    def add_connection_listener(
        self, listener: Callable[[ConnectionState], object]
    ) -> Callable[[], None]:
        """Call ``listener(state)`` on every connection-state change; returns a remover.

        The listener runs in the event loop and must not block. It may be
        added before ``open()``, and then also sees the first ``CONNECTED``.
        """
        remover: Callable[[], None] = self._driver.add_listener(listener)
        return remover

    def connection_states(self) -> AsyncIterator[ConnectionState]:
        """Iterate over connection-state changes from now on, until the backend closes.

        >>> async for state in backend.connection_states():  # doctest: +SKIP
        ...     if state is ConnectionState.LOST: ...
        """
        states: AsyncIterator[ConnectionState] = self._driver.states()
        return states


def from_url(url: str, **options: object) -> EtcdBackend:
    """``etcd://h1:2379,h2:2379[/prefix][?lease_ttl=10&...]`` (+ keyword query options)."""
    checked = parse_etcd_url(url, **options)  # bad input fails before anything is imported
    _load_client()
    from ._driver import EtcdDriver

    return EtcdBackend._around(EtcdDriver(checked))
