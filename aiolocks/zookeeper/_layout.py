"""Where a lock's nodes live, and how they are named: Apache Curator's layout, exactly.

Two layouts, chosen with ``zk://...?layout=``:

``aiolocks`` (the default)
    Each family has its own folder: ``mutex("orders/42")`` lives at
    ``/aiolocks/mutex/orders/42``; ``%`` and code points ZooKeeper refuses
    are escaped, so every valid lock name maps to a path.
``curator``
    The name *is* the path, as a Curator user writes it:
    ``mutex("locks/orders")`` is ``new InterProcessMutex(client,
    "/locks/orders")``. Nothing is escaped; a name ZooKeeper cannot hold
    as a path is refused (:func:`check_curator_name`).

Below that folder both layouts use Curator 5.x's node names and ordering, so
every recipe excludes (or elects) together with Curator processes on the
same path:

- ``mutex``: ``InterProcessMutex``; nodes ``_c_<uuid>-lock-<seq>``.
- ``semaphore_mutex``: ``InterProcessSemaphoreMutex``, which is
  ``InterProcessSemaphoreV2`` with one lease; laid out as ``semaphore``.
- ``semaphore``: ``InterProcessSemaphoreV2``; the turnstile mutex in
  ``locks/`` (``_c_<uuid>-lock-<seq>``), the leases in ``leases/``
  (``_c_<uuid>-lease-<seq>``).
- ``read_write_lock``: ``InterProcessReadWriteLock``; ``_c_<uuid>-__READ__<seq>``
  and ``_c_<uuid>-__WRIT__<seq>`` in one queue.
- ``leader_latch``: ``LeaderLatch``; ``_c_<uuid>-latch-<seq>``, the participant
  id (UTF-8) as the node's data, as Curator writes it.

``_c_<uuid>-`` is Curator's protected-mode prefix (``CreateBuilder.withProtection``);
the server appends the 10-digit sequence. Curator orders the children of a
lock folder by the text after the last lock name in each child's name
(``StandardLockInternalsDriver.standardFixForSorting``), compared as
strings.

A downgrade read (a task holding the write lock takes the read lock) is
named ``_c_<uuid>-__READ__<write seq>-<seq>``: the text Curator sorts by is
then ``<write seq>-<seq>``, which sorts right after the write node it was
taken under and before any node created after that write node. So a writer
that queued behind the write lock, Curator's or ours, stays behind the
downgrade read (the CURATOR-621 fix, in a form Curator orders the same way).
"""

from __future__ import annotations

import functools
import re
from typing import Final

from .._core.driver import Family
from .._core.errors import InvalidLockNameError

__all__ = [
    "DEFAULT_LAYOUT",
    "LAYOUTS",
    "RECORDS_ROOT",
    "ROOT",
    "check_curator_name",
    "escape",
    "lock_path",
    "match_node",
    "node_prefix",
    "parse_layout",
    "record_path",
]

#: the folder of the default layout, below the chroot
ROOT: Final = "/aiolocks"

#: the folder of the record store (groups, latches, ``once``), in both layouts:
#: records are aiolocks' own (no Curator recipe shares them), so every process
#: finds them in one place whatever layout its locks use
RECORDS_ROOT: Final = f"{ROOT}/records"

DEFAULT_LAYOUT: Final = "aiolocks"
LAYOUTS: Final = ("aiolocks", "curator")

#: Curator's lock names (the text before the server's sequence), by our node kind.
#: ``__READ__`` and ``__WRIT__`` have the same length on purpose (Curator's
#: InterProcessReadWriteLock relies on it).
_LOCK_NAMES: Final = {
    "lock": "lock-",
    "lease": "lease-",
    "latch": "latch-",
    "read": "__READ__",
    "write": "__WRIT__",
}

