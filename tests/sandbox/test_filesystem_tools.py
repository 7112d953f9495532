"""Every tool of a ``filesystem`` sandbox, on a real sandbox, with AgentScope's arguments.

The tools answer as the MCP filesystem server of AgentScope's filesystem sandbox does: one
text part, ``isError`` with an ``Error: ...`` text when the tool fails, and every path
confined to ``/workspace``. Calls go over the wire (``POST /call_tool``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.sandbox_server import RunningServer

Tool = Callable[..., dict[str, Any]]


@pytest.fixture
def tool(sandbox_server: RunningServer) -> Iterator[Tool]:
    http = httpx.Client(
        base_url=sandbox_server.url,
        headers={"Authorization": f"Bearer {sandbox_server.token}"},
        timeout=60,
    )
    sandbox_id = http.post("/create_from_pool", json={"sandbox_type": "filesystem"}).json()["data"]

    def call(name: str, **arguments: Any) -> dict[str, Any]:
        reply = http.post(
            "/call_tool", json={"identity": sandbox_id, "tool_name": name, "arguments": arguments}
        )
        if reply.status_code != 200:
            return {"status": reply.status_code, "detail": reply.json()["detail"]}
        result: dict[str, Any] = reply.json()["data"]
        if name not in ("run_ipython_cell", "run_shell_command"):
            assert len(result["content"]) == 1 and result["content"][0]["type"] == "text"
        return result

    yield call
    http.post("/release", json={"identity": sandbox_id})
    http.close()


def ok(result: dict[str, Any]) -> str:
    assert result.get("isError") is False, result
    return str(result["content"][0]["text"])


def error(result: dict[str, Any]) -> str:
    assert result.get("isError") is True, result
    message = str(result["content"][0]["text"])
    assert message.startswith("Error: ")
    return message


def test_write_read_and_read_multiple_files(tool: Tool) -> None:
    assert ok(tool("write_file", path="notes/a.txt", content="alpha\n")) == (
        "Successfully wrote to notes/a.txt"
    )
    ok(tool("write_file", path="/workspace/notes/é ü.md", content="naïve ☃\n"))
    assert ok(tool("read_file", path="notes/a.txt")) == "alpha\n"
    assert ok(tool("read_file", path="/workspace/notes/é ü.md")) == "naïve ☃\n"
    assert "No such file" in error(tool("read_file", path="missing.txt"))

    both = ok(tool("read_multiple_files", paths=["notes/a.txt", "missing.txt", "notes/é ü.md"]))
    pieces = both.split("\n---\n")
    assert pieces[0] == "notes/a.txt:\nalpha\n\n"
    assert pieces[1].startswith("missing.txt: Error - ")
    assert pieces[2] == "notes/é ü.md:\nnaïve ☃\n\n"


def test_a_file_that_is_not_utf8_is_an_error_not_a_crash(
    tool: Tool, sandbox_server: RunningServer
) -> None:
    ok(tool("write_file", path="latin1.txt", content="x"))
    [workspace] = list(sandbox_server.root.glob("sandboxes/*/workspace/latin1.txt"))
    workspace.write_bytes(b"caf\xe9")
    assert "not UTF-8" in error(tool("read_file", path="latin1.txt"))
    assert "not UTF-8" in ok(tool("read_multiple_files", paths=["latin1.txt"]))
    assert "not UTF-8" in error(
        tool("edit_file", path="latin1.txt", edits=[{"oldText": "caf", "newText": "tea"}])
    )


def test_a_file_name_that_is_not_utf8_is_listed_with_a_replacement_character(
    tool: Tool,
) -> None:
    made = tool("run_shell_command", command="touch \"$(printf 'caf\\351.txt')\" && echo made")
    assert made["content"][0]["text"] == "made\n"
    assert "[FILE] caf\ufffd.txt" in ok(tool("list_directory", path="."))
    found = ok(tool("search_files", path=".", pattern="caf", excludePatterns=[]))
    assert found == "/workspace/caf\ufffd.txt"
    tree = json.loads(ok(tool("directory_tree", path=".")))
    assert {"name": "caf\ufffd.txt", "type": "file"} in tree


def test_edit_file_replaces_exact_text_then_lines_by_indentation_and_shows_a_diff(
    tool: Tool,
) -> None:
    source = "def greet():\n    print('hello')\n    return 1\n"
    ok(tool("write_file", path="app.py", content=source))

    preview = ok(
        tool(
            "edit_file",
            path="app.py",
            edits=[{"oldText": "print('hello')", "newText": "print('bonjour')"}],
            dryRun=True,
        )
    )
    assert preview.startswith("```diff\n--- app.py\toriginal\n+++ app.py\tmodified\n")
    assert "-    print('hello')\n+    print('bonjour')\n" in preview
    assert preview.endswith("```\n\n")
    assert ok(tool("read_file", path="app.py")) == source

    # Two edits in order; the second matches its lines whatever their indentation.
    ok(
        tool(
            "edit_file",
            path="app.py",
            edits=[
                {"oldText": "print('hello')", "newText": "print('bonjour')"},
                {
                    "oldText": "print('bonjour')\nreturn 1",
                    "newText": "print('hi')\nif True:\n    return 2",
                },
            ],
        )
    )
    assert ok(tool("read_file", path="app.py")) == (
        "def greet():\n    print('hi')\n    if True:\n        return 2\n"
    )
    # An exact match keeps the new text as given.
    ok(tool("edit_file", path="app.py", edits=[{"oldText": "return 2", "newText": "return 3"}]))
    assert ok(tool("read_file", path="app.py")).endswith("        return 3\n")

    missing = error(tool("edit_file", path="app.py", edits=[{"oldText": "absent", "newText": "x"}]))
    assert "Could not find exact match for edit:\nabsent" in missing
    half = tool(
        "edit_file",
        path="app.py",
        edits=[{"oldText": "hi", "newText": "hallo"}, {"oldText": "absent", "newText": "x"}],
    )
    error(half)
    assert "print('hi')" in ok(tool("read_file", path="app.py")), "a failed edit changes nothing"

    ok(tool("write_file", path="fence.md", content="```\ncode\n```\n"))
    fenced = ok(tool("edit_file", path="fence.md", edits=[{"oldText": "code", "newText": "x"}]))
    assert fenced.startswith("````diff\n") and fenced.endswith("````\n\n")


def test_directories_list_tree_move_search_and_info(tool: Tool) -> None:
    assert ok(tool("create_directory", path="src/pkg/deep")) == (
        "Successfully created directory src/pkg/deep"
    )
    ok(tool("create_directory", path="src/pkg/deep"))  # exists: still fine
    ok(tool("write_file", path="src/pkg/Main.py", content="print(1)\n"))
    ok(tool("write_file", path="src/pkg/deep/main_test.py", content=""))
    ok(tool("write_file", path="build/main.o", content=""))
    ok(tool("write_file", path="README", content="12345"))

    assert ok(tool("list_directory", path=".")) == "[FILE] README\n[DIR] build\n[DIR] src"
    assert ok(tool("list_directory", path="src/pkg")) == "[FILE] Main.py\n[DIR] deep"

    tree = json.loads(ok(tool("directory_tree", path="src")))
    assert tree == [
        {
            "name": "pkg",
            "type": "directory",
            "children": [
                {"name": "Main.py", "type": "file"},
                {
                    "name": "deep",
                    "type": "directory",
                    "children": [{"name": "main_test.py", "type": "file"}],
                },
            ],
        }
    ]

    everything = ok(tool("search_files", path=".", pattern="MAIN", excludePatterns=[]))
    assert everything.split("\n") == [
        "/workspace/build/main.o",
        "/workspace/src/pkg/Main.py",
        "/workspace/src/pkg/deep/main_test.py",
    ]
    some = ok(
        tool("search_files", path=".", pattern="main", excludePatterns=["build", "*_test.py"])
    )
    assert some == "/workspace/src/pkg/Main.py"
    assert ok(tool("search_files", path="src", pattern="nothing", excludePatterns=[])) == (
        "No matches found"
    )

    info = dict(
        line.split(": ", 1) for line in ok(tool("get_file_info", path="README")).split("\n")
    )
    assert info["size"] == "5"
    assert info["isFile"] == "true" and info["isDirectory"] == "false"
    assert info["permissions"] in ("644", "664", "600")
    assert set(info) == {
        "size",
        "created",
        "modified",
        "accessed",
        "isDirectory",
        "isFile",
        "permissions",
    }
    assert "isDirectory: true" in ok(tool("get_file_info", path="src"))

    assert ok(tool("move_file", source="README", destination="src/README.md")) == (
        "Successfully moved README to src/README.md"
    )
    assert ok(tool("read_file", path="src/README.md")) == "12345"
    assert "already exists" in error(tool("move_file", source="build", destination="src"))
    assert "cannot be moved" in error(tool("move_file", source=".", destination="elsewhere"))
    assert "cannot be moved" in error(tool("move_file", source="src", destination="/workspace"))
    # Into a folder that does not exist: the error named the source alone, which exists.
    assert error(tool("move_file", source="src/README.md", destination="docs/README.md")) == (
        "Error: No such file or directory: /workspace/src/README.md -> /workspace/docs/README.md"
    )

    assert ok(tool("list_allowed_directories")) == "Allowed directories:\n/workspace"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read_file", {"path": "../../etc/passwd"}),
        ("read_multiple_files", {"paths": ["ok.txt", "../x"]}),
        ("write_file", {"path": "/etc/evil", "content": "x"}),
        ("edit_file", {"path": "/tmp/x", "edits": [{"oldText": "a", "newText": "b"}]}),
        ("create_directory", {"path": "/opt/evil"}),
        ("list_directory", {"path": ".."}),
        ("directory_tree", {"path": "/"}),
        ("move_file", {"source": "a", "destination": "../a"}),
        ("move_file", {"source": "/etc/passwd", "destination": "a"}),
        ("search_files", {"path": "/", "pattern": "passwd", "excludePatterns": []}),
        ("get_file_info", {"path": "/etc/shadow"}),
    ],
)
def test_paths_outside_the_workspace_are_refused(
    tool: Tool, name: str, arguments: dict[str, Any]
) -> None:
    refused = tool(name, **arguments)
    assert refused["status"] == 400
    assert "workspace" in refused["detail"]


def test_symbolic_links_cannot_lead_a_tool_out_of_the_workspace(tool: Tool) -> None:
    ok(tool("write_file", path="inside.txt", content="mine"))
    # The sandbox's code may link anywhere (a filesystem sandbox also runs the generic
    # tools); the file tools must not follow such links out of the workspace.
    cell = (
        "import os\n"
        "os.symlink('/etc', 'etc_link')\n"
        "os.symlink('/etc/passwd', 'passwd_link')\n"
        "os.symlink('.', 'loop')\n"
        "print('made')"
    )
    assert ok(tool("run_ipython_cell", code=cell)) == "made\n"
    outside = {
        "read_file": {"path": "etc_link/passwd"},
        "write_file": {"path": "etc_link/evil", "content": "x"},
        "edit_file": {"path": "passwd_link", "edits": [{"oldText": "root", "newText": "x"}]},
        "create_directory": {"path": "etc_link/new"},
        "list_directory": {"path": "etc_link"},
        "directory_tree": {"path": "etc_link"},
        "search_files": {"path": "etc_link", "pattern": "passwd", "excludePatterns": []},
        "get_file_info": {"path": "passwd_link"},
        "move_file": {"source": "inside.txt", "destination": "etc_link/stolen.txt"},
    }
    for name, arguments in outside.items():
        assert "outside the workspace" in error(tool(name, **arguments)), name
    several = ok(tool("read_multiple_files", paths=["inside.txt", "passwd_link"]))
    assert "passwd_link: Error - 'passwd_link' is outside the workspace" in several
    assert "root:" not in several

    # Moving a link moves the link itself (inside); a link loop does not hang a search or
    # a tree (links are listed, never followed).
    ok(tool("move_file", source="passwd_link", destination="renamed_link"))
    assert ok(tool("search_files", path=".", pattern="loop", excludePatterns=[])) == (
        "/workspace/loop"
    )
    tree = json.loads(ok(tool("directory_tree", path=".")))
    assert {"name": "loop", "type": "file"} in tree
    assert ok(tool("read_file", path="inside.txt")) == "mine"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("edit_file", {"path": "a", "edits": []}),
        ("edit_file", {"path": "a", "edits": [{"oldText": "", "newText": "x"}]}),
        ("edit_file", {"path": "a", "edits": [{"old": "a", "new": "b"}]}),
        (
            "edit_file",
            {"path": "a", "edits": [{"oldText": "a", "newText": "b"}], "dryRun": "maybe"},
        ),
        ("read_multiple_files", {"paths": []}),
        ("read_multiple_files", {"paths": ["a"] * 101}),
        ("read_multiple_files", {"paths": "a"}),
        ("search_files", {"path": ".", "pattern": ""}),
        ("search_files", {"path": ".", "pattern": "a", "excludePatterns": "b"}),
        ("move_file", {"source": "a"}),
        ("write_file", {"path": "a\x00b", "content": "x"}),
        ("list_allowed_directories", {"path": "."}),
        ("read_file", {"path": "a/" * 2100}),
        ("search_files", {"path": ".", "pattern": "*" * 2000}),
        ("search_files", {"path": ".", "pattern": "a", "excludePatterns": ["*"] * 33}),
    ],
)
def test_bad_arguments_are_request_errors(tool: Tool, name: str, arguments: dict[str, Any]) -> None:
    refused = tool(name, **arguments)
    assert refused["status"] == 400
    assert isinstance(refused["detail"], str)


def test_a_fifo_in_the_workspace_does_not_hang_a_file_tool(tool: Tool) -> None:
    made = tool("run_shell_command", command="mkfifo pipe && echo made")
    assert made["content"][0]["text"] == "made\n"
    assert "not a regular file" in error(tool("read_file", path="pipe"))
    assert "not a regular file" in ok(tool("read_multiple_files", paths=["pipe"]))
    error(tool("write_file", path="pipe", content="x"))
    error(tool("edit_file", path="pipe", edits=[{"oldText": "a", "newText": "b"}]))
    assert "[FILE] pipe" in ok(tool("list_directory", path="."))
    assert "isFile: false" in ok(tool("get_file_info", path="pipe"))


def test_a_directory_given_to_a_file_tool_is_named_and_leaks_no_descriptor(tool: Tool) -> None:
    made = tool("run_shell_command", command="mkdir -p src && echo hello > notes.txt && echo made")
    assert made["content"][0]["text"] == "made\n"
    said = "'src' is a directory, not a file"
    assert error(tool("read_file", path="src")) == f"Error: {said}"
    assert ok(tool("read_multiple_files", paths=["src", "notes.txt"])) == (
        f"src: Error - {said}\n---\nnotes.txt:\nhello\n\n"
    )
    assert error(tool("edit_file", path="src", edits=[{"oldText": "a", "newText": "b"}])) == (
        f"Error: {said}"
    )
    assert error(tool("write_file", path="src", content="x")) == f"Error: {said}"
    assert error(tool("read_file", path="/workspace/src/")) == (
        "Error: '/workspace/src/' is a directory, not a file"
    )
    # The agent may hold 256 descriptors: a descriptor left behind by each call used them up.
    for _ in range(300):
        error(tool("read_file", path="src"))
    assert ok(tool("read_file", path="notes.txt")) == "hello\n"
    ok(tool("write_file", path="new.txt", content="x"))
    listed = tool("run_shell_command", command="ls")
    assert listed.get("isError") is False, listed
    assert listed["content"][0]["text"] == "new.txt\nnotes.txt\nsrc\n"


def test_a_write_to_a_directorys_path_is_refused_making_nothing(tool: Tool) -> None:
    # "drafts/" wrote a file named drafts, the slash dropped.
    said = "'drafts/' is a directory's path, not a file's"
    assert error(tool("write_file", path="drafts/", content="x")) == f"Error: {said}"
    assert error(tool("write_file", path="/workspace/a/b/", content="x")).startswith("Error: ")
    listed = tool("run_shell_command", command="ls -A")
    assert listed["content"][0]["text"] == "", listed


def test_a_write_of_text_that_is_not_unicode_leaves_the_file_as_it_was(
    sandbox_server: RunningServer,
) -> None:
    # A lone surrogate (JSON lets a client send "\ud800", as a model's broken emoji) failed
    # the write after the file was emptied: an edit adding one to a file wiped it.
    with httpx.Client(
        base_url=sandbox_server.url,
        headers={"Authorization": f"Bearer {sandbox_server.token}"},
        timeout=60,
    ) as http:
        sandbox_id = http.post("/create_from_pool", json={"sandbox_type": "filesystem"}).json()[
            "data"
        ]

        def call(name: str, **arguments: Any) -> dict[str, Any]:
            # As AgentScope's client encodes it: ASCII, a lone surrogate escaped.
            body = json.dumps({"identity": sandbox_id, "tool_name": name, "arguments": arguments})
            reply = http.post(
                "/call_tool", content=body, headers={"Content-Type": "application/json"}
            )
            assert reply.status_code == 200, reply.text
            result: dict[str, Any] = reply.json()["data"]
            return result

        try:
            assert ok(call("write_file", path="plan.md", content="- step one\n"))
            edit = [{"oldText": "one", "newText": "\ud800"}]
            assert "surrogates not allowed" in error(call("edit_file", path="plan.md", edits=edit))
            assert "surrogates not allowed" in error(
                call("write_file", path="plan.md", content="- \ud800\n")
            )
            assert ok(call("read_file", path="plan.md")) == "- step one\n"
        finally:
            http.post("/release", json={"identity": sandbox_id})
