"""What a local server writes of the requests it serves (uvicorn's access lines, its WebSocket
lines) shows an API key a request carries as ``ask_***``, wherever the key was put: its query,
its path, its ``Authorization`` header."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_no_line_of_a_local_server_shows_a_key_a_request_carries(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "app.py").write_text(APP)
    keys = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys), "alice")
    port = free_port()
    environment = {
        **os.environ,
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys),
        "PORT": str(port),
        "POWERTOOLS_LOG_LEVEL": "INFO",
    }
    command = [*command, "--port", str(port)] if "--agent" in command else command
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        with httpx.Client(base_url=url) as client:
            assert client.get("/health", params={"token": key}).status_code == 200
            assert client.get("/sessions", params={"token": key}).status_code == 401
            assert client.get(f"/files/{key}", headers=bearer(key)).status_code == 404
        with connect(f"ws://127.0.0.1:{port}/ws?token={key}", additional_headers=bearer(key)) as ws:
            assert ws.recv(timeout=10) == "hello"
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{port}/ws?token={key}").close()
        assert refused.value.response.status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    secret = key.split("_", 2)[2]
    assert secret not in output
    assert "WebSocket /ws?token=ask_***" in output
    assert "no WebSocket library" not in output


# app.py run where no WebSocket library can be imported.
WITHOUT_WEBSOCKET_LIBRARIES = (
    "import runpy, sys; sys.modules['websockets'] = sys.modules['wsproto'] = None; "
    "runpy.run_path('app.py', run_name='__main__')"
)


def test_a_server_without_a_websocket_library_says_so_as_it_starts(tmp_path: Path) -> None:
    # It started saying nothing, and answered each handshake 404.
    (tmp_path / "app.py").write_text(APP)
    keys = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys), "alice")
    port = free_port()
    environment = {
        **os.environ,
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys),
        "PORT": str(port),
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen(
        [sys.executable, "-c", WITHOUT_WEBSOCKET_LIBRARIES],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        with (
            pytest.raises(InvalidStatus) as refused,
            connect(f"ws://127.0.0.1:{port}/ws", additional_headers=bearer(key)),
        ):
            pass
        assert refused.value.response.status_code == 404
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    warnings = [line for line in output.splitlines() if "no WebSocket library" in line]
    assert len(warnings) == 1
    assert "/ws" in warnings[0]
    assert "pip install websockets" in warnings[0]
