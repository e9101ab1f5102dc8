"""Validation of lock names.

A lock name is a ``/``-separated path such as ``locks/pay/order-1001``. A
leading ``/`` is allowed and means the same name. Each backend maps the
canonical form (no leading ``/``) into its own space.
"""

from __future__ import annotations

from .errors import InvalidLockNameError

__all__ = ["MAX_NAME_BYTES", "has_control_character", "is_control", "validate_name"]

MAX_NAME_BYTES = 1024


def is_control(ch: str) -> bool:
    """``ch`` is a C0 or C1 control character (or DEL): never allowed in names or ids."""
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F


def has_control_character(text: str) -> bool:
    """``text`` contains a character :func:`is_control` refuses."""
    return any(is_control(ch) for ch in text)


def validate_name(name: object) -> str:
    """Return the canonical form of ``name`` or raise :class:`InvalidLockNameError`.

    >>> validate_name("/locks/pay/order-1")
    'locks/pay/order-1'
    """
    if not isinstance(name, str):
        raise InvalidLockNameError(f"lock name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise InvalidLockNameError("lock name must not be empty")
    for i, ch in enumerate(name):
        if is_control(ch):
            raise InvalidLockNameError(
                f"lock name {name!r} contains control character U+{ord(ch):04X} at index {i}"
            )
    size = len(name.encode("utf-8", errors="surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise InvalidLockNameError(
            f"lock name is {size} bytes in UTF-8, more than the limit of {MAX_NAME_BYTES}: "
            f"{name[:40]!r}..."
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidLockNameError(
            f"lock name {name!r} is not valid Unicode (lone surrogate at index {exc.start})"
        ) from None
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
    return body
