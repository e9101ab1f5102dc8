"""The parts of ZooKeeper's wire protocol that aiolocks encodes and decodes itself.

aiozk supplies the request and reply types (declarative ``Part`` classes)
and their generic serializers; this module adds what aiolocks needs on top,
without registering anything in aiozk's module-level tables (other aiozk
users in the process see aiozk unchanged):

* ``createContainer`` (opcode 19): aiozk sends the container flag (4) with
  ``create2`` (opcode 15), which ZooKeeper 3.8 silently turns into a plain
  persistent node. Lock parents must be real containers so that the server
  reaps empty lock paths (Curator's ``creatingParentContainersIfNeeded``).
  :class:`CreateContainerRequest` is encoded here and its reply (path and
  ``Stat``, as ``create2``'s) decoded here, by opcode.
* ``create2``'s reply carries the new node's ``Stat``; its ``created_zxid``
  is the fencing token and its ``ephemeral_owner`` proves which session
  owns the node (CURATOR-696).
* Speed: the requests and replies of the lock recipe's hot path (create,
  list, read, exists, delete, watch events) are encoded and decoded with
  one precompiled ``struct`` each, where aiozk walks its ``Part`` tree and
  compiles a ``struct`` format per field. Anything else takes aiozk's
  serializers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from aiozk import protocol
from aiozk.protocol.create import Create2Request, Create2Response, CreateRequest, CreateResponse
from aiozk.protocol.stat import Stat

__all__ = [
    "CONTAINER_FLAG",
    "CREATE_CONTAINER",
    "CreateContainerRequest",
    "decode_reply",
    "decode_watch_event",
    "encode_request",
]

#: CreateMode.CONTAINER.toFlag() in the Java client
CONTAINER_FLAG = 4

#: the ``createContainer`` opcode (ZooDefs.OpCode.createContainer)
CREATE_CONTAINER = 19


class CreateContainerRequest(CreateRequest):  # type: ignore[misc]
    """``createContainer``: same body as ``create``, opcode 19, flags must be 4.

    (aiozk registers reply classes by opcode, not request classes: defining
    this subclass changes nothing in aiozk.) Its reply is decoded as a
    ``Create2Response`` (path and ``Stat``) by :func:`decode_reply`.
    """

    opcode = CREATE_CONTAINER
    writes_data = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.flags = CONTAINER_FLAG


# -- the hot path's wire format (zookeeper.jute), one struct per shape ----------

_HEADER = struct.Struct("!ii")  # xid, opcode
_INT = struct.Struct("!i")
_STAT = struct.Struct("!qqqqiiiqiiq")
_STAT_FIELDS = tuple(name for name, _ in Stat.parts)
_WATCH_HEAD = struct.Struct("!ii")  # type, state
_BOOL = (b"\x00", b"\x01")


def _ustring(value: Any) -> bytes:
    """A jute ``ustring`` (-1 for None), as aiozk's ``UString`` renders it."""
    if value is None:
        return _INT.pack(-1)
    data = str(value).encode("utf-8")
    return _INT.pack(len(data)) + data


def _buffer(value: Any) -> bytes:
    """A jute ``buffer`` (-1 for None), as aiozk's ``Buffer`` renders it."""
    if value is None:
        return _INT.pack(-1)
    data = value.encode() if isinstance(value, str) else bytes(value)
    return _INT.pack(len(data)) + data


def _path_and_watch(request: Any) -> bytes:
    return _ustring(request.path) + _BOOL[bool(request.watch)]


def _delete(request: Any) -> bytes:
    return _ustring(request.path) + _INT.pack(request.version)


def _create(request: Any) -> bytes:
    acl = request.acl or []
    parts = [_ustring(request.path), _buffer(request.data), _INT.pack(len(acl))]
    for entry in acl:
        parts += (_INT.pack(entry.perms), _ustring(entry.id.scheme), _ustring(entry.id.id))
    parts.append(_INT.pack(request.flags))
    return b"".join(parts)


