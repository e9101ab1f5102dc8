"""An asyncio TCP proxy with fault controls, for network-failure tests.

Put it between a client and a real server and break the network on cue::

    async with TcpProxy("127.0.0.1", redis_server.port) as proxy:
        client = redis.asyncio.Redis(port=proxy.port)
        proxy.stall()        # a partition: sockets stay open, no byte moves
        proxy.stall(False)   # healed: what was held back is delivered
        proxy.cut()          # every live connection is closed now
        proxy.refuse()       # new connections are closed at once
        proxy.delay(0.2)     # 200 ms of latency each way

Design: one handler per accepted connection opens the upstream connection
and runs two directions; each direction is a reader that stamps every chunk
with its due time (now + delay, never earlier than the previous chunk, so
order is kept) and a writer that waits until that time and until the proxy
is not stalled. A stalled reader stops reading, so the kernel buffers fill
and the sender sees back-pressure, as on a real partition. End of stream is
passed on as a half-close. Every task the proxy runs is tracked and
cancelled by :meth:`TcpProxy.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Final, Self, final

__all__ = ["TcpProxy"]

_CHUNK: Final = 65536


class _Link:
    """One proxied connection: the client side and (once connected) the upstream side."""

    def __init__(self, client: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task = task
        self.cut = False

    def abort(self) -> None:
        # abort(), not close(): a cut is abrupt, buffered bytes are dropped.
        self.cut = True
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()
        # The handler may be parked on a stall or a delay; end it now so the
        # connection is really gone (and no longer counted) when cut() returns.
        if self.task is not asyncio.current_task():
            self.task.cancel()


@final
class TcpProxy:
    """A TCP proxy on ``127.0.0.1`` to ``target_host:target_port`` with fault controls.

    ::

        async with TcpProxy("127.0.0.1", zk.port) as proxy:
            client = aiozk.ZKClient(proxy.netloc)
            ...
            proxy.cut()

    Faults: :meth:`cut` closes every live connection (new ones are still
    accepted), :meth:`refuse` closes new connections at once, :meth:`stall`
    stops all forwarding while keeping sockets open (a partition), and
    :meth:`delay` adds latency to every forwarded chunk. :meth:`heal` undoes
    refuse, stall and delay. ``stop()`` closes everything and cancels every
    task the proxy started.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.target_host: Final = target_host
        """Where connections are forwarded."""
        self.target_port: Final = target_port
        """Where connections are forwarded."""
        self._listen_host = listen_host
        self._port = listen_port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._delay = 0.0
        self._accepted = 0
        self._changed = asyncio.Event()

    # -- lifecycle

    async def start(self) -> Self:
        """Start listening (on the same port again after :meth:`stop`)."""
        if self._server is not None:
            return self
        self._server = await asyncio.start_server(self._handle, self._listen_host, self._port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        """Stop listening, close every connection and cancel and await every task."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self._links):
            link.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # Cleanup path: collect every handler so nothing outlives the proxy.
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- addresses and counters

    @property
    def host(self) -> str:
        """The listening address (``127.0.0.1``)."""
        return self._listen_host

    @property
    def port(self) -> int:
        """The listening port (0 before the first :meth:`start` unless given)."""
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` to connect to instead of the target."""
        return (self._listen_host, self._port)

    @property
    def netloc(self) -> str:
        """``"127.0.0.1:<port>"``, for URLs and ZooKeeper host lists."""
        return f"{self._listen_host}:{self._port}"

    @property
    def connections_total(self) -> int:
        """How many connections were accepted since the proxy was created."""
        return self._accepted

    @property
    def active_connections(self) -> int:
        """How many connections are open right now."""
        return len(self._links)

    async def wait_for_connections(self, count: int = 1) -> None:
        """Wait until at least ``count`` connections are open (wrap in ``asyncio.timeout``)."""
        while len(self._links) < count:
            self._changed.clear()
            await self._changed.wait()

    # -- faults

    def cut(self) -> int:
        """Close every live connection now; return how many. New connections are still accepted."""
        links = list(self._links)
        for link in links:
            self._links.discard(link)
            link.abort()
        self._notify()
        return len(links)

    def refuse(self, enabled: bool = True) -> None:
        """While enabled, close every new connection right after accepting it."""
        self._refusing = enabled

    def stall(self, enabled: bool = True) -> None:
        """While enabled, forward nothing in either direction; sockets stay open (a partition).

        Bytes held back are delivered, in order, once the stall ends. New
        connections are accepted but reach the target only after the stall.
        """
        if enabled:
            self._flowing.clear()
        else:
            self._flowing.set()

    def delay(self, seconds: float) -> None:
        """Add ``seconds`` of latency to every chunk forwarded from now on (0 to stop)."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, not {seconds}")
        self._delay = seconds

    def heal(self) -> None:
        """End refuse, stall and delay."""
        self.refuse(False)
        self.stall(False)
        self.delay(0.0)

    # -- forwarding

    def _notify(self) -> None:
        self._changed.set()

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._accepted += 1
        link = _Link(client_writer, task)
        try:
            if self._refusing or self._server is None:
                return
            self._links.add(link)
            self._notify()
            # A partitioned network does not even let the connection through.
            await self._flowing.wait()
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return
            link.upstream = upstream_writer
            async with asyncio.TaskGroup() as group:
                group.create_task(self._direction(link, client_reader, upstream_writer))
                group.create_task(self._direction(link, upstream_reader, client_writer))
        except asyncio.CancelledError:
            # stop() cancels the handlers; on Python 3.11 a CancelledError
            # escaping a stream handler is logged by asyncio as an error.
            return
        finally:
            # Cleanup path (also on cancellation from stop()): no socket may
            # outlive its handler, or the event loop warns about it.
            self._links.discard(link)
            link.abort()
            self._tasks.discard(task)
            self._notify()

    async def _direction(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        last_due = 0.0

        async def pump_in() -> None:
            nonlocal last_due
            while True:
                await self._flowing.wait()
                try:
                    data = await reader.read(_CHUNK)
                except OSError:
                    # A reset on one side resets the other: abort the link.
                    link.abort()
                    return
                last_due = max(loop.time() + self._delay, last_due)
                await queue.put((last_due, data))
                if not data:
                    return

        async def pump_out() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._flowing.wait()
                if not data:
                    # Pass the end of stream on as a half-close, so a peer
                    # that shut down its sending side still gets its answer.
                    if link.cut:
                        return
                    with contextlib.suppress(OSError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                try:
                    writer.write(data)
                    await writer.drain()
                except OSError:
                    link.abort()
                    return

        async with asyncio.TaskGroup() as group:
            group.create_task(pump_in())
            group.create_task(pump_out())

    def __repr__(self) -> str:
        return (
            f"<TcpProxy {self.netloc} -> {self.target_host}:{self.target_port} "
            f"active={self.active_connections}>"
        )
