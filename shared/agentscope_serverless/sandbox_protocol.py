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

from typing import Annotated, Any, Literal

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
    "create",
    "release",
    "start",
    "stop",
    "get_status",
    "get_info",
    "check_health",
    "call_tool",
    "list_tools",
    "add_mcp_servers",
    "get_session_mapping",
    "list_session_keys",
)
"""Every ``POST`` operation of the protocol; each also has an ``{operation}_async`` twin that
takes the same body. Nothing else is exposed: ``/cleanup`` is refused."""

POSITIONAL_PARAMETERS: dict[str, tuple[str, ...]] = {
    "create_from_pool": ("sandbox_type", "meta"),
    "create": ("sandbox_type", "mount_dir", "storage_path", "environment", "meta"),
    "release": ("identity",),
    "start": ("identity",),
    "stop": ("identity",),
    "get_status": ("identity",),
    "get_info": ("identity",),
    "get_session_mapping": ("session_ctx_id",),
    "list_session_keys": (),
}
"""The ``_async`` operations AgentScope's client declares as ``(*args, **kwargs)``: it sends
their positional arguments as ``{"args": <first>, "kwargs": <second>}``, which these names
give a meaning to (see :func:`async_body`)."""

BASE = "base"
FILESYSTEM = "filesystem"
GENERIC_TOOLS = "generic"
FILESYSTEM_TOOLS = "filesystem"
ALLOWED_DIRECTORY = "/workspace"
MAX_TOOL_NAME_LENGTH = 128
MIN_BEARER_TOKEN_LENGTH = 16
"""The fewest characters of a bearer token our sandbox server takes, and a client's settings
(``SANDBOX_BEARER_TOKEN``) too: a shorter token is guessed in few tries."""

SANDBOX_TYPE_ALIASES = {"base_async": BASE, "filesystem_async": FILESYSTEM}
"""AgentScope's async sandbox classes ask for these types; they are the same sandboxes."""


def async_body(operation: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body of ``{operation}_async`` in the shape of ``{operation}``.

    AgentScope's async client sends the positional arguments of the operations in
    :data:`POSITIONAL_PARAMETERS` under ``args`` and ``kwargs`` (the names of its wrapper's
    parameters): ``get_info_async("sbx-1")`` posts ``{"args": "sbx-1"}``.

    >>> async_body("get_info", {"args": "sbx-1"})
    {'identity': 'sbx-1'}
    >>> async_body("create_from_pool", {"args": "base", "kwargs": {"session_ctx_id": "s"}})
    {'sandbox_type': 'base', 'meta': {'session_ctx_id': 's'}}
    >>> async_body("call_tool", {"identity": "sbx-1", "tool_name": "read_file"})
    {'identity': 'sbx-1', 'tool_name': 'read_file'}
    """
    names = POSITIONAL_PARAMETERS.get(operation)
    if names is None or not ({"args", "kwargs"} & body.keys()):
        return body
    converted = {key: value for key, value in body.items() if key not in ("args", "kwargs")}
    for position, key in enumerate(("args", "kwargs")):
        if key not in body:
            continue
        if position >= len(names):
            raise ValueError(f"{operation} takes {len(names)} positional argument(s)")
        if names[position] in converted:
            raise ValueError(f"{names[position]} is given twice")
        converted[names[position]] = body[key]
    return converted


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateFromPoolRequest(_Request):
    """``create_from_pool``: a new sandbox of ``sandbox_type``; replies with its id.

    ``meta["session_ctx_id"]`` adds the sandbox to that session's mapping.
    """

    sandbox_type: str = Field(BASE, min_length=1, max_length=64)
    meta: dict[str, Any] | None = None


class CreateRequest(_Request):
    """``create``: a new sandbox, as ``create_from_pool`` plus an ``environment``.

    ``mount_dir`` and ``storage_path`` (host paths and object storage in AgentScope) are
    accepted only empty: this server never mounts a host path into a sandbox.
    """

    sandbox_type: str = Field(BASE, min_length=1, max_length=64)
    mount_dir: str | None = None
    storage_path: str | None = None
    environment: dict[str, str] | None = None
    meta: dict[str, Any] | None = None


class IdentityRequest(_Request):
    """``release``, ``start``, ``stop``, ``get_status``, ``get_info`` and ``check_health``:
    one sandbox by id."""

    identity: str = Field(min_length=1, max_length=256)


class CallToolRequest(_Request):
    """``call_tool``: run ``tool_name`` in the sandbox; replies with a :class:`CallToolResult`."""

    identity: str = Field(min_length=1, max_length=256)
    tool_name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_LENGTH)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ListToolsRequest(_Request):
    """``list_tools``: the tools of a sandbox, all of them or one ``tool_type``."""

    identity: str = Field(min_length=1, max_length=256)
    tool_type: str | None = None


class AddMcpServersRequest(_Request):
    """``add_mcp_servers``: ``server_configs`` is ``{"mcpServers": {name: config}}``."""

    identity: str = Field(min_length=1, max_length=256)
    server_configs: dict[str, Any]
    overwrite: bool = False


class EmptyRequest(_Request):
    """``list_session_keys``: no arguments."""


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
    """What ``get_info`` tells about a sandbox: AgentScope's ``ContainerModel`` fields, plus
    ours (``sandbox_id``, ``sandbox_type``, ``status``, times).

    The container fields hold the sandbox id (``session_id``, ``container_id``,
    ``container_name``); there is no ``url`` to reach it directly (``""``), no ``ports``,
    and ``mount_dir``, ``storage_path`` and ``runtime_token`` are always null: no host path
    and no token ever leaves the server. ``version`` names the sandbox type the way
    AgentScope's image names do (its client guesses the type from it).
    """

    session_id: str
    container_id: str
    container_name: str
    url: str = ""
    ports: list[int | str] = Field(default_factory=list)
    mount_dir: None = None
    storage_path: None = None
    runtime_token: None = None
    version: str
    meta: dict[str, Any] = Field(default_factory=dict)
    timeout: int | None = None
    sandbox_id: str
    sandbox_type: str
    status: str
    created_at: float
    last_used_at: float


class RunIpythonCellArguments(_Request):
    """Arguments of ``run_ipython_cell``."""

    code: str = Field(description="Python code to run. Variables persist between calls.")


class RunShellCommandArguments(_Request):
    """Arguments of ``run_shell_command``."""

    command: str = Field(description="A /bin/sh command line, run in the workspace.")


PATH_DESCRIPTION = (
    f"A path in the workspace: relative to it, or absolute under {ALLOWED_DIRECTORY}."
)
MAX_PATHS = 100
MAX_PATH_LENGTH = 4096
MAX_PATTERN_LENGTH = 1024
WorkspacePath = Annotated[str, Field(max_length=MAX_PATH_LENGTH)]
Pattern = Annotated[str, Field(min_length=1, max_length=MAX_PATTERN_LENGTH)]
MAX_EDITS = 100
MAX_PATTERNS = 32


class ReadFileArguments(_Request):
    """Arguments of ``read_file``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION)


