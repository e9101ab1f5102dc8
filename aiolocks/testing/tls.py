"""Throw-away TLS certificates for test servers, made with the ``openssl`` command.

:func:`make_tls_files` writes a certificate authority, a server certificate
for the name ``localhost`` only (so a client that dials ``127.0.0.1`` sees a
host name mismatch) and a client certificate signed by it, and a second,
unrelated authority (to test that its certificates are refused).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import final

from ._process import ServerNotInstalledError

__all__ = ["TlsFiles", "make_tls_files"]


@final
@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of the PEM files :func:`make_tls_files` wrote."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: an authority that signed neither certificate
    other_ca_cert: Path
    #: a client certificate signed by :attr:`other_ca_cert` (the server must refuse it)
    other_client_cert: Path
    other_client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise ServerNotInstalledError("the openssl command is needed to make test certificates")
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _authority(name: str, cwd: Path) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN=aiolocks test {name}", "-keyout", f"{name}.key", "-out", f"{name}.crt",
        cwd=cwd,
    )  # fmt: skip


def _signed(name: str, ca: str, cwd: Path, *, server: bool) -> None:
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr",
        cwd=cwd,
    )  # fmt: skip
    extensions = cwd / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE"]
    if server:
        lines += ["subjectAltName=DNS:localhost", "extendedKeyUsage=serverAuth"]
    else:
        lines += ["extendedKeyUsage=clientAuth"]
    extensions.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", extensions.name, "-out", f"{name}.crt",
        cwd=cwd,
    )  # fmt: skip


def make_tls_files(directory: Path) -> TlsFiles:
    """Write a CA, a server and a client certificate (and a foreign CA) into ``directory``.

    :raises ServerNotInstalledError: the ``openssl`` command is missing.
    """
    directory.mkdir(parents=True, exist_ok=True)
    _authority("ca", directory)
    _authority("other-ca", directory)
    _signed("server", "ca", directory, server=True)
    _signed("client", "ca", directory, server=False)
    _signed("other-client", "other-ca", directory, server=False)
    return TlsFiles(
        ca_cert=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        other_ca_cert=directory / "other-ca.crt",
        other_client_cert=directory / "other-client.crt",
        other_client_key=directory / "other-client.key",
    )
