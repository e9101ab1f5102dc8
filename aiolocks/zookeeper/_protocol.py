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
"""

from __future__ import annotations

from typing import Any

from aiozk import protocol
from aiozk.protocol.create import CreateRequest
from aiozk.protocol.primitives import UString
from aiozk.protocol.response import Response
from aiozk.protocol.stat import Stat

__all__ = ["CONTAINER_FLAG", "CreateContainerRequest", "CreateContainerResponse"]

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
