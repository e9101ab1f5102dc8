"""Per-lock options that every backend accepts, so code moves between backends.

``fair=``, ``lease_time=`` and ``watchdog=`` mean something on Redis. On
backends where they have no effect (``memory://`` and ``zk://`` are always
FIFO, and their holds never lapse on a lease) they are still checked and
accepted, so a service written against Redis runs unchanged on the embedded
backend in its tests: ``lease_time`` is in :data:`~.timeouts.LEASE_TIME_RANGE`
everywhere. Unknown options are a :class:`ValueError` naming them.
"""

from __future__ import annotations

from collections.abc import Mapping

from .driver import Family
from .timeouts import LEASE_TIME_RANGE, check_seconds

__all__ = ["check_portable_options"]


def _check(key: str, value: object) -> object:
    if key in ("fair", "watchdog"):
        if not isinstance(value, bool):
            raise ValueError(f"option {key}={value!r} must be True or False")
        return value
    if key == "lease_time":  # one range on every backend, so code moves between them
        return check_seconds(value, "option lease_time", LEASE_TIME_RANGE)
    raise KeyError(key)


def check_portable_options(
    family: Family, options: Mapping[str, object], where: str
) -> Mapping[str, object]:
    """Validate ``fair``/``lease_time``/``watchdog``; refuse anything else by name."""
    checked: dict[str, object] = {}
    for key, value in options.items():
        try:
            checked[key] = _check(key, value)
        except KeyError:
            raise ValueError(
                f"unknown option {key!r} for a {family.value} on {where} "
                "(accepted: fair, lease_time, watchdog)"
            ) from None
    return checked
