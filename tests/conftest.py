"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import uuid

import pytest

# Servers run in threads of the test process and log a JSON line per request; keep them out
# of the test output (set POWERTOOLS_LOG_LEVEL=INFO to see them). The logging itself is
# tested on a server process of its own (tests/cli).
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")


@pytest.fixture
def user_id() -> str:
    """A user id no other test uses, so durable backends need no cleaning between tests."""
    return f"user-{uuid.uuid4().hex[:12]}"
