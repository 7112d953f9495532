"""The sandbox operations as tools an agent (and the model behind it) can call.

Each :class:`ToolDefinition` has a name, a description, the JSON schema of its parameters
and the sandbox type it needs; ``SandboxService.connect(tools=...)`` infers the sandbox
types from them. :func:`openai_tools` offers them to a model, and :func:`execute_tool`
runs a model's tool call on the connected sandboxes and returns the text to show it.
As AgentScope's sandbox tools, a definition is also called (``run_ipython_cell(code=...,
sandbox=box)``), bound (``run_ipython_cell.bind(box)``) and read (``.schema``).

>>> run_ipython_cell.to_openai_tool()["function"]["name"]
'run_ipython_cell'
>>> infer_sandbox_types([read_file, "run_shell_command"])
['filesystem', 'base']
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agentscope_serverless.errors import InvalidInputError, SandboxRequestError
from agentscope_serverless.sandbox_protocol import TOOL_SPECS, CallToolResult, ToolSpec
from agentscope_serverless.services._validation import require_shallow_json
from agentscope_serverless.services.sandbox.box import Sandbox


@dataclass(frozen=True)
class ToolDefinition:
    """A tool that runs in a sandbox of ``sandbox_type`` (``sandbox``, once bound).

    >>> def demo(box: Any) -> None:
    ...     run_ipython_cell(code="x = 6", sandbox=box)
    ...     run_ipython_cell.bind(box)(code="print(x * 7)")["content"][0]["text"]  # '42\\n'
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(hash=False)
    sandbox_type: str
    sandbox: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_spec(cls, spec: ToolSpec) -> ToolDefinition:
        """The definition of one of the protocol's tools."""
        return cls(spec.name, spec.description, spec.input_schema(), spec.sandbox_type)

    def to_openai_tool(self) -> dict[str, Any]:
        """The tool as an entry of OpenAI's ``tools`` list."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    @property
    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function tool (AgentScope's ``SandboxTool.schema``)."""
        return self.to_openai_tool()

    def bind(self, sandbox: Any) -> ToolDefinition:
        """A copy of this tool that runs on ``sandbox``; this one stays unbound."""
        return replace(self, sandbox=self._fitting(sandbox))

    def __call__(self, *, sandbox: Any = None, **arguments: Any) -> dict[str, Any]:
        """Run this tool on ``sandbox``, else the bound one, else a temporary sandbox of its
        type (made as ``BaseSandbox()`` is, released after the call); the MCP
        ``CallToolResult`` as a dict."""
        box = self._fitting(sandbox) if sandbox is not None else self.sandbox
        if box is not None:
            return box.call_tool(self.name, arguments)  # type: ignore[no-any-return]
        with self._sandbox_class()() as temporary:
            return temporary.call_tool(self.name, arguments)  # type: ignore[no-any-return]

    def _sandbox_class(self) -> type:
        """AgentScope's sandbox class of this tool's type (``BaseSandbox``, ...)."""
        # Imported here: those classes are built on this package.
        from agentscope_serverless.sandbox.registry import SandboxRegistry

        sandbox_class = SandboxRegistry.get_classes_by_type(self.sandbox_type)
        assert sandbox_class is not None, f"no sandbox class of type {self.sandbox_type!r}"
        return sandbox_class

    def _fitting(self, sandbox: Any) -> Any:
        """``sandbox``, if it is of this tool's type (a filesystem sandbox is a base one)."""
        if not isinstance(sandbox, self._sandbox_class()):
            raise SandboxRequestError(
                f"the tool {self.name!r} runs in a {self.sandbox_type!r} sandbox, "
                f"not in a {str(getattr(sandbox, 'sandbox_type', None))!r} one"
            )
        return sandbox

    async def execute_async(
        self, sandboxes: Sandbox | Sequence[Sandbox], arguments: str | Mapping[str, Any] | None
    ) -> str:
        """Run this tool on the fitting sandbox; the text result (see :func:`result_text`)."""
        box = select_sandbox(self, sandboxes)
        result = await box.call_tool_async(self.name, parse_arguments(arguments))
        return result_text(result)

    def execute(
        self, sandboxes: Sandbox | Sequence[Sandbox], arguments: str | Mapping[str, Any] | None
    ) -> str:
        """Run this tool on the fitting sandbox; the text result (see :func:`result_text`)."""
        box = select_sandbox(self, sandboxes)
        return result_text(box.call_tool(self.name, parse_arguments(arguments)))


