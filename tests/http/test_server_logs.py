"""What a local server writes of the requests it serves (uvicorn's access lines, its WebSocket
lines) shows an API key a request carries as ``ask_***``, wherever the key was put: its query,
its path, its ``Authorization`` header."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from agentscope_serverless.auth.file import FileKeyStore
from tests.support.http import bearer, free_port, issue_key, wait_until_healthy

APP = """
import os

from fastapi import WebSocket

from agentscope_serverless import AgentApp

app = AgentApp(app_name="logged")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    yield "hi"


fastapi_app = app.get_fastapi_app()


@fastapi_app.websocket("/ws")
async def echo(websocket: WebSocket):
    await websocket.accept()
    await websocket.send_text("hello")
    await websocket.close()


@fastapi_app.websocket("/ws/echo")
async def echo_once(websocket: WebSocket):
    await websocket.accept()
    await websocket.send_text(await websocket.receive_text())
    await websocket.close()


if __name__ == "__main__":
    app.run(port=int(os.environ["PORT"]))
"""

# How each way of serving an app locally is started (in the app's folder).
COMMANDS = {
    "app.run()": [sys.executable, "app.py"],
    # At the trace level, uvicorn logs each request's scope, its headers included.
    "serve": [
        *(sys.executable, "-m", "agentscope_serverless.serve", "--agent", "app:app"),
        *("--log-level", "trace"),
    ],
}


@dataclass
class LoggedServer:
    """A local server of ``APP`` as a process, what it needs to be asked, and what it wrote."""

    port: int
    key: str  # a user key the server knows
    output: str = ""  # all the server wrote to its stdout and stderr, once it has stopped

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def logged_server(folder: Path, command: list[str], log_level: str) -> Iterator[LoggedServer]:
    """Serve ``APP`` from ``folder`` with ``command``, a file key store and our log level;
    stop it with Ctrl+C on leaving and keep all it wrote in ``output``."""
    (folder / "app.py").write_text(APP)
    keys = folder / "keys.json"
    server = LoggedServer(port=free_port(), key=issue_key(FileKeyStore(keys), "alice"))
    environment = {
        **os.environ,
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys),
        "PORT": str(server.port),  # app.py's port; the serve command takes it as an option
        "POWERTOOLS_LOG_LEVEL": log_level,
    }
    if "agentscope_serverless.serve" in command:
        command = [*command, "--port", str(server.port)]
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until_healthy(server.url, process)
        yield server
    finally:
        process.send_signal(signal.SIGINT)
        server.output, _ = process.communicate(timeout=30)


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_no_line_of_a_local_server_shows_a_key_a_request_carries(
    tmp_path: Path, command: list[str]
) -> None:
    with logged_server(tmp_path, command, "INFO") as server:
        key, websocket = server.key, f"ws://127.0.0.1:{server.port}/ws"
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/health", params={"token": key}).status_code == 200
            assert client.get("/sessions", params={"token": key}).status_code == 401
            assert client.get(f"/files/{key}", headers=bearer(key)).status_code == 404
            # A valid request id, as it is made of letters, digits and "_": its request's
            # line quoted it whole.
            assert client.get("/sessions", headers={"X-Request-Id": key}).status_code == 401
        with connect(f"{websocket}?token={key}", additional_headers=bearer(key)) as ws:
            assert ws.recv(timeout=10) == "hello"
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{websocket}?token={key}").close()
        assert refused.value.response.status_code == 401
    secret = key.split("_", 2)[2]
    assert secret not in server.output
    assert "WebSocket /ws?token=ask_***" in server.output
    assert "no WebSocket library" not in server.output


def test_no_line_of_a_local_server_shows_a_key_percent_encoded_in_a_query(
    tmp_path: Path,
) -> None:
    # uvicorn's WebSocket line quoted them as sent: ask%5F<id>%5F<secret>.
    with logged_server(tmp_path, COMMANDS["serve"][:-2], "INFO") as server:
        key, websocket = server.key, f"ws://127.0.0.1:{server.port}/ws"
        first = key[4]
        for query in (
            key.replace("_", "%5F"),
            f"ask%5f{key[4:]}",
            f"ask_%{ord(first):02X}{key[5:]}",
            "%61sk" + key[3:].replace("-", "%2D"),
        ):
            with connect(f"{websocket}?api_key={query}", additional_headers=bearer(key)) as ws:
                assert ws.recv(timeout=10) == "hello"
    secret = key.split("_", 2)[2]
    # What is left of the secret between the characters an encoding may have replaced.
    for piece in re.split(r"[_-]", secret):
        assert len(piece) < 6 or piece not in server.output
    assert "api_key=ask_***" in server.output


def test_no_frame_line_of_a_local_server_shows_the_end_of_a_key_a_long_frame_carries(
    tmp_path: Path,
) -> None:
    # At the debug level, a frame's line quoted its beginning and end, the cut made before
    # the key was masked: the end of the secret was logged.
    with logged_server(tmp_path, COMMANDS["serve"], "INFO") as server:
        key = server.key
        with connect(f"ws://127.0.0.1:{server.port}/ws/echo", additional_headers=bearer(key)) as ws:
            ws.send("x" * 100 + key)
            assert ws.recv(timeout=10) == "x" * 100 + key
    assert "< TEXT 'xxx" in server.output  # the frame's line is there
    secret = key.split("_", 2)[2]
    assert secret[-12:] not in server.output


# app.py run where no WebSocket library can be imported.
WITHOUT_WEBSOCKET_LIBRARIES = (
    "import runpy, sys; sys.modules['websockets'] = sys.modules['wsproto'] = None; "
    "runpy.run_path('app.py', run_name='__main__')"
)


def test_a_server_without_a_websocket_library_says_so_as_it_starts(tmp_path: Path) -> None:
    # It started saying nothing, and answered each handshake 404.
    command = [sys.executable, "-c", WITHOUT_WEBSOCKET_LIBRARIES]
    with logged_server(tmp_path, command, "WARNING") as server:
        with (
            pytest.raises(InvalidStatus) as refused,
            connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=bearer(server.key)),
        ):
            pass
        assert refused.value.response.status_code == 404
    warnings = [line for line in server.output.splitlines() if "no WebSocket library" in line]
    assert len(warnings) == 1
    assert "/ws" in warnings[0]
    assert "pip install websockets" in warnings[0]


def test_a_local_server_logs_each_websocket_handshake_as_a_request(tmp_path: Path) -> None:
    # No line of ours named a handshake, and uvicorn logged each refusal as an ERROR.
    with logged_server(tmp_path, COMMANDS["serve"][:-2], "INFO") as server:
        websocket = f"ws://127.0.0.1:{server.port}/ws"
        with pytest.raises(InvalidStatus) as refused:
            connect(websocket, additional_headers={"X-Request-Id": "refused-1"}).close()
        assert refused.value.response.status_code == 401
        with connect(websocket, additional_headers={**bearer(server.key), "X-Request-Id": "ok-1"}):
            pass
    lines = [json.loads(line) for line in server.output.splitlines() if line.startswith("{")]
    handshakes = {line["request_id"]: line for line in lines if line["message"] == "request"}
    assert handshakes["refused-1"]["status"] == 401
    assert handshakes["refused-1"]["path"] == "/ws"
    assert handshakes["refused-1"]["code"] == "UNAUTHENTICATED"
    assert handshakes["ok-1"]["status"] == 101
    assert "code" not in handshakes["ok-1"]
    assert "without completing handshake" not in server.output
