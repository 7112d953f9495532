"""Sandbox tools for an agent run: the built-in sandbox tools, on the user's session sandboxes.

:func:`session_sandbox_tools` wraps each :class:`ToolDefinition` in an :class:`AgentTool`
bound to one ``(session_id, user_id)``. The sandboxes are connected (reused when the session
has them, created otherwise) on the first tool call of the run, not before, so a run whose
model calls no tool costs the sandbox server nothing::

    tools = session_sandbox_tools(sandbox_service, session.id, session.user_id)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from agentscope_serverless.agents.tools import AgentTool
from agentscope_serverless.sandbox_protocol import BASE
from agentscope_serverless.services.sandbox.box import Sandbox
from agentscope_serverless.services.sandbox.service import SandboxService
from agentscope_serverless.services.sandbox.tools import BUILTIN_TOOLS, ToolDefinition, as_tool


def session_sandbox_tools(
    service: SandboxService,
    session_id: str,
    user_id: str,
    tools: Iterable[ToolDefinition | str] = BUILTIN_TOOLS,
    *,
    sandbox_types: Sequence[str] = (BASE,),
) -> list[AgentTool]:
    """Agent tools running ``tools`` on the session's sandboxes of ``sandbox_types``.

    One ``base`` sandbox by default: on our sandbox server it offers every built-in tool,
    so the model's Python, shell and files share one workspace. (A server whose base
    sandbox lacks the file tools needs ``sandbox_types=["base", "filesystem"]``.)
    """
    definitions = [as_tool(tool) for tool in tools]
    connected: list[Sandbox] = []
    lock = asyncio.Lock()

    async def sandboxes() -> list[Sandbox]:
        async with lock:
            if not connected:
                connected.extend(
                    await service.connect_async(session_id, user_id, env_types=sandbox_types)
                )
        return connected

    def agent_tool(definition: ToolDefinition) -> AgentTool:
        async def call(arguments: dict[str, Any]) -> str:
            return await definition.execute_async(await sandboxes(), arguments)

        return AgentTool(
            name=definition.name,
            description=definition.description,
            parameters=definition.parameters,
            call=call,
        )

    return [agent_tool(definition) for definition in definitions]


__all__ = ["session_sandbox_tools"]
