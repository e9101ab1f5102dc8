"""The etcd backend (``etcd://``): work in progress, not usable through ``aiolocks.connect()`` yet.

What exists so far is the ground the driver will stand on:
``aiolocks.etcd._client`` (an asyncio etcd v3 client on ``grpc.aio`` with
endpoint failover, deadlines, one keep-alive stream per lease and resumable
watches) and ``aiolocks.etcd._url`` (parsing and checking ``etcd://`` URLs).
Both are internal: nothing is public here until the backend is, and
``import aiolocks`` never imports this package (nor ``grpc``).
"""

from __future__ import annotations

__all__: list[str] = []
