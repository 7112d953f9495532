"""Tools an agent can call: a name, a description, JSON-schema parameters, an async callable.

This is the whole protocol between an agent and its tools, so tools from anywhere (plain
Python functions, sandbox tools, remote APIs) plug in by being wrapped in one
:class:`AgentTool`. The callable takes the arguments as a dict and returns text for the
model::

    async def add(arguments: dict[str, Any]) -> str:
        return str(arguments["a"] + arguments["b"])

    adder = AgentTool(
        name="add",
        description="Add two numbers.",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        call=add,
    )
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.log import logger
from agentscope_serverless.services._validation import MAX_JSON_DEPTH, nests_deeper_than

ToolCallable = Callable[[dict[str, Any]], Awaitable[str]]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class AgentTool:
    """A tool: ``call(arguments)`` runs it with the model's arguments and returns text.

    ``parameters`` is a JSON Schema object describing the arguments; ``name`` follows the
    OpenAI rule (1 to 64 letters, digits, ``_`` or ``-``).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    call: ToolCallable

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} must be 1-64 letters, digits, _ or -")
        if self.parameters.get("type") != "object":
            raise ValueError(f"the parameters of tool {self.name!r} must be a JSON Schema object")

    def to_openai(self) -> dict[str, Any]:
        """The tool as an item of the OpenAI ``tools`` list."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    async def invoke(self, arguments: str | None) -> str:
        """Run the tool with the JSON ``arguments`` a model sent.

        Bad arguments and failures come back as text for the model to read, never as an
        exception; an unexpected exception is reported by type only (its message could
        carry secrets).
        """
        if nests_deeper_than(arguments or ""):
            return f"error: the arguments nest deeper than {MAX_JSON_DEPTH} levels"
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            return "error: the arguments are not valid JSON"
        if not isinstance(parsed, dict):
            return "error: the arguments must be a JSON object"
        try:
            # Typed as text, but nothing stops a Python tool from returning anything.
            result: object = await self.call(parsed)
        except AgentScopeServerlessError as exc:
            return f"error: {exc.message}"
        except Exception as exc:
            logger.exception("a tool failed", extra={"tool": self.name})
            return f"error: the tool failed ({type(exc).__name__})"
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            logger.error("a tool returned a value that is not text", extra={"tool": self.name})
            return f"error: the tool returned {type(result).__name__}, not text"


__all__ = ["AgentTool", "ToolCallable"]
