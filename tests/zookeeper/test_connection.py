"""The reply reader of the connections aiolocks makes (``BufferedConnection``).

It must decode exactly what aiozk's own reader decodes, from any split of
the byte stream, and keep aiozk's bound on a reply that stops half-way.
The byte streams are fed to the readers directly; the last test checks that
a backend built from a URL uses this reader against a real server.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import aiozk
import pytest
from aiozk import exc, protocol
from aiozk.connection import Connection, reply_header_struct, size_struct
from aiozk.protocol.stat import Stat

from aiolocks.zookeeper import ZooKeeperBackend
from aiolocks.zookeeper._protocol import BufferedConnection

pytestmark = [pytest.mark.asyncio]

GET_CHILDREN = 8
GET_DATA = 4


def _connection(cls: type[Any], read_timeout: float = 0.3) -> tuple[Any, asyncio.StreamReader]:
    conn = cls("127.0.0.1", 2181, watch_handler=lambda event: None, read_timeout=read_timeout)
    reader = asyncio.StreamReader()
    conn.reader = reader
    return conn, reader


def _frame(xid: int, zxid: int, error: int, body: Any = None) -> bytes:
    payload = reply_header_struct.pack(xid, zxid, error)
    if body is not None:
        fmt, data = body.render()
        payload += struct.pack("!" + fmt, *data)
    framed: bytes = size_struct.pack(len(payload)) + payload
    return framed


def _stat(czxid: int) -> Stat:
    return Stat(
        created_zxid=czxid,
        last_modified_zxid=czxid,
        created=1,
        modified=2,
        version=0,
        child_version=0,
        acl_version=0,
        ephemeral_owner=0x1234,
        data_length=3,
        num_children=0,
        last_modified_children=czxid,
    )


def _stream() -> tuple[bytes, dict[int, int]]:
    """Replies of several kinds back to back, and the opcodes their xids were sent with."""
    children = protocol.GetChildrenResponse(children=["lock-0000000001", "lock-0000000002"])
    data = protocol.GetDataResponse(data=b"abc", stat=_stat(77))
    watch = protocol.WatchEvent(type=protocol.WatchEvent.DELETED, state=3, path="/a/lock-1")
    stream = (
        _frame(1, 100, 0, children)
        + _frame(2, 101, 0, data)
        + _frame(protocol.WATCH_XID, -1, 0, watch)
        + _frame(3, 102, -101, None)  # NoNode
    )
    return stream, {1: GET_CHILDREN, 2: GET_DATA, 3: GET_DATA}


async def _read_all(cls: type[Any], chunk: int) -> list[tuple[Any, Any, Any]]:
    stream, opcodes = _stream()
    conn, reader = _connection(cls)
    conn.opcode_xref.update(opcodes)

    async def feed() -> None:
        for i in range(0, len(stream), chunk):
            reader.feed_data(stream[i : i + chunk])
            await asyncio.sleep(0)

    feeder = asyncio.create_task(feed())
    replies = [await conn.read_response() for _ in range(4)]
    await feeder
    assert conn.opcode_xref == {}
    return replies


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
async def test_replies_decode_as_aiozk_decodes_them_from_any_split(chunk: int) -> None:
    ours = await _read_all(BufferedConnection, chunk)
    theirs = await _read_all(Connection, chunk)
    for (xid, zxid, reply), (their_xid, their_zxid, their_reply) in zip(ours, theirs, strict=True):
        assert (xid, zxid) == (their_xid, their_zxid)
        if isinstance(reply, Exception):
            assert type(reply) is type(their_reply) is exc.NoNode
        else:
            assert type(reply) is type(their_reply)
            assert reply == their_reply
    assert ours[0][2].children == ["lock-0000000001", "lock-0000000002"]
    assert ours[1][2].stat.created_zxid == 77
    assert ours[2][2].path == "/a/lock-1"


async def test_a_reply_that_stops_half_way_is_unfinished_after_read_timeout() -> None:
    conn, reader = _connection(BufferedConnection, read_timeout=0.2)
    conn.opcode_xref[1] = GET_CHILDREN
    frame = _frame(1, 5, 0, protocol.GetChildrenResponse(children=["x"]))
    reader.feed_data(frame[:-3])
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(exc.UnfinishedRead):
        await conn.read_response()
    assert 0.15 <= loop.time() - started < 2.0


async def test_a_stream_that_ends_half_way_is_a_closed_connection() -> None:
    conn, reader = _connection(BufferedConnection)
    conn.opcode_xref[1] = GET_CHILDREN
    frame = _frame(1, 5, 0, protocol.GetChildrenResponse(children=["x"]))
    reader.feed_data(frame[:-3])
    reader.feed_eof()
    with pytest.raises(ConnectionAbortedError):
        await conn.read_response()


@pytest.mark.zookeeper
async def test_backends_built_from_a_url_read_with_it(backend: ZooKeeperBackend) -> None:
    async with backend.mutex("reader/check"):
        conn = backend._driver._client.session.conn
        assert type(conn) is BufferedConnection


@pytest.mark.zookeeper
async def test_watch_callbacks_run_as_the_event_is_read(
    backend: ZooKeeperBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """No ``call_soon`` hop: callbacks run in the reader; one failing does not stop the rest."""
    client = backend._driver._client
    session = client.session
    path = "/aiolocks-watch-dispatch"
    await client.create(path, b"x")
    ran_in: list[asyncio.Task[Any] | None] = []
    delivered = asyncio.Event()

    def failing(_path: str) -> None:
        raise RuntimeError("boom")

    def recording(_path: str) -> None:
        ran_in.append(asyncio.current_task())
        delivered.set()

    full = client.normalize_path(path)  # events name the path with the chroot
    for callback in (failing, recording):
        session.add_watch_callback(protocol.WatchEvent.DELETED, full, callback)
    try:
        await client.exists(path, watch=True)
        await client.delete(path)
        await asyncio.wait_for(delivered.wait(), 10)
    finally:
        for callback in (failing, recording):
            session.remove_watch_callback(protocol.WatchEvent.DELETED, full, callback)
    # aiozk would run it from call_soon, outside any task
    assert ran_in == [session.conn.read_loop_task]
    assert f"watch callback for {full} failed" in caplog.text
    async with backend.mutex("reader/still-works"):
        pass


def _requests() -> list[Any]:
    from aiolocks.zookeeper._protocol import CreateContainerRequest

    acl = [
        aiozk.ACL.make(scheme="world", id="anyone", read=True, write=True),
        aiozk.ACL.make(scheme="digest", id="user:hash=", admin=True),
    ]
    return [
        protocol.GetChildrenRequest(path="/a/b", watch=False),
        protocol.GetChildrenRequest(path="/ünï/cødé", watch=True),
        protocol.GetDataRequest(path="/a/lock-0000000001", watch=True),
        protocol.ExistsRequest(path="/a", watch=False),
        protocol.DeleteRequest(path="/a/lock-0000000001", version=-1),
        protocol.DeleteRequest(path="/a", version=7),
        protocol.Create2Request(path="/a/_c_x-lock-", data=b"payload", acl=acl, flags=3),
        protocol.Create2Request(path="/a/n", data=None, acl=[], flags=0),
        protocol.CreateRequest(path="/a", data="text", acl=acl[:1], flags=0),
        CreateContainerRequest(path="/a/parent", data=b"", acl=acl[:1]),
        protocol.SetDataRequest(path="/a", data=b"x", version=-1),  # aiozk's own path
    ]


@pytest.mark.parametrize("index", range(len(_requests())))
async def test_requests_encode_byte_for_byte_as_aiozk_serializes_them(index: int) -> None:
    from aiolocks.zookeeper._protocol import encode_request

    request = _requests()[index]
    assert encode_request(request, 41) == request.serialize(41)


def _replies() -> list[tuple[int, Any]]:
    from aiolocks.zookeeper._protocol import CreateContainerResponse

    return [
        (GET_CHILDREN, protocol.GetChildrenResponse(children=[])),
        (GET_CHILDREN, protocol.GetChildrenResponse(children=["ü-lock-0000000003", "b"])),
        (GET_DATA, protocol.GetDataResponse(data=None, stat=_stat(1))),
        (GET_DATA, protocol.GetDataResponse(data=b"\x00\xff", stat=_stat(2**40))),
        (3, protocol.ExistsResponse(stat=_stat(9))),
        (2, protocol.DeleteResponse()),
        (1, protocol.CreateResponse(path="/a/b")),
        (15, protocol.Create2Response(path="/a/lock-0000000009", stat=_stat(12))),
        (19, CreateContainerResponse(path="/a", stat=_stat(13))),
        (5, protocol.SetDataResponse(stat=_stat(14))),  # aiozk's own path
    ]


@pytest.mark.parametrize("index", range(len(_replies())))
async def test_replies_decode_as_aiozk_deserializes_them(index: int) -> None:
    from aiolocks.zookeeper._protocol import decode_reply

    opcode, reply = _replies()[index]
    fmt, data = reply.render()
    payload = struct.pack("!" + fmt, *data)
    ours = decode_reply(opcode, payload)
    theirs = protocol.response_xref[opcode].deserialize(payload)
    assert type(ours) is type(theirs) is type(reply)
    assert ours == theirs == reply
    assert vars(ours) == vars(theirs)
