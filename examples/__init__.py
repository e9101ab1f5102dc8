"""Runnable aiolocks examples: ``python examples/<name>.py [--url URL]``.

This file only makes the folder importable for ``tests/examples``; every
example is a standalone script.
"""