class ReadMultipleFilesArguments(_Request):
    """Arguments of ``read_multiple_files``."""

    paths: list[WorkspacePath] = Field(
        min_length=1, max_length=MAX_PATHS, description="The files to read, each a path."
    )


class WriteFileArguments(_Request):
    """Arguments of ``write_file``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION)
    content: str = Field(description="The whole new content of the file (UTF-8 text).")


class EditOperation(_Request):
    """One edit of edit_file: replace oldText by newText."""

    oldText: str = Field(min_length=1, description="Text to search for (exact match first).")
    newText: str = Field(description="Text to replace it with.")


class EditFileArguments(_Request):
    """Arguments of ``edit_file``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION)
    edits: list[EditOperation] = Field(
        min_length=1, max_length=MAX_EDITS, description="The edits, applied in order."
    )
    dryRun: bool = Field(False, description="Only show the diff; change nothing.")


class ListDirectoryArguments(_Request):
    """Arguments of ``list_directory``."""

    path: WorkspacePath = Field(".", description=PATH_DESCRIPTION)


class CreateDirectoryArguments(_Request):
    """Arguments of ``create_directory``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION + " Parents are created too.")


class DirectoryTreeArguments(_Request):
    """Arguments of ``directory_tree``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION)


class MoveFileArguments(_Request):
    """Arguments of ``move_file``."""

    source: WorkspacePath = Field(description=PATH_DESCRIPTION)
    destination: WorkspacePath = Field(description=PATH_DESCRIPTION + " It must not exist yet.")


