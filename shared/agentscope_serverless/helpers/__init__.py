"""Helpers: an HTTP client of an agent API, and runners for tests."""
