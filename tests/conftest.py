"""Fixtures shared by the whole suite."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def user_id() -> str:
    """A user id no other test uses, so durable backends need no cleaning between tests."""
    return f"user-{uuid.uuid4().hex[:12]}"