class SearchFilesArguments(_Request):
    """Arguments of ``search_files``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION)
    pattern: Pattern = Field(description="Text that matching names contain (case-insensitive).")
    excludePatterns: list[Pattern] = Field(
        default_factory=list,
        max_length=MAX_PATTERNS,
        description="Glob patterns of paths (relative to path) to leave out.",
    )


class GetFileInfoArguments(_Request):
    """Arguments of ``get_file_info``."""

    path: WorkspacePath = Field(description=PATH_DESCRIPTION)


class NoArguments(_Request):
    """Arguments of ``list_allowed_directories``: none."""


PATH_ARGUMENTS = ("path", "source", "destination")
"""The arguments of the filesystem tools that name one path (``paths`` names several)."""


def _inline(schema: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        reference = schema.get("$ref")
        if isinstance(reference, str):
            return _inline(definitions[reference.rsplit("/", 1)[-1]], definitions)
        return {
            key: _inline(value, definitions)
            for key, value in schema.items()
            if key not in ("title", "$defs")
        }
    if isinstance(schema, list):
        return [_inline(item, definitions) for item in schema]
    return schema


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
        schema.pop("description", None)
        inlined: dict[str, Any] = _inline(schema, schema.get("$defs", {}))
        inlined.setdefault("properties", {})
        return inlined

    def json_schema(self) -> dict[str, Any]:
        """The tool as AgentScope's ``list_tools`` describes it: an OpenAI function tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema(),
            },
        }

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
    *(
        ToolSpec(
            name=name,
            description=description,
            sandbox_type=FILESYSTEM,
            tool_type=FILESYSTEM_TOOLS,
            arguments=arguments,
        )
        for name, arguments, description in (
            (
                "read_file",
                ReadFileArguments,
                "Read the complete contents of a UTF-8 text file of the workspace.",
            ),
            (
                "read_multiple_files",
                ReadMultipleFilesArguments,
                "Read several files at once: each file's path, a colon and its contents, "
                "separated by '---' lines; a file that cannot be read shows its error and "
                "does not stop the others.",
            ),
            (
                "write_file",
                WriteFileArguments,
                "Create a new file or overwrite an existing one with new content (parent "
                "directories are created).",
            ),
            (
                "edit_file",
                EditFileArguments,
                "Make edits to a text file: each edit replaces an exact text (or the same "
                "lines with other indentation) by a new text. Returns a git-style diff; "
                "with dryRun the file is not changed.",
            ),
            (
                "create_directory",
                CreateDirectoryArguments,
                "Create a directory (and its parents), or succeed silently if it exists.",
            ),
            (
                "list_directory",
                ListDirectoryArguments,
                "List a directory, one entry per line, prefixed with [DIR] or [FILE].",
            ),
            (
                "directory_tree",
                DirectoryTreeArguments,
                "A recursive tree of files and directories as JSON: each entry has 'name', "
                "'type' ('file' or 'directory') and, for directories, 'children'.",
            ),
            (
                "move_file",
                MoveFileArguments,
                "Move or rename a file or directory; fails if the destination exists.",
            ),
            (
                "search_files",
                SearchFilesArguments,
                "Recursively search for files and directories whose name contains pattern "
                "(case-insensitive); returns their full paths, one per line.",
            ),
            (
                "get_file_info",
                GetFileInfoArguments,
                "Metadata of a file or directory: size, times, type and permissions.",
            ),
            (
                "list_allowed_directories",
                NoArguments,
                "The directories the filesystem tools may access.",
            ),
        )
    ),
)
"""The tools of our sandboxes, in the order they are listed."""

TOOLS_BY_NAME: dict[str, ToolSpec] = {spec.name: spec for spec in TOOL_SPECS}


def tools_by_type(specs: tuple[ToolSpec, ...], tool_type: str | None = None) -> dict[str, Any]:
    """``list_tools``'s reply in AgentScope's shape: ``{tool_type: {name: {"name",
    "json_schema"}}}``, all types or only ``tool_type`` (then ``{tool_type: {}}`` if it has
    none).

    >>> sorted(tools_by_type(TOOL_SPECS))
    ['filesystem', 'generic']
    >>> tools_by_type(TOOL_SPECS, "browser")
    {'browser': {}}
    """
    grouped: dict[str, dict[str, Any]] = {}
    for spec in specs:
        grouped.setdefault(spec.tool_type, {})[spec.name] = {
            "name": spec.name,
            "json_schema": spec.json_schema(),
        }
    if tool_type:
        return {tool_type: grouped.get(tool_type, {})}
    return grouped


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
    "ALLOWED_DIRECTORY",
    "BASE",
    "ERROR_STATUS",
    "FILESYSTEM",
    "FILESYSTEM_TOOLS",
    "GENERIC_TOOLS",
    "MAX_TOOL_NAME_LENGTH",
    "MIN_BEARER_TOKEN_LENGTH",
    "OPERATIONS",
    "PATH_ARGUMENTS",
    "POSITIONAL_PARAMETERS",
    "SANDBOX_TYPE_ALIASES",
    "TOOLS_BY_NAME",
    "TOOL_SPECS",
    "AddMcpServersRequest",
    "CallToolRequest",
    "CallToolResult",
    "CreateDirectoryArguments",
    "CreateFromPoolRequest",
    "CreateRequest",
    "DirectoryTreeArguments",
    "EditFileArguments",
    "EditOperation",
    "EmptyRequest",
    "GetFileInfoArguments",
    "IdentityRequest",
    "ListDirectoryArguments",
    "ListToolsRequest",
    "MoveFileArguments",
    "NoArguments",
    "ReadFileArguments",
    "ReadMultipleFilesArguments",
    "RunIpythonCellArguments",
    "RunShellCommandArguments",
    "SandboxInfo",
    "SearchFilesArguments",
    "SessionMappingRequest",
    "TextPart",
    "ToolSpec",
    "WriteFileArguments",
    "async_body",
    "error_for_status",
    "status_for_error",
    "tools_by_type",
]
