"""A sandbox tool as an AgentScope tool function.

>>> toolkit = Toolkit()
>>> toolkit.register_tool_function(sandbox_tool_adapter(sandbox.run_ipython_cell))
>>> tool = sandbox_tool_adapter(sandbox, "run_ipython_cell")
>>> toolkit.register_tool_function(tool, json_schema=tool.json_schema)

Calling the function runs the tool in the sandbox and answers an AgentScope
``ToolResponse`` with the result's text blocks. A sandbox's tool method (AgentScope
Runtime's form) keeps its name, signature and docstring, from which the toolkit makes the
tool's schema.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from agentscope_serverless.adapters.agentscope import agentscope_missing

try:
    from agentscope.tool import ToolResponse  # type: ignore[import-not-found]
except ModuleNotFoundError as exc:
    raise agentscope_missing(__name__, exc) from None

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
        return _tool_response(await self.sandbox.call_tool_async(self.name, arguments))


def _tool_response(result: Any) -> Any:
    """A tool's ``CallToolResult`` as an AgentScope ``ToolResponse`` of its text blocks."""
    if isinstance(result, ToolResponse):
        return result
    blocks = [
        {"type": "text", "text": str(part.get("text", ""))}
        for part in result.get("content", [])
        if isinstance(part, dict) and part.get("type") == "text"
    ]
    return ToolResponse(content=blocks, metadata={"isError": bool(result.get("isError"))})


def _tool_method(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a sandbox's tool method) answering a ``ToolResponse``, its name, signature
    and docstring kept."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def awaited(*args: Any, **kwargs: Any) -> Any:
            return _tool_response(await func(*args, **kwargs))

        return awaited

    @functools.wraps(func)
    def called(*args: Any, **kwargs: Any) -> Any:
        return _tool_response(func(*args, **kwargs))

    return called


def sandbox_tool_adapter(
    sandbox: Sandbox | Callable[..., Any],
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Any:
    """A sandbox's tool method (``sandbox.run_ipython_cell``) as an AgentScope tool function,
    as AgentScope Runtime's adapter; or, given a sandbox, its tool ``name`` (built-in, or
    described by ``description``/``parameters``)."""
    if not isinstance(sandbox, Sandbox):
        if name is not None or not callable(sandbox):
            raise TypeError("give a sandbox's tool method, or a sandbox and a tool name")
        return _tool_method(sandbox)
    if name is None:
        raise TypeError("give the name of the sandbox's tool to adapt")
    return SandboxToolFunction(sandbox, name, description, parameters)


__all__ = ["SandboxToolFunction", "sandbox_tool_adapter"]
