"""Tests of the etcd groundwork (client layer, URLs, test servers, draft driver) against real etcd.

``aiolocks.testing`` is imported first, before anything loads gRPC: it turns
gRPC's fork handlers off (unless set otherwise), which could abort the
servers that the launchers fork while the etcd client is busy.
"""

import aiolocks.testing  # noqa: F401
