"""PostgreSQL backend (``postgresql://``), in progress: nothing here is public yet.

What exists so far is the layer the driver will stand on:
:mod:`aiolocks.postgres._sql` (advisory-lock keys, the fencing and lease
tables, the queries, the session checks) and :mod:`aiolocks.postgres._url`
(URL options). Importing this package loads no database client.
"""

from __future__ import annotations

__all__: list[str] = []
