"""A thin asyncio etcd v3 client on ``grpc.aio``: what the etcd lock driver stands on.

Why not a ready client: ``aetcd`` (the maintained asyncio client) is used
only for the gRPC stubs and protobuf messages it generated from etcd's API
(``aetcd.rpc``). Its high-level client cannot be used as it is: it has no
background keep-alive stream (``refresh_lease`` opens a stream per call and
answers TTL=0 for an expired lease), ignores range limits, revisions and
``min/max_*_revision``, cannot sort or limit a range inside a transaction,
speaks to one endpoint, and one error on its shared watch stream reaches
every watcher without resuming. Everything the lock recipes need is here in
a few hundred lines over the stubs.

Rules of this layer:

* **Deadlines everywhere.** Every unary request has a deadline
  (``request_timeout`` unless given); connecting has ``connect_timeout``.
  Nothing retries without a bound: no request outlives its deadline.
* **Endpoint failover.** A request that meets an unreachable or stalled
  member (``UNAVAILABLE``, its deadline, or the member's own request
  timeout, which etcd sends as ``UNKNOWN: context deadline exceeded``)
  marks the member bad and the client moves on to the next endpoint.
  Reads and the requests the caller marks ``retry=True`` (writes that are
  safe to repeat, such as a transaction guarded by a compare) are tried
  again on the next endpoint,
  round after round with a short pause, until their deadline; other writes
  are tried again (once per endpoint) only when the request cannot have
  left this process (no connection to the member).
* **Errors** map to :class:`~aiolocks.BackendUnavailableError` (no member
  answered in time), :class:`~aiolocks.AccessDeniedError` (wrong
  credentials, a permission the user lacks, a refused TLS handshake: never
  retried), :class:`LeaseNotFoundError`, :class:`CompactedError` and
  :class:`EtcdRequestError` (any other refusal), all in :func:`_map_refusal`.
  Cancellation is never wrapped; a cancelled request is cancelled on the
  wire and leaves the channel usable.
* **Authentication** (a user and password given): the client gets a token
  from ``Auth/Authenticate`` when it connects, after a failover to another
  member, and whenever etcd says the token is invalid or expired (simple
  tokens expire after the server's ``--auth-token-ttl`` without use); the
  token goes with every request and stream as the ``token`` metadata.
* **One keep-alive stream per lease** (:class:`LeaseKeepAlive`), refreshing
  at TTL/3, with the client-side deadline known to the caller.
* **One watch stream per client**: every :class:`Watch` is multiplexed on
  it by etcd's watch id; when the stream breaks, it is opened on another
  endpoint and every watch is re-created from its next revision.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Self, final

import grpc
import grpc.aio
from aetcd.rpc import rpc_pb2 as pb
from aetcd.rpc import rpc_pb2_grpc as pb_grpc

from .._core.backoff import Backoff
from .._core.errors import AccessDeniedError, BackendUnavailableError, LockError
from ._url import EtcdTLS

__all__ = [
    "CompactedError",
    "Compare",
    "DeleteOp",
    "DeleteResult",
    "EtcdClient",
    "EtcdError",
    "EtcdRequestError",
    "EventType",
    "KeyValue",
    "LeaseGrant",
    "LeaseInfo",
    "LeaseKeepAlive",
    "LeaseNotFoundError",
    "PutOp",
    "PutResult",
    "RangeOp",
    "RangeResult",
    "SortOrder",
    "SortTarget",
    "TxnResult",
    "Watch",
    "WatchEvent",
    "WatchResponse",
    "prefix_end",
]

_log = logging.getLogger("aiolocks.etcd")

#: Keys and values may be given as ``str`` (UTF-8) or ``bytes``.
Bytes = bytes | str

_DEFAULT_CHANNEL_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    # Reconnect quickly after a member comes back (gRPC's default backoff
    # grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # HTTP/2 pings notice a dead connection that has streams open (a watch on
    # a partitioned member). etcd refuses pings more often than every 5 s.
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # Each client its own connections: gRPC otherwise shares them between
    # channels to the same address, and one client would inherit another's
    # reconnect backoff.
    ("grpc.use_local_subchannel_pool", 1),
)

_TRANSPORT_CODES: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
)
# Details of an UNAVAILABLE that gRPC gives when the request never left this
# process: safe to send again to another member even when it is a write.
_NOT_SENT_MARKERS: Final = (
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "no connection",
    "dns resolution failed",
)
# etcd's answers to a request with a token it no longer knows (expired, or
# issued before a change of users/roles): get a new token and send again.
_STALE_TOKEN_MARKERS: Final = ("invalid auth token", "revision of auth store is old")
# etcd's refusals of the credentials or of a permission.
_DENIED_MARKERS: Final = (
    "permission denied",
    "authentication failed",
    "user name is empty",
    "user name not found",
    "invalid auth token",
)
# What gRPC says when the TLS handshake failed: a refused certificate, not an
# outage (the server answered, and would answer the same again).
_TLS_REFUSED_MARKERS: Final = (
    "handshake failed",
    "certificate_verify_failed",
    "certificate verify failed",
    "not in peer certificate",
    "peer name",
    "hostname verification",
    # the member closed TLS with an alert: it refused our client certificate
    # (or we sent none to a member started with --client-cert-auth)
    "tsi_data_corrupted",
)


# --------------------------------------------------------------------------- errors


class EtcdError(LockError):
    """Base class of the errors etcd answers with (transport failures are
    :class:`~aiolocks.BackendUnavailableError` instead)."""


class EtcdRequestError(EtcdError):
    """etcd refused a request; ``code`` is the gRPC status name, ``details`` its message."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"etcd refused the request: {code}: {details}")
        self.code = code
        self.details = details


class LeaseNotFoundError(EtcdError):
    """The lease does not exist any more (expired or revoked)."""


class CompactedError(EtcdError):
    """A watch or read asked for a revision that was compacted away.

    ``compact_revision`` is the oldest revision still available (0 when the
    server did not say).
    """

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


def _code_name(exc: grpc.aio.AioRpcError) -> str:
    code = exc.code()
    return str(code.name) if code is not None else "UNKNOWN"


def _details(exc: grpc.aio.AioRpcError) -> str:
    return str(exc.details() or "")


#: how a member reports that its *own* request timeout ran out (5 s plus two
#: election timeouts: a write or lease request it could not commit, having no
#: quorum): gRPC ``UNKNOWN`` with Go's context error as the details. As
#: ``DEADLINE_EXCEEDED``, an outage whose write may or may not apply later, not
#: a refusal (found by the cluster fault runs: a client on a minority member).
_MEMBER_DEADLINE: Final = "context deadline exceeded"


def _is_transport(exc: grpc.aio.AioRpcError) -> bool:
    code = exc.code()
    if code == grpc.StatusCode.UNKNOWN:
        return _details(exc).strip().lower() == _MEMBER_DEADLINE
    return code in _TRANSPORT_CODES


#: what ends a watch stream without refusing it: the next member is tried.
#: ``INTERNAL`` ("Internal error from Core") is how gRPC reports a stream
#: broken under it (found by the membership fault runs, a member restarted).
_STREAM_RETRY_CODES: Final = _TRANSPORT_CODES | frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


def _stream_retried(exc: grpc.aio.AioRpcError) -> bool:
    """A watch stream that ended with ``exc`` is opened again (on the next member)."""
    return exc.code() in _STREAM_RETRY_CODES


def _not_sent(exc: grpc.aio.AioRpcError) -> bool:
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = _details(exc).lower()
    return any(marker in details for marker in _NOT_SENT_MARKERS)


def _stale_token(exc: grpc.aio.AioRpcError) -> bool:
    details = _details(exc).lower()
    return any(marker in details for marker in _STALE_TOKEN_MARKERS)


def _tls_refused(exc: grpc.aio.AioRpcError) -> bool:
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = _details(exc).lower()
    return any(marker in details for marker in _TLS_REFUSED_MARKERS)


def _denied(details: str) -> AccessDeniedError | None:
    """etcd (or the TLS handshake) refused the credentials or a permission."""
    lowered = details.lower()
    if any(marker in lowered for marker in _TLS_REFUSED_MARKERS):
        return AccessDeniedError(
            "etcd: the TLS handshake failed (is the member's certificate signed by "
            "ssl_ca_certs and made for the host name dialled, and does the member trust "
            f"ssl_certfile?): {details}"
        )
    if "authentication is not enabled" in lowered:
        return AccessDeniedError(
            f"etcd: {details}: the URL names a user, but the cluster does not authenticate "
            "(run 'etcdctl auth enable', or leave user:password@ out)"
        )
    if any(marker in lowered for marker in _DENIED_MARKERS):
        return AccessDeniedError(f"etcd refused the credentials or a permission: {details}")
    return None


def _map_refusal(exc: grpc.aio.AioRpcError) -> LockError:
    """The one mapping of an etcd refusal (or a failed TLS handshake) to an aiolocks error."""
    details = _details(exc)
    denied = _denied(details)
    if denied is not None or exc.code() in (
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    ):
        return denied or AccessDeniedError(f"etcd refused access: {details}")
    if "lease not found" in details:
        return LeaseNotFoundError(f"etcd: {details}")
    if "compacted" in details:
        return CompactedError(f"etcd: {details}", 0)
    return EtcdRequestError(_code_name(exc), details)


