"""The console script: serve, invoke and chat as real processes; keys on the key file."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentscope_serverless.auth import FileKeyStore
from agentscope_serverless.auth.keys import new_key
from agentscope_serverless.cli import app
from agentscope_serverless.errors import AuthenticationError
from tests.support.http import (
    assert_late_request_heads_are_cut_off,
    free_port,
    user_message,
    wait_until_healthy,
)
from tests.support.signals import terminal_signals

SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")


@dataclass
class Server:
    url: str
    key: str
    banner: list[str]
    output: Path

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines the server wrote so far."""
        lines = self.output.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@contextmanager
def serving(
    output: Path,
    *options: str,
    log_level: str = "INFO",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[Server]:
    """``agentscope-serverless serve`` with ``options`` (and the variables ``env``) on a free
    port, started in ``cwd`` (default: this one), its output in ``output``, and its printed
    development key (if it printed one)."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "POWERTOOLS_LOG_LEVEL": log_level, **(env or {})}
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--port", str(port), *options],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        banner = output.read_text().splitlines()
        key = next((line for line in banner if line.startswith("ask_")), "")
        yield Server(url=url, key=key, banner=banner, output=output)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``agentscope-serverless serve`` of the demo agent."""
    output = tmp_path_factory.mktemp("serve") / "output.txt"
    with serving(output, "--log-level", "warning") as running:
        yield running


def test_serve_prints_a_dev_key_and_working_curl_examples(server: Server) -> None:
    assert any(server.url in line and "/docs" in line for line in server.banner)
    curls = [line for line in server.banner if line.startswith("curl ")]
    assert len(curls) == 2 and all(server.key in line for line in curls)
    first, second = (as_request(line) for line in curls)
    assert first.startswith("id: 0\ndata: ")
    assert "Your name is Alice." in second


def as_request(curl: str) -> str:
    """Run a printed ``curl -N URL -H ... -d BODY`` line with httpx (curl may be missing)."""
    words = shlex.split(curl)
    assert words[:2] == ["curl", "-N"]
    url, options = words[2], words[3:]
    headers = dict(
        value.split(": ", 1) for flag, value in itertools.pairwise(options) if flag == "-H"
    )
    body = options[options.index("-d") + 1]
    return httpx.post(url, headers=headers, content=body, timeout=30).text


def test_invoke_then_chat_continue_one_session(server: Server) -> None:
    cli = CliRunner()
    told = cli.invoke(
        app,
        [
            "invoke",
            "My name is Alice",
            "--url",
            server.url,
            "--key",
            server.key,
            "--session",
            "cli-session",
        ],
    )
    assert told.exit_code == 0, told.output
    assert "Nice to meet you, Alice! I will remember your name." in told.output
    assert "session: cli-session" in told.output
    chatted = cli.invoke(
        app,
        ["chat", "--url", server.url, "--session", "cli-session"],
        input="What is my name?\nhello\n/exit\n",
        env={"AGENTSCOPE_API_KEY": server.key},
    )
    assert chatted.exit_code == 0, chatted.output
    assert "Your name is Alice." in chatted.output
    assert "Hello, Alice!" in chatted.output


def test_invoke_names_any_user_as_text(server: Server) -> None:
    cli = CliRunner()
    base = ["invoke", "hello", "--url", server.url, "--key", server.key]
    own = cli.invoke(app, [*base, "--user", "dev"])
    assert own.exit_code == 0, own.output
    assert "Hello! I am a demo agent" in own.output
    # The development key acts only as "dev": the server answers, whatever the name's script.
    other = cli.invoke(app, [*base, "--user", "Zoé 🙂"])
    assert other.exit_code == 1
    assert "403" in other.output and "names another user" in other.output


def test_invoke_as_a_process_reports_a_bad_key(server: Server) -> None:
    result = subprocess.run(
        [SCRIPT, "invoke", "hi", "--url", server.url, "--key", "ask_nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "401" in result.stderr and "invalid API key" in result.stderr


def test_invoke_with_the_key_of_a_server_since_restarted_says_so(
    server: Server, tmp_path: Path
) -> None:
    with serving(tmp_path / "earlier.txt", "--no-web") as earlier:
        stale = earlier.key  # that server has stopped: this one never knew its key
    said = run_cli("invoke", "hi", "--url", server.url, "--key", stale)
    assert said.returncode == 1
    assert "HTTP 401 UNAUTHENTICATED: invalid API key (this server knows no such key" in (
        said.stderr
    )
    assert "or a development key printed by serve, which lasts as long as that server" in (
        said.stderr
    )
    assert "after a restart, use the key it printed then)" in said.stderr


@pytest.mark.parametrize(
    ("web_ui", "options", "shown"),
    [("false", [], False), ("", [], True), ("0", ["--web"], True), ("true", ["--no-web"], False)],
)
def test_serve_shows_the_chat_page_as_web_ui_says_unless_an_option_says_otherwise(
    tmp_path: Path, web_ui: str, options: list[str], shown: bool
) -> None:
    # WEB_UI=false was overruled by the default of --web: the page was served all the same.
    with serving(tmp_path / "output.txt", *options, env={"WEB_UI": web_ui}) as running:
        page = httpx.get(f"{running.url}/", follow_redirects=True)
        assert any(line.startswith("chat page: ") for line in running.banner) is shown
    assert (page.status_code == 200 and "text/html" in page.headers["content-type"]) is shown


def test_invoke_says_what_to_change_for_a_key_refused_for_its_user(tmp_path: Path) -> None:
    # The errors spoke of the X-User-Id header and the user_id field, which invoke has not.
    key_file = tmp_path / "keys.json"
    cli = CliRunner()

    def create(*args: str) -> str:
        created = cli.invoke(app, ["keys", "create", *args, "--file", str(key_file)])
        assert created.exit_code == 0, created.output
        return next(line for line in created.output.splitlines() if line.startswith("ask_"))

    user_key, service_key, revoked_key = (
        create("--user", "alice"),
        create("--service"),
        create("--user", "carol"),
    )
    revoked_id = json.loads(key_file.read_text())["keys"][2]["key_id"]
    assert cli.invoke(app, ["keys", "revoke", revoked_id, "--file", str(key_file)]).exit_code == 0
    env = {"AUTH_KEYS_BACKEND": "file", "AUTH_KEYS_FILE": str(key_file)}
    with serving(tmp_path / "output.txt", "--no-web", env=env) as running:
        cases = [
            (service_key, [], "a service key acts for a user it names: pass --user <user>"),
            (user_key, ["--user", "bob"], "a user key acts only as its own user: leave out --user"),
            (revoked_key, [], "this server knows no such key: a wrong key, one revoked, or a "),
        ]
        for key, user, hint in cases:
            said = run_cli("invoke", "hi", "--url", running.url, "--key", key, *user)
            assert said.returncode == 1
            assert hint in " ".join(said.stderr.split()), said.stderr
        served = run_cli(
            "invoke", "hi", "--url", running.url, "--key", service_key, "--user", "bob"
        )
        assert served.returncode == 0, served.stderr


# Blank as the server reads a message: whitespace, and invisible characters (a zero width
# space, a word joiner, a soft hyphen), which it refuses with 422.
BLANK_MESSAGES = ["", "   ", "\n", "\u200b\u2060\u00ad"]


@pytest.mark.parametrize("message", BLANK_MESSAGES)
def test_invoke_refuses_a_blank_message_before_sending_it(server: Server, message: str) -> None:
    # Stored, a blank message would reach the model with every later turn (chat skips them).
    result = run_cli("invoke", message, "--url", server.url, "--key", server.key)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the message is blank: say something to the agent" in result.stderr
    assert "session:" not in result.stdout


def test_chat_skips_a_line_of_invisible_characters_as_an_empty_one(server: Server) -> None:
    # The line was sent, and the server's 422 printed as an error.
    typed = "".join(f"{message}\n" for message in BLANK_MESSAGES[1:]) + "hello\n/exit\n"
    target = ("--url", server.url, "--key", server.key)
    chatted = run_cli("chat", *target, stdin=typed.encode())
    assert chatted.returncode == 0, chatted.stderr
    assert "error" not in chatted.stderr, chatted.stderr
    assert chatted.stdout.count("agent>") == 1  # the reply to "hello" alone
    assert "Hello! I am a demo agent" in chatted.stdout


def test_invoke_needs_a_key() -> None:
    result = CliRunner().invoke(app, ["invoke", "hi"], env={"AGENTSCOPE_API_KEY": ""})
    assert result.exit_code == 1
    assert "no API key" in result.output


def test_keys_create_list_revoke_with_the_file_store(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    cli = CliRunner()
    created = cli.invoke(app, ["keys", "create", "--user", "alice", "--file", str(key_file)])
    assert created.exit_code == 0, created.output
    key = next(line for line in created.output.splitlines() if line.startswith("ask_"))
    service = cli.invoke(
        app, ["keys", "create", "--service"], env={"AUTH_KEYS_FILE": str(key_file)}
    )
    assert service.exit_code == 0, service.output

    store = FileKeyStore(key_file)
    records = json.loads(key_file.read_text())["keys"]
    assert {(r["kind"], r["user_id"]) for r in records} == {("user", "alice"), ("service", None)}
    assert key not in key_file.read_text()

    listed = cli.invoke(app, ["keys", "list", "--file", str(key_file)])
    assert listed.exit_code == 0
    alice_id = next(r["key_id"] for r in records if r["user_id"] == "alice")
    assert alice_id in listed.output and "alice" in listed.output and "active" in listed.output
    assert "ask_" not in listed.output

    revoked = cli.invoke(app, ["keys", "revoke", alice_id, "--file", str(key_file)])
    assert revoked.exit_code == 0
    assert "revoked" in cli.invoke(app, ["keys", "list", "--file", str(key_file)]).output

    async def check() -> None:
        async with store:
            with pytest.raises(AuthenticationError):
                await store.authenticate(key)

    asyncio.run(check())


def test_keys_list_shows_a_creation_time_edited_beyond_any_date_as_it_is(tmp_path: Path) -> None:
    # A server takes such a key; keys list ended in an OverflowError's traceback.
    key_file = tmp_path / "keys.json"
    cli = CliRunner()
    created = cli.invoke(app, ["keys", "create", "--user", "alice", "--file", str(key_file)])
    assert created.exit_code == 0, created.output
    content = json.loads(key_file.read_text())
    content["keys"][0]["created_at"] = 10**20
    key_file.write_text(json.dumps(content))
    listed = cli.invoke(app, ["keys", "list", "--file", str(key_file)])
    assert listed.exit_code == 0, listed.output
    assert listed.output.split("\t")[2:] == ["alice", str(10**20), "active\n"]


def test_keys_list_of_an_unreadable_key_file_writes_nothing_to_its_output(tmp_path: Path) -> None:
    # The warning naming the file was a JSON line on stdout: `keys list | cut -f1` read it.
    key_file = tmp_path / "keys.json"
    key_file.write_text('{"version": 1, "keys": [')
    result = subprocess.run(
        [SCRIPT, "keys", "list", "--file", str(key_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "POWERTOOLS_LOG_LEVEL": "INFO"},
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "error: key file is unavailable: it is not a readable key file" in result.stderr
    (warning,) = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert warning["path"] == str(key_file)


@pytest.mark.parametrize("command", [["create", "--user", "bob"], ["revoke", "0123456789abcdef"]])
def test_keys_say_in_one_line_that_a_key_file_cannot_be_written(
    tmp_path: Path, command: list[str]
) -> None:
    # Its folder could not be made (a file of that name): a traceback.
    (tmp_path / "afile").write_text("")
    key_file = tmp_path / "afile" / "keys.json"
    result = CliRunner().invoke(app, ["keys", *command, "--file", str(key_file)])
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "error: key file is unavailable: it cannot be written"
    assert not isinstance(result.exception, OSError)


def test_keys_revoke_takes_the_key_itself_and_never_prints_it(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    cli = CliRunner()
    created = cli.invoke(app, ["keys", "create", "--user", "alice", "--file", str(key_file)])
    key = next(line for line in created.output.splitlines() if line.startswith("ask_"))
    secret = key.split("_", 2)[2]
    mistyped = cli.invoke(app, ["keys", "revoke", f"'{key}'", "--file", str(key_file)])
    assert mistyped.exit_code == 1 and secret not in mistyped.output
    revoked = cli.invoke(app, ["keys", "revoke", key, "--file", str(key_file)])
    assert revoked.exit_code == 0, revoked.output
    assert secret not in revoked.output and key.split("_")[1] in revoked.output
    assert "revoked" in cli.invoke(app, ["keys", "list", "--file", str(key_file)]).output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["keys", "create"], "--user"),
        (["keys", "create", "--user", "a", "--service"], "leave out --user"),
        (
            ["keys", "create", "--user", " alice"],
            "error: --user ' alice' begins or ends with whitespace: give the id without it\n",
        ),
        (["keys", "create", "--user", " "], "error: --user is blank"),
        (["keys", "revoke", "0000000000000000"], "no key with id"),
    ],
)
def test_keys_commands_explain_mistakes(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*args, "--file", str(tmp_path / "k.json")])
    assert result.exit_code == 1
    assert message in result.output


def test_requests_are_logged_as_json_with_a_request_id_and_never_a_key(server: Server) -> None:
    headers = {"Authorization": f"Bearer {server.key}", "X-Request-Id": "trace-me-1"}
    httpx.get(f"{server.url}/sessions", headers=headers)
    httpx.get(f"{server.url}/sessions", headers={"Authorization": "Bearer ask_wrong"})
    deadline = time.monotonic() + 10
    while not any(line.get("request_id") == "trace-me-1" for line in server.log_lines()):
        assert time.monotonic() < deadline, "no log line for the request"
        time.sleep(0.05)
    logged = next(line for line in server.log_lines() if line.get("request_id") == "trace-me-1")
    assert (logged["message"], logged["method"], logged["path"]) == ("request", "GET", "/sessions")
    assert logged["status"] == 200 and logged["duration_ms"] >= 0
    assert logged["service"] == "agentscope-serverless"
    secret = server.key.split("_", 2)[2]
    json_lines = [line for line in server.output.read_text().splitlines() if line.startswith("{")]
    assert all(secret not in line and "ask_wrong" not in line for line in json_lines)


def test_a_librarys_record_is_logged_as_one_json_line_with_the_request_id(server: Server) -> None:
    # An A2A 1.0 call whose params its method cannot read (a task id that is a number): the
    # A2A SDK logs it itself, on its own logger (as a warning: the client's mistake).
    call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": 5}}
    headers = {
        "Authorization": f"Bearer {server.key}",
        "X-Request-Id": "library-1",
        "A2A-Version": "1.0",
    }
    before = len(server.output.read_text().splitlines())
    answer = httpx.post(f"{server.url}/a2a", json=call, headers=headers)
    assert answer.json()["error"]["code"] == -32602
    deadline = time.monotonic() + 10
    while not any(
        '"message":"request"' in line for line in server.output.read_text().splitlines()[before:]
    ):
        assert time.monotonic() < deadline, "no log line for the request"
        time.sleep(0.05)
    written = server.output.read_text().splitlines()[before:]
    assert all(line.startswith("{") for line in written), written
    # The server is shared: other tests' requests may log in between, under their own ids.
    lines = [json.loads(line) for line in written]
    (sdk,) = [line for line in lines if line["message"] == "Failed to parse request params"]
    assert sdk["request_id"] == "library-1", sdk
    assert sdk["level"] == "WARNING" and "exception" not in sdk, sdk


def test_a_key_sent_as_a_value_is_masked_in_the_lines_quoting_it(server: Server) -> None:
    # Another user's key sent where a number goes: the A2A SDK's warnings quote the value
    # (JSON-RPC and HTTP+JSON), the request line its path. The server never knew that key.
    key_id, secret, key = new_key()
    headers = {"Authorization": f"Bearer {server.key}", "A2A-Version": "1.0"}
    params = {"id": "x", "historyLength": key}
    call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": params}
    before = len(server.output.read_text().splitlines())
    assert httpx.post(f"{server.url}/a2a", json=call, headers=headers).json()["error"]
    listed = httpx.get(f"{server.url}/a2a/tasks", params={"pageSize": key}, headers=headers)
    assert listed.status_code == 400
    assert httpx.get(f"{server.url}/sessions/{key}", headers=headers).status_code == 404
    deadline = time.monotonic() + 10
    while True:
        written = server.output.read_text().splitlines()[before:]
        lines = [json.loads(line) for line in written if line.startswith("{")]
        quoting = [line["message"] for line in lines if "field: invalid" in line["message"]]
        paths = [line["path"] for line in lines if line.get("path", "").startswith("/sessions/")]
        if len(quoting) == 2 and paths:
            break
        assert time.monotonic() < deadline, written
        time.sleep(0.05)
    assert all(line.startswith("{") for line in written), written
    (rpc,) = [message for message in quoting if "Failed to parse historyLength" in message]
    (rest,) = [message for message in quoting if "pageSize" in message]
    assert "'ask_***'" in rpc and "ask_***" in rest, quoting
    assert paths == ["/sessions/ask_***"]
    assert all(key_id not in line and secret[:8] not in line for line in written), written


@pytest.mark.parametrize(
    ("chosen", "banner"),
    [
        ({}, "session history dynamodb, memory redis, state dynamodb"),
        ({"STATE_BACKEND": "redis"}, "session history dynamodb, memory redis, state redis"),
    ],
    ids=["stack-backends", "state-chosen"],
)
def test_serve_on_the_local_stack_remembers_and_cleans_up(
    tmp_path: Path, chosen: dict[str, str], banner: str
) -> None:
    """The stack's backends, but for one the environment chooses."""
    port = free_port()
    output = tmp_path / "output.txt"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **chosen}
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--stack", "--port", str(port), "--log-level", "warning"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, timeout=60)
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        written = output.read_text()
        assert banner in written, written
        key = next(line for line in written.splitlines() if line.startswith("ask_"))
        headers = {"Authorization": f"Bearer {key}"}
        for text in ("My name is Alice", "What is my name?"):
            body = {"input": [user_message(text)], "session_id": "stack", "stream": False}
            reply = httpx.post(f"{url}/process", json=body, headers=headers, timeout=30).json()
        assert reply["output"][0]["content"][0]["text"] == "Your name is Alice."
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert len(children) >= 2, "redis-server and moto run as children of serve"
    for child in children:
        with pytest.raises(ProcessLookupError):
            os.kill(int(child), 0)


AGENT_MODULES = {
    "broken.py": "def query(:\n",
    "helpers.py": "def answer():\n    return 'hi'\n\n\nnothing = None\n",
    "needs_a_key.py": "import os\n\nKEY = os.environ['AGENTSCOPE_UNSET_WEATHER_KEY']\n",
    "needs_a_package.py": "import agentscope_no_such_package\n",
    "imports_a_missing_name.py": "import os\n\nfrom helpers import nowhere\n",
    "no_handler.py": "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n",
    "named.py": "from agentscope_serverless.app import AgentApp\n\nbot = AgentApp()\n\n\n"
    "def query():\n    pass\n",
    "no_self.py": "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n\n\n"
    "@app.query(framework='text')\nasync def query(msgs, **kwargs):\n    yield 'hi'\n",
    "serves_itself.py": "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n\n\n"
    "@app.query(framework='text')\nasync def query(self, msgs, **kwargs):\n    yield 'hi'\n\n\n"
    "app.run(port=0)\n",
    "own_health.py": "from agentscope_serverless.app import AgentApp\n\napp = AgentApp()\n\n\n"
    "@app.query(framework='text')\nasync def query(self, msgs, **kwargs):\n    yield 'hi'\n\n\n"
    "@app.endpoint('/health', methods=['GET'])\ndef health():\n    return {'mine': True}\n",
}


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("broken:app", "cannot import 'broken': invalid syntax ("),
        (
            "saved_as_utf16:app",
            "cannot import 'saved_as_utf16': source code string cannot contain null bytes (a "
            "Python file it imports is not UTF-8 text: saved as UTF-16, say; save it as UTF-8)\n",
        ),
        ("helpers:app", "module 'helpers' has no attribute 'app'"),
        (
            "needs_a_key:app",
            "importing 'needs_a_key' raised KeyError: 'AGENTSCOPE_UNSET_WEATHER_KEY' (",
        ),
        ("needs_a_key:app", "needs_a_key.py, line 3)"),
        ("no_handler:app", "no query handler: register one with @app.query("),
        ("named:app", "module 'named' has no attribute 'app' (the module's AgentApp: named:bot)"),
        (
            "named:query",
            "not an AgentApp: name the AgentApp object (app in app = AgentApp(...)) "
            "(the module's AgentApp: named:bot)",
        ),
        (
            "needs_a_package:app",
            "No module named 'agentscope_no_such_package' (",
        ),
        (
            "needs_a_package:app",
            "needs_a_package.py, line 1) (not installed for the Python serving "
            f"the agent, {sys.executable}: install the package providing it with "
            f"{sys.executable} -m pip install, and list it in the project's requirements.txt)",
        ),
        ("missing:app", "cannot import 'missing': No module named 'missing'\n"),
        (  # the user's module, and its line, importing a name the other does not have
            "imports_a_missing_name:app",
            "cannot import name 'nowhere' from 'helpers' (",
        ),
        ("imports_a_missing_name:app", "imports_a_missing_name.py, line 3)\n"),
        ("no_self:app", "query() takes msgs where the runner comes: it is called with the runner"),
        ("helpers:answer", "is a function, not an AgentApp"),
        (
            "serves_itself:app",
            "'serves_itself' calls app.run() as it is imported, which would serve it apart from "
            'this server: call app.run() only under if __name__ == "__main__":\n',
        ),
        ("helpers:nothing", "is None, not an AgentApp"),
        (
            "own_health:app",
            "the app's route GET /health clashes with the runtime's GET /health, which cannot "
            "be replaced: pick another path for it\n",
        ),
        ("./agent.py:bot", "not a file path) and the name of its AgentApp, e.g. agent:bot"),
        ("agent.py:bot", "not a file path) and the name of its AgentApp, e.g. agent:bot"),
        ("agent.py", "e.g. agent:app"),
        ("", "--agent is empty (a variable not set?): give the AgentApp as module:attribute"),
    ],
)
def test_serve_says_what_is_wrong_with_the_agent(tmp_path: Path, agent: str, message: str) -> None:
    for name, text in AGENT_MODULES.items():
        (tmp_path / name).write_text(text)
    # As PowerShell's `>` or Notepad's "Unicode" save it.
    utf16 = "from agentscope_serverless.agents.demo import app\r\n".encode("utf-16")
    (tmp_path / "saved_as_utf16.py").write_bytes(utf16)
    result = subprocess.run(
        [SCRIPT, "serve", "--port", str(free_port()), "--agent", agent],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and "ask_" not in result.stdout


PORTED_APP = """from agentscope_serverless import AgentApp

app = AgentApp(app_name="ported")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    yield "x"


@app.endpoint("/runs", methods=["GET"])
def runs():
    return {"my_runs": []}


@app.endpoint("/memory", methods=["POST"])
def memory(body: dict):
    return {"my_memory": body}
"""


def test_serve_serves_an_apps_endpoints_on_runtime_paths_saying_which_routes_they_hide(
    tmp_path: Path,
) -> None:
    (tmp_path / "ported.py").write_text(PORTED_APP)
    output = tmp_path / "output.txt"
    with serving(output, "--agent", "ported:app", "--app-dir", str(tmp_path)) as running:
        with httpx.Client(
            base_url=running.url, headers={"Authorization": f"Bearer {running.key}"}
        ) as client:
            runs = client.get("/runs")
            memory = client.post("/memory", json={"note": "mine"})
        warnings = [line["message"] for line in running.log_lines() if line["level"] == "WARNING"]
    assert (runs.status_code, runs.json()) == (200, {"my_runs": []})
    assert (memory.status_code, memory.json()) == (200, {"my_memory": {"note": "mine"}})
    assert warnings == [
        f"the app's route {route} is served in place of the runtime's {route} (pick another "
        "path to keep it)"
        for route in ("GET /runs", "POST /memory")
    ]


FAILING_HOOKS = """from agentscope_serverless.app import AgentApp

app = AgentApp()
early = AgentApp(before_start=lambda web: {}["vector_db_url"])


@app.init
async def connect(self):
    raise ConnectionError("cannot reach the vector store")


@app.query(framework="text")
@early.query(framework="text")
async def query(self, msgs, **kwargs):
    yield "hi"
"""


@pytest.mark.parametrize(
    ("command", "agent", "message"),
    [
        (
            [SCRIPT, "serve"],
            "hooks:app",
            "the @app.init hook connect() failed: ConnectionError: cannot reach the vector store",
        ),
        (
            [sys.executable, "-m", "agentscope_serverless.serve"],
            "hooks:app",
            "the @app.init hook connect() failed: ConnectionError: cannot reach the vector store",
        ),
        ([SCRIPT, "serve"], "hooks:early", "the before_start hook <lambda>() failed: KeyError"),
    ],
)
def test_serve_says_in_one_line_which_start_up_hook_failed_and_why(
    tmp_path: Path, command: list[str], agent: str, message: str
) -> None:
    (tmp_path / "hooks.py").write_text(FAILING_HOOKS)
    result = subprocess.run(
        [*command, "--port", str(free_port()), "--agent", agent],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode != 0
    [line] = [line for line in result.stderr.splitlines() if "could not start" in line]
    assert message in line, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    # No key and no commands to try for a server that never started.
    assert "ask_" not in result.stdout and "Try it" not in result.stdout, result.stdout


FAILING_SHUTDOWN_HOOKS = """import os
from pathlib import Path

from agentscope_serverless.app import AgentApp

FAIL = os.environ["FAIL_HOOK"]
MARKS = Path(os.environ["HOOK_MARKS"])


def finish(app):
    (MARKS / "after_finish.ran").write_text("yes")
    if FAIL == "after_finish":
        raise RuntimeError("cannot flush with key " + os.environ["LLM_API_KEY"])


app = AgentApp(after_finish=finish)


@app.shutdown
async def close(self):
    (MARKS / "shutdown.ran").write_text("yes")
    if FAIL == "shutdown":
        raise ConnectionError("cannot close with key " + os.environ["LLM_API_KEY"])


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    yield "hi"
"""


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("shutdown", "the @app.shutdown hook close() failed: ConnectionError: cannot close"),
        ("after_finish", "the after_finish hook finish() failed: RuntimeError: cannot flush"),
    ],
)
def test_serve_says_in_one_line_which_shut_down_hook_failed_its_secrets_masked(
    tmp_path: Path, hook: str, message: str
) -> None:
    # A failing shut-down hook was uvicorn's raw traceback, the exception's text (here the
    # LLM key) in clear.
    secret = "sk-shutdown-hook-secret-9876543210"
    (tmp_path / "hooks.py").write_text(FAILING_SHUTDOWN_HOOKS)
    env = {"FAIL_HOOK": hook, "LLM_API_KEY": secret, "HOOK_MARKS": str(tmp_path)}
    output = tmp_path / "output.txt"
    with serving(output, "--agent", "hooks:app", "--app-dir", str(tmp_path), env=env):
        pass
    said = output.read_text()
    [line] = [line for line in said.splitlines() if "could not stop" in line]
    assert f"{message} with key ***" in line, said
    assert secret not in said
    assert "Traceback" not in said
    assert "Application shutdown failed" in said  # still a failed shutdown
    # Both hooks ran, whichever failed.
    assert (tmp_path / "shutdown.ran").exists()
    assert (tmp_path / "after_finish.ran").exists()


