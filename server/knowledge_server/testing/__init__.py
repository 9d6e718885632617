"""Test doubles for the service's outside dependencies, for tests, benchmarks and demos.

Nothing in the runtime package imports this package (a test checks it): a double is
started by whoever needs it, e.g. ``python -m knowledge_server.testing.fake_llm``.
"""