#: request class -> body encoder (exact classes: a subclass may add parts)
_ENCODERS: dict[type[Any], Callable[[Any], bytes]] = {
    protocol.GetChildrenRequest: _path_and_watch,
    protocol.GetDataRequest: _path_and_watch,
    protocol.ExistsRequest: _path_and_watch,
    protocol.DeleteRequest: _delete,
    CreateRequest: _create,
    Create2Request: _create,
    CreateContainerRequest: _create,
}


def encode_request(request: Any, xid: int | None) -> bytes:
    """``request.serialize(xid)``, byte for byte, faster for the hot-path requests."""
    encoder = _ENCODERS.get(type(request))
    if encoder is None or xid is None:
        return request.serialize(xid)  # type: ignore[no-any-return]
    return _HEADER.pack(xid, request.opcode) + encoder(request)


def _read_ustring(buf: bytes, offset: int) -> tuple[str | None, int]:
    (size,) = _INT.unpack_from(buf, offset)
    offset += 4
    if size == -1:
        return None, offset
    return buf[offset : offset + size].decode("utf-8"), offset + size


def _read_buffer(buf: bytes, offset: int) -> tuple[bytes | None, int]:
    (size,) = _INT.unpack_from(buf, offset)
    offset += 4
    if size == -1:
        return None, offset
    return buf[offset : offset + size], offset + size


def _make(cls: Any, **fields: Any) -> Any:
    """An aiozk ``Part`` with its fields set (what ``cls(**fields)`` builds, without the checks)."""
    part = cls.__new__(cls)
    part.__dict__.update(fields)
    return part


def _read_stat(buf: bytes, offset: int) -> Any:
    return _make(Stat, **dict(zip(_STAT_FIELDS, _STAT.unpack_from(buf, offset), strict=True)))


def _children(buf: bytes) -> Any:
    (count,) = _INT.unpack_from(buf, 0)
    offset = 4
    children = []
    for _ in range(count):
        name, offset = _read_ustring(buf, offset)
        children.append(name)
    return _make(protocol.GetChildrenResponse, children=children)


def _data(buf: bytes) -> Any:
    data, offset = _read_buffer(buf, 0)
    return _make(protocol.GetDataResponse, data=data, stat=_read_stat(buf, offset))


def _exists(buf: bytes) -> Any:
    return _make(protocol.ExistsResponse, stat=_read_stat(buf, 0))


def _path_and_stat(cls: type[Any]) -> Callable[[bytes], Any]:
    def decode(buf: bytes) -> Any:
        path, offset = _read_ustring(buf, 0)
        return _make(cls, path=path, stat=_read_stat(buf, offset))

    return decode


def _created(buf: bytes) -> Any:
    path, _ = _read_ustring(buf, 0)
    return _make(CreateResponse, path=path)


def _deleted(_buf: bytes) -> Any:
    return _make(protocol.DeleteResponse)


#: opcode -> (reply class, decoder), for the replies the lock recipe waits for
_DECODERS: dict[int, tuple[type[Any], Callable[[bytes], Any]]] = {
    protocol.GetChildrenRequest.opcode: (protocol.GetChildrenResponse, _children),
    protocol.GetDataRequest.opcode: (protocol.GetDataResponse, _data),
    protocol.ExistsRequest.opcode: (protocol.ExistsResponse, _exists),
    protocol.DeleteRequest.opcode: (protocol.DeleteResponse, _deleted),
    CreateRequest.opcode: (CreateResponse, _created),
    Create2Request.opcode: (Create2Response, _path_and_stat(Create2Response)),
    CREATE_CONTAINER: (Create2Response, _path_and_stat(Create2Response)),
}


def decode_reply(opcode: int, payload: bytes) -> Any:
    """The reply to a request of ``opcode``.

    The hot path's replies and ``createContainer``'s are decoded here; the
    others by aiozk's reply class for that opcode (looked up, never added).
    """
    entry = _DECODERS.get(opcode)
    if entry is not None:
        return entry[1](payload)
    return protocol.response_xref[opcode].deserialize(payload)


def decode_watch_event(payload: bytes) -> Any:
    """``WatchEvent.deserialize(payload)``, faster."""
    event_type, state = _WATCH_HEAD.unpack_from(payload, 0)
    path, _ = _read_ustring(payload, 8)
    return _make(protocol.WatchEvent, type=event_type, state=state, path=path)
