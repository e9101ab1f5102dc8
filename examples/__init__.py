"""Runnable aiolocks examples: ``python examples/<name>.py [--url URL]``, or
``python -m examples.<name>`` for those that import a sibling (the payment apps
``fastapi_app`` and ``aiohttp_app`` share ``shop`` and ``shop_demo``; ``taskiq_jobs``
runs under ``taskiq worker`` and ``taskiq scheduler``).

The folder is a package so that the examples can import each other and
``tests/examples`` can import them.
"""
