"""Our connection to a ZooKeeper server (``aiolocks.zookeeper._connection.Connection``).

Its reader cuts replies out of the byte stream inside ``data_received`` and
must decode exactly what aiozk's own reader decodes, from any split of the
stream; the hot-path codec must encode and decode byte for byte as aiozk's
serializers do. The byte streams are fed to the readers directly; the
tests marked ``zookeeper`` check the same against a real server.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import uuid
from typing import Any

import aiozk
import pytest
from aiozk import exc, protocol
from aiozk.connection import Connection as AiozkConnection
from aiozk.connection import reply_header_struct, size_struct
from aiozk.protocol.stat import Stat

from aiolocks.zookeeper import ZooKeeperBackend
from aiolocks.zookeeper._connection import Connection, Session

from .conftest import own_session

pytestmark = [pytest.mark.asyncio]

GET_CHILDREN = 8
GET_DATA = 4


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


WATCHED = "/a/lock-1"


def _stream() -> tuple[bytes, dict[int, int]]:
    """Replies of several kinds back to back, and the opcodes their xids were sent with."""
    children = protocol.GetChildrenResponse(children=["lock-0000000001", "lock-0000000002"])
    data = protocol.GetDataResponse(data=b"abc", stat=_stat(77))
    watch = protocol.WatchEvent(type=protocol.WatchEvent.DELETED, state=3, path=WATCHED)
    stream = (
        _frame(1, 100, 0, children)
        + _frame(2, 101, 0, data)
        + _frame(protocol.WATCH_XID, -1, 0, watch)
        + _frame(3, 102, -101, None)  # NoNode
    )
    return stream, {1: GET_CHILDREN, 2: GET_DATA, 3: GET_DATA}


async def _aiozk_reads(chunk: int) -> list[tuple[Any, Any, Any]]:
    """What aiozk's own reader makes of the stream (the reference)."""
    stream, opcodes = _stream()
    conn = AiozkConnection("127.0.0.1", 2181, watch_handler=lambda event: None, read_timeout=1)
    reader = asyncio.StreamReader()
    conn.reader = reader
    conn.opcode_xref.update(opcodes)

    async def feed() -> None:
        for i in range(0, len(stream), chunk):
            reader.feed_data(stream[i : i + chunk])
            await asyncio.sleep(0)

    feeder = asyncio.create_task(feed())
    replies = [await conn.read_response() for _ in range(4)]
    await feeder
    return replies


def _ours() -> tuple[Connection, Session]:
    session = Session([("127.0.0.1", 2181)], timeout=4.0, events=None)
    return Connection("127.0.0.1", 2181, session), session


def _expect(conn: Connection, opcodes: dict[int, int]) -> dict[int, asyncio.Future[Any]]:
    loop = asyncio.get_running_loop()
    futures: dict[int, asyncio.Future[Any]] = {}
    for xid, opcode in opcodes.items():
        futures[xid] = loop.create_future()
        conn.pending[xid] = (opcode, futures[xid])
    return futures


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 20])
async def test_replies_decode_as_aiozk_decodes_them_from_any_split(chunk: int) -> None:
    stream, opcodes = _stream()
    conn, session = _ours()
    futures = _expect(conn, opcodes)
    events: list[tuple[str, bool]] = []
    session.add_watch_callback(
        protocol.WatchEvent.DELETED, WATCHED, lambda path: events.append((path, futures[2].done()))
    )
    for i in range(0, len(stream), chunk):
        conn.data_received(stream[i : i + chunk])
    assert conn.pending == {}
    # the watch event ran its callback as it was read: after reply 2, before reply 3
    assert events == [(WATCHED, True)]
    theirs = await _aiozk_reads(chunk)
    for xid, (their_xid, their_zxid, their_reply) in zip(
        (1, 2, 3), (theirs[0], theirs[1], theirs[3]), strict=True
    ):
        assert xid == their_xid
        fut = futures[xid]
        if isinstance(their_reply, Exception):
            assert type(fut.exception()) is type(their_reply) is exc.NoNode
        else:
            zxid, reply = fut.result()
            assert zxid == their_zxid
            assert type(reply) is type(their_reply)
            assert reply == their_reply
    assert futures[1].result()[1].children == ["lock-0000000001", "lock-0000000002"]
    assert futures[2].result()[1].stat.created_zxid == 77
    assert session.last_zxid == 102  # the last reply header's zxid


async def test_a_reply_split_half_way_waits_for_its_rest() -> None:
    conn, _session = _ours()
    futures = _expect(conn, {1: GET_CHILDREN})
    frame = _frame(1, 5, 0, protocol.GetChildrenResponse(children=["x"]))
    conn.data_received(frame[:-3])
    assert not futures[1].done()
    conn.data_received(frame[-3:])
    assert futures[1].result()[1].children == ["x"]


