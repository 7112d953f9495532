"""``Toolkit``, ``ToolResponse`` and a tool function, as AgentScope names them."""

from __future__ import annotations

from typing import Any


class ToolResponse:
    def __init__(self, content: list[Any], metadata: dict[str, Any] | None = None) -> None:
        self.content = content
        self.metadata = metadata


class Toolkit:
    def __init__(self) -> None:
        self.tools: dict[str, Any] = {}

    def register_tool_function(self, tool_func: Any, **kwargs: Any) -> None:
        self.tools[getattr(tool_func, "__name__", str(tool_func))] = tool_func


async def execute_python_code(code: str, **kwargs: Any) -> ToolResponse:
    raise RuntimeError("the scripted agent runs no code")
