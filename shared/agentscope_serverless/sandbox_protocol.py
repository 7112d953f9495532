"""The sandbox manager wire protocol: the only code the sandbox client and server share.

Every operation is ``POST {base_url}/{operation}`` with a JSON object of arguments and
``Authorization: Bearer <token>``; success is ``{"data": <result>}``, failure a non-2xx
status with ``{"detail": "..."}``. ``GET /health`` needs no token. These are the messages of
AgentScope's sandbox manager server, so our client works against a real one too.

>>> CallToolRequest(identity="sbx-1", tool_name="run_ipython_cell", arguments={"code": "1+1"})
CallToolRequest(identity='sbx-1', tool_name='run_ipython_cell', arguments={'code': '1+1'})
>>> CallToolResult.from_text(stdout="2\\n").model_dump()["content"][0]["description"]
'stdout'
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentscope_serverless.errors import (
    SandboxAuthenticationError,
    SandboxCapacityError,
    SandboxError,
    SandboxNotFoundError,
    SandboxRequestError,
    SandboxUnavailableError,
)

OPERATIONS = (
    "create_from_pool",
    "release",
    "get_info",
    "check_health",
    "call_tool",
    "list_tools",
    "get_session_mapping",
)
"""Every ``POST`` operation of the protocol (nothing else is exposed: no ``/cleanup``)."""

BASE = "base"
FILESYSTEM = "filesystem"
GENERIC_TOOLS = "generic"
FILESYSTEM_TOOLS = "filesystem"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateFromPoolRequest(_Request):
    """``create_from_pool``: a new sandbox of ``sandbox_type``; replies with its id.

    ``meta["session_ctx_id"]`` adds the sandbox to that session's mapping.
    """

    sandbox_type: str = Field(BASE, min_length=1, max_length=64)
    meta: dict[str, Any] | None = None


class IdentityRequest(_Request):
    """``release``, ``get_info`` and ``check_health``: one sandbox by id."""

    identity: str = Field(min_length=1, max_length=256)


class CallToolRequest(_Request):
    """``call_tool``: run ``tool_name`` in the sandbox; replies with a :class:`CallToolResult`."""

    identity: str = Field(min_length=1, max_length=256)
    tool_name: str = Field(min_length=1, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ListToolsRequest(_Request):
    """``list_tools``: the tools of a sandbox, all of them or one ``tool_type``."""

    identity: str = Field(min_length=1, max_length=256)
    tool_type: str | None = None


class SessionMappingRequest(_Request):
    """``get_session_mapping``: the ids of the sandboxes created for a session context."""

    session_ctx_id: str = Field(min_length=1, max_length=1100)


class TextPart(BaseModel):
    """One text part of a tool result; ``description`` says which stream it is."""

    type: Literal["text"] = "text"
    text: str
    description: str | None = None


class CallToolResult(BaseModel):
    """A tool result in MCP's ``CallToolResult`` shape, as AgentScope's sandboxes return it.

    Parts are described ``stdout``, ``stderr`` (only when there is some) and, for shell
    commands, ``returncode``. ``isError`` is true when the tool failed (a Python exception,
    a non-zero exit status, a limit that stopped the call).
    """

    meta: dict[str, Any] | None = None
    content: list[TextPart] = Field(default_factory=list)
    structuredContent: dict[str, Any] | None = None
    isError: bool = False

    @classmethod
    def from_text(
        cls,
        *,
        stdout: str = "",
        stderr: str = "",
        returncode: int | None = None,
        is_error: bool = False,
    ) -> CallToolResult:
        """A result with a ``stdout`` part, a ``stderr`` part when there is stderr, and a
        ``returncode`` part when one is given."""
        content = [TextPart(text=stdout, description="stdout")]
        if stderr:
            content.append(TextPart(text=stderr, description="stderr"))
        if returncode is not None:
            content.append(TextPart(text=str(returncode), description="returncode"))
        return cls(content=content, isError=is_error)

    def part(self, description: str) -> str | None:
        """The text of the part with that description, or None."""
        for item in self.content:
            if item.description == description:
                return item.text
        return None


class SandboxInfo(BaseModel):
    """What ``get_info`` tells about a sandbox on our server (never host paths or tokens)."""

    sandbox_id: str
    sandbox_type: str
    status: str
    created_at: float
    last_used_at: float
    meta: dict[str, Any] = Field(default_factory=dict)
    version: str


class RunIpythonCellArguments(_Request):
    """Arguments of ``run_ipython_cell``."""

    code: str = Field(description="Python code to run. Variables persist between calls.")


class RunShellCommandArguments(_Request):
    """Arguments of ``run_shell_command``."""

    command: str = Field(description="A /bin/sh command line, run in the workspace.")


class ReadFileArguments(_Request):
    """Arguments of ``read_file``."""

    path: str = Field(description="File path relative to the workspace.")


class WriteFileArguments(_Request):
    """Arguments of ``write_file``."""

    path: str = Field(description="File path relative to the workspace.")
    content: str = Field(description="The whole new content of the file (UTF-8 text).")


class ListDirectoryArguments(_Request):
    """Arguments of ``list_directory``."""

    path: str = Field(".", description="Directory path relative to the workspace.")


class CreateDirectoryArguments(_Request):
    """Arguments of ``create_directory``."""

    path: str = Field(description="Directory path relative to the workspace (parents too).")


class ToolSpec(BaseModel):
    """A sandbox tool: its name, what it does, its arguments, and the sandbox type it needs."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    sandbox_type: str
    tool_type: str
    arguments: type[_Request]

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (an object schema, as MCP and OpenAI expect)."""
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        schema.pop("description", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def mcp_tool(self) -> dict[str, Any]:
        """The tool as an MCP ``Tool``: ``{"name", "description", "inputSchema"}``."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema(),
        }


TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="run_ipython_cell",
        description=(
            "Run Python code in a persistent interpreter inside the sandbox and return what it "
            "printed. Variables, imports and functions persist between calls; the value of a "
            "final expression is printed. The working directory is the sandbox workspace."
        ),
        sandbox_type=BASE,
        tool_type=GENERIC_TOOLS,
        arguments=RunIpythonCellArguments,
    ),
    ToolSpec(
        name="run_shell_command",
        description=(
            "Run a shell command (/bin/sh) in the sandbox workspace and return its stdout, "
            "stderr and exit status. There is no network; processes end with the command."
        ),
        sandbox_type=BASE,
        tool_type=GENERIC_TOOLS,
        arguments=RunShellCommandArguments,
    ),
    ToolSpec(
        name="read_file",
        description="Read a UTF-8 text file of the sandbox workspace.",
        sandbox_type=FILESYSTEM,
        tool_type=FILESYSTEM_TOOLS,
        arguments=ReadFileArguments,
    ),
    ToolSpec(
        name="write_file",
        description=(
            "Create or overwrite a text file in the sandbox workspace (parent directories are "
            "created)."
        ),
        sandbox_type=FILESYSTEM,
        tool_type=FILESYSTEM_TOOLS,
        arguments=WriteFileArguments,
    ),
    ToolSpec(
        name="list_directory",
        description=(
            "List a directory of the sandbox workspace, one entry per line, prefixed with "
            "[DIR] or [FILE]."
        ),
        sandbox_type=FILESYSTEM,
        tool_type=FILESYSTEM_TOOLS,
        arguments=ListDirectoryArguments,
    ),
    ToolSpec(
        name="create_directory",
        description="Create a directory (and its parents) in the sandbox workspace.",
        sandbox_type=FILESYSTEM,
        tool_type=FILESYSTEM_TOOLS,
        arguments=CreateDirectoryArguments,
    ),
)
"""The tools of our sandboxes, in the order they are listed."""

TOOLS_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in TOOL_SPECS}

ERROR_STATUS: tuple[tuple[type[SandboxError], int], ...] = (
    (SandboxRequestError, 400),
    (SandboxAuthenticationError, 401),
    (SandboxNotFoundError, 404),
    (SandboxCapacityError, 429),
    (SandboxUnavailableError, 503),
)
"""Which HTTP status each sandbox error travels as (anything else is a 500)."""


def status_for_error(error: SandboxError) -> int:
    """The HTTP status a server replies with for ``error``."""
    for error_class, status in ERROR_STATUS:
        if isinstance(error, error_class):
            return status
    return 500


def error_for_status(status: int) -> type[SandboxError]:
    """The error class a client raises for a non-2xx ``status``."""
    if status in (401, 403):
        return SandboxAuthenticationError
    if status == 404:
        return SandboxNotFoundError
    if status == 429:
        return SandboxCapacityError
    if status >= 500 or status == 408:
        return SandboxUnavailableError
    return SandboxRequestError


__all__ = [
    "BASE",
    "ERROR_STATUS",
    "FILESYSTEM",
    "FILESYSTEM_TOOLS",
    "GENERIC_TOOLS",
    "OPERATIONS",
    "TOOLS_BY_NAME",
    "TOOL_SPECS",
    "CallToolRequest",
    "CallToolResult",
    "CreateDirectoryArguments",
    "CreateFromPoolRequest",
    "IdentityRequest",
    "ListDirectoryArguments",
    "ListToolsRequest",
    "ReadFileArguments",
    "RunIpythonCellArguments",
    "RunShellCommandArguments",
    "SandboxInfo",
    "SessionMappingRequest",
    "TextPart",
    "ToolSpec",
    "WriteFileArguments",
    "error_for_status",
    "status_for_error",
]
