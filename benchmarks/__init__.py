"""Side-by-side benchmarks of aiolocks and the peer libraries (``python -m benchmarks``).

Not part of the installed package and not run by the test suite (a smoke
run is: ``tests/benchmarks/test_smoke.py``). See :mod:`benchmarks.run` for
the method and ``docs/benchmarks.md`` for the latest figures.
"""
