"""PostgreSQL over TLS (``ssl=on``): ``sslmode=verify-full`` with ``sslrootcert``."""

from __future__ import annotations

import uuid

import pytest

import aiolocks
from aiolocks._connect import backend_from_url
from aiolocks.testing import PostgresServer
from aiolocks.testing.tls import TlsFiles

pytestmark = pytest.mark.postgres


def _url(server: PostgresServer, host: str, query: str) -> str:
    return f"postgresql://{server.user}@{host}:{server.port}/{server.database}?{query}"


@pytest.mark.parametrize("mode", ["advisory", "lease"])
@pytest.mark.asyncio
async def test_verify_full(tls_postgres: PostgresServer, tls_files: TlsFiles, mode: str) -> None:
    query = (
        f"sslmode=verify-full&sslrootcert={tls_files.ca_cert}&sslcert={tls_files.client_cert}"
        f"&sslkey={tls_files.client_key}&mode={mode}"
    )
    name = f"sec/pg-tls/{uuid.uuid4().hex[:8]}"
    async with (
        aiolocks.connect(_url(tls_postgres, "localhost", query)) as backend,
        backend.mutex(name) as held,
    ):
        assert held.fencing_token is not None
        rows = tls_postgres.query(
            "SELECT s.ssl FROM pg_stat_ssl AS s JOIN pg_stat_activity AS a USING (pid) "
            "WHERE a.application_name = 'aiolocks'"
        )
        assert rows and all(ssl == "t" for (ssl,) in rows), rows


@pytest.mark.parametrize(
    ("host", "extra", "ca"),
    [
        ("127.0.0.1", "", "ca"),  # the certificate names localhost only
        ("localhost", "", "other"),  # signed by a CA we do not trust
    ],
)
@pytest.mark.asyncio
async def test_untrusted_or_mismatched_certificate_is_denied(
    tls_postgres: PostgresServer, tls_files: TlsFiles, host: str, extra: str, ca: str
) -> None:
    root = tls_files.ca_cert if ca == "ca" else tls_files.other_ca_cert
    url = _url(tls_postgres, host, f"sslmode=verify-full&sslrootcert={root}{extra}")
    with pytest.raises(aiolocks.AccessDeniedError, match="certificate verify failed"):
        async with aiolocks.connect(url, on_unavailable="local"):
            pass


@pytest.mark.asyncio
async def test_verify_ca_skips_the_host_name(
    tls_postgres: PostgresServer, tls_files: TlsFiles
) -> None:
    url = _url(tls_postgres, "127.0.0.1", f"sslmode=verify-ca&sslrootcert={tls_files.ca_cert}")
    async with aiolocks.connect(url) as backend, backend.mutex("sec/pg-verify-ca"):
        pass


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sslrootcert={ca}", "needs sslmode"),
        ("sslmode=prefer&sslrootcert={ca}", "needs sslmode"),
        ("sslmode=verify-full&sslrootcert=/no/such.pem", "no such readable file"),
        ("sslmode=require&sslkey={ca}", "sslkey needs sslcert"),
    ],
)
def test_tls_option_errors(query: str, message: str, tls_files: TlsFiles) -> None:
    with pytest.raises(ValueError, match=message):
        backend_from_url(f"postgresql://u@h/db?{query.format(ca=tls_files.ca_cert)}")
