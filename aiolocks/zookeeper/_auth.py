"""ZooKeeper digest authentication, the ACL of an authenticated backend's nodes, and TLS.

``zk://user:password@hosts/...`` authenticates every connection of the
backend's session with ZooKeeper's ``digest`` scheme (``addauth digest
user:password``). ZooKeeper's digest provider accepts any ``user:password``
at login: the pair only *names an identity*, ``digest:user:<hash>``, where
``<hash>`` is ``base64(sha1("user:password"))``. A wrong password is
therefore not refused at connect; it is another identity, and the server
refuses it (``NoAuth``) where the ACLs written by the right one apply.

What the backend writes (``acl=creator``, the default with credentials),
on every node it creates (the chroot if missing, the lock folders, which
are containers, and the lock nodes):

* ``digest:user:<hash>``: every permission;
* ``world:anyone``: READ only, so ``status``, ``list`` and watchers work
  for anyone who can reach the ensemble.

In ZooKeeper the right to create or delete a node is checked on its
*parent*: the folders being writable by the identity alone is what keeps
another client (without the credentials) from creating a node in a lock's
queue or deleting a held lock's node. Every client that shares locks must
therefore use the same user and password. ``acl=open`` writes
``world:anyone`` with every permission (ZooKeeper's ``OPEN_ACL_UNSAFE``,
the default without credentials).
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
from collections.abc import Mapping
from typing import Any, Final

from aiozk import ACL, protocol

from ._connection import Credential

__all__ = [
    "ACL_MODES",
    "TLS_OPTIONS",
    "check_user",
    "creator_acl",
    "digest_credential",
    "digest_id",
    "tls_context",
]

#: values of the ``acl`` URL option
ACL_MODES: Final = ("creator", "open")


def digest_id(user: str, password: str) -> str:
    """The identity ZooKeeper's digest provider gives ``user:password``: ``user:<hash>``."""
    digest = hashlib.sha1(f"{user}:{password}".encode()).digest()  # ZooKeeper's scheme
    return f"{user}:{base64.b64encode(digest).decode('ascii')}"


def digest_credential(user: str, password: str) -> Credential:
    """The ``addauth digest user:password`` of a ``zk://user:password@...`` URL."""
    return Credential("digest", f"{user}:{password}".encode(), identity=user)


def creator_acl(user: str, password: str) -> list[Any]:
    """``acl=creator``: every permission to the identity, READ to anyone."""
    owner = ACL.make(
        scheme="digest",
        id=digest_id(user, password),
        read=True,
        write=True,
        create=True,
        delete=True,
        admin=True,
    )
    return [owner, protocol.WORLD_READABLE]


def check_user(user: str) -> str:
    """A digest user name: non-empty, no ``:`` (the digest separator), no control character."""
    if not user:
        raise ValueError("the zk:// URL has a password but no user name (zk://user:password@...)")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in user):
        raise ValueError("the user name of the zk:// URL contains a control character")
    return user


#: the TLS options of a zk:// URL (besides ``tls`` itself)
TLS_OPTIONS: Final = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


def _readable(name: str, value: object) -> str:
    path = str(value)
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        raise ValueError(f"option {name}={path!r}: no such readable file")
    return path


def tls_context(options: Mapping[str, object]) -> ssl.SSLContext | None:
    """The ``ssl.SSLContext`` for ``tls=true`` and the ``ssl_*`` options (None without TLS).

    The server's certificate is always verified (against ``ssl_ca_certs``,
    else the system's authorities), and its host name unless
    ``ssl_check_hostname=false``; ``ssl_certfile``/``ssl_keyfile`` are our
    certificate for servers that ask for one. Files are checked here, before
    any network I/O; an ``ssl_*`` option without ``tls=true`` is a mistake.
    """
    if not options.get("tls", False):
        given = [name for name in TLS_OPTIONS if name in options]
        if given:
            raise ValueError(f"option {given[0]} needs tls=true (the secureClientPort)")
        return None
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        raise ValueError("option ssl_keyfile needs ssl_certfile (the client certificate)")
    cafile = options.get("ssl_ca_certs")
    certfile = options.get("ssl_certfile")
    keyfile = options.get("ssl_keyfile")
    try:
        context = ssl.create_default_context(
            cafile=None if cafile is None else _readable("ssl_ca_certs", cafile)
        )
        if certfile is not None:
            context.load_cert_chain(
                _readable("ssl_certfile", certfile),
                None if keyfile is None else _readable("ssl_keyfile", keyfile),
            )
    except ssl.SSLError as exc:
        raise ValueError(f"the TLS files of the zk:// URL cannot be used: {exc.reason}") from None
    context.check_hostname = bool(options.get("ssl_check_hostname", True))
    return context
