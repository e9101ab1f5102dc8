"""The etcd client layer against a real server: the KV, transaction, lease and watch
semantics the lock recipes rely on, keep-alive and its client-side deadline, cancellation."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from aiolocks import BackendUnavailableError
from aiolocks.etcd._client import (
    CompactedError,
    Compare,
    DeleteOp,
    DeleteResult,
    EtcdClient,
    EventType,
    LeaseNotFoundError,
    PutOp,
    PutResult,
    RangeOp,
    RangeResult,
    SortOrder,
    SortTarget,
    WatchEvent,
    WatchResponse,
    prefix_end,
)
from aiolocks.testing import EtcdServer, etcd_flavors

from ..polling import eventually

pytestmark = pytest.mark.etcd

#: generous bound for "this must happen" waits on a loaded machine (never a speed check)
PATIENCE = 30.0


async def _next(watch: object) -> WatchResponse:
    iterator = watch.__aiter__()  # type: ignore[attr-defined]
    async with asyncio.timeout(PATIENCE):
        response: WatchResponse = await iterator.__anext__()
    return response


def test_import_aiolocks_loads_neither_grpc_nor_the_etcd_client() -> None:
    code = (
        "import sys, aiolocks, aiolocks.etcd; "
        "bad = [m for m in ('grpc', 'aetcd', 'aiolocks.etcd._client') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prefix_end() -> None:
    assert prefix_end(b"a/") == b"a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"


_WIRE_COMPARES = [
    Compare.create_revision(b"q/k", "==", 0),
    Compare.create_revision("q/", "<", 2**40, prefix=True),
    Compare.version(b"k", "!=", 3),
    Compare.mod_revision(b"k", ">", 1),
    Compare.value_of(b"k", "==", b""),
    Compare.value_of(b"k", "==", "\u00e9t\u00e9"),
    Compare.lease(b"k", "==", 0x7FFF_FFFF_FFFF_FFFF),
    Compare.create_revision(b"k", "==", -1),
]
_WIRE_OPS: list[RangeOp | PutOp | DeleteOp] = [
    RangeOp.of(b"k"),
    RangeOp.of(b"", range_end=b"\x00"),
    RangeOp.of(
        "q/\x00",
        prefix=True,
        limit=300,
        revision=7,
        sort_order=SortOrder.DESCEND,
        sort_target=SortTarget.CREATE,
        serializable=True,
        keys_only=True,
        count_only=True,
        min_mod_revision=1,
        max_mod_revision=2**35,
        min_create_revision=3,
        max_create_revision=127,
    ),
    PutOp.of(b"k", b"v" * 200, lease=0x1234_5678_9ABC, prev_kv=True),
    PutOp.of(b"k", b""),
    DeleteOp.of(b"q/", prefix=True, prev_kv=True),
    DeleteOp.of(b"k"),
]


@pytest.mark.parametrize("split", [0, 1, 3, len(_WIRE_OPS)])
def test_transactions_written_in_wire_format_match_protobuf(split: int) -> None:
    """The client writes transactions itself: byte for byte what protobuf writes."""
    from aetcd.rpc import rpc_pb2 as pb

    from aiolocks.etcd._client import _request_op, _txn_request

    compares = _WIRE_COMPARES[: split + 1]
    success, failure = _WIRE_OPS[:split], _WIRE_OPS[split:]
    expected = pb.TxnRequest(
        compare=[c._to_pb() for c in compares],
        success=[_request_op(op) for op in success],
        failure=[_request_op(op) for op in failure],
    )
    wire = _txn_request(compares, success, failure)
    assert wire == expected.SerializeToString()
    assert pb.TxnRequest.FromString(wire) == expected
    # an operation keeps its encoding: the second use writes the same bytes
    assert _txn_request(compares, success, failure) == wire
    with pytest.raises(TypeError, match="RangeOp, PutOp or DeleteOp"):
        _txn_request([], [], ["k"])  # type: ignore[list-item]


def test_bad_arguments_fail_before_any_io() -> None:
    with pytest.raises(ValueError, match="not host:port"):
        EtcdClient(["localhost"])
    with pytest.raises(ValueError, match="not one string"):
        EtcdClient("127.0.0.1:2379")
    with pytest.raises(ValueError, match="at least one endpoint"):
        EtcdClient([])
    with pytest.raises(ValueError, match="request_timeout"):
        EtcdClient(["127.0.0.1:2379"], request_timeout=0)
    with pytest.raises(ValueError, match="compare operator"):
        Compare.version("k", "=", 0)
    with pytest.raises(ValueError, match="limit must be >= 0"):
        RangeOp.of("k", limit=-1)
    with pytest.raises(ValueError, match="either prefix"):
        DeleteOp.of("k", prefix=True, range_end="z")
    with pytest.raises(TypeError, match="bytes or str"):
        PutOp.of("k", 5)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_put_range_delete_and_revisions(client: EtcdClient, prefix: str) -> None:
    first = await client.put(prefix + "a", "1")
    second = await client.put(prefix + "b", b"2")
    assert second.revision > first.revision
    updated = await client.put(prefix + "a", "3", prev_kv=True)
    assert updated.prev_kv is not None and updated.prev_kv.value == b"1"
    kv = await client.get(prefix + "a")
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (
        b"3",
        first.revision,
        updated.revision,
        2,
    )
    assert await client.get(prefix + "missing") is None
    # A read at an old revision sees the old value.
    old = await client.range(prefix + "a", revision=first.revision)
    assert old.kvs[0].value == b"1"
    deleted = await client.delete(prefix, prefix=True, prev_kv=True)
    assert deleted.deleted == 2
    assert sorted(kv.key for kv in deleted.prev_kvs) == [
        (prefix + "a").encode(),
        (prefix + "b").encode(),
    ]
    assert (await client.range(prefix, prefix=True)).count == 0


@pytest.mark.asyncio
async def test_range_limit_sort_and_create_revision_bounds(client: EtcdClient, prefix: str) -> None:
    # Keys whose name order differs from their creation order.
    revisions = {}
    for name in ("c", "a", "d", "b"):
        revisions[name] = (await client.put(prefix + name, name)).revision
    oldest = await client.range(
        prefix,
        prefix=True,
        limit=1,
        sort_target=SortTarget.CREATE,
        sort_order=SortOrder.ASCEND,
    )
    assert [kv.key for kv in oldest.kvs] == [(prefix + "c").encode()]
    assert oldest.count == 4 and oldest.more
    # The recipe's "last key created before mine": newest below a create revision.
    before_b = await client.range(
        prefix,
        prefix=True,
        limit=1,
        sort_target=SortTarget.CREATE,
        sort_order=SortOrder.DESCEND,
        max_create_revision=revisions["b"] - 1,
    )
    assert [kv.key for kv in before_b.kvs] == [(prefix + "d").encode()]
    newer = await client.range(prefix, prefix=True, min_create_revision=revisions["d"])
    assert sorted(kv.key for kv in newer.kvs) == [(prefix + "b").encode(), (prefix + "d").encode()]
    assert (await client.range(prefix, prefix=True, limit=2)).more


@pytest.mark.asyncio
async def test_txn_create_if_absent_then_range_in_one_request(
    client: EtcdClient, prefix: str
) -> None:
    key = prefix + "lease-1"
    lease = await client.lease_grant(30)
    try:
        queue = RangeOp.of(
            prefix, prefix=True, limit=1, sort_target=SortTarget.CREATE, sort_order=SortOrder.ASCEND
        )
        created = await client.txn(
            [Compare.create_revision(key, "==", 0)],
            [PutOp.of(key, "me", lease=lease.id), queue],
            [RangeOp.of(key), queue],
            retry=True,
        )
        assert created.succeeded
        put, first = created.responses
        assert isinstance(put, PutResult) and isinstance(first, RangeResult)
        assert first.kvs[0].create_revision == put.revision == created.revision
        assert first.kvs[0].lease == lease.id
        # The same transaction again takes the failure branch and reads the key.
        again = await client.txn(
            [Compare.create_revision(key, "==", 0)],
            [PutOp.of(key, "me", lease=lease.id), queue],
            [RangeOp.of(key), queue],
        )
        assert not again.succeeded
        mine = again.responses[0]
        assert isinstance(mine, RangeResult)
        assert mine.kvs[0].create_revision == created.revision
        # Compare on the lease and on the version.
        on_lease = await client.txn(
            [Compare.lease(key, "==", lease.id), Compare.version(key, "==", 1)], [], []
        )
        assert on_lease.succeeded
        other_lease = await client.txn([Compare.lease(key, "!=", lease.id)], [], [])
        assert not other_lease.succeeded
    finally:
        await client.lease_revoke(lease.id)


@pytest.mark.asyncio
async def test_delete_only_if_create_revision_is_still_mine(
    client: EtcdClient, prefix: str
) -> None:
    key = prefix + "k"
    mine = (await client.put(key, "v1")).revision
    # Someone deletes and re-creates the key (a newer holder).
    await client.delete(key)
    theirs = (await client.put(key, "v2")).revision
    stale = await client.txn([Compare.create_revision(key, "==", mine)], [DeleteOp.of(key)], [])
    assert not stale.succeeded
    assert (await client.get(key)) is not None
    current = await client.txn([Compare.create_revision(key, "==", theirs)], [DeleteOp.of(key)], [])
    assert current.succeeded
    deleted = current.responses[0]
    assert isinstance(deleted, DeleteResult) and deleted.deleted == 1
    # Newer mod revision compare (a put behind our back changes mod, not create).
    rev = (await client.put(key, "v3")).revision
    await client.put(key, "v4")
    assert not (await client.txn([Compare.mod_revision(key, "==", rev)], [], [])).succeeded
    assert (await client.txn([Compare.create_revision(key, "==", rev)], [], [])).succeeded
    assert (await client.txn([Compare.value_of(key, "==", "v4")], [], [])).succeeded


@pytest.mark.asyncio
async def test_lease_grant_time_to_live_revoke(client: EtcdClient, prefix: str) -> None:
    lease = await client.lease_grant(20)
    assert lease.ttl >= 20
    await client.put(prefix + "x", "1", lease=lease.id)
    info = await client.lease_time_to_live(lease.id, keys=True)
    assert info.granted_ttl == lease.ttl and 0 < info.ttl <= lease.ttl
    assert info.keys == ((prefix + "x").encode(),)
    await client.lease_revoke(lease.id)
    assert await client.get(prefix + "x") is None
    assert (await client.lease_time_to_live(lease.id)).ttl == -1
    with pytest.raises(LeaseNotFoundError):
        await client.lease_revoke(lease.id)
    with pytest.raises(LeaseNotFoundError):
        await client.put(prefix + "y", "1", lease=lease.id)
    with pytest.raises(ValueError, match="whole number"):
        await client.lease_grant(0)


@pytest.mark.asyncio
async def test_keep_alive_keeps_the_lease_and_moves_the_deadline(
    client: EtcdClient, prefix: str
) -> None:
    lease = await client.lease_grant(2)
    expired: list[str] = []
    keeper = client.keep_alive(lease, on_expired=expired.append)
    try:
        await client.put(prefix + "k", "v", lease=lease.id)
        first_deadline = keeper.deadline
        assert first_deadline >= lease.granted_at + lease.ttl
        # Seven answered refreshes at TTL/3 span more than two TTLs: without
        # them the lease would have expired several times over.
        await eventually(lambda: keeper.refreshes >= 7, PATIENCE, what="7 refreshes", interval=0.1)
        assert keeper.deadline > first_deadline
        assert keeper.remaining() > 0
        assert not keeper.expired and not expired
        assert (await client.lease_time_to_live(lease.id)).ttl > 0
        assert await client.get(prefix + "k") is not None
    finally:
        await keeper.revoke()
    assert await client.get(prefix + "k") is None
    assert not expired  # revoke() by us is not an expiry


@pytest.mark.asyncio
async def test_revoke_behind_our_back_expires_keeper_and_watchers_see_deletes(
    client: EtcdClient, etcd: EtcdServer, prefix: str
) -> None:
    lease = await client.lease_grant(30)
    # Refresh often, so that the answer TTL=0 after the revoke comes soon.
    keeper = client.keep_alive(lease, interval=0.5)
    keys = [prefix + name for name in ("a", "b")]
    for key in keys:
        await client.put(key, "v", lease=lease.id)
    watch = await client.watch(prefix, prefix=True)
    try:
        await asyncio.to_thread(etcd.etcdctl, "lease", "revoke", f"{lease.id:x}")
        seen: set[bytes] = set()
        while len(seen) < 2:
            response = await _next(watch)
            for event in response.events:
                assert event.type is EventType.DELETE
                seen.add(event.kv.key)
        assert seen == {key.encode() for key in keys}
        async with asyncio.timeout(PATIENCE):
            reason = await keeper.wait_expired()
        assert "TTL=0" in reason
        assert keeper.expired
    finally:
        await watch.aclose()
        await keeper.aclose()


@pytest.mark.asyncio
async def test_watch_from_a_start_revision_replays_and_filters(
    client: EtcdClient, prefix: str
) -> None:
    start = (await client.put(prefix + "a", "1")).revision
    await client.put(prefix + "a", "2")
    await client.delete(prefix + "a")
    async with await client.watch(prefix, prefix=True, start_revision=start, prev_kv=True) as w:
        events: list[WatchEvent] = []
        while len(events) < 3:
            events.extend((await _next(w)).events)
        assert [e.type for e in events] == [EventType.PUT, EventType.PUT, EventType.DELETE]
        assert events[1].prev_kv is not None and events[1].prev_kv.value == b"1"
        assert w.next_revision == events[-1].kv.mod_revision + 1
    async with await client.watch(prefix, prefix=True, start_revision=start, no_put=True) as w:
        only = (await _next(w)).events
        assert [e.type for e in only] == [EventType.DELETE]


@pytest.mark.asyncio
async def test_watch_progress_notification(client: EtcdClient, prefix: str) -> None:
    async with await client.watch(prefix + "quiet") as w:
        await client.put(prefix + "elsewhere", "x")
        await w.request_progress()
        response = await _next(w)
        assert response.is_progress
        assert response.revision >= w.created_revision


@pytest.mark.asyncio
async def test_watch_of_a_compacted_revision_raises(client: EtcdClient, prefix: str) -> None:
    start = (await client.put(prefix + "k", "1")).revision
    latest = (await client.put(prefix + "k", "2")).revision
    await client._unary("kv", "Compact", _compaction_request(latest), timeout=None, retry=False)
    # etcd confirms the watch, then cancels it: the error comes out of the iteration.
    async with await client.watch(prefix + "k", start_revision=start) as w:
        with pytest.raises(CompactedError) as caught:
            await _next(w)
    assert caught.value.compact_revision >= latest
    with pytest.raises(CompactedError):
        await client.range(prefix + "k", revision=start)


def _compaction_request(revision: int) -> object:
    from aetcd.rpc import rpc_pb2

    return rpc_pb2.CompactionRequest(revision=revision, physical=True)


@pytest.mark.asyncio
async def test_cancelled_requests_leave_the_channel_usable(client: EtcdClient, prefix: str) -> None:
    # Cancel requests at every stage: before sending, in flight, after the answer.
    for delay in (0, 0, 0.0005, 0.001, 0.002, 0.005, 0.01):
        for _ in range(5):
            task = asyncio.create_task(client.put(prefix + "k", "v"))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    # Cancel a watch while it is being created and a keep-alive right after it starts.
    for _ in range(5):
        watching = asyncio.create_task(client.watch(prefix + "w"))
        await asyncio.sleep(0)
        watching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watching
    lease = await client.lease_grant(30)
    for _ in range(5):
        keeper = client.keep_alive(lease)
        await asyncio.sleep(0)
        await keeper.aclose()
    assert not client._streams
    await client.lease_revoke(lease.id)
    # The channel still works for every kind of call.
    result = await client.put(prefix + "after", "ok")
    assert (await client.get(prefix + "after")) is not None
    async with await client.watch(prefix + "after", start_revision=result.revision) as w:
        assert (await _next(w)).events[0].kv.value == b"ok"


@pytest.mark.asyncio
async def test_closed_client_refuses_requests(etcd: EtcdServer) -> None:
    client = EtcdClient(list(etcd.endpoints))
    await client.connect()
    await client.close()
    with pytest.raises(BackendUnavailableError, match="closed"):
        await client.get("k")


def test_close_leaves_no_grpc_report_for_after_the_loop(etcd: EtcdServer) -> None:
    """gRPC reports the end of a cancelled stream through one poller thread per process,
    to the loop that started it; a report still due when that loop closes fails on the
    next loop ("Event loop is closed"). close() waits for them: a loop closed at once
    after it leaves nothing behind."""
    stale: list[object] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            stale.append(context.get("handle"))
        else:
            loop.default_exception_handler(context)

    async def streams_then_close(key: str) -> None:
        asyncio.get_running_loop().set_exception_handler(handler)
        client = EtcdClient(list(etcd.endpoints))
        await client.connect()
        client.keep_alive(await client.lease_grant(30))
        watch = await client.watch(key)
        await client.put(key, "v")
        assert (await _next(watch)).events
        asked = asyncio.ensure_future(client.get(key))  # under way when close() starts
        await asyncio.sleep(0)
        await client.close()
        assert (await asked) is not None  # it got its answer

    for round_ in range(20):  # without the wait, most rounds leave a report behind
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(streams_then_close(f"close-loop/{round_}"))
        finally:
            loop.close()
    assert stale == []


@pytest.mark.asyncio
async def test_servers_start_from_the_main_thread_while_grpc_is_busy(
    client: EtcdClient, prefix: str
) -> None:
    # Launchers fork with a pre-exec hook; gRPC's fork handlers used to abort
    # such a child (exit -6) about one start in five while gRPC threads were busy.
    lease = await client.lease_grant(30)
    keeper = client.keep_alive(lease)
    watch = await client.watch(prefix)
    try:
        for _ in range(15):

            async def busy() -> None:
                for _ in range(30):
                    await client.get(prefix + "k")

            traffic = asyncio.create_task(busy())
            server = EtcdServer(flavor=etcd_flavors()[-1])
            try:
                server.start()  # blocking, from the main thread, as the fixtures do
                assert server.health()
            finally:
                server.close()
                await traffic
    finally:
        await watch.aclose()
        await keeper.revoke()


@pytest.mark.parametrize(
    ("code", "retried"),
    [
        ("UNAVAILABLE", True),
        ("DEADLINE_EXCEEDED", True),
        ("CANCELLED", True),
        ("INTERNAL", True),  # "Internal error from Core": a stream broken under it
        ("UNKNOWN", True),
        ("PERMISSION_DENIED", False),
        ("UNAUTHENTICATED", False),
        ("INVALID_ARGUMENT", False),
    ],
)
def test_a_watch_stream_broken_by_the_transport_is_opened_again(code: str, retried: bool) -> None:
    """Only a refusal ends the watches; a broken stream moves to the next member."""
    import grpc

    from aiolocks.etcd._client import _stream_retried

    exc = grpc.aio.AioRpcError(
        getattr(grpc.StatusCode, code), grpc.aio.Metadata(), grpc.aio.Metadata(), details="x"
    )
    assert _stream_retried(exc) is retried
