"""Validation of lock names.

A lock name is a ``/``-separated path such as ``locks/pay/order-1001``. A
leading ``/`` is allowed and means the same name. Each backend maps the
canonical form (no leading ``/``) into its own space.

The canonical form is NFC-normalised, so two spellings of one text (``é``
as one code point or as ``e`` + combining accent) are one lock on every
backend. Characters that could make a name print as another one are
refused: control (Cc), format (Cf, which holds the bidirectional controls
and zero-width characters) and line/paragraph separators (Zl, Zp). So is a
segment shaped like a node the ZooKeeper recipe (or Apache Curator) creates
inside a lock's folder: such a name would sit in its parent lock's queue.
"""

from __future__ import annotations

import re
import unicodedata

from .errors import InvalidLockNameError

__all__ = [
    "MAX_NAME_BYTES",
    "REFUSED_CATEGORIES",
    "has_control_character",
    "is_control",
    "is_refused",
    "validate_name",
]

MAX_NAME_BYTES = 1024

#: Unicode general categories refused in names and participant ids
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})

#: a child node name of the ZooKeeper lock recipe or of Curator's:
#: ``_c_<uuid>-...`` (protected mode), or ``<kind><10-digit sequence>``
_INTERNAL_SEGMENT = re.compile(
    r"_c_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-.*"
    r"|(?:lock-|read-|write-|lease-|latch-|__READ__|__WRIT__)\d{10}"
)


def is_control(ch: str) -> bool:
    """``ch`` is a C0 or C1 control character (or DEL): never allowed in names or ids."""
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F


def is_refused(ch: str) -> bool:
    """``ch`` may not appear in a name or participant id (see :data:`REFUSED_CATEGORIES`)."""
    return is_control(ch) or unicodedata.category(ch) in REFUSED_CATEGORIES


def has_control_character(text: str) -> bool:
    """``text`` contains a character :func:`is_refused` refuses (control, format, separator)."""
    return any(is_refused(ch) for ch in text)


def _describe(ch: str) -> str:
    kind = "control" if unicodedata.category(ch) == "Cc" else "format/separator"
    label = unicodedata.name(ch, "")
    return f"{kind} character U+{ord(ch):04X}" + (f" ({label})" if label else "")


def _checked_unicode(name: str) -> str:
    """``name`` (not plain printable ASCII) checked for refused characters, then NFC."""
    for i, ch in enumerate(name):
        if is_refused(ch):
            raise InvalidLockNameError(f"lock name {name!r} contains {_describe(ch)} at index {i}")
    if len(name) > 4 * MAX_NAME_BYTES:  # do not normalise a huge string
        raise InvalidLockNameError(
            f"lock name is {len(name)} characters, more than the limit of {MAX_NAME_BYTES} "
            f"bytes: {name[:40]!r}..."
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidLockNameError(
            f"lock name {name!r} is not valid Unicode (lone surrogate at index {exc.start})"
        ) from None
    return unicodedata.normalize("NFC", name)


def validate_name(name: object) -> str:
    """Return the canonical (NFC, no leading ``/``) form of ``name`` or raise
    :class:`InvalidLockNameError`.

    >>> validate_name("/locks/pay/order-1")
    'locks/pay/order-1'
    """
    if not isinstance(name, str):
        raise InvalidLockNameError(f"lock name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise InvalidLockNameError("lock name must not be empty")
    if not (name.isascii() and name.isprintable()):  # printable ASCII: nothing to refuse
        name = _checked_unicode(name)
    size = len(name) if name.isascii() else len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise InvalidLockNameError(
            f"lock name is {size} bytes in UTF-8, more than the limit of {MAX_NAME_BYTES}: "
            f"{name[:40]!r}..."
        )
    body = name[1:] if name.startswith("/") else name
    if not body:
        raise InvalidLockNameError(f"lock name {name!r} has no segments")
    if body.endswith("/"):
        raise InvalidLockNameError(f"lock name {name!r} must not end with '/'")
    for segment in body.split("/"):
        if segment == "":
            raise InvalidLockNameError(f"lock name {name!r} has an empty segment ('//')")
        if segment in (".", ".."):
            raise InvalidLockNameError(f"lock name {name!r} has a {segment!r} segment")
        if (segment[-1].isdigit() or segment.startswith("_c_")) and _INTERNAL_SEGMENT.fullmatch(
            segment
        ):
            raise InvalidLockNameError(
                f"lock name {name!r} has a segment {segment!r} shaped like a lock "
                "recipe's own node (it would join its parent lock's queue)"
            )
    return body
