"""Which Redis failures are a refusal (:class:`AccessDeniedError`), not an outage.

redis-py's ``AuthenticationError`` subclasses its ``ConnectionError``, and a
TLS handshake that fails verification surfaces as a ``ConnectionError`` too;
left alone, a wrong password or an untrusted certificate would read as
"server unreachable": retried, and with ``on_unavailable="local"`` turned
into a process-local lock in every process at once. Every place that maps
Redis errors asks :func:`denied` first.
"""

from __future__ import annotations

import ssl

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoPermissionError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.backoff import Backoff
from .._core.errors import AccessDeniedError, BackendUnavailableError, LockError

__all__ = [
    "COMMAND_ERRORS",
    "SERVED_LATER",
    "UNREACHABLE",
    "denied",
    "is_refusal",
    "map_error",
    "retry_after",
]

#: replies of a Redis Cluster or a failover in the middle of a change: the
#: servers answer, but the data is not served now and will be soon
#: (``CLUSTERDOWN``/``MASTERDOWN``, ``TRYAGAIN``, ``READONLY`` from a demoted
#: primary, and redis-py's own ``RedisClusterException`` such as "All slots
#: are not covered", which is no ``RedisError``). Found by the cluster fault runs.
SERVED_LATER = (ClusterDownError, TryAgainError, ReadOnlyError, RedisClusterException)
#: redis-py's errors of a server out of reach or not serving for now (a
#: refusal among them: :func:`denied`): retried, then ``BackendUnavailableError``
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, *SERVED_LATER)
#: every error a redis-py command may raise (``RedisClusterException`` is no ``RedisError``)
COMMAND_ERRORS = (RedisError, RedisClusterException, OSError)

#: server replies that refuse the client whatever it retries
_REFUSAL_PREFIXES = ("NOPERM", "WRONGPASS", "NOAUTH")

#: how a refusal shows in the Sentinel's summary of the errors it met
_REFUSAL_NAMES = ("AuthenticationError", "NoPermissionError", "WRONGPASS", "NOAUTH")

#: OpenSSL reasons for a handshake the peer refused (our certificate missing,
#: not trusted, or expired on the server's side)
_TLS_REFUSALS = (
    "CERTIFICATE_VERIFY_FAILED",
    "certificate verify failed",
    "CERTIFICATE_REQUIRED",
    "certificate required",
    "UNKNOWN_CA",
    "unknown ca",
    "BAD_CERTIFICATE",
    "bad certificate",
    "CERTIFICATE_EXPIRED",
    "certificate expired",
)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


class SentinelRefused(RedisError):
    """A Sentinel refused our credentials or certificate (raised from its error).

    Not a redis-py ``ConnectionError``, so neither redis-py's retry nor its
    Sentinel discovery asks the Sentinels again until ``connect_timeout``
    runs out: a refusal is reported at once (the retry of each Sentinel's
    client in ``redis/_client.py`` raises it).
    """


def _refuses(item: BaseException) -> bool:
    """``item`` itself (not what it was raised from) is a refusal."""
    if isinstance(
        item,
        AuthenticationError | NoPermissionError | SentinelRefused | ssl.SSLCertVerificationError,
    ):
        return True
    if isinstance(item, ResponseError) and str(item).startswith(_REFUSAL_PREFIXES):
        return True
    if isinstance(item, OSError | RedisError) and any(
        reason in str(item) for reason in _TLS_REFUSALS
    ):
        return True
    # every Sentinel that answered refused our credentials
    return isinstance(item, MasterNotFoundError) and any(
        name in str(item) for name in _REFUSAL_NAMES
    )


def is_refusal(exc: BaseException) -> bool:
    """``exc`` (or what it was raised from) says Redis refused us, not that it is away."""
    return any(_refuses(item) for item in _chain(exc))


async def retry_after(exc: BaseException, backoff: Backoff) -> bool:
    """After the outage ``exc``: wait out ``backoff``'s next delay; whether to try again.

    The one rule of every retry loop over Redis commands: a refusal (a
    password rotated away, an ACL, an untrusted certificate; redis-py raises
    some of them as a ``ConnectionError``) is final at once, since asking
    again is refused again; any other outage is retried until ``backoff``'s
    limit. The background loops that outlive a caller (the watchdog, the
    pub/sub reconnect) do not use it: they retry until the lease decides.
    """
    return not is_refusal(exc) and await backoff.wait()


def denied(exc: BaseException, describe: str, what: str = "connecting") -> AccessDeniedError | None:
    """The :class:`AccessDeniedError` for ``exc``, or None when it is not a refusal.

    ``raise denied(...) from exc``; the message names the server (never a
    password), what was being done and the refusal itself (which may be
    deep in the chain: a Sentinel connection's handshake failure reaches us
    wrapped in a bare ``TimeoutError``).
    """
    reason = next((item for item in _chain(exc) if _refuses(item)), None)
    if reason is None:
        return None
    return AccessDeniedError(
        f"Redis {describe} refused access while {what}: {reason} "
        "(check the user, password, ACL rules and TLS certificates)"
    )


def map_error(exc: BaseException, what: str, describe: str) -> LockError:
    """Driver errors -> aiolocks errors, in one place (``raise map_error(...) from exc``)."""
    refused = denied(exc, describe, what)
    if refused is not None:
        return refused
    if isinstance(exc, UNREACHABLE):
        return BackendUnavailableError(f"Redis {describe} unreachable while {what}: {exc}")
    return LockError(f"Redis {describe} refused {what}: {exc}")
