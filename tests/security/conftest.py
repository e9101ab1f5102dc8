"""A Redis server with a password, an ACL user limited to the lock keys, and TLS.

Started once per module by the test setup; its certificates are made with
the ``openssl`` command (:mod:`aiolocks.testing.tls`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aiolocks.testing.servers import RedisServer
from aiolocks.testing.tls import TlsFiles, make_tls_files

#: the ``default`` user's password (the test harness's admin connection)
ADMIN_PASSWORD = "Adm1nS3cret"
#: the lock user's password
LOCKER_PASSWORD = "L0ckerS3cret"
#: the key prefix the lock user may use
PREFIX = "locks:"
#: the least-privilege ACL line of docs/security.md, for ``PREFIX``
LOCKER_ACL = (
    f"locker on >{LOCKER_PASSWORD} ~{PREFIX}* &{PREFIX}* &__keyspace@*__:{PREFIX}* "
    "-@all +@read +@write +@scripting +@pubsub +@connection +time -@dangerous"
)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA, a server and a client certificate (and a foreign CA), fresh for the module."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secure_redis(tls_files: TlsFiles) -> Iterator[RedisServer]:
    """``redis-server`` with ``requirepass``, the ``locker`` ACL user and a TLS port."""
    with RedisServer(password=ADMIN_PASSWORD, acl_users=[LOCKER_ACL], tls=tls_files) as server:
        yield server


def locker_url(server: RedisServer, password: str = LOCKER_PASSWORD, query: str = "") -> str:
    """The lock user's plain ``redis://`` URL on ``server``."""
    extra = f"&{query}" if query else ""
    return f"redis://locker:{password}@127.0.0.1:{server.port}/0?key_prefix={PREFIX}{extra}"
