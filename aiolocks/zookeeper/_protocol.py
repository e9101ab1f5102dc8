"""Extensions of aiozk's wire protocol that aiolocks needs.

aiozk 0.32 builds requests from declarative ``Part`` classes and looks the
reply class up by opcode (``response_xref``), so a new request/response pair
is a few lines. What aiozk lacks, and why we need it:

* ``createContainer`` (opcode 19): aiozk sends the container flag (4) with
  ``create2`` (opcode 15), which ZooKeeper 3.8 silently turns into a plain
  persistent node. Lock parents must be real containers so that the server
  reaps empty lock paths (Curator's ``creatingParentContainersIfNeeded``).
* ``create2``'s reply carries the new node's ``Stat``; aiozk's ``create()``
  drops it. We send :class:`aiozk.protocol.Create2Request` ourselves and keep
  the ``Stat``: its ``created_zxid`` is the fencing token and its
  ``ephemeral_owner`` proves which session owns the node (CURATOR-696).
* :class:`BufferedConnection`: aiozk's reader takes every reply in two
  ``asyncio.wait_for`` reads after its length, and on Python 3.11
  ``wait_for`` runs each read in a task of its own: two tasks and a few
  event-loop passes per reply. This one reads the reply in one read, and
  encodes the requests and decodes the replies of the lock recipe's hot
  path (create, list, read, exists, delete, watch events) with one
  precompiled ``struct`` each, where aiozk walks its ``Part`` tree and
  compiles a ``struct`` format per field. Anything else takes aiozk's path.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any

from aiozk import exc, protocol
from aiozk.connection import Connection, reply_header_struct, size_struct
from aiozk.protocol.create import Create2Request, Create2Response, CreateRequest, CreateResponse
from aiozk.protocol.primitives import UString
from aiozk.protocol.response import Response
from aiozk.protocol.stat import Stat

__all__ = [
    "CONTAINER_FLAG",
    "BufferedConnection",
    "CreateContainerRequest",
    "CreateContainerResponse",
]

#: CreateMode.CONTAINER.toFlag() in the Java client
CONTAINER_FLAG = 4


class CreateContainerRequest(CreateRequest):  # type: ignore[misc]
    """``createContainer``: same body as ``create``, opcode 19, flags must be 4."""

    opcode = 19
    writes_data = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.flags = CONTAINER_FLAG


class CreateContainerResponse(Response):  # type: ignore[misc]
    """Reply to ``createContainer``: the path and the ``Stat`` (as ``create2``).

    Defining the class registers it in aiozk's opcode table, which is what
    lets aiozk's reader decode the reply.
    """

    opcode = 19
    parts = (("path", UString), ("stat", Stat))


# Guard against a future aiozk that reassigns opcode 19 to something else.
assert protocol.response_xref[19] is CreateContainerResponse

logger = logging.getLogger("aiolocks.zookeeper")

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
    CreateContainerRequest.opcode: (
        CreateContainerResponse,
        _path_and_stat(CreateContainerResponse),
    ),
}


def decode_reply(opcode: int, payload: bytes) -> Any:
    """``response_xref[opcode].deserialize(payload)``, faster for the hot-path replies."""
    cls = protocol.response_xref[opcode]
    entry = _DECODERS.get(opcode)
    if entry is None or entry[0] is not cls:  # not ours, or re-registered since
        return cls.deserialize(payload)
    return entry[1](payload)


def decode_watch_event(payload: bytes) -> Any:
    """``WatchEvent.deserialize(payload)``, faster."""
    event_type, state = _WATCH_HEAD.unpack_from(payload, 0)
    path, _ = _read_ustring(payload, 8)
    return _make(protocol.WatchEvent, type=event_type, state=state, path=path)


class BufferedConnection(Connection):  # type: ignore[misc]
    """aiozk's ``Connection``, reading each reply in one read instead of two ``wait_for``.

    Same results as aiozk's ``read_response`` (``(xid, zxid, response)``,
    errors as exception values, watch events decoded), and the same bound:
    the rest of a reply whose length has arrived must follow within
    ``read_timeout`` (else ``UnfinishedRead``), checked with a timer instead
    of two tasks. A stream that ends mid-reply is a closed connection, as it
    is at a reply boundary. Handshake replies keep aiozk's own path.
    """

    async def read_response(self, initial_connect: bool = False) -> tuple[Any, Any, Any]:
        if initial_connect or self.pending_specials[protocol.CLOSE_XID]:
            return await super().read_response(initial_connect)  # type: ignore[no-any-return]
        reader = self.reader
        try:
            raw_size = await reader.readexactly(size_struct.size)
            (size,) = size_struct.unpack(raw_size)
            if len(getattr(reader, "_buffer", b"")) >= size:
                packet = await reader.readexactly(size)  # all here: returns at once
            else:
                async with asyncio.timeout(self.read_timeout):
                    packet = await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            raise ConnectionAbortedError from None
        except TimeoutError:
            raise exc.UnfinishedRead from None
        xid, zxid, error_code = reply_header_struct.unpack_from(packet)
        if error_code:
            self.opcode_xref.pop(xid)
            return xid, zxid, exc.get_response_error(error_code)
        payload = packet[reply_header_struct.size :]
        if xid == protocol.WATCH_XID:
            return xid, zxid, decode_watch_event(payload)
        opcode = self.opcode_xref.pop(xid)
        return xid, zxid, decode_reply(opcode, payload)

    def send(self, request: Any, xid: int | None = None) -> asyncio.Future[Any]:
        """aiozk's ``send`` (same bookkeeping), with :func:`encode_request`."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closing:
            future.set_exception(exc.ConnectError(self.host, self.port))
            return future
        if request.special_xid:
            xid = request.special_xid
        payload = encode_request(request, xid)
        self.opcode_xref[xid] = request.opcode
        if xid in protocol.SPECIAL_XIDS:
            self.pending_specials[xid].append(future)
        else:
            self.pending[xid] = future
        try:
            self.writer.write(size_struct.pack(len(payload)) + payload)
        except Exception:
            logger.exception("writing to ZooKeeper %s:%s failed", self.host, self.port)
            self.abort()
        return future