# --------------------------------------------------------------------------- values


def _b(value: Bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"etcd keys and values are bytes or str, not {type(value).__name__}")


def prefix_end(prefix: Bytes) -> bytes:
    """The ``range_end`` that covers every key starting with ``prefix``.

    >>> prefix_end(b"locks/a/")
    b'locks/a0'
    """
    data = bytearray(_b(prefix))
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\x00"  # every key


# --------------------------------------------------------------------------- wire encoding
#
# The lock recipes send a transaction or two per acquire and release; building
# them as protobuf message objects costs more than the rest of the client's
# work together. Transactions are therefore written straight in protobuf's
# wire format (fields in number order, zero values left out, as protobuf
# itself writes them; tests compare the bytes with the generated messages'),
# and each operation object keeps its encoding, so the operations a driver
# reuses (the read of a queue's head) are encoded once.

_SMALL_VARINTS: Final = tuple(bytes((n,)) for n in range(128))


def _varint(number: int) -> bytes:
    if 0 <= number < 128:
        return _SMALL_VARINTS[number]
    number &= 0xFFFF_FFFF_FFFF_FFFF  # int64: a negative number is its two's complement
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _int_field(tag: bytes, number: int) -> bytes:
    return tag + _varint(number) if number else b""


def _bytes_field(tag: bytes, data: bytes) -> bytes:
    return tag + _varint(len(data)) + data if data else b""


def _message_field(tag: bytes, data: bytes) -> bytes:
    return tag + _varint(len(data)) + data


# Field tags ((number << 3) | wire type) of the messages written here.
_VARINT: Final = tuple(bytes(((n << 3) | 0,)) for n in range(16))
_LENGTH: Final = tuple(bytes(((n << 3) | 2,)) for n in range(16))
_COMPARE_RANGE_END: Final = b"\x82\x04"  # Compare.range_end is field 64


@final
@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def _from_pb(cls, kv: Any) -> KeyValue:
        return cls(
            key=bytes(kv.key),
            value=bytes(kv.value),
            create_revision=int(kv.create_revision),
            mod_revision=int(kv.mod_revision),
            version=int(kv.version),
            lease=int(kv.lease),
        )


@final
@dataclass(frozen=True, slots=True)
class RangeResult:
    """The answer to a range read: ``kvs``, ``count`` of all matches, ``more`` beyond the limit."""

    kvs: tuple[KeyValue, ...]
    count: int
    more: bool
    revision: int

    @classmethod
    def _from_pb(cls, response: Any) -> RangeResult:
        return cls(
            kvs=tuple(KeyValue._from_pb(kv) for kv in response.kvs),
            count=int(response.count),
            more=bool(response.more),
            revision=int(response.header.revision),
        )


@final
@dataclass(frozen=True, slots=True)
class PutResult:
    """The answer to a put: the store ``revision`` it made, and the previous key if asked."""

    revision: int
    prev_kv: KeyValue | None

    @classmethod
    def _from_pb(cls, response: Any) -> PutResult:
        prev = KeyValue._from_pb(response.prev_kv) if response.HasField("prev_kv") else None
        return cls(revision=int(response.header.revision), prev_kv=prev)


@final
@dataclass(frozen=True, slots=True)
class DeleteResult:
    """The answer to a delete: how many keys went, and which if ``prev_kv`` was asked."""

    deleted: int
    prev_kvs: tuple[KeyValue, ...]
    revision: int

    @classmethod
    def _from_pb(cls, response: Any) -> DeleteResult:
        return cls(
            deleted=int(response.deleted),
            prev_kvs=tuple(KeyValue._from_pb(kv) for kv in response.prev_kvs),
            revision=int(response.header.revision),
        )


@final
@dataclass(frozen=True, slots=True)
class TxnResult:
    """The answer to a transaction: which branch ran and the answer of each of its operations."""

    succeeded: bool
    responses: tuple[RangeResult | PutResult | DeleteResult, ...]
    revision: int


class SortOrder(enum.IntEnum):
    """Order of a range read (etcd's ``RangeRequest.SortOrder``)."""

    NONE = 0
    ASCEND = 1
    DESCEND = 2


class SortTarget(enum.IntEnum):
    """What a range read sorts by (etcd's ``RangeRequest.SortTarget``)."""

    KEY = 0
    VERSION = 1
    CREATE = 2
    MOD = 3
    VALUE = 4


_COMPARE_RESULTS: Final = {"==": 0, ">": 1, "<": 2, "!=": 3}


