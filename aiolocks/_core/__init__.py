"""Backend-neutral semantics of aiolocks, written once for every driver.

Nothing here imports ``aiozk`` or ``redis``: drivers import ``_core``, never the
other way round.
"""