async def test_a_stream_that_ends_half_way_fails_what_is_pending() -> None:
    conn, _session = _ours()
    futures = _expect(conn, {1: GET_CHILDREN, 2: GET_DATA})
    frame = _frame(1, 5, 0, protocol.GetChildrenResponse(children=["x"]))
    conn.data_received(frame[:-3])
    conn.connection_lost(None)
    for fut in futures.values():
        assert isinstance(fut.exception(), exc.ConnectError)
    assert conn.closed.done() and not conn.is_open
    late = conn.send(protocol.GetChildrenRequest(path="/", watch=False))
    assert isinstance(late.exception(), exc.ConnectError)


async def test_a_reply_nobody_waits_for_is_dropped() -> None:
    """A caller that gave up (cancelled) leaves no entry; its late reply changes nothing."""
    conn, _session = _ours()
    futures = _expect(conn, {1: GET_CHILDREN, 2: GET_CHILDREN})
    futures[1].cancel()
    conn.data_received(
        _frame(1, 5, 0, protocol.GetChildrenResponse(children=["x"]))
        + _frame(7, 6, 0, protocol.GetChildrenResponse(children=["y"]))  # unknown xid
        + _frame(2, 7, 0, protocol.GetChildrenResponse(children=["z"]))
    )
    assert futures[2].result()[1].children == ["z"]
    assert conn.pending == {}


@pytest.mark.zookeeper
async def test_backends_built_from_a_url_read_with_it(backend: ZooKeeperBackend) -> None:
    async with backend.mutex("reader/check"):
        conn = own_session(backend).conn
        assert type(conn) is Connection
        assert conn.is_open


@pytest.mark.zookeeper
async def test_watch_callbacks_run_as_the_event_is_read(
    backend: ZooKeeperBackend, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No ``call_soon`` hop: callbacks run in the reader; one failing does not stop the rest."""
    session = own_session(backend)
    link = backend._zk.link
    assert link is not None
    path = f"/watch-dispatch-{uuid.uuid4().hex}"
    await observer.create(path, b"x")
    ran_in: list[asyncio.Task[Any] | None] = []
    delivered = asyncio.Event()

    def failing(_path: str) -> None:
        raise RuntimeError("boom")

    def recording(_path: str) -> None:
        ran_in.append(asyncio.current_task())
        delivered.set()

    full = link.normalize_path(path)  # events name the path with the chroot
    for callback in (failing, recording):
        session.add_watch_callback(protocol.WatchEvent.DELETED, full, callback)
    try:
        monitor = backend._driver.monitor
        await monitor.call(protocol.ExistsRequest(path=full, watch=True), None, retry=True)
        await observer.delete(path)
        await asyncio.wait_for(delivered.wait(), 10)
    finally:
        for callback in (failing, recording):
            session.remove_watch_callback(protocol.WatchEvent.DELETED, full, callback)
    # run from data_received itself (in no task), not scheduled with call_soon
    assert ran_in == [None]
    assert f"watch callback for {full} failed" in caplog.text
    assert not session.watch_callbacks.get((protocol.WatchEvent.DELETED, full))
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
    return [
        (GET_CHILDREN, protocol.GetChildrenResponse(children=[])),
        (GET_CHILDREN, protocol.GetChildrenResponse(children=["ü-lock-0000000003", "b"])),
        (GET_DATA, protocol.GetDataResponse(data=None, stat=_stat(1))),
        (GET_DATA, protocol.GetDataResponse(data=b"\x00\xff", stat=_stat(2**40))),
        (3, protocol.ExistsResponse(stat=_stat(9))),
        (2, protocol.DeleteResponse()),
        (1, protocol.CreateResponse(path="/a/b")),
        (15, protocol.Create2Response(path="/a/lock-0000000009", stat=_stat(12))),
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


async def test_create_container_replies_decode_as_create2_replies() -> None:
    """Opcode 19 is decoded by us (aiozk has no reply class for it registered by us)."""
    from aiolocks.zookeeper._protocol import CREATE_CONTAINER, decode_reply

    reply = protocol.Create2Response(path="/a", stat=_stat(13))
    fmt, data = reply.render()
    ours = decode_reply(CREATE_CONTAINER, struct.pack("!" + fmt, *data))
    assert type(ours) is protocol.Create2Response
    assert ours == reply and ours.stat.created_zxid == 13


async def test_importing_the_backend_leaves_aiozk_tables_alone() -> None:
    """Other aiozk users in the process must see aiozk as it ships."""
    code = (
        "from aiozk import protocol\n"
        "before = dict(protocol.response_xref)\n"
        "import aiolocks, aiolocks.zookeeper, aiolocks.zookeeper._protocol\n"
        "import aiolocks.zookeeper._connection, aiolocks.zookeeper._driver\n"
        "assert protocol.response_xref == before, set(protocol.response_xref) ^ set(before)\n"
        "print(all(protocol.response_xref[k] is v for k, v in before.items()))\n"
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
