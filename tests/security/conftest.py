"""A Redis server with a password, an ACL user limited to the lock keys, and TLS.

Started once per module by the test setup; its certificates are made with
the ``openssl`` command (:mod:`aiolocks.testing.tls`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiolocks.testing import PostgresServer
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


@pytest.fixture(scope="module")
def tls_postgres(tls_files: TlsFiles) -> Iterator[PostgresServer]:
    """A PostgreSQL with ``ssl=on`` serving the ``localhost`` certificate of ``tls_files``."""
    # a folder of its own under /tmp: pytest's are closed to the server's OS user
    folder = Path(tempfile.mkdtemp(prefix="aiolocks-pg-tls-"))
    cert, key = folder / "server.crt", folder / "server.key"
    shutil.copy(tls_files.server_cert, cert)
    shutil.copy(tls_files.server_key, key)
    key.chmod(0o600)
    if os.geteuid() == 0:  # the server runs as its own OS user, which must own the key
        owner = pwd.getpwnam(os.environ.get("AIOLOCKS_POSTGRES_OS_USER", "postgres"))
        for path in (folder, cert, key):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    settings = {"ssl": "on", "ssl_cert_file": str(cert), "ssl_key_file": str(key)}
    try:
        with PostgresServer(settings=settings) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)
