"""Test helpers and fixture modules shared across test folders; fixture modules are
registered in tests/conftest.py with `pytest_plugins`."""
