"""Tool definitions: what a model is offered, type inference, arguments, text results."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentscope_serverless.errors import InvalidInputError, SandboxRequestError
from agentscope_serverless.services.sandbox import BUILTIN_TOOLS, Sandbox, SandboxClient
from agentscope_serverless.services.sandbox.tools import (
    get_tool,
    infer_sandbox_types,
    openai_tools,
    parse_arguments,
    read_file,
    result_text,
    run_ipython_cell,
    run_shell_command,
    select_sandbox,
    write_file,
)


def test_builtin_tools_name_the_sandbox_operations_and_their_types() -> None:
    assert {tool.name: tool.sandbox_type for tool in BUILTIN_TOOLS} == {
        "run_ipython_cell": "base",
        "run_shell_command": "base",
        "read_file": "filesystem",
        "read_multiple_files": "filesystem",
        "write_file": "filesystem",
        "edit_file": "filesystem",
        "create_directory": "filesystem",
        "list_directory": "filesystem",
        "directory_tree": "filesystem",
        "move_file": "filesystem",
        "search_files": "filesystem",
        "get_file_info": "filesystem",
        "list_allowed_directories": "filesystem",
    }


def test_a_tool_converts_to_an_openai_tools_entry() -> None:
    assert write_file.to_openai_tool() == {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": write_file.description,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "A path in the workspace: relative to it, or absolute "
                        "under /workspace.",
                        "maxLength": 4096,
                    },
                    "content": {
                        "type": "string",
                        "description": "The whole new content of the file (UTF-8 text).",
                    },
                },
                "required": ["path", "content"],
                "additionalProperties": False,
            },
        },
    }
    assert [entry["function"]["name"] for entry in openai_tools(["run_shell_command"])] == [
        "run_shell_command"
    ]
    assert len(openai_tools()) == len(BUILTIN_TOOLS)


def test_sandbox_types_are_inferred_once_each_in_tool_order() -> None:
    agentscope_style = SimpleNamespace(sandbox_type=SimpleNamespace(value="browser"))
    assert infer_sandbox_types([read_file, run_ipython_cell, "write_file", agentscope_style]) == [
        "filesystem",
        "base",
        "browser",
    ]
    with pytest.raises(InvalidInputError, match="unknown sandbox tool"):
        infer_sandbox_types(["fly_to_the_moon"])
    with pytest.raises(InvalidInputError):
        get_tool("")


def test_arguments_come_as_a_json_object_or_a_mapping() -> None:
    assert parse_arguments('{"code": "1"}') == {"code": "1"}
    assert parse_arguments({"code": "1"}) == {"code": "1"}
    assert parse_arguments("") == {}
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        parse_arguments("{code")
    with pytest.raises(InvalidInputError, match="JSON object"):
        parse_arguments("[1]")


def test_arguments_nesting_deeper_than_a_parser_follows_are_refused() -> None:
    # What a model could be talked into sending: json.loads would overflow the stack.
    deep = '{"code": ' + "[" * 50_000 + "]" * 50_000 + "}"
    with pytest.raises(InvalidInputError, match="arguments nests deeper than 100 levels"):
        parse_arguments(deep)
    assert parse_arguments('{"code": ' + "[" * 99 + "]" * 99 + "}")["code"] is not None


def test_result_text_labels_stderr_and_a_failing_exit_status() -> None:
    result = {
        "content": [
            {"type": "text", "text": "out", "description": "stdout"},
            {"type": "text", "text": "bad\n", "description": "stderr"},
            {"type": "text", "text": "2", "description": "returncode"},
        ],
        "isError": True,
    }
    assert result_text(result) == "out\n[stderr]\nbad\n[exit status 2]\n"
    ok = {"content": [{"type": "text", "text": "0", "description": "returncode"}]}
    assert result_text(ok) == ""


def test_a_tool_runs_on_a_sandbox_of_its_type() -> None:
    client = SandboxClient("http://127.0.0.1:9")
    base = Sandbox(client, "b", "base")
    files = Sandbox(client, "f", "filesystem")
    assert select_sandbox(read_file, [base, files]) is files
    assert select_sandbox(run_shell_command, [files, base]) is base
    assert select_sandbox(read_file, base) is base
    with pytest.raises(SandboxRequestError, match="no connected sandbox of type 'filesystem'"):
        select_sandbox(read_file, [base, Sandbox(client, "b2", "base")])
