"""Fixtures of the sandbox tests; the sandbox server itself is shared (tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from agentscope_serverless.services.sandbox import SandboxService
from tests.support.sandbox_server import (
    LIMITS,
    TOKEN,
    RunningServer,
    free_port,
    require_sandbox_tools,
    start_server,
    stop_server,
)

__all__ = [
    "LIMITS",
    "TOKEN",
    "RunningServer",
    "free_port",
    "require_sandbox_tools",
    "start_server",
    "stop_server",
]


@pytest.fixture
async def sandbox_service(sandbox_server: RunningServer) -> AsyncIterator[SandboxService]:
    async with SandboxService(sandbox_server.url, sandbox_server.token) as service:
        yield service


@pytest.fixture
def session_id() -> str:
    return f"session-{uuid.uuid4().hex[:12]}"