@pytest.mark.parametrize("imports", ["from .loud import shout", "from shop.loud import shout"])
def test_serve_from_inside_the_projects_package_says_where_to_serve_from(
    tmp_path: Path, imports: str
) -> None:
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loud.py").write_text("def shout(text):\n    return text.upper()\n")
    (package / "agent.py").write_text(f"{imports}\n{AGENT_MODULES['no_handler.py']}")
    result = subprocess.run(
        [SCRIPT, "serve", "--port", str(free_port()), "--agent", "agent:app"],
        capture_output=True,
        text=True,
        cwd=package,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    where = f"(serve it as --agent shop.agent:app from {tmp_path}, or with --app-dir {tmp_path})"
    assert where in result.stderr
    assert "pip install" not in result.stderr


@pytest.mark.parametrize(
    ("where", "options", "agent", "message"),
    [
        # From inside the project's package, from the folder holding the project.
        ("project/shop", [], "shop.agent:app", "(serve it from {project}, or with --app-dir"),
        (".", [], "shop.agent:app", "(serve it from {project}, or with --app-dir {project})"),
        # A relative --app-dir is taken from the working directory, and must be a folder.
        (".", ["--app-dir", "project"], "shop.agent:app", "serving shop.agent:app"),
        (".", ["--app-dir", "projet"], "shop.agent:app", "--app-dir projet: no such folder ("),
        # A module of the project's package misspelt.
        ("project", [], "shop.agnet:app", "(the package shop has no module agnet: shop.agent?)"),
    ],
)
def test_serve_from_another_folder_says_where_the_agent_is(
    tmp_path: Path, where: str, options: list[str], agent: str, message: str
) -> None:
    project = tmp_path / "project"
    (project / "shop").mkdir(parents=True)
    (project / "shop" / "__init__.py").write_text("")
    (project / "shop" / "agent.py").write_text(AGENT_MODULES["no_handler.py"])
    result = subprocess.run(
        [SCRIPT, "serve", "--port", str(free_port()), "--agent", agent, *options],
        capture_output=True,
        text=True,
        cwd=tmp_path / where,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    if message.startswith("serving"):  # imported: it fails only for its lack of a handler
        assert "no query handler" in result.stderr, result.stderr
    else:
        assert message.format(project=project) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "ask_" not in result.stdout


def refused_start(
    cwd: Path, *args: str, command: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``serve`` (or ``command``) on a free port with ``args``, run in ``cwd``: it must
    refuse to start (exit 2); its output, to read what it said."""
    result = subprocess.run(
        [*(command or [SCRIPT, "serve"]), "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    return result


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AGENT_APP", "demo_agent:app\r"),
        ("AUTH_KEYS_BACKEND", "file\r"),
        ("AGENT_APP", " x:app"),
        ("AUTH_KEYS_FILE", "keys.json\r"),
        ("LLM_MODEL", "gpt-4o\r"),
        ("LLM_BASE_URL", "http://127.0.0.1:9/v1\r"),
    ],
)
def test_serve_says_a_setting_holds_a_windows_line_ending(
    tmp_path: Path, variable: str, value: str
) -> None:
    # A settings file saved on Windows, sourced by bash: each value ends with a \r. A key
    # file named so was another file (every key refused), a model so named sent as it was.
    (tmp_path / "demo_agent.py").write_text("from agentscope_serverless.agents.demo import app\n")
    result = refused_start(tmp_path, env={variable: value})
    assert result.stderr.splitlines() == [
        f"error: invalid settings: {variable}: its value begins or ends with white space, such "
        "as a newline or the \\r a Windows line ending leaves: remove it"
    ]
    assert "ask_" not in result.stdout


def test_serve_refuses_a_redis_url_option_the_redis_client_does_not_take(tmp_path: Path) -> None:
    # Taken, the server started and answered every request needing Redis with a 500.
    env = {
        "SESSION_HISTORY_BACKEND": "redis",
        "REDIS_URL": "redis://:hush-pw@127.0.0.1:1/0?ssl=true",
    }
    result = refused_start(tmp_path, env=env)
    [line] = result.stderr.splitlines()
    assert line.startswith(
        "error: invalid settings: REDIS_URL: the query option 'ssl' is not one the Redis client "
        "takes (for TLS, begin the URL with rediss://); it takes db, socket_timeout,"
    ), line
    assert "hush" not in result.stdout + result.stderr and "ask_" not in result.stdout


@pytest.mark.parametrize(
    "command", [[SCRIPT, "serve"], [sys.executable, "-m", "agentscope_serverless.serve"]]
)
@pytest.mark.parametrize("level", ["verbose", "INFO ", "warn_ing"])
def test_serve_refuses_a_log_level_uvicorn_has_not_before_printing_anything(
    tmp_path: Path, command: list[str], level: str
) -> None:
    # Taken, the banner and a development key were printed, then a KeyError's traceback.
    result = refused_start(tmp_path, "--log-level", level, command=command)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: --log-level {level!r}: give one of critical, error, warning, info, debug, trace"
    ]


def test_serve_takes_a_log_level_in_any_case(tmp_path: Path) -> None:
    with serving(tmp_path / "output.txt", "--log-level", "WARNING") as running:
        assert running.key.startswith("ask_")


@pytest.mark.parametrize("value", ["verbose", "debug\r", "NOTSET", "warn", "FATAL"])
def test_serve_warns_of_a_log_level_variable_that_names_no_level(
    tmp_path: Path, value: str
) -> None:
    # Taken for INFO without a word: an operator asking for ERROR, or DEBUG, got neither.
    with serving(tmp_path / "output.txt", log_level=value) as running:
        lines = running.log_lines()
    warned = [line["message"] for line in lines if line["level"] == "WARNING"]
    assert warned[0].startswith(f"POWERTOOLS_LOG_LEVEL={value!r} "), warned
    assert warned[0].endswith(": logging at INFO"), warned
    assert len([m for m in warned if "LOG_LEVEL" in m]) == 1, warned


@pytest.mark.parametrize("agent", ["mypkg/agent.py", "./mypkg/agent.py", "mypkg.agent"])
@pytest.mark.parametrize(
    "command", [[SCRIPT, "serve"], [sys.executable, "-m", "agentscope_serverless.serve"]]
)
def test_serve_names_an_agent_option_not_given_as_module_attribute_with_an_example(
    tmp_path: Path, command: list[str], agent: str
) -> None:
    result = refused_start(tmp_path, "--agent", agent, command=command)
    assert result.stderr.splitlines() == [
        f"error: --agent {agent!r}: give the AgentApp as module:attribute, the module's import "
        "path (not a file path) and the name of its AgentApp, e.g. mypkg.agent:app"
    ]


def test_serve_names_the_agent_app_variable_not_given_as_module_attribute(tmp_path: Path) -> None:
    result = refused_start(tmp_path, env={"AGENT_APP": "mypkg/agent.py"})
    assert result.stderr.splitlines() == [
        "error: invalid settings: AGENT_APP: give the AgentApp as module:attribute, the "
        "module's import path (not a file path) and the name of its AgentApp, e.g. "
        "mypkg.agent:app"
    ]


LEAKING_AGENT = """import os

key = os.environ["LLM_API_KEY"]
raise RuntimeError(f"could not log in with {key}")
"""


@pytest.mark.parametrize(
    "command", [[SCRIPT, "serve"], [sys.executable, "-m", "agentscope_serverless.serve"]]
)
def test_serve_masks_the_secrets_an_agent_quotes_as_it_fails_to_import(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "leaks.py").write_text(LEAKING_AGENT)
    result = refused_start(
        tmp_path, "--agent", "leaks:app", command=command, env={"LLM_API_KEY": "sk-LEAKME-12345678"}
    )
    assert "raised RuntimeError: could not log in with *** (" in result.stderr, result.stderr
    assert "LEAKME" not in result.stdout + result.stderr


def test_serve_reload_masks_the_secrets_an_agent_quotes_as_it_fails_to_import(
    tmp_path: Path,
) -> None:
    (tmp_path / "leaks.py").write_text(LEAKING_AGENT)
    port = free_port()
    process = subprocess.Popen(
        [SCRIPT, "serve", "--port", str(port), "--agent", "leaks:app", "--reload"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "LLM_API_KEY": "sk-LEAKME-12345678"},
    )
    try:
        said = read_until(process.stderr, "of the project changes)\n", within=60)
        assert "raised RuntimeError: could not log in with *** (" in said, said
        assert "LEAKME" not in said
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_says_an_agent_module_named_as_one_of_pythons_is_not_imported(
    tmp_path: Path,
) -> None:
    # A calendar agent in calendar.py: Python's calendar module is the one imported.
    (tmp_path / "calendar.py").write_text("from agentscope_serverless.agents.demo import app\n")
    result = subprocess.run(
        [SCRIPT, "serve", "--port", str(free_port()), "--agent", "calendar:app"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "'calendar' is Python's own module, imported instead of a module of yours" in (
        result.stderr
    )
    assert "rename yours, calendar_agent.py say" in result.stderr


def test_serve_reload_says_what_is_wrong_with_the_agent_and_serves_it_once_fixed(
    tmp_path: Path,
) -> None:
    agent = tmp_path / "needs_a_key.py"
    agent.write_text(AGENT_MODULES["needs_a_key.py"])
    port = free_port()
    command = [SCRIPT, "serve", "--port", str(port), "--agent", "needs_a_key:app", "--reload"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        said = read_until(process.stderr, "of the project changes)\n", within=60)
        assert "error: AGENT_APP='needs_a_key:app': importing 'needs_a_key' raised KeyError" in said
        assert "Traceback" not in said
        # Meanwhile a request is answered, saying what to do, rather than left waiting.
        reply = httpx.post(f"http://127.0.0.1:{port}/process", json={}, timeout=30)
        assert reply.status_code == 503
        assert "the agent could not be loaded" in reply.json()["error"]["message"]
        assert "AGENTSCOPE_UNSET_WEATHER_KEY" not in reply.text
        agent.write_text("from agentscope_serverless.agents.demo import app\n")
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_reload_on_any_free_port_announces_the_port_it_serves(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [SCRIPT, "serve", "--port", "0", "--reload", "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        said = read_until(process.stdout, " chat --url ", within=60)
        url = said.split("AgentScope Serverless on ", 1)[1].split()[0]
        assert not url.endswith(":0"), said
        wait_until_healthy(url, process, timeout=60)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize(
    ("command", "env"),
    [
        ([SCRIPT, "serve", "--header-timeout", "0.5"], {}),
        ([SCRIPT, "serve", "--header-timeout", "0.5", "--reload"], {}),
        # An archive's entry command, set by the environment.
        (
            [sys.executable, "-m", "agentscope_serverless.serve"],
            {"REQUEST_HEAD_TIMEOUT_SECONDS": "0.5"},
        ),
    ],
)
def test_serve_cuts_off_a_client_sending_half_a_request_head(
    tmp_path: Path, command: list[str], env: dict[str, str]
) -> None:
    # Connections that sent half a request line, or nothing, were held open for as long as
    # their client wanted, each taking one of the server's file descriptors.
    port = free_port()
    process = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        env={**os.environ, **env},
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
        assert_late_request_heads_are_cut_off(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_serve_refuses_a_header_timeout_that_is_not_a_finite_positive_number(seconds: str) -> None:
    # "inf" turned the limit off, unsaid.
    said = run_cli("serve", "--header-timeout", seconds, "--port", str(free_port()))
    assert said.returncode == 2
    assert f"--header-timeout must be a finite number of seconds above 0, not {seconds}" in (
        said.stderr
    )
    assert "Traceback" not in said.stderr


def run_cli(
    *args: str | bytes, stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script as a process on a UTF-8 terminal, with the variables ``env`` added to
    ours, its output as text."""
    result = subprocess.run(
        [SCRIPT, *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1", **(env or {})},
        timeout=60,
    )
    return subprocess.CompletedProcess(
        result.args,
        result.returncode,
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
    )


def test_invoke_and_chat_refuse_bytes_that_are_not_utf8(server: Server) -> None:
    target = ("--url", server.url, "--key", server.key)
    for args in ([b"caf\xe9", *target], ["hi", "--session", b"s\xe9", *target]):
        said = run_cli("invoke", *args)
        assert said.returncode == 1, said.stderr
        assert "is not valid UTF-8 text" in said.stderr and "Traceback" not in said.stderr
    chatted = run_cli("chat", *target, stdin=b"caf\xe9\nhello\n/exit\n")
    assert chatted.returncode == 0, chatted.stderr
    assert "the message is not valid UTF-8 text" in chatted.stderr
    assert "Hello! I am a demo agent" in chatted.stdout


@pytest.mark.parametrize("key", ["ask_…", "ask_0123456789abcdef_hush\n", "ask_0 hush"])
def test_invoke_refuses_a_key_with_stray_characters_without_showing_it(
    server: Server, key: str
) -> None:
    said = run_cli("invoke", "hi", "--url", server.url, "--key", key)
    assert said.returncode == 1
    assert "the API key holds characters no key has" in said.stderr
    assert "Traceback" not in said.stderr and "hush" not in said.stderr


def test_invoke_says_why_it_cannot_connect(server: Server) -> None:
    bare = server.url.removeprefix("http://")
    no_scheme = run_cli("invoke", "hi", "--url", bare, "--key", server.key)
    assert no_scheme.returncode == 1
    assert "must start with http:// or https://" in no_scheme.stderr
    tls = server.url.replace("http://", "https://")
    to_plain_http = run_cli("invoke", "hi", "--url", tls, "--key", server.key)
    assert to_plain_http.returncode == 1
    assert f"cannot connect to {tls} (" in to_plain_http.stderr
    assert "SSL" in to_plain_http.stderr


@pytest.mark.parametrize("route", ["/process", "/compatible-mode/v1"])
def test_invoke_says_the_url_is_the_servers_not_a_routes(server: Server, route: str) -> None:
    said = run_cli("invoke", "hi", "--url", server.url + route, "--key", server.key)
    assert said.returncode == 1
    assert f"{server.url}{route}/ serves no /process: --url is the base URL" in said.stderr
    assert "such as http://127.0.0.1:8090, without a route" in said.stderr


@contextmanager
def website(status: int, content_type: str = "text/html") -> Iterator[tuple[str, list[str]]]:
    """A server on loopback that is not this project's: every POST answered ``status`` with
    a page of ``content_type``; its URL and the paths it was sent."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    posted: list[str] = []

    class Site(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(self.path)
            page = b"<html><body>Welcome</body></html>"
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    Thread(target=http_server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{http_server.server_address[1]}", posted
    finally:
        http_server.shutdown()
        http_server.server_close()


@pytest.mark.parametrize(
    ("status", "content_type", "said"),
    [
        (405, "text/html", "serves no /process"),
        (501, "text/html", "serves no /process"),
        (200, "text/html; charset=utf-8", "answered /process with text/html, not an event stream"),
    ],
)
def test_chat_ends_at_a_server_that_serves_no_process(
    status: int, content_type: str, said: str
) -> None:
    # Only a 404 ended it: at a static file server (501), a website (405) or one answering
    # every path with its page (200), each message said "HTTP 405" or "the reply was cut
    # off", and chat went on, exiting 0.
    with website(status, content_type) as (url, posted):
        result = run_cli("chat", "--url", url, "--key", "ask_a_b", stdin=b"hi\nhello again\n")
    assert result.returncode == 1, result.stdout + result.stderr
    assert said in result.stderr
    assert posted == ["/process"]


@pytest.mark.parametrize("command", ["invoke", "chat"])
@pytest.mark.parametrize("given", ["option", "variable"])
def test_invoke_and_chat_refuse_a_url_with_credentials_never_showing_them(
    command: str, given: str
) -> None:
    # Taken, the password was printed in the banner and in every error, and the URL's
    # credentials were sent instead of the key (401, "not Bearer").
    with website(401) as (site, posted):
        url = site.replace("http://", "http://agent:s3cret-PW@")
        args = ["hi"] if command == "invoke" else []
        env = {"AGENTSCOPE_API_KEY": "ask_abc_def"}
        if given == "option":
            args += ["--url", url]
        else:
            env["AGENTSCOPE_URL"] = url
        result = run_cli(command, *args, stdin=b"hi\n/exit\n", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: --url (or AGENTSCOPE_URL) holds credentials (user:password@ before the host): "
        "the server takes only an API key, given with --key; remove them from the URL"
    ]
    assert "s3cret" not in result.stdout + result.stderr
    assert posted == []


@pytest.mark.parametrize("command", ["invoke", "chat"])
@pytest.mark.parametrize("suffix", ["/?tenant=acme&token=t0ken-Secret", "/#frag"])
def test_invoke_and_chat_refuse_a_url_with_a_query_or_fragment(command: str, suffix: str) -> None:
    # Taken, the paths were added after the query (POST / with "?tenant=acme/process": a
    # 405), and the error quoted the URL, a token in its query too.
    with website(401) as (url, posted):
        args = ["hi"] if command == "invoke" else []
        result = run_cli(
            command, *args, "--url", f"{url}{suffix}", "--key", "ask_a_b", stdin=b"hi\n/exit\n"
        )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: --url (or AGENTSCOPE_URL) holds a query or a fragment (?... or #...): it is the "
        "server's base URL, which the routes' paths are added to; remove them from it"
    ]
    assert "t0ken" not in result.stdout + result.stderr
    assert posted == []


def test_keys_on_a_table_without_aws_credentials_say_so(tmp_path: Path) -> None:
    unset = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"}
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env.update(
        HOME=str(tmp_path),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    result = subprocess.run(
        [SCRIPT, "keys", "list", "--table", "my-agent-ApiKeysTable"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert "error: dynamodb is unavailable: no AWS credentials were found" in result.stderr
    assert "connection failed" not in result.stderr


def test_serve_on_a_dynamodb_key_table_names_the_table(tmp_path: Path) -> None:
    port = free_port()
    output = tmp_path / "output.txt"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "AUTH_KEYS_BACKEND": "dynamodb",
        "AUTH_KEYS_TABLE": "my-agent-keys",
        "AUTH_KEYS_FILE": str(tmp_path / "keys.json"),
        "DYNAMODB_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
    }
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--port", str(port), "--log-level", "warning"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        # The banner comes before the server answers (its health needs the unreachable table).
        deadline = time.monotonic() + 60
        while "API keys:" not in output.read_text():
            assert process.poll() is None, output.read_text()
            assert time.monotonic() < deadline, "no banner"
            time.sleep(0.05)
        banner = output.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)
    keys_line = next(line for line in banner.splitlines() if line.startswith("API keys:"))
    assert "the DynamoDB table my-agent-keys" in keys_line
    assert "keys create --user alice --table my-agent-keys" in keys_line
    assert "keys.json" not in keys_line


def test_init_prints_a_cd_that_works_for_a_name_with_a_space(tmp_path: Path) -> None:
    result = subprocess.run(
        [SCRIPT, "init", "my bot"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    printed = next(line for line in result.stdout.splitlines() if line.startswith("cd "))
    words = shlex.split(printed)
    assert words[:3] == ["cd", "my bot", "&&"]
    assert (tmp_path / words[1] / "my_bot" / "agent.py").is_file()
    assert Path(words[3]).name == "agentscope-serverless"  # by its path, when not on PATH
    assert words[4:] == ["serve", "--agent", "my_bot.agent:app"]


def test_init_keeps_the_secrets_of_local_runs_out_of_the_repository(tmp_path: Path) -> None:
    # The .gitignore it wrote let a `git add .` take .env, which holds the agent's keys.
    result = subprocess.run(
        [SCRIPT, "init", "bot"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    project = tmp_path / "bot"
    names = [".env", ".env.local", ".env.production", ".env.example", "bot/agent.py"]
    for name in names[:-1]:
        (project / name).write_text("LLM_API_KEY=sk-secret\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    ignored = subprocess.run(
        ["git", "check-ignore", *names], capture_output=True, text=True, cwd=project
    )
    assert ignored.stdout.split() == [".env", ".env.local", ".env.production"]


def test_init_dot_makes_the_project_in_the_empty_working_folder_named_after_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "weather"
    folder.mkdir()
    result = subprocess.run(
        [SCRIPT, "init", "."], capture_output=True, text=True, cwd=folder, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "with the agent weather.agent:app" in result.stdout
    assert (folder / "weather" / "agent.py").is_file()
    assert "# weather" in (folder / "README.md").read_text()


def test_init_names_the_command_by_its_path_when_no_virtualenv_is_active(
    tmp_path: Path,
) -> None:
    # The printed "agentscope-serverless serve" was "command not found" in a shell whose
    # PATH does not hold the virtualenv; the project's test found no package with pytest.
    outside = {**os.environ, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [SCRIPT, "init", "bot"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env=outside,
    )
    assert result.returncode == 0, result.stderr
    printed = next(line for line in result.stdout.splitlines() if line.startswith("cd "))
    command = shlex.split(printed)[3]
    assert Path(command).is_absolute() and os.access(command, os.X_OK)
    project = tmp_path / "bot"
    assert f"source {Path(sys.executable).parent.parent}/bin/activate" in (
        project / "README.md"
    ).read_text().replace("\n", " ")
    pytest_run = subprocess.run(
        [str(Path(SCRIPT).with_name("pytest")), "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=120,
    )
    assert pytest_run.returncode == 0, pytest_run.stdout + pytest_run.stderr


@pytest.mark.parametrize("plugins", [[], ["-p", "no:asyncio"]])
def test_inits_project_runs_its_test_without_a_warning(tmp_path: Path, plugins: list[str]) -> None:
    # Its first run warned that pytest-asyncio's asyncio_default_fixture_loop_scope was unset;
    # without pytest-asyncio (as -p no:asyncio), setting it must not warn of an unknown option.
    assert run_cli("init", str(tmp_path / "shouter")).returncode == 0
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugins],
        capture_output=True,
        text=True,
        cwd=tmp_path / "shouter",
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout
    assert "warning" not in (tested.stdout + tested.stderr).lower(), tested.stdout


@pytest.mark.parametrize(
    "name", ["email", "json", "fastapi", "tests", "six", "idna", "jmespath", "agentscope", "openai"]
)
def test_init_refuses_a_name_whose_package_python_already_has(tmp_path: Path, name: str) -> None:
    # "init email" wrote a project whose test and serve failed: its package was the
    # standard library's. "init six" (a module of a dependency of the runtime) wrote one
    # that every build refused.
    result = subprocess.run(
        [SCRIPT, "init", name], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 2  # a usage error, as for any name that cannot be one
    assert "which Python or the runtime already has" in result.stderr
    assert f"(try '{name}_agent')" in result.stderr
    assert not (tmp_path / name).exists()


def test_keys_show_a_user_id_as_written(tmp_path: Path) -> None:
    key_file = str(tmp_path / "keys.json")
    for user in ("[/ops]", "[red]bob"):
        created = run_cli("keys", "create", "--user", user, "--file", key_file)
        assert created.returncode == 0, created.stderr
        assert f"for user {user!r}" in created.stdout
        assert any(line.startswith("ask_") for line in created.stdout.splitlines())
    listed = run_cli("keys", "list", "--file", key_file)
    assert listed.returncode == 0, listed.stderr
    assert "[/ops]" in listed.stdout and "[red]bob" in listed.stdout


def test_keys_list_to_a_pipe_is_one_tab_separated_line_per_key(tmp_path: Path) -> None:
    # It printed the terminal's table, box drawing and all, which awk cannot take apart.
    key_file = str(tmp_path / "keys.json")
    for user in ("alice", "tab\there"):
        assert run_cli("keys", "create", "--user", user, "--file", key_file).returncode == 0
    listed = run_cli("keys", "list", "--file", key_file)  # its stdout is a pipe
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert sorted((row[1], row[2], row[4]) for row in rows) == [
        ("user", "alice", "active"),
        ("user", "tab\\there", "active"),
    ]
    stored = json.loads(Path(key_file).read_text())["keys"]
    assert {row[0] for row in rows} == {record["key_id"] for record in stored}


def test_keys_list_shows_control_characters_of_a_hand_edited_user_id_escaped(
    tmp_path: Path,
) -> None:
    # A user id edited to hold U+202E showed reversed, as another user's ("\u202eecila" as
    # "alice"), and one holding ESC wrote its escape sequence raw to a pipe.
    key_file = tmp_path / "keys.json"
    for user in ("mallory", "eve"):
        assert run_cli("keys", "create", "--user", user, "--file", str(key_file)).returncode == 0
    content = json.loads(key_file.read_text())
    content["keys"][0]["user_id"] = "\u202eecila"
    content["keys"][1]["user_id"] = "bob\x1b[2J\u2066"
    key_file.write_text(json.dumps(content))
    piped = run_cli("keys", "list", "--file", str(key_file))
    assert piped.returncode == 0, piped.stderr
    assert sorted(line.split("\t")[2] for line in piped.stdout.splitlines()) == [
        "\\u202eecila",
        "bob\\x1b[2J\\u2066",
    ]
    shown = run_cli(
        "keys", "list", "--file", str(key_file), env={"TTY_COMPATIBLE": "1", "COLUMNS": "200"}
    )  # the terminal's table
    assert shown.returncode == 0, shown.stderr
    assert "\\u202eecila" in shown.stdout and "bob\\x1b[2J\\u2066" in shown.stdout
    assert "\u202e" not in shown.stdout + piped.stdout
    assert "\u2066" not in shown.stdout + piped.stdout


def test_keys_create_refuses_a_user_id_with_bidirectional_controls(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.json"
    for user in ("\u202eecila", "ali\u2067ce", "bob\u200f"):
        refused = run_cli("keys", "create", "--user", user, "--file", str(key_file))
        assert refused.returncode == 1
        assert "user_id must not contain bidirectional controls" in refused.stderr
        assert "ask_" not in refused.stdout
    assert not key_file.exists()


FAILING_AGENT = """
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="failing")


@app.query(framework="text")
async def query(self, msgs, request=None, session=None, memories=None, **kwargs):
    raise ValueError(msgs[-1].get_text_content())
    yield ""
"""


@contextlib.contextmanager
def serving_agent_file(tmp_path: Path, module: str, source: str) -> Iterator[tuple[str, str]]:
    """``serve`` of the agent ``source``, written as ``module.py``: its URL and its key."""
    (tmp_path / f"{module}.py").write_text(source)
    port = free_port()
    output = tmp_path / "output.txt"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--port", str(port), "--agent", f"{module}:app", "--no-web"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        key = next(line for line in output.read_text().splitlines() if line.startswith("ask_"))
        yield url, key
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_invoke_and_chat_print_an_agent_error_as_written(tmp_path: Path) -> None:
    text = "row [/i] of items[i] :thumbs_up:"
    with serving_agent_file(tmp_path, "failing", FAILING_AGENT) as (url, key):
        said = run_cli("invoke", text, "--url", url, "--key", key)
        chatted = run_cli("chat", "--url", url, "--key", key, stdin=f"{text}\n/exit\n".encode())
    assert said.returncode == 1
    assert f"error: the agent failed: Unknown agent error: ValueError: {text}" in said.stderr
    assert chatted.returncode == 0
    assert f"ValueError: {text}" in chatted.stderr and "Traceback" not in chatted.stderr


ESCAPING_AGENT = """
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="escaping")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    if msgs[-1].get_text_content() == "fail":
        raise ValueError("the title \\x1b]0;owned\\x07 is set")
    yield "clipboard \\x1b]52;c;ZXZpbA==\\x07, screen \\x1b[2J, C1 \\x9b2J, end"
"""


def test_invoke_and_chat_print_no_terminal_control_sequence_of_the_agent(
    tmp_path: Path,
) -> None:
    # A reply or error (a model's, a web page's it read) could set the clipboard, the title...
    with serving_agent_file(tmp_path, "escaping", ESCAPING_AGENT) as (url, key):
        said = run_cli("invoke", "hi", "--url", url, "--key", key)
        failed = run_cli("invoke", "fail", "--url", url, "--key", key)
        chatted = run_cli("chat", "--url", url, "--key", key, stdin=b"hi\nfail\n/exit\n")
    for result in (said, failed, chatted):
        assert "\x1b" not in result.stdout + result.stderr
        assert "\x9b" not in result.stdout + result.stderr
    shown = "clipboard \\x1b]52;c;ZXZpbA==\\x07, screen \\x1b[2J, C1 \\x9b2J, end"
    assert shown in said.stdout and shown in chatted.stdout
    assert "ValueError: the title \\x1b]0;owned\\x07 is set" in failed.stderr
    assert "ValueError: the title \\x1b]0;owned\\x07 is set" in chatted.stderr


THINKING_AGENT = """
from agentscope_serverless.app import AgentApp
from agentscope_serverless.schemas.agent_schemas import Message, MessageType, TextContent

app = AgentApp(app_name="thinking")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    thinking = Message(type=MessageType.REASONING, role="assistant")
    yield thinking.in_progress()
    yield TextContent(text="Hmm, a greeting.", delta=True)
    yield thinking.completed()
    yield "Hello!"
"""


def test_chat_prints_a_thinking_models_reasoning_apart_from_its_answer(tmp_path: Path) -> None:
    with serving_agent_file(tmp_path, "thinking", THINKING_AGENT) as (url, key):
        chatted = run_cli("chat", "--url", url, "--key", key, stdin=b"hi\n/exit\n")
    assert chatted.returncode == 0, chatted.stderr
    # The reasoning, then the answer on a line of its own.
    assert "Hmm, a greeting.\nHello!" in chatted.stdout


TOOL_AGENT = """
from agentscope_serverless.app import AgentApp
from agentscope_serverless.schemas.agent_schemas import DataContent, Message, MessageType

app = AgentApp(app_name="tools")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    yield Message(role="assistant", content="Let me check.").completed()
    call = {"call_id": "c1", "name": "get_weather", "arguments": "{}"}
    yield Message(
        type=MessageType.PLUGIN_CALL, role="assistant", content=[DataContent(data=call)]
    ).completed()
    yield "Sunny."
"""


def test_invoke_prints_each_message_apart_and_the_tools_the_agent_calls(tmp_path: Path) -> None:
    with serving_agent_file(tmp_path, "tools", TOOL_AGENT) as (url, key):
        said = run_cli("invoke", "weather?", "--url", url, "--key", key)
    assert said.returncode == 0, said.stderr
    # They ran together ("Let me check.Sunny."), the call unseen.
    assert "Let me check.\n[calls get_weather]\nSunny." in said.stdout


@pytest.mark.parametrize(
    "command", [[SCRIPT, "serve"], [sys.executable, "-m", "agentscope_serverless.serve"]]
)
@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_refuses_a_port_out_of_range_before_loading_the_agent(
    tmp_path: Path, command: list[str], port: str
) -> None:
    # The module took 99999 as 34463 (uvicorn wraps it), and -1 failed in uvicorn after the
    # agent was loaded.
    result = refused_start(tmp_path, f"--port={port}", command=command)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: --port must be a port number from 0 to 65535, not {port}"
    ]


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``serve`` of the slow agent (a piece of text every 200 ms for 5 s)."""
    output = tmp_path_factory.mktemp("slow") / "output.txt"
    with serving(output, "--agent", "tests.support.slow_agent:app", log_level="WARNING") as running:
        yield running


def read_until(stream: Any, marker: str, within: float = 30) -> str:
    """What ``stream`` gives until ``marker`` appears in it (fails after ``within`` s)."""
    seen = ""
    deadline = time.monotonic() + within
    while marker not in seen:
        assert time.monotonic() < deadline, f"{marker!r} did not come: {seen!r}"
        ready, _, _ = select.select([stream], [], [], 0.1)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, f"the output ended before {marker!r}: {seen!r}"
            seen += chunk.decode()
    return seen


def test_ctrl_c_in_chat_cancels_the_reply_and_goes_back_to_the_prompt(
    slow_server: Server,
) -> None:
    chat = subprocess.Popen(
        [SCRIPT, "chat", "--url", slow_server.url, "--key", slow_server.key],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=terminal_signals,
    )
    assert chat.stdin is not None and chat.stdout is not None
    try:
        chat.stdin.write(b"go slowly\n")
        chat.stdin.flush()
        read_until(chat.stdout, "piece 1.")
        chat.send_signal(signal.SIGINT)
        stopped = read_until(chat.stdout, "you>")  # the prompt again, the chat goes on
        assert "stopped: the run was cancelled" in stopped
        chat.stdin.write(b"/exit\n")
        chat.stdin.flush()
        rest = chat.stdout.read().decode()
        assert chat.wait(timeout=30) == 0
    finally:
        chat.kill()
    session = rest.split("session: ")[1].split()[0]
    headers = {"Authorization": f"Bearer {slow_server.key}"}
    deadline = time.monotonic() + 30
    while True:  # the run's end is stored as it stops
        runs = httpx.get(f"{slow_server.url}/runs", params={"session_id": session}, headers=headers)
        statuses = [run["status"] for run in runs.json()["items"]]
        if statuses != ["in_progress"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert statuses == ["canceled"]


def test_invoke_gives_up_on_a_server_that_never_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A port held by a process that accepts and says nothing (a server's reloader whose
    # worker died): invoke waited for ever, printing nothing.
    import socket

    import agentscope_serverless.cli as cli_module

    monkeypatch.setattr(cli_module, "SILENCE_SECONDS", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        result = CliRunner().invoke(app, ["invoke", "hi", "--url", url, "--key", "ask_x_y"])
    assert time.monotonic() - started < 10
    assert result.exit_code == 1
    assert f"{url} sent nothing for 0.5 s: it is not answering" in result.output


def _cut_stream_server(tail: bytes) -> Any:
    """A server whose ``/process`` streams the start of a reply, then ``tail``, then ends."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    start = [
        {"object": "response", "status": "created", "session_id": "s1"},
        {"object": "content", "delta": True, "text": "Hello, ", "msg_id": "m1"},
    ]

    async def chunks() -> Any:
        for event in start:
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield tail

    server = FastAPI()

    @server.post("/process")
    async def process() -> StreamingResponse:
        headers = {"X-Run-Id": "run-1", "X-Session-Id": "s1"}
        return StreamingResponse(chunks(), media_type="text/event-stream", headers=headers)

    return server


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        # A buffered Lambda function's answer cut at its size limit, saying so.
        (
            b'event: error\ndata: {"error": {"code": "RESPONSE_TOO_LARGE", "message": "cut"}}\n\n',
            "cut (RESPONSE_TOO_LARGE)",
        ),
        # A connection cut before the run's last event.
        (b"", "the reply was cut off before it ended (read the rest with GET /runs/run-1/events)"),
    ],
)
def test_invoke_says_when_a_reply_is_cut_off(tail: bytes, said: str) -> None:
    # It printed the start of the reply and exited 0, as if that were the whole answer.
    from tests.support.http import running

    with running(_cut_stream_server(tail)) as url:
        result = CliRunner().invoke(app, ["invoke", "hi", "--url", url, "--key", "ask_x_y"])
    assert "Hello, " in result.output
    assert result.exit_code == 1, result.output
    assert said in " ".join(result.output.split())


def test_chat_goes_on_in_the_session_of_a_failed_reply(tmp_path: Path) -> None:
    # The next message after a failed reply started a new session: the conversation (whose
    # input the failed turn kept) was left behind.
    with serving_agent_file(tmp_path, "failing", FAILING_AGENT) as (url, key):
        chatted = run_cli("chat", "--url", url, "--key", key, stdin=b"first\nsecond\n/exit\n")
        assert chatted.returncode == 0
        session = chatted.stdout.split("session: ")[-1].split()[0]
        page = httpx.get(
            f"{url}/sessions/{session}/messages", headers={"Authorization": f"Bearer {key}"}
        )
    texts = [m["content"][0]["text"] for m in page.json()["items"] if m["role"] == "user"]
    assert texts == ["first", "second"]


def test_chat_ends_on_an_error_no_message_can_fix(server: Server) -> None:
    # It printed the error again for every line typed, then exited 0.
    nowhere = f"http://127.0.0.1:{free_port()}"
    for url, key, said in [
        (nowhere, server.key, f"cannot connect to {nowhere}"),
        (server.url, "ask_nope_wrong", "HTTP 401 UNAUTHENTICATED"),
        (server.url, server.key, "HTTP 403 PERMISSION_DENIED"),
        (server.url + "/process", server.key, "serves no /process"),
    ]:
        user = ["--user", "bob"] if "403" in said else []
        chatted = run_cli("chat", "--url", url, "--key", key, *user, stdin=b"hi\nhello\n")
        assert chatted.returncode == 1, chatted.stderr
        assert chatted.stderr.count(said) == 1, chatted.stderr
        assert chatted.stdout.count("you>") == 1


def command_paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command under ``command`` (a click group or command)."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from command_paths(sub, (*path, name))


def test_every_help_reads_as_plain_text_wrapped_in_an_80_column_terminal() -> None:
    # serve's showed the docstring's ``--agent``, broke its lines mid-sentence where the
    # docstring did, and cut a setting's name short (REQUEST_HEAD_TIMEOUT…).
    import typer.main

    for path in command_paths(typer.main.get_command(app)):
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
        assert "``" not in shown and "…" not in shown, (path, shown)
        description = shown.split("╭")[0].splitlines()[3:]
        for line, after in itertools.pairwise(description):
            if line.strip() and after.strip():  # a line broken early, its next word would fit
                assert len(line.rstrip()) + 1 + len(after.split()[0]) > 79, (path, shown)
    serve = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "80"}).output
    assert "REQUEST_HEAD_TIMEOUT_SECONDS, 15" in serve


def test_serve_help_names_every_folder_reload_never_watches() -> None:
    # It named five of the sixteen (not .venv, build, .aws-sam or the tools' caches).
    from agentscope_serverless.reloader import IGNORED_FOLDERS

    serve = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    words = set(re.findall(r"[\w.-]+", serve))
    assert sorted(IGNORED_FOLDERS - words) == []


@pytest.mark.parametrize(
    "command", [[SCRIPT, "serve"], [sys.executable, "-m", "agentscope_serverless.serve"]]
)
@pytest.mark.parametrize(
    ("variable", "value", "schemes"),
    [
        ("LLM_BASE_URL", "api.openai.com/v1", "http:// or https://"),
        ("REDIS_URL", "localhost:6379", "redis:// or rediss:// or unix://"),
    ],
)
def test_serve_refuses_a_url_setting_without_its_scheme_before_printing_a_key(
    tmp_path: Path, command: list[str], variable: str, value: str, schemes: str
) -> None:
    result = refused_start(tmp_path, command=command, env={variable: value})
    assert result.stderr.splitlines() == [
        f"error: invalid settings: {variable}: give a URL beginning with {schemes}"
        + (" and a host" if schemes.startswith("http") else "")
    ]
    assert "ask_" not in result.stdout and "Try it" not in result.stdout


@pytest.mark.parametrize(
    "command", [["serve"], ["-m", "agentscope_serverless.serve"]], ids=["cli", "module"]
)
def test_serve_names_a_variable_misspelling_a_setting_in_one_warning_at_start(
    tmp_path: Path, command: list[str]
) -> None:
    # Ignored without a word: the server ran with its stores in memory.
    output = tmp_path / "output.txt"
    env = {
        "SESSION_HISTORY_BACKND": "redis",
        "State_Backen": "dynamodb",
        "OPENAI_API_KEY": "sk-own-1234",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    port = free_port()
    program = [SCRIPT] if command == ["serve"] else [sys.executable]
    with output.open("w") as sink:
        process = subprocess.Popen(
            [*program, *command, "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
    finally:
        process.terminate()
        process.wait(timeout=30)
    said = [line for line in output.read_text().splitlines() if "no setting" in line]
    assert len(said) == 1, output.read_text()
    assert json.loads(said[0])["message"] == (
        "environment variables that are no setting, ignored: SESSION_HISTORY_BACKND (did you "
        "mean SESSION_HISTORY_BACKEND?), State_Backen (did you mean STATE_BACKEND?)"
    )
    assert "OPENAI" not in output.read_text() and "redis" not in said[0]