#: ``_c_<uuid>-<lock name>[<anchor>-]<seq>``; the anchor only on a downgrade read
_NODE_RE: Final = re.compile(
    r"^_c_(?P<uid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-"
    r"(?:(?P<kind>lock|lease|latch)-|(?P<rw>__READ__(?:(?P<anchor>\d{10})-)?|__WRIT__))"
    r"(?P<seq>\d{10})$"
)

# ZooKeeper refuses these code points in paths (PathUtils.validatePath).
_FORBIDDEN_RANGES: Final = ((0xD800, 0xF8FF), (0xFFF0, 0xFFFF))


def parse_layout(value: object) -> str:
    """``layout=`` from a URL query or a keyword: ``aiolocks`` or ``curator``."""
    if value not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {value!r}")
    return str(value)


def node_prefix(uid: str, kind: str, anchor: int | None = None) -> str:
    """The name a node is created with; the server appends its 10-digit sequence."""
    name = _LOCK_NAMES[kind]
    if anchor is not None:
        if kind != "read":
            raise ValueError(f"only a read node carries a downgrade anchor, not {kind!r}")
        name = f"{name}{anchor:010d}-"
    return f"_c_{uid}-{name}"


def match_node(name: str) -> tuple[str, str, int, int | None] | None:
    """``(kind, uid, seq, anchor)`` of a lock node's name; ``None`` for a foreign child."""
    m = _NODE_RE.match(name)
    if m is None:
        return None
    kind = m.group("kind")
    if kind is None:
        kind = "write" if m.group("rw") == "__WRIT__" else "read"
    anchor = m.group("anchor")
    return kind, m.group("uid"), int(m.group("seq")), None if anchor is None else int(anchor)


def _forbidden(ch: str) -> bool:
    code = ord(ch)
    # Above U+FFFF: Java (the server) sees a surrogate pair, which it refuses.
    return code > 0xFFFF or any(lo <= code <= hi for lo, hi in _FORBIDDEN_RANGES)


def escape(name: str) -> str:
    """Map a lock name to path characters ZooKeeper accepts; injective (default layout).

    ``%`` becomes ``%25``, code points ZooKeeper refuses become ``%uXXXX``
    and those above U+FFFF (surrogate pairs in Java, also refused)
    ``%UXXXXXX``; everything else (including ``/``) is kept, so paths stay
    readable.
    """
    if "%" not in name and not any(_forbidden(ch) for ch in name):
        return name
    out = []
    for ch in name:
        code = ord(ch)
        if ch == "%":
            out.append("%25")
        elif code > 0xFFFF:
            out.append(f"%U{code:06X}")
        elif _forbidden(ch):
            out.append(f"%u{code:04X}")
        else:
            out.append(ch)
    return "".join(out)


def check_curator_name(name: str) -> None:
    """Refuse a (canonical) lock name that cannot be a ZooKeeper path as it is.

    On ``layout=curator`` the name is the path, unescaped: it must not hold
    code points ZooKeeper refuses, nor lie under ``/zookeeper`` (the
    server's own tree).

    :raises InvalidLockNameError: naming the problem (a ``ValueError``)
    """
    for i, ch in enumerate(name):
        if _forbidden(ch):
            raise InvalidLockNameError(
                f"lock name {name!r} has U+{ord(ch):04X} at index {i}, which ZooKeeper refuses "
                "in paths; with layout=curator a name is the ZooKeeper path as it is"
            )
    if name.split("/", 1)[0] == "zookeeper":
        raise InvalidLockNameError(
            f"lock name {name!r} is under /zookeeper, which the server reserves for itself"
        )


@functools.lru_cache(maxsize=4096)
def lock_path(family: Family, name: str, layout: str = DEFAULT_LAYOUT) -> str:
    """The folder under which the nodes of lock ``name`` live (below the chroot)."""
    if layout == "curator":
        return f"/{name}"
    return f"{ROOT}/{family.value}/{escape(name)}"


def record_path(key: str) -> str:
    """The node of record ``key`` (or the folder of a record prefix), below the chroot."""
    return f"{RECORDS_ROOT}/{escape(key)}"
