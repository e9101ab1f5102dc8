"""JSON values carried by the coordination recipes (member capabilities, leader values).

They are stored as UTF-8 JSON in the record store, so what a process writes
is what every other process reads, whatever its backend client. A value is
checked (and encoded) before any I/O: a value JSON cannot carry (a set, a
NaN, a non-str key) is a :class:`ValueError` at the call that passed it.
"""

from __future__ import annotations

import json
from typing import TypeAlias

__all__ = ["MAX_VALUE_BYTES", "JSONValue", "dump_json", "load_json"]

#: what ``json.loads`` returns
JSONValue: TypeAlias = "bool | int | float | str | list[JSONValue] | dict[str, JSONValue] | None"

#: the largest encoded record value the recipes write (every server takes it)
MAX_VALUE_BYTES = 64 * 1024


def dump_json(what: str, value: object) -> bytes:
    """``value`` as compact UTF-8 JSON, or a ValueError naming ``what`` it was."""
    try:
        _check_keys(value)
        # ASCII with escapes: every client decodes it, even a lone surrogate
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{what} must be JSON (str keys, no NaN): {exc}") from None
    data = text.encode("ascii")
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes as JSON, more than {MAX_VALUE_BYTES}")
    return data


def _check_keys(value: object) -> None:
    """Refuse a non-str object key, which ``json.dumps`` would silently turn into a str."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"object key {key!r} is not a str")
            _check_keys(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_keys(item)


def load_json(data: bytes) -> JSONValue:
    """The JSON value in ``data``; ValueError for bytes that are not JSON (a foreign record)."""
    value: JSONValue = json.loads(data)  # UnicodeDecodeError is a ValueError too
    return value
