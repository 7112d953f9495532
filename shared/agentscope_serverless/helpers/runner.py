"""Runners for tests: :class:`SimpleRunner` answers, :class:`ErrorRunner` fails.

>>> app = AgentApp(runner=SimpleRunner())  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import AgentRequest

SIMPLE_REPLY = ("Hello! ", "This is a simple runner.")


class SimpleRunner(Runner):
    """Streams a fixed two-piece reply, whatever the request."""

    async def query_handler(  # type: ignore[override]
        self, request: AgentRequest | None = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        for piece in SIMPLE_REPLY:
            yield piece


class ErrorRunner(Runner):
    """Fails every run with ``RuntimeError("error runner")``."""

    async def query_handler(  # type: ignore[override]
        self, request: AgentRequest | None = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        nothing: tuple[str, ...] = ()
        for piece in nothing:  # an async generator, like a streaming agent
            yield piece
        raise RuntimeError("error runner")


__all__ = ["AgentRequest", "ErrorRunner", "Runner", "SimpleRunner"]
