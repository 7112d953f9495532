"""A sandbox tool as an AgentScope tool function.

>>> toolkit = Toolkit()
>>> tool = sandbox_tool_adapter(sandbox, "run_ipython_cell")
>>> toolkit.register_tool_function(tool, json_schema=tool.json_schema)

Calling the function runs the tool in the sandbox and answers an AgentScope
``ToolResponse`` with the result's text blocks.
"""

from __future__ import annotations

from typing import Any

from agentscope.tool import ToolResponse  # type: ignore[import-not-found]

from agentscope_serverless.services.sandbox.box import Sandbox
from agentscope_serverless.services.sandbox.tools import BUILTIN_TOOLS


class SandboxToolFunction:
    """``await tool(**arguments)``: the tool ``name`` run in ``sandbox``."""

    def __init__(
        self,
        sandbox: Sandbox,
        name: str,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        known = {tool.name: tool for tool in BUILTIN_TOOLS}.get(name)
        self.sandbox = sandbox
        self.name = self.__name__ = name
        self.description = description or (known.description if known else name)
        self.parameters = parameters or (
            known.parameters if known else {"type": "object", "properties": {}}
        )
        self.__doc__ = self.description

    @property
    def json_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function schema (what AgentScope's Toolkit takes)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    async def __call__(self, **arguments: Any) -> Any:
        result = await self.sandbox.call_tool_async(self.name, arguments)
        blocks = [
            {"type": "text", "text": str(part.get("text", ""))}
            for part in result.get("content", [])
            if isinstance(part, dict) and part.get("type") == "text"
        ]
        return ToolResponse(content=blocks, metadata={"isError": bool(result.get("isError"))})


def sandbox_tool_adapter(
    sandbox: Sandbox,
    name: str,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> SandboxToolFunction:
    """The sandbox tool ``name`` (built-in, or described by ``description``/``parameters``)."""
    return SandboxToolFunction(sandbox, name, description, parameters)


__all__ = ["SandboxToolFunction", "sandbox_tool_adapter"]
