"""AgentScope Runtime's runners for tests: :class:`SimpleRunner` answers, :class:`ErrorRunner`
fails, with AgentScope's words (tests written for it check them).

>>> app = AgentApp(runner=SimpleRunner())  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import AgentRequest

SIMPLE_REPLY = ("Hi", "! My name is Friday", ".")


class SimpleRunner(Runner):
    """Streams ``Hi! My name is Friday.`` in three pieces, whatever the request."""

    async def query_handler(  # type: ignore[override]
        self, request: AgentRequest | None = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        for piece in SIMPLE_REPLY:
            yield piece


class ErrorRunner(Runner):
    """Streams ``Hi``, then fails with ``RuntimeError("Error")``."""

    async def query_handler(  # type: ignore[override]
        self, request: AgentRequest | None = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        yield "Hi"
        raise RuntimeError("Error")


__all__ = ["AgentRequest", "ErrorRunner", "Runner", "SimpleRunner"]