@final
@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction, built with the class methods::

    Compare.create_revision("locks/a/1", "==", 0)
    Compare.lease("locks/a/1", "==", lease_id)
    """

    target: int
    result: int
    key: bytes
    number: int = 0
    value: bytes = b""
    range_end: bytes = b""
    #: this operation in protobuf's wire format, written at its first use
    _wire: bytes = field(default=b"", init=False, repr=False, compare=False)

    @staticmethod
    def _result(op: str) -> int:
        try:
            return _COMPARE_RESULTS[op]
        except KeyError:
            raise ValueError(f"compare operator {op!r} is not one of == != < >") from None

    @classmethod
    def version(cls, key: Bytes, op: str, version: int) -> Compare:
        """``version(key) op version`` (0 = the key does not exist)."""
        return cls(0, cls._result(op), _b(key), number=version)

    @classmethod
    def create_revision(
        cls, key: Bytes, op: str, revision: int, *, prefix: bool = False
    ) -> Compare:
        """``create_revision(key) op revision`` (0 = the key does not exist).

        ``prefix=True``: the condition must hold for every key that starts
        with ``key`` (a range compare).
        """
        key_bytes = _b(key)
        end = prefix_end(key_bytes) if prefix else b""
        return cls(1, cls._result(op), key_bytes, number=revision, range_end=end)

    @classmethod
    def mod_revision(cls, key: Bytes, op: str, revision: int) -> Compare:
        """``mod_revision(key) op revision``."""
        return cls(2, cls._result(op), _b(key), number=revision)

    @classmethod
    def value_of(cls, key: Bytes, op: str, value: Bytes) -> Compare:
        """``value(key) op value``."""
        return cls(3, cls._result(op), _b(key), value=_b(value))

    @classmethod
    def lease(cls, key: Bytes, op: str, lease_id: int) -> Compare:
        """``lease(key) op lease_id`` (0 = no lease)."""
        return cls(4, cls._result(op), _b(key), number=lease_id)

    def _encoded(self) -> bytes:
        """``Compare`` in wire format (the target's field is written even when 0: a oneof)."""
        wire = self._wire
        if not wire:
            target = self.target
            if target == 3:
                operand = _message_field(_LENGTH[7], self.value)
            else:
                operand = _VARINT[(4, 5, 6, 0, 8)[target]] + _varint(self.number)
            wire = (
                _int_field(_VARINT[1], self.result)
                + _int_field(_VARINT[2], target)
                + _bytes_field(_LENGTH[3], self.key)
                + operand
                + _bytes_field(_COMPARE_RANGE_END, self.range_end)
            )
            object.__setattr__(self, "_wire", wire)
        return wire

    def _to_pb(self) -> Any:
        compare = pb.Compare(result=self.result, target=self.target, key=self.key)
        if self.range_end:
            compare.range_end = self.range_end
        if self.target == 0:
            compare.version = self.number
        elif self.target == 1:
            compare.create_revision = self.number
        elif self.target == 2:
            compare.mod_revision = self.number
        elif self.target == 3:
            compare.value = self.value
        else:
            compare.lease = self.number
        return compare


@final
@dataclass(frozen=True, slots=True)
class RangeOp:
    """A range read, alone (:meth:`EtcdClient.range`) or inside a transaction.

    ``range_end`` empty: the single ``key``; ``prefix=True``: every key that
    starts with ``key``. ``limit`` 0 = no limit, ``revision`` 0 = the newest.
    """

    key: bytes
    range_end: bytes = b""
    limit: int = 0
    revision: int = 0
    sort_order: SortOrder = SortOrder.NONE
    sort_target: SortTarget = SortTarget.KEY
    serializable: bool = False
    keys_only: bool = False
    count_only: bool = False
    min_mod_revision: int = 0
    max_mod_revision: int = 0
    min_create_revision: int = 0
    max_create_revision: int = 0
    #: this operation in protobuf's wire format, written at its first use
    _wire: bytes = field(default=b"", init=False, repr=False, compare=False)

    @classmethod
    def of(
        cls,
        key: Bytes,
        *,
        range_end: Bytes = b"",
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        sort_order: SortOrder = SortOrder.NONE,
        sort_target: SortTarget = SortTarget.KEY,
        serializable: bool = False,
        keys_only: bool = False,
        count_only: bool = False,
        min_mod_revision: int = 0,
        max_mod_revision: int = 0,
        min_create_revision: int = 0,
        max_create_revision: int = 0,
    ) -> RangeOp:
        """Build a range read with keys given as ``str`` or ``bytes``."""
        if prefix and range_end:
            raise ValueError("give either prefix=True or range_end, not both")
        for name, number in (
            ("limit", limit),
            ("revision", revision),
            ("min_mod_revision", min_mod_revision),
            ("max_mod_revision", max_mod_revision),
            ("min_create_revision", min_create_revision),
            ("max_create_revision", max_create_revision),
        ):
            if number < 0:
                raise ValueError(f"{name} must be >= 0, not {number}")
        key_bytes = _b(key)
        return cls(
            key=key_bytes,
            range_end=prefix_end(key_bytes) if prefix else _b(range_end),
            limit=limit,
            revision=revision,
            sort_order=sort_order,
            sort_target=sort_target,
            serializable=serializable,
            keys_only=keys_only,
            count_only=count_only,
            min_mod_revision=min_mod_revision,
            max_mod_revision=max_mod_revision,
            min_create_revision=min_create_revision,
            max_create_revision=max_create_revision,
        )

    def _encoded(self) -> bytes:
        """``RequestOp(request_range=...)`` in wire format."""
        wire = self._wire
        if not wire:
            body = b"".join(
                (
                    _bytes_field(_LENGTH[1], self.key),
                    _bytes_field(_LENGTH[2], self.range_end),
                    _int_field(_VARINT[3], self.limit),
                    _int_field(_VARINT[4], self.revision),
                    _int_field(_VARINT[5], int(self.sort_order)),
                    _int_field(_VARINT[6], int(self.sort_target)),
                    _int_field(_VARINT[7], int(self.serializable)),
                    _int_field(_VARINT[8], int(self.keys_only)),
                    _int_field(_VARINT[9], int(self.count_only)),
                    _int_field(_VARINT[10], self.min_mod_revision),
                    _int_field(_VARINT[11], self.max_mod_revision),
                    _int_field(_VARINT[12], self.min_create_revision),
                    _int_field(_VARINT[13], self.max_create_revision),
                )
            )
            wire = _message_field(_LENGTH[1], body)
            object.__setattr__(self, "_wire", wire)
        return wire

    def _to_pb(self) -> Any:
        return pb.RangeRequest(
            key=self.key,
            range_end=self.range_end,
            limit=self.limit,
            revision=self.revision,
            sort_order=int(self.sort_order),
            sort_target=int(self.sort_target),
            serializable=self.serializable,
            keys_only=self.keys_only,
            count_only=self.count_only,
            min_mod_revision=self.min_mod_revision,
            max_mod_revision=self.max_mod_revision,
            min_create_revision=self.min_create_revision,
            max_create_revision=self.max_create_revision,
        )


@final
@dataclass(frozen=True, slots=True)
class PutOp:
    """A put, alone or inside a transaction (``lease`` 0 = no lease)."""

    key: bytes
    value: bytes
    lease: int = 0
    prev_kv: bool = False
    #: this operation in protobuf's wire format, written at its first use
    _wire: bytes = field(default=b"", init=False, repr=False, compare=False)

    @classmethod
    def of(cls, key: Bytes, value: Bytes, *, lease: int = 0, prev_kv: bool = False) -> PutOp:
        """Build a put with key and value given as ``str`` or ``bytes``."""
        if lease < 0:
            raise ValueError(f"lease must be >= 0, not {lease}")
        return cls(_b(key), _b(value), lease, prev_kv)

    def _encoded(self) -> bytes:
        """``RequestOp(request_put=...)`` in wire format."""
        wire = self._wire
        if not wire:
            body = (
                _bytes_field(_LENGTH[1], self.key)
                + _bytes_field(_LENGTH[2], self.value)
                + _int_field(_VARINT[3], self.lease)
                + _int_field(_VARINT[4], int(self.prev_kv))
            )
            wire = _message_field(_LENGTH[2], body)
            object.__setattr__(self, "_wire", wire)
        return wire

    def _to_pb(self) -> Any:
        return pb.PutRequest(key=self.key, value=self.value, lease=self.lease, prev_kv=self.prev_kv)


@final
@dataclass(frozen=True, slots=True)
class DeleteOp:
    """A delete of one key (or of a range / prefix), alone or inside a transaction."""

    key: bytes
    range_end: bytes = b""
    prev_kv: bool = False
    #: this operation in protobuf's wire format, written at its first use
    _wire: bytes = field(default=b"", init=False, repr=False, compare=False)

    @classmethod
    def of(
        cls, key: Bytes, *, range_end: Bytes = b"", prefix: bool = False, prev_kv: bool = False
    ) -> DeleteOp:
        """Build a delete with keys given as ``str`` or ``bytes``."""
        if prefix and range_end:
            raise ValueError("give either prefix=True or range_end, not both")
        key_bytes = _b(key)
        end = prefix_end(key_bytes) if prefix else _b(range_end)
        return cls(key_bytes, end, prev_kv)

    def _encoded(self) -> bytes:
        """``RequestOp(request_delete_range=...)`` in wire format."""
        wire = self._wire
        if not wire:
            body = (
                _bytes_field(_LENGTH[1], self.key)
                + _bytes_field(_LENGTH[2], self.range_end)
                + _int_field(_VARINT[3], int(self.prev_kv))
            )
            wire = _message_field(_LENGTH[3], body)
            object.__setattr__(self, "_wire", wire)
        return wire

    def _to_pb(self) -> Any:
        return pb.DeleteRangeRequest(key=self.key, range_end=self.range_end, prev_kv=self.prev_kv)


Op = RangeOp | PutOp | DeleteOp


def _request_op(op: Op) -> Any:
    if isinstance(op, RangeOp):
        return pb.RequestOp(request_range=op._to_pb())
    if isinstance(op, PutOp):
        return pb.RequestOp(request_put=op._to_pb())
    if isinstance(op, DeleteOp):
        return pb.RequestOp(request_delete_range=op._to_pb())
    raise TypeError(f"a transaction operation is a RangeOp, PutOp or DeleteOp, not {op!r}")


def _txn_request(compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> bytes:
    """A ``TxnRequest`` in wire format (see "wire encoding" above)."""
    parts: list[bytes] = []
    for condition in compare:
        if not isinstance(condition, Compare):
            raise TypeError(f"a transaction condition is a Compare, not {condition!r}")
        wire = condition._encoded()
        parts += (_LENGTH[1], _varint(len(wire)), wire)
    for tag, ops in ((_LENGTH[2], success), (_LENGTH[3], failure)):
        for op in ops:
            if not isinstance(op, RangeOp | PutOp | DeleteOp):
                raise TypeError(
                    f"a transaction operation is a RangeOp, PutOp or DeleteOp, not {op!r}"
                )
            wire = op._encoded()
            parts += (tag, _varint(len(wire)), wire)
    return b"".join(parts)


def _response_op(response: Any) -> RangeResult | PutResult | DeleteResult:
    kind = response.WhichOneof("response")
    if kind == "response_range":
        return RangeResult._from_pb(response.response_range)
    if kind == "response_put":
        return PutResult._from_pb(response.response_put)
    if kind == "response_delete_range":
        return DeleteResult._from_pb(response.response_delete_range)
    raise EtcdRequestError("UNIMPLEMENTED", f"unexpected transaction answer {kind!r}")


@final
@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """A granted lease: its ``id``, the ``ttl`` the server granted (seconds), and
    ``granted_at``, the event-loop time when the grant request was sent (the
    lease cannot end before ``granted_at + ttl``)."""

    id: int
    ttl: int
    granted_at: float


@final
@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A lease's time to live: ``ttl`` remaining (-1 when it does not exist), ``keys`` on it."""

    id: int
    ttl: int
    granted_ttl: int
    keys: tuple[bytes, ...]


class EventType(enum.Enum):
    """What a watch event reports."""

    PUT = 0
    DELETE = 1


@final
@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch (``kv.mod_revision`` is the revision of the change)."""

    type: EventType
    kv: KeyValue
    prev_kv: KeyValue | None


@final
@dataclass(frozen=True, slots=True)
class WatchResponse:
    """A batch of events, or a progress notification (no events) at ``revision``.

    Every event up to ``revision`` that matches the watch has been delivered
    once a progress notification arrives.
    """

    events: tuple[WatchEvent, ...]
    revision: int

    @property
    def is_progress(self) -> bool:
        """Whether this is a progress notification (no events)."""
        return not self.events


# --------------------------------------------------------------------------- client


class _KVStub(pb_grpc.KVStub):  # type: ignore[misc]
    """etcd's KV service, plus ``txn_wire``: a ``Txn`` that takes its request already encoded."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.txn_wire = channel.unary_unary(
            "/etcdserverpb.KV/Txn",
            request_serializer=None,  # the request is bytes in wire format
            response_deserializer=pb.TxnResponse.FromString,
            _registered_method=True,
        )


class _Stubs:
    __slots__ = ("auth", "channel", "kv", "lease", "maintenance", "watch")

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.auth = pb_grpc.AuthStub(channel)
        self.kv = _KVStub(channel)
        self.lease = pb_grpc.LeaseStub(channel)
        self.watch = pb_grpc.WatchStub(channel)
        self.maintenance = pb_grpc.MaintenanceStub(channel)


def _read(path: str | None, option: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ValueError(f"{option}={path!r}: cannot be read ({exc.strerror})") from None


class _Auth:
    """The etcd user's credentials and its current token (nothing when no user is given).

    The password stays in this object and is sent only in ``Authenticate``;
    it is in no message and no ``repr``.
    """

    __slots__ = ("_lock", "_password", "count", "token", "username")

    def __init__(self, username: str | None, password: str | None) -> None:
        self.username = username
        self._password = password
        self.token: str | None = None
        self.count = 0
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"<etcd auth user={self.username!r}>"

    def current(self) -> tuple[tuple[str, str], ...] | None:
        """The metadata that carries the current token (``None``: none yet, or no user)."""
        return None if not self.token else (("token", self.token),)

    def drop(self, token: str | None) -> None:
        """``token`` was refused (or the member changed): the next request gets a new one."""
        if token is not None and self.token == token:
            self.token = None

    async def metadata(self, stubs: _Stubs, timeout: float) -> tuple[tuple[str, str], ...] | None:
        """The ``token`` metadata, authenticating first when there is no token.

        :raises grpc.aio.AioRpcError: as ``Authenticate`` failed (the caller maps it).
        """
        if self.username is None or self.token is not None:
            return self.current()
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.token is None:  # not renewed by another request meanwhile
                request = pb.AuthenticateRequest(name=self.username, password=self._password)
                response = await _plain_await(stubs.auth.Authenticate(request, timeout=timeout))
                self.token = str(response.token)
                self.count += 1
                _log.debug("etcd: authenticated as %r", self.username)
        return self.current()


def _check_endpoint(endpoint: str) -> str:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    return endpoint


def _check_timeout(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, not {value!r}")
    return float(value)


async def _plain_await(call: Any) -> Any:
    """Await a grpc.aio call so that a cancellation reaches the caller as it was sent.

    Awaiting the call directly makes grpc raise a fresh ``CancelledError``
    of its own when the caller is cancelled; anyio's cancel scopes do not
    recognise that one as theirs and let it escape the scope (a
    ``move_on_after`` around an acquire would cancel the whole task). Waiting
    on a future of our own, which the call's completion sets, leaves the
    caller's own cancellation intact (the call is cancelled with it), and
    costs no task of its own.
    """
    if not call.done():
        waiter = asyncio.get_running_loop().create_future()

        def wake(_call: object) -> None:
            if not waiter.done():
                waiter.set_result(None)

        call.add_done_callback(wake)
        try:
            await waiter
        except BaseException:  # the caller's cancellation: the call goes with it
            call.cancel()
            raise
    if call.cancelled():
        # Not our cancellation: grpc cancels the calls of a channel being
        # closed. A CancelledError here would look like the caller's own.
        raise BackendUnavailableError("the etcd request was cancelled: the client is closing")
    return await call  # done: its answer, or the AioRpcError


#: grpc.aio's task that waits, for each stream call, for the call's final
#: status from gRPC core (grpcio 1.3x to 1.8x); it ends once core has
#: delivered the call's completions to this loop (see :meth:`EtcdClient.close`).
#: Only its name is read: under another name nothing is awaited.
_GRPC_STATUS_WAITER: Final = "_AioCall._handle_status_once_received"
#: how long close() lets gRPC deliver the completions of the calls it cancelled
_CLOSE_SETTLE_SECONDS: Final = 1.0


def _status_waiters() -> set[asyncio.Task[Any]]:
    """This loop's pending :data:`_GRPC_STATUS_WAITER` tasks."""
    return {
        task
        for task in asyncio.all_tasks()
        if not task.done() and getattr(task.get_coro(), "__qualname__", "") == _GRPC_STATUS_WAITER
    }


async def _settle(waiters: set[asyncio.Task[Any]], count: int, deadline: float) -> None:
    """Wait until ``count`` of ``waiters`` have ended (at most until loop time ``deadline``).

    gRPC core reports the end of a cancelled call through grpc.aio's one
    poller per process, which hands it to the loop that started the call:
    a report that arrives after that loop has closed fails on whichever
    loop runs next (``RuntimeError: Event loop is closed``). Waiting here
    for the calls' own status tasks keeps every report on this loop.
    """
    pending = {task for task in waiters if not task.done()}
    ended = len(waiters) - len(pending)
    loop = asyncio.get_running_loop()
    while pending and ended < count and (remaining := deadline - loop.time()) > 0:
        done, pending = await asyncio.wait(
            pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
        )
        ended += len(done)


async def _answered(calls: Sequence[Any], deadline: float) -> None:
    """Wait until every one of the unary ``calls`` is done (at most until ``deadline``).

    A request cancelled under way leaves gRPC core's report of it to arrive
    later, with nothing to wait for it; one that gets its answer does not.
    """
    loop = asyncio.get_running_loop()
    waiters: list[asyncio.Future[None]] = []
    for call in calls:
        if not call.done():
            waiter: asyncio.Future[None] = loop.create_future()
            call.add_done_callback(lambda _call, w=waiter: w.done() or w.set_result(None))
            waiters.append(waiter)
    remaining = deadline - loop.time()
    if waiters and remaining > 0:
        await asyncio.wait(waiters, timeout=remaining)


class EtcdClient:
    """An asyncio etcd v3 client over several endpoints, with deadlines everywhere.

    ::

        async with EtcdClient(["127.0.0.1:2379", "127.0.0.1:22379"]) as client:
            await client.put("k", "v")
            result = await client.range("k")

    ``endpoints`` are ``host:port`` strings, tried in order; the client sticks
    to the member that answered until it fails. Channels are plain-text gRPC
    unless ``tls`` is given. With ``username`` and ``password`` the client
    authenticates as that etcd user (see the module doc); the password is
    never part of a message or ``repr``.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        connect_timeout: float = 5.0,
        request_timeout: float = 5.0,
        channel_options: Sequence[tuple[str, int | str]] = (),
        username: str | None = None,
        password: str | None = None,
        tls: EtcdTLS | None = None,
    ) -> None:
        if (username is None) != (password is None):
            raise ValueError("etcd authentication needs both username and password")
        if isinstance(endpoints, str):
            raise ValueError("endpoints is a list of 'host:port' strings, not one string")
        self._endpoints: tuple[str, ...] = tuple(_check_endpoint(e) for e in endpoints)
        if not self._endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        self._connect_timeout = _check_timeout("connect_timeout", connect_timeout)
        self._request_timeout = _check_timeout("request_timeout", request_timeout)
        self._channel_options = (*_DEFAULT_CHANNEL_OPTIONS, *channel_options)
        self._stubs: dict[str, _Stubs] = {}
        self._current = 0
        self._closed = False
        self._streams: set[LeaseKeepAlive | Watch] = set()
        #: gRPC calls under way (unary and streams), cancelled by close()
        self._calls: set[Any] = set()
        self._hub: _WatchHub | None = None
        self._cluster_id = 0
        self._auth = _Auth(username, password)
        self._tls = tls
        self._channel_credentials: grpc.ChannelCredentials | None = None

    def __repr__(self) -> str:
        user = f" user={self._auth.username!r}" if self._auth.username else ""
        tls = " tls" if self._tls is not None else ""
        return f"<EtcdClient {','.join(self._endpoints)}{user}{tls}>"

    # -- life cycle

    @property
    def username(self) -> str | None:
        """The etcd user the client authenticates as (``None``: no authentication)."""
        return self._auth.username

    @property
    def authentications(self) -> int:
        """Tokens obtained so far (one per connect, failover or expired token)."""
        return self._auth.count

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints, in the order given."""
        return self._endpoints

    @property
    def endpoint(self) -> str:
        """The endpoint the next request goes to."""
        return self._endpoints[self._current]

    @property
    def cluster_id(self) -> int:
        """The id of the cluster that answered :meth:`connect` (0 before it did)."""
        return self._cluster_id

    @property
    def request_timeout(self) -> float:
        """The deadline of a request that gives none, in seconds."""
        return self._request_timeout

    @property
    def connect_timeout(self) -> float:
        """How long :meth:`connect` (and re-opening a stream) may take, in seconds."""
        return self._connect_timeout

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    async def connect(self) -> None:
        """Find an endpoint that answers, within ``connect_timeout``.

        :raises BackendUnavailableError: no endpoint answered in time (the
            message lists each endpoint's error).
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._connect_timeout
        errors: list[str] = []
        count = len(self._endpoints)
        for attempt in range(count):
            index = (self._current + attempt) % count
            endpoint = self._endpoints[index]
            remaining = deadline - loop.time()
            if remaining <= 0:
                errors.append(f"{endpoint}: not tried (connect_timeout spent)")
                continue
            # Leave the later endpoints their share of the time.
            budget = remaining / (count - attempt)
            try:
                stubs = self._stubs_for(endpoint)
                self._auth.drop(self._auth.token)  # a new token on every (re)connect
                metadata = await self._auth.metadata(stubs, budget)
                status = await stubs.maintenance.Status(
                    pb.StatusRequest(), timeout=budget, metadata=metadata
                )
            except grpc.aio.AioRpcError as exc:
                if not _is_transport(exc) or _tls_refused(exc):
                    raise _map_refusal(exc) from exc
                errors.append(f"{endpoint}: {_code_name(exc)} {_details(exc)}")
                continue
            self._current = index
            self._cluster_id = int(status.header.cluster_id)
            return
        raise BackendUnavailableError(
            f"no etcd endpoint answered within {self._connect_timeout:g}s: " + "; ".join(errors)
        )

    async def close(self) -> None:
        """Stop every keep-alive and watch of this client, end its requests, close its channels.

        Requests under way get their answers, then what is left is
        cancelled; returns once gRPC has reported the end of every stream
        (all within :data:`_CLOSE_SETTLE_SECONDS`), so that no report of
        this client's calls is left for after the event loop closes.
        """
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CLOSE_SETTLE_SECONDS
        streams = sum(isinstance(call, grpc.aio.StreamStreamCall) for call in self._calls)
        waiters = _status_waiters() if streams else set()
        for stream in list(self._streams):
            await stream.aclose()
        if self._hub is not None:
            await self._hub.aclose()
        calls, self._calls = list(self._calls), set()
        await _answered(calls, deadline)
        for call in calls:
            call.cancel()
        stubs, self._stubs = list(self._stubs.values()), {}
        for item in stubs:
            await item.channel.close(grace=None)
        await _settle(waiters, streams, deadline)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailableError("the etcd client is closed")

    def _stubs_for(self, endpoint: str) -> _Stubs:
        stubs = self._stubs.get(endpoint)
        if stubs is None:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(endpoint, options=self._channel_options)
            else:
                channel = grpc.aio.secure_channel(
                    endpoint, self._credentials_for_tls(), options=self._channel_options
                )
            stubs = self._stubs[endpoint] = _Stubs(channel)
        return stubs

    def _credentials_for_tls(self) -> grpc.ChannelCredentials:
        """gRPC's TLS credentials from the PEM files (read once per client)."""
        if self._channel_credentials is None:
            assert self._tls is not None
            self._channel_credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(self._tls.ca_certs, "ssl_ca_certs"),
                private_key=_read(self._tls.keyfile or self._tls.certfile, "ssl_keyfile"),
                certificate_chain=_read(self._tls.certfile, "ssl_certfile"),
            )
        return self._channel_credentials

    def _current_stubs(self) -> tuple[str, _Stubs]:
        self._check_open()
        endpoint = self._endpoints[self._current]
        return endpoint, self._stubs_for(endpoint)

    def _failed(self, endpoint: str) -> None:
        """The member at ``endpoint`` failed: move on to the next endpoint (once per failure)."""
        if self._endpoints[self._current] == endpoint and len(self._endpoints) > 1:
            self._current = (self._current + 1) % len(self._endpoints)
            _log.info("etcd endpoint %s failed; moving to %s", endpoint, self.endpoint)
            self._auth.drop(self._auth.token)  # authenticate again with the next member

    async def _unary(
        self,
        service: str,
        method: str,
        request: Any,
        *,
        timeout: float | None,
        retry: bool,
    ) -> Any:
        """One unary call with a deadline, failing over across endpoints (see the module doc)."""
        loop = asyncio.get_running_loop()
        total = self._request_timeout if timeout is None else _check_timeout("timeout", timeout)
        deadline = loop.time() + total
        count = len(self._endpoints)
        errors: list[str] = []
        last: grpc.aio.AioRpcError | None = None
        attempt = 0
        renewals = 0
        backoff: Backoff | None = None  # from the second round on
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if attempt and attempt % count == 0:
                if not retry:
                    break  # a write that cannot be repeated: every endpoint once at most
                # Every member failed once (a leader election, members
                # restarting): pause a little, then another round, until the deadline.
                if backoff is None:
                    backoff = Backoff(time.monotonic() + remaining, first=0.1, cap=0.5)
                if not await backoff.wait():
                    break  # the pause would end past the deadline
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
            endpoint, stubs = self._current_stubs()
            # A stalled member must not eat the whole deadline of a request
            # that the next member could answer.
            budget = max(min(remaining, 1.0), remaining / count) if retry else remaining
            attempt += 1
            token = None
            try:
                metadata = await self._auth.metadata(stubs, budget)
                token = self._auth.token  # the one this request carries
                call = getattr(getattr(stubs, service), method)(
                    request, timeout=budget, metadata=metadata
                )
                self._calls.add(call)
                try:
                    return await _plain_await(call)
                finally:
                    self._calls.discard(call)
            except grpc.aio.AioRpcError as exc:
                if self._auth.username and _stale_token(exc) and renewals < 2:
                    # Refused before it was applied: safe to send again with a new token.
                    renewals += 1
                    attempt -= 1
                    self._auth.drop(token)
                    continue
                if not _is_transport(exc) or _tls_refused(exc):
                    raise _map_refusal(exc) from exc
                last = exc
                errors.append(f"{endpoint}: {_code_name(exc)} {_details(exc)}")
                self._failed(endpoint)
                if not (retry or _not_sent(exc)):
                    break
        raise BackendUnavailableError(
            f"etcd {method} got no answer within {total:g}s after {attempt} attempt(s): "
            + "; ".join(errors[-count:] or ["no time"])
        ) from last

    # -- KV

    async def range(
        self,
        key: Bytes | RangeOp,
        *,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        sort_order: SortOrder = SortOrder.NONE,
        sort_target: SortTarget = SortTarget.KEY,
        max_create_revision: int = 0,
        min_create_revision: int = 0,
        serializable: bool = False,
        timeout: float | None = None,
    ) -> RangeResult:
        """Read one key, a prefix, or the :class:`RangeOp` given (its options win).

        :raises CompactedError: ``revision`` was compacted away.
        :raises BackendUnavailableError: no member answered in time.
        """
        op = (
            key
            if isinstance(key, RangeOp)
            else RangeOp.of(
                key,
                prefix=prefix,
                limit=limit,
                revision=revision,
                sort_order=sort_order,
                sort_target=sort_target,
                max_create_revision=max_create_revision,
                min_create_revision=min_create_revision,
                serializable=serializable,
            )
        )
        response = await self._unary("kv", "Range", op._to_pb(), timeout=timeout, retry=True)
        return RangeResult._from_pb(response)

    async def get(self, key: Bytes, *, timeout: float | None = None) -> KeyValue | None:
        """The key, or ``None`` when it does not exist."""
        result = await self.range(key, timeout=timeout)
        return result.kvs[0] if result.kvs else None

    async def put(
        self,
        key: Bytes,
        value: Bytes,
        *,
        lease: int = 0,
        prev_kv: bool = False,
        timeout: float | None = None,
    ) -> PutResult:
        """Write a key (attached to ``lease`` when not 0).

        Not repeated on another member after a timeout (it may have been
        applied); use :meth:`txn` with a compare for a write that is safe to
        repeat.

        :raises LeaseNotFoundError: the lease does not exist.
        """
        op = PutOp.of(key, value, lease=lease, prev_kv=prev_kv)
        response = await self._unary("kv", "Put", op._to_pb(), timeout=timeout, retry=False)
        return PutResult._from_pb(response)

    async def delete(
        self,
        key: Bytes,
        *,
        prefix: bool = False,
        range_end: Bytes = b"",
        prev_kv: bool = False,
        timeout: float | None = None,
    ) -> DeleteResult:
        """Delete a key, a range or a prefix (repeated on another member if needed: idempotent)."""
        op = DeleteOp.of(key, prefix=prefix, range_end=range_end, prev_kv=prev_kv)
        response = await self._unary("kv", "DeleteRange", op._to_pb(), timeout=timeout, retry=True)
        return DeleteResult._from_pb(response)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
        *,
        retry: bool = False,
        timeout: float | None = None,
    ) -> TxnResult:
        """``If(compare...) Then(success...) Else(failure...)`` in one atomic request.

        ``retry=True`` lets a timed-out transaction be sent again to another
        member: only for transactions whose compares make a repeat harmless
        (create-if-absent, delete-if-still-mine).
        """
        request = _txn_request(compare, success, failure)
        response = await self._unary("kv", "txn_wire", request, timeout=timeout, retry=retry)
        return TxnResult(
            succeeded=bool(response.succeeded),
            responses=tuple(_response_op(item) for item in response.responses),
            revision=int(response.header.revision),
        )

    async def status(self, *, timeout: float | None = None) -> dict[str, object]:
        """The current member's status: ``version``, ``leader``, ``member_id``, ``revision``."""
        response = await self._unary(
            "maintenance", "Status", pb.StatusRequest(), timeout=timeout, retry=True
        )
        return {
            "version": str(response.version),
            "leader": int(response.leader),
            "member_id": int(response.header.member_id),
            "revision": int(response.header.revision),
            "raft_term": int(response.raftTerm),
        }

    async def auth_enabled(self, *, timeout: float | None = None) -> bool | None:
        """Whether the cluster checks users (``AuthStatus``, etcd 3.5+); ``None`` on 3.4.

        etcd 3.4 has no ``AuthStatus``: it answers UNIMPLEMENTED, and the
        caller has to infer the answer otherwise.
        """
        try:
            response = await self._unary(
                "auth", "AuthStatus", pb.AuthStatusRequest(), timeout=timeout, retry=True
            )
        except EtcdRequestError as exc:
            if exc.code == "UNIMPLEMENTED":
                return None
            raise
        return bool(response.enabled)

    # -- leases

    async def lease_grant(
        self, ttl: int, *, lease_id: int = 0, timeout: float | None = None
    ) -> LeaseGrant:
        """Grant a lease of ``ttl`` seconds (the server may grant more: its minimum TTL).

        A timed-out grant is not repeated (a lease might be left behind to
        expire on its own).
        """
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise ValueError(f"a lease TTL is a whole number of seconds >= 1, not {ttl!r}")
        granted_at = asyncio.get_running_loop().time()
        response = await self._unary(
            "lease",
            "LeaseGrant",
            pb.LeaseGrantRequest(TTL=ttl, ID=lease_id),
            timeout=timeout,
            retry=False,
        )
        if response.error:
            raise EtcdRequestError("UNKNOWN", str(response.error))
        return LeaseGrant(id=int(response.ID), ttl=int(response.TTL), granted_at=granted_at)

    async def lease_revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke a lease: its keys are deleted at once.

        :raises LeaseNotFoundError: it expired or was revoked already.
        """
        await self._unary(
            "lease", "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease_id), timeout=timeout, retry=True
        )

    async def lease_time_to_live(
        self, lease_id: int, *, keys: bool = False, timeout: float | None = None
    ) -> LeaseInfo:
        """How long the lease has left (``ttl == -1``: it does not exist any more)."""
        response = await self._unary(
            "lease",
            "LeaseTimeToLive",
            pb.LeaseTimeToLiveRequest(ID=lease_id, keys=keys),
            timeout=timeout,
            retry=True,
        )
        return LeaseInfo(
            id=int(response.ID),
            ttl=int(response.TTL),
            granted_ttl=int(response.grantedTTL),
            keys=tuple(bytes(k) for k in response.keys),
        )

    def keep_alive(
        self,
        lease: LeaseGrant,
        *,
        on_expired: Callable[[str], object] | None = None,
        on_refreshed: Callable[[float], object] | None = None,
        on_failed: Callable[[str], object] | None = None,
        interval: float | None = None,
    ) -> LeaseKeepAlive:
        """Start keeping ``lease`` alive on one stream (every ``interval``, default TTL/3).

        ``on_expired(reason)`` is called once, in the event loop, when the
        lease is known or presumed gone (see :class:`LeaseKeepAlive`);
        ``on_refreshed(deadline)`` after every answered refresh that moved
        the deadline (event-loop time); ``on_failed(detail)`` after every
        refresh that failed or went unanswered (the deadline not yet passed).
        """
        self._check_open()
        keeper = LeaseKeepAlive(
            self,
            lease,
            on_expired=on_expired,
            on_refreshed=on_refreshed,
            on_failed=on_failed,
            interval=interval,
        )
        self._streams.add(keeper)
        keeper._start()
        return keeper

    # -- watches

    def _watch_hub(self) -> _WatchHub:
        self._check_open()
        if self._hub is None:
            self._hub = _WatchHub(self)
        return self._hub

    @property
    def watch_streams_opened(self) -> int:
        """How many ``Watch`` streams this client has opened so far (all watches share one)."""
        return 0 if self._hub is None else self._hub.streams_opened

    async def watch(
        self,
        key: Bytes,
        *,
        prefix: bool = False,
        range_end: Bytes = b"",
        start_revision: int = 0,
        prev_kv: bool = False,
        progress_notify: bool = False,
        no_put: bool = False,
        no_delete: bool = False,
    ) -> Watch:
        """Create a watch on the client's one watch stream; return once etcd confirms it.

        Every watch of a client shares one gRPC stream (etcd multiplexes them
        by watch id); confirmation is awaited within ``connect_timeout``.

        ``start_revision`` 0 = changes after now. Iterate the returned
        :class:`Watch` for :class:`WatchResponse` batches; close it with
        :meth:`Watch.aclose` (or ``async with``).

        A ``start_revision`` that was compacted away makes the iteration raise
        :class:`CompactedError` (etcd confirms such a watch, then cancels it).

        :raises BackendUnavailableError: no member confirmed the watch in time.
        """
        self._check_open()
        if start_revision < 0:
            raise ValueError(f"start_revision must be >= 0, not {start_revision}")
        if prefix and range_end:
            raise ValueError("give either prefix=True or range_end, not both")
        key_bytes = _b(key)
        filters: list[int] = []
        if no_put:
            filters.append(0)
        if no_delete:
            filters.append(1)
        watch = Watch(
            self,
            key=key_bytes,
            range_end=prefix_end(key_bytes) if prefix else _b(range_end),
            start_revision=start_revision,
            prev_kv=prev_kv,
            progress_notify=progress_notify,
            filters=tuple(filters),
        )
        self._streams.add(watch)
        try:
            await self._watch_hub().add(watch)
        except BaseException:
            await watch.aclose()
            raise
        return watch


# --------------------------------------------------------------------------- keep-alive


class LeaseKeepAlive:
    """Keeps one lease alive on one ``LeaseKeepAlive`` stream, refreshing every TTL/3.

    The client knows the lease's deadline without asking the server:
    ``deadline`` is the event-loop time at which the lease ends if no other
    refresh is answered, that is the time the last *answered* refresh was sent
    plus the TTL the server answered (sending time, not answer time: the
    server restarted the TTL somewhere in between, so this never overestimates).
    When the deadline passes, even with no member reachable, or when the
    server answers TTL=0 (the lease was revoked or had expired), ``expired``
    becomes true and ``on_expired(reason)`` runs once.

    A stream that breaks, or whose member does not answer a refresh within the
    refresh interval, is reopened on the next endpoint; attempts go on until
    the deadline, never past it.
    """

    def __init__(
        self,
        client: EtcdClient,
        lease: LeaseGrant,
        *,
        on_expired: Callable[[str], object] | None,
        interval: float | None,
        on_refreshed: Callable[[float], object] | None = None,
        on_failed: Callable[[str], object] | None = None,
    ) -> None:
        if lease.ttl < 1:
            raise ValueError(f"lease {lease.id:x} has no time left (TTL {lease.ttl})")
        self._client = client
        self.lease_id: Final = lease.id
        """The lease kept alive."""
        self._ttl = lease.ttl
        self._interval = lease.ttl / 3 if interval is None else _check_timeout("interval", interval)
        self._deadline = lease.granted_at + lease.ttl
        self._on_expired = on_expired
        self._on_refreshed = on_refreshed
        self._on_failed = on_failed
        self._expired_reason: str | None = None
        self._expired = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._timer: asyncio.TimerHandle | None = None
        self._refreshes = 0

    @property
    def ttl(self) -> int:
        """The TTL in seconds that the server answered last."""
        return self._ttl

    @property
    def deadline(self) -> float:
        """Event-loop time when the lease ends unless another refresh is answered."""
        return self._deadline

    def remaining(self) -> float:
        """Seconds until :attr:`deadline` (negative once it has passed)."""
        return self._deadline - asyncio.get_running_loop().time()

    @property
    def refreshes(self) -> int:
        """How many refreshes the server has answered."""
        return self._refreshes

    @property
    def expired(self) -> bool:
        """Whether the lease is known or presumed gone."""
        return self._expired.is_set()

    @property
    def expired_reason(self) -> str | None:
        """Why the lease is gone (``None`` while it lives)."""
        return self._expired_reason

    async def wait_expired(self) -> str:
        """Wait until the lease is gone; return the reason."""
        await self._expired.wait()
        return self._expired_reason or "expired"

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._arm_timer(loop)
        name = f"aiolocks-etcd-keepalive-{self.lease_id:x}"
        self._task = loop.create_task(self._run(), name=name)

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        self._timer = None
        if self.expired:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            self._expire("the lease deadline passed with no refresh answered (client-side)")
        else:
            self._arm_timer(loop)

    def _expire(self, reason: str) -> None:
        if self.expired:
            return
        self._expired_reason = reason
        self._expired.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        callback = self._on_expired
        if callback is not None:
            try:
                callback(reason)
            except Exception:
                _log.exception("on_expired callback of lease %x failed", self.lease_id)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        backoff: Backoff | None = None  # from the second failure in a row
        while not self.expired and not self._stopping:
            try:
                endpoint, stubs = self._client._current_stubs()
            except BackendUnavailableError:
                return
            call = stubs.lease.LeaseKeepAlive(metadata=self._client._auth.current())
            self._client._calls.add(call)
            try:
                while not self.expired and not self._stopping:
                    sent_at = loop.time()
                    await call.write(pb.LeaseKeepAliveRequest(ID=self.lease_id))
                    wait = max(min(self._interval, self._deadline - loop.time()), 0.01)
                    try:
                        response = await asyncio.wait_for(call.read(), wait)
                    except TimeoutError:
                        raise _Stalled(endpoint) from None
                    if response is grpc.aio.EOF:
                        raise _Stalled(endpoint)
                    ttl = int(response.TTL)
                    if ttl <= 0:
                        self._expire("etcd answered TTL=0: the lease was revoked or expired")
                        return
                    failures = 0
                    self._refreshes += 1
                    self._ttl = ttl
                    if sent_at + ttl > self._deadline:
                        self._deadline = sent_at + ttl
                        self._arm_timer(loop)
                        refreshed = self._on_refreshed
                        if refreshed is not None:
                            try:
                                refreshed(self._deadline)
                            except Exception:
                                _log.exception(
                                    "on_refreshed callback of lease %x failed", self.lease_id
                                )
                    # not a retry: the keep-alive cadence, one refresh per interval
                    await asyncio.sleep(max(sent_at + self._interval - loop.time(), 0))
            except Exception as exc:
                # AioRpcError from the member, _Stalled, or gRPC refusing to
                # write on a call that its transport has already finished.
                if self._stop_requested():
                    return  # grpc turned our cancellation into an error of its own
                failures += 1
                if isinstance(exc, grpc.aio.AioRpcError):
                    detail = f"{_code_name(exc)} {_details(exc)}"
                elif isinstance(exc, _Stalled):
                    detail = "no answer in time"
                else:
                    detail = repr(exc)
                if isinstance(exc, grpc.aio.AioRpcError) and not _is_transport(exc):
                    refusal = _map_refusal(exc)
                    if isinstance(refusal, LeaseNotFoundError):
                        self._expire(f"etcd: {detail}")
                        return
                _log.info(
                    "keep-alive of lease %x on %s failed: %s", self.lease_id, endpoint, detail
                )
                self._client._failed(endpoint)
                failed = self._on_failed
                if failed is not None:
                    try:
                        failed(f"{endpoint}: {detail}")
                    except Exception:
                        _log.exception("on_failed callback of lease %x failed", self.lease_id)
            finally:
                call.cancel()
                self._client._calls.discard(call)
            # Next endpoint at once the first time, then pause a little
            # (bounded by the deadline: the timer ends the lease then).
            if failures > 1:
                if failures == 2 or backoff is None:
                    backoff = Backoff(math.inf, first=0.1, cap=self._interval / 2)
                await backoff.wait()

    def _stop_requested(self) -> bool:
        return self._stopping

    async def revoke(self, *, timeout: float | None = None) -> None:
        """Stop refreshing and revoke the lease (its keys go at once); a gone lease is fine."""
        await self.aclose()
        with contextlib.suppress(LeaseNotFoundError):
            await self._client.lease_revoke(self.lease_id, timeout=timeout)

    async def aclose(self) -> None:
        """Stop refreshing (the lease then ends at its deadline); ``on_expired`` is not called."""
        self._on_expired = None
        self._on_refreshed = None
        self._on_failed = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stopping = True
        task, self._task = self._task, None
        self._client._streams.discard(self)
        # grpc may swallow a cancellation that lands in one of its awaits
        # (turning it into an error of its own, which the loop treats as a
        # failed stream): cancel again until the task has ended.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait((task,), timeout=0.1)
        if task is not None and not task.cancelled() and task.exception() is not None:
            _log.debug("keep-alive of lease %x ended with %r", self.lease_id, task.exception())

    def __repr__(self) -> str:
        state = self._expired_reason or f"ttl={self._ttl}"
        return f"<LeaseKeepAlive {self.lease_id:x} {state}>"


class _Reauth(Exception):
    """A watch was refused with a token that may have expired: reopen the stream with a new one."""


class _Stalled(Exception):
    """A stream's member did not answer in time (internal)."""


# --------------------------------------------------------------------------- watch


def _watch_response(response: Any) -> WatchResponse:
    events = tuple(
        WatchEvent(
            type=EventType.DELETE if int(event.type) == 1 else EventType.PUT,
            kv=KeyValue._from_pb(event.kv),
            prev_kv=KeyValue._from_pb(event.prev_kv) if event.HasField("prev_kv") else None,
        )
        for event in response.events
    )
    return WatchResponse(events=events, revision=int(response.header.revision))


_CLOSED: Final = object()


def _canceller(call: Any) -> Callable[[asyncio.Task[None]], None]:
    def cancel(_task: asyncio.Task[None]) -> None:
        call.cancel()

    return cancel


class _WatchHub:
    """Every watch of one client on one bidirectional ``Watch`` stream.

    etcd gives each watch of a stream a ``watch_id``; create answers come
    back in the order the creates were sent, so the hub pairs them with a
    FIFO. One task reads the stream and hands each batch to its watch;
    one task per stream generation writes (gRPC allows one write at a time).

    When the stream breaks (member killed, connection cut, a create left
    unanswered for the endpoint's share of ``connect_timeout``), the hub
    marks the member bad, opens a stream on the next endpoint and re-creates
    every open watch from the revision after the last one it delivered, so
    no event is lost or repeated. If no member takes the watches within
    ``connect_timeout``, every watch's iteration raises
    :class:`~aiolocks.BackendUnavailableError` (once per such round) while
    the hub keeps trying: a watch iterated again resumes when a member is
    back. A watch whose start revision was compacted is cancelled by etcd;
    its iteration raises :class:`CompactedError`.
    """

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._watches: set[Watch] = set()
        self._by_id: dict[int, Watch] = {}
        self._pending: collections.deque[tuple[Watch, float]] = collections.deque()
        self._call: Any = None
        self._outbox: asyncio.Queue[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._kick: asyncio.Future[None] | None = None
        self._errors: list[str] = []
        self._closed = False
        self._stream_token: str | None = None
        #: since when (loop time) no stream has answered, and how many broke meanwhile
        self._failing_since: float | None = None
        self._failures = 0
        self._backoff: Backoff | None = None  # between streams while they keep failing
        #: streams opened so far (a test and the benchmarks read it)
        self.streams_opened = 0

    @property
    def watch_count(self) -> int:
        """Open watches on the stream (or waiting for it)."""
        return len(self._watches)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="aiolocks-etcd-watch-stream")

    def _send(self, request: Any) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(request)

    def _queue_create(self, watch: Watch) -> None:
        loop = asyncio.get_running_loop()
        self._pending.append((watch, loop.time()))
        self._send(pb.WatchRequest(create_request=watch._create_request()))
        kick = self._kick
        if kick is not None and not kick.done():
            kick.set_result(None)

    async def add(self, watch: Watch) -> None:
        """Create ``watch`` on the stream; return once etcd confirmed it.

        :raises BackendUnavailableError: no member confirmed it within ``connect_timeout``.
        """
        client = self._client
        created = watch._created
        self._watches.add(watch)
        if self._call is not None:
            self._queue_create(watch)
        self._ensure_task()
        await asyncio.wait((created,), timeout=client.connect_timeout)
        if not created.done():
            self.remove(watch)
            raise BackendUnavailableError(
                "no etcd endpoint accepted the watch within "
                f"{client.connect_timeout:g}s: " + "; ".join(self._errors or ["no answer"])
            )
        created.result()  # raises what etcd refused

    def remove(self, watch: Watch) -> None:
        """Stop delivering to ``watch``; cancel it on the stream (no answer awaited)."""
        self._watches.discard(watch)
        watch_id = watch._watch_id
        if watch_id is not None and self._by_id.get(watch_id) is watch:
            del self._by_id[watch_id]
            self._send(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id)))
        # A create still in flight is cancelled when its answer comes (see _dispatch).

    def request_progress(self) -> None:
        """Ask the member for a progress notification of every watch of the stream."""
        if self._call is None:
            raise BackendUnavailableError("the etcd watch stream is not open")
        self._send(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))

    def _fail_all(self, error: Exception) -> None:
        for watch in list(self._watches):
            if not watch._created.done():
                watch._created.set_exception(error)
                self._watches.discard(watch)
            else:
                watch._deliver(error)

    def _dispatch(self, response: Any) -> None:
        watch_id = int(response.watch_id)
        if response.created:
            if not self._pending:
                return
            watch, _ = self._pending.popleft()
            if watch._closed or watch not in self._watches:
                if not response.canceled:
                    self._send(
                        pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id))
                    )
                return
            if response.canceled:
                if self._token_refused(watch, str(response.cancel_reason)):
                    raise _Reauth
                self._watches.discard(watch)
                error = watch._cancel_error(response)
                if watch._created.done():
                    watch._deliver(error)
                else:
                    watch._created.set_exception(error)
                return
            self._errors.clear()
            self._by_id[watch_id] = watch
            watch._on_created(watch_id, int(response.header.revision))
            return
        if response.canceled:
            gone = self._by_id.pop(watch_id, None)
            if gone is not None:
                self._watches.discard(gone)
                gone._deliver(gone._cancel_error(response))
            return
        target = self._by_id.get(watch_id)
        if target is not None:
            target._deliver(_watch_response(response))
        elif not response.events:
            # A progress notification for the whole stream (watch_id -1).
            for watch in list(self._by_id.values()):
                watch._deliver(_watch_response(response))

    async def _authenticate(self, endpoint: str, stubs: _Stubs) -> bool:
        """Get a token for the next stream (when the client has a user); ``False``: none.

        A refusal fails every watch; a member that does not answer is marked bad.
        """
        client = self._client
        try:
            await client._auth.metadata(stubs, client.connect_timeout / len(client.endpoints))
        except grpc.aio.AioRpcError as exc:
            if not _is_transport(exc) or _tls_refused(exc):
                self._fail_all(_map_refusal(exc))
                self._watches.clear()
                return False
            self._errors.append(f"{endpoint}: {_code_name(exc)} {_details(exc)}")
            client._failed(endpoint)
            await asyncio.sleep(0.1)  # a fixed pause before the next member (constant)
            return False
        self._stream_token = client._auth.token
        return True

    def _token_refused(self, watch: Watch, reason: str) -> bool:
        """Whether a refused create deserves one more try on a stream with a new token.

        etcd checks a new watch against the token the stream was opened with:
        once that token expired, every create is refused as if the user
        lacked the permission. A refusal on a stream with a fresh token is
        the real answer.
        """
        auth = self._client._auth
        lowered = reason.lower()
        if auth.username is None or watch._auth_retried:
            return False
        if "permission denied" not in lowered and "invalid auth token" not in lowered:
            return False
        watch._auth_retried = True
        auth.drop(self._stream_token)
        return True

    async def _write_loop(self, call: Any, outbox: asyncio.Queue[Any]) -> None:
        while True:
            request = await outbox.get()
            await call.write(request)

    async def _run(self) -> None:
        client = self._client
        self._failing_since, self._failures = None, 0
        while self._watches and not self._closed:
            try:
                endpoint, stubs = client._current_stubs()
            except BackendUnavailableError:
                return
            if not await self._authenticate(endpoint, stubs):
                continue  # no token: the next member, or every watch was refused
            call = stubs.watch.Watch(metadata=client._auth.current())
            client._calls.add(call)
            self.streams_opened += 1
            outbox: asyncio.Queue[Any] = asyncio.Queue()
            self._call, self._outbox = call, outbox
            self._pending.clear()
            self._by_id.clear()
            for watch in list(self._watches):
                watch._watch_id = None
                self._queue_create(watch)
            writer = asyncio.get_running_loop().create_task(self._write_loop(call, outbox))
            writer.add_done_callback(_canceller(call))
            try:
                await self._read_stream(call, endpoint)
            except _Reauth:
                _log.debug("etcd watch refused with the stream's token: reopening with a new one")
                continue
            except (grpc.aio.AioRpcError, _Stalled, asyncio.InvalidStateError) as exc:
                if self._is_closed() or not self._stream_failed(endpoint, exc):
                    return
            finally:
                self._call = self._outbox = None
                writer.cancel()
                call.cancel()
                client._calls.discard(call)
            await self._after_failure()

    async def _read_stream(self, call: Any, endpoint: str) -> None:
        """Hand every answer of ``call`` to its watch until the hub closes.

        :raises _Stalled: the stream ended, or a create went unanswered for
            the endpoint's share of ``connect_timeout``
        """
        loop = asyncio.get_running_loop()
        budget = self._client.connect_timeout / len(self._client.endpoints)
        read: asyncio.Future[Any] | None = None
        try:
            while not self._closed:
                if read is None:
                    read = asyncio.ensure_future(call.read())
                timeout = None
                if self._pending:
                    timeout = max(self._pending[0][1] + budget - loop.time(), 0.0)
                kick: asyncio.Future[None] = loop.create_future()
                self._kick = kick
                try:
                    await asyncio.wait(
                        (read, kick), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    self._kick = None
                    kick.cancel()
                if not read.done():
                    if kick.done() and not kick.cancelled():
                        continue  # a new create: recompute the timeout
                    if self._pending:
                        raise _Stalled(endpoint)
                    continue
                done, read = read, None
                if done.cancelled():
                    raise _Stalled(endpoint)
                response = done.result()
                if response is grpc.aio.EOF:
                    raise _Stalled(endpoint)
                self._failing_since, self._failures = None, 0
                self._dispatch(response)
        finally:
            if read is not None:
                read.cancel()

    def _stream_failed(self, endpoint: str, exc: Exception) -> bool:
        """Note why the stream on ``endpoint`` broke; ``False`` when the watches end here.

        A refusal of the whole stream (not a transport failure) fails every
        watch; anything else marks the member bad and tries the next one.
        """
        client = self._client
        if isinstance(exc, grpc.aio.AioRpcError) and not _stream_retried(exc):
            self._fail_all(_map_refusal(exc))
            self._watches.clear()
            return False
        detail = (
            f"{_code_name(exc)} {_details(exc)}"
            if isinstance(exc, grpc.aio.AioRpcError)
            else "no answer in time"
        )
        self._errors.append(f"{endpoint}: {detail}")
        del self._errors[: -len(client.endpoints)]
        _log.info("etcd watch stream on %s failed: %s", endpoint, detail)
        client._failed(endpoint)
        return True

    async def _after_failure(self) -> None:
        """Fail every watch once per ``connect_timeout`` without a stream; pause after a round."""
        client = self._client
        self._failures += 1
        now = asyncio.get_running_loop().time()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since >= client.connect_timeout:
            self._fail_all(
                BackendUnavailableError(
                    "no etcd endpoint accepted the watch stream within "
                    f"{client.connect_timeout:g}s: " + "; ".join(self._errors)
                )
            )
            self._failing_since = now
        rounds = len(client.endpoints)
        if self._failures > rounds:
            if self._failures == rounds + 1 or self._backoff is None:
                self._backoff = Backoff(math.inf, first=0.05 * (rounds + 1), cap=0.5)
            await self._backoff.wait()

    def _is_closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Close the stream and stop its task (the watches are closed by the client)."""
        self._closed = True
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait((task,), timeout=0.1)


class Watch:
    """One watch, on the client's one shared watch stream; iterate it for
    :class:`WatchResponse` batches.

    If the stream breaks (member killed, stalled past gRPC's keep-alive), the
    watch is re-created on the next endpoint from the revision after the last
    one delivered, so no event is lost or repeated; if no member takes it
    within the client's ``connect_timeout``, iteration raises
    :class:`~aiolocks.BackendUnavailableError` (iterate again to go on
    waiting). A compaction past that revision raises :class:`CompactedError`.
    """

    def __init__(
        self,
        client: EtcdClient,
        *,
        key: bytes,
        range_end: bytes,
        start_revision: int,
        prev_kv: bool,
        progress_notify: bool,
        filters: tuple[int, ...],
    ) -> None:
        self._client = client
        self._key = key
        self._range_end = range_end
        self._next_revision = start_revision
        self._prev_kv = prev_kv
        self._progress_notify = progress_notify
        self._filters = filters
        self._watch_id: int | None = None
        self._closed = False
        self._auth_retried = False
        self._created_revision = 0
        self._created: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox: asyncio.Queue[WatchResponse | Exception | object] = asyncio.Queue()
        self._wakers: list[asyncio.Future[None]] = []

    @property
    def key(self) -> bytes:
        """The watched key (or start of the watched range)."""
        return self._key

    @property
    def watch_id(self) -> int | None:
        """The server's id of this watch on the current stream."""
        return self._watch_id

    @property
    def created_revision(self) -> int:
        """The store revision when the watch was (last) created: changes after it are seen."""
        return self._created_revision

    @property
    def next_revision(self) -> int:
        """The revision the watch resumes from if its stream breaks (0: from now)."""
        return self._next_revision

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    def _create_request(self) -> Any:
        return pb.WatchCreateRequest(
            key=self._key,
            range_end=self._range_end,
            start_revision=self._next_revision,
            progress_notify=self._progress_notify,
            filters=list(self._filters),
            prev_kv=self._prev_kv,
        )

    def _on_created(self, watch_id: int, revision: int) -> None:
        self._watch_id = watch_id
        self._auth_retried = False
        self._created_revision = revision
        if self._next_revision == 0:
            self._next_revision = revision + 1
        if not self._created.done():
            self._created.set_result(None)

    def _deliver(self, item: WatchResponse | Exception) -> None:
        if self._closed:
            return
        if isinstance(item, WatchResponse):
            if item.events:
                self._next_revision = max(e.kv.mod_revision for e in item.events) + 1
            else:
                self._next_revision = max(self._next_revision, item.revision + 1)
        self._inbox.put_nowait(item)
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            if not waker.done():
                waker.set_result(None)

    def _wake_on_delivery(self, waker: asyncio.Future[None]) -> None:
        """Set ``waker`` when something is delivered (at once if something waits already).

        For a caller that only needs to know that something happened, without
        a task to iterate the watch.
        """
        if not self._inbox.empty():
            if not waker.done():
                waker.set_result(None)
            return
        self._wakers.append(waker)

    def _cancel_error(self, response: Any) -> LockError:
        compact = int(response.compact_revision)
        if compact:
            return CompactedError(
                f"etcd: revision {self._next_revision} of the watch on {self._key!r} was "
                f"compacted (oldest left: {compact})",
                compact,
            )
        reason = str(response.cancel_reason or "watch canceled")
        return _denied(reason) or EtcdRequestError("CANCELLED", reason)

    def __aiter__(self) -> AsyncIterator[WatchResponse]:
        return self

    async def __anext__(self) -> WatchResponse:
        if self._closed:
            raise StopAsyncIteration
        item = await self._inbox.get()
        if item is _CLOSED:
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, WatchResponse)
        return item

    async def request_progress(self) -> None:
        """Ask the member for a progress notification (a :class:`WatchResponse` with no events)."""
        if self._closed:
            raise BackendUnavailableError("the watch is closed")
        self._client._watch_hub().request_progress()

    async def aclose(self) -> None:
        """Cancel the watch (idempotent, never raises); an iteration under way ends."""
        self.close()

    def close(self) -> None:
        """:meth:`aclose` without an await, for synchronous ``close()`` methods."""
        if self._closed:
            return
        self._closed = True
        self._client._streams.discard(self)
        hub = self._client._hub
        if hub is not None:
            hub.remove(self)
        self._inbox.put_nowait(_CLOSED)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Watch {self._key!r} id={self._watch_id} next={self._next_revision}>"
