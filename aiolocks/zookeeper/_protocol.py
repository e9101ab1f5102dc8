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
  event-loop passes per reply. This one reads the reply in one bounded read.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiozk import exc, protocol
from aiozk.connection import Connection, reply_header_struct, size_struct
from aiozk.protocol.create import CreateRequest
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
        try:
            raw_size = await self.reader.readexactly(size_struct.size)
            (size,) = size_struct.unpack(raw_size)
            async with asyncio.timeout(self.read_timeout):
                packet = await self.reader.readexactly(size)
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
            return xid, zxid, protocol.WatchEvent.deserialize(payload)
        opcode = self.opcode_xref.pop(xid)
        return xid, zxid, protocol.response_xref[opcode].deserialize(payload)