BUILTIN_TOOLS: tuple[ToolDefinition, ...] = tuple(ToolDefinition.from_spec(s) for s in TOOL_SPECS)
_BY_NAME = {tool.name: tool for tool in BUILTIN_TOOLS}

run_ipython_cell = _BY_NAME["run_ipython_cell"]
run_shell_command = _BY_NAME["run_shell_command"]
read_file = _BY_NAME["read_file"]
write_file = _BY_NAME["write_file"]
list_directory = _BY_NAME["list_directory"]
create_directory = _BY_NAME["create_directory"]


def get_tool(name: str) -> ToolDefinition:
    """The built-in tool called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidInputError(
            f"unknown sandbox tool {name!r}; known tools: {', '.join(_BY_NAME)}", field="tools"
        ) from None


def as_tool(tool: Any) -> ToolDefinition:
    """A :class:`ToolDefinition` from a definition or a built-in tool's name."""
    if isinstance(tool, ToolDefinition):
        return tool
    if isinstance(tool, str):
        return get_tool(tool)
    raise InvalidInputError(
        f"a tool must be a ToolDefinition or a tool name, got {type(tool).__name__}",
        field="tools",
    )


def sandbox_type_of(tool: Any) -> str:
    """The sandbox type a tool needs: a definition, a name, or any object with a
    ``sandbox_type`` attribute (such as AgentScope's sandbox tools)."""
    declared = getattr(tool, "sandbox_type", None)
    if declared is not None and not isinstance(tool, ToolDefinition | str):
        return str(getattr(declared, "value", declared))
    return as_tool(tool).sandbox_type


def infer_sandbox_types(tools: Iterable[Any]) -> list[str]:
    """The sandbox types ``tools`` need, each once, in the order of the tools."""
    types: list[str] = []
    for tool in tools:
        sandbox_type = sandbox_type_of(tool)
        if sandbox_type not in types:
            types.append(sandbox_type)
    return types


def openai_tools(tools: Iterable[Any] = BUILTIN_TOOLS) -> list[dict[str, Any]]:
    """OpenAI ``tools`` entries for ``tools`` (definitions or names; all built-ins by default)."""
    return [as_tool(tool).to_openai_tool() for tool in tools]


def select_sandbox(tool: ToolDefinition, sandboxes: Sandbox | Sequence[Sandbox]) -> Sandbox:
    """The sandbox to run ``tool`` on: the first of its type, else the only one given."""
    boxes = [sandboxes] if isinstance(sandboxes, Sandbox) else list(sandboxes)
    for box in boxes:
        if box.sandbox_type == tool.sandbox_type:
            return box
    if len(boxes) == 1:
        return boxes[0]
    raise SandboxRequestError(
        f"no connected sandbox of type {tool.sandbox_type!r} for the tool {tool.name!r}"
    )


def parse_arguments(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Tool-call arguments given as a JSON object string (as models send them) or a mapping."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        require_shallow_json(arguments, field="arguments")
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            raise InvalidInputError(
                f"tool arguments are not valid JSON: {exc}", field="arguments"
            ) from None
    else:
        parsed = dict(arguments)
    if not isinstance(parsed, dict):
        raise InvalidInputError("tool arguments must be a JSON object", field="arguments")
    return parsed


def result_text(result: CallToolResult | Mapping[str, Any]) -> str:
    """A tool result as one text: stdout, then labelled stderr and exit status when present.

    >>> result_text({"content": [{"type": "text", "text": "hi\\n", "description": "stdout"}]})
    'hi\\n'
    """
    if not isinstance(result, CallToolResult):
        result = CallToolResult.model_validate(result)
    pieces: list[str] = []
    for part in result.content:
        if part.description in (None, "stdout"):
            pieces.append(part.text)
        elif part.description == "returncode":
            if part.text != "0":
                pieces.append(f"[exit status {part.text}]\n")
        else:
            pieces.append(f"[{part.description}]\n{part.text}")
    return "".join(piece if piece.endswith("\n") else piece + "\n" for piece in pieces if piece)


__all__ = [
    "BUILTIN_TOOLS",
    "ToolDefinition",
    "as_tool",
    "create_directory",
    "get_tool",
    "infer_sandbox_types",
    "list_directory",
    "openai_tools",
    "parse_arguments",
    "read_file",
    "result_text",
    "run_ipython_cell",
    "run_shell_command",
    "sandbox_type_of",
    "select_sandbox",
    "write_file",
]
