"""Tell a refused client certificate from an outage when a TLS 1.3 connect was reset.

Under TLS 1.3 the client's handshake ends before the server has checked the
client's certificate. redis-py then sends its first command at once; a
server that refuses the certificate sends an alert and closes a socket with
that command unread, so the kernel answers with a reset, and a reset that
arrives before the client read the alert throws the alert away: the client
sees only "connection reset by peer", which reads as an outage.

:func:`certificate_refusal` asks again without that race: a handshake with
the same client certificate, then nothing sent, only read. A server that
refuses the certificate now closes with nothing unread (no reset): its alert
arrives. A server that accepts it sends its session tickets (TLS 1.3) and
then waits for a command. Nothing is written after the handshake, so no
password or command goes to a server we did not verify (the probe does not
check the server's certificate: the real connect does that).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any

__all__ = ["certificate_refusal", "probe_target", "was_reset"]

#: bytes read at a time from the probe's socket
_CHUNK = 16384


def was_reset(exc: BaseException) -> bool:
    """``exc``, or what it was raised from, is a connection reset by the peer."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return False
        if isinstance(current, ConnectionResetError):
            return True
        current = current.__cause__ or current.__context__
    return False


def probe_target(client: Any) -> tuple[str, int, Mapping[str, Any]] | None:
    """``(host, port, connection kwargs)`` of a single-server TLS ``client``, else None."""
    from redis.asyncio.connection import SSLConnection

    pool = getattr(client, "connection_pool", None)
    if pool is None or not issubclass(pool.connection_class, SSLConnection):
        return None
    kwargs = pool.connection_kwargs
    host, port = kwargs.get("host"), kwargs.get("port")
    if not host or not port:
        return None
    return str(host), int(port), kwargs


def _context(kwargs: Mapping[str, Any]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only the server's verdict on our certificate
    if kwargs.get("ssl_certfile"):  # without one: a server may require one
        context.load_cert_chain(
            kwargs["ssl_certfile"], kwargs.get("ssl_keyfile"), kwargs.get("ssl_password")
        )
    return context


async def certificate_refusal(
    host: str, port: int, kwargs: Mapping[str, Any], timeout: float
) -> ssl.SSLError | None:
    """The server's alert refusing our client certificate, or None (accepted, or unknown)."""
    try:
        context = _context(kwargs)
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                return await _verdict(context, host, reader, writer)
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError):
        return None  # no answer either way (ssl.SSLError is an OSError: handled inside)


async def _verdict(
    context: ssl.SSLContext,
    host: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> ssl.SSLError | None:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=host)
    handshaken = False
    while True:
        try:
            if not handshaken:
                tls.do_handshake()
                handshaken = True
            tls.read(1)
            return None  # the server spoke first: it accepted us
        except ssl.SSLWantReadError:
            if handshaken and tls.session is not None and tls.session.has_ticket:
                return None  # a session ticket: the handshake was accepted
        except ssl.SSLZeroReturnError:
            return None
        except ssl.SSLError as exc:
            return exc  # the server's alert
        pending = outgoing.read()
        if pending:
            writer.write(pending)
            await writer.drain()
        data = await reader.read(_CHUNK)
        if not data:
            return None  # closed without an alert: nothing to tell
        incoming.write(data)
