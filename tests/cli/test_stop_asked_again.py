"""A local server asked again to stop (a second SIGTERM) while it waits for a request still
open stops at once, however it was started: ``serve``, ``python -m
agentscope_serverless.serve`` or a script's ``app.run()``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agentscope_serverless.auth.file import FileKeyStore
from tests.support.http import bearer, free_port, issue_key, wait_until_healthy
from tests.support.signals import terminal_signals

SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")

APP = """
import asyncio
import os

from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="slow")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    yield "first "
    await asyncio.sleep(600)


if __name__ == "__main__":
    app.run(port=int(os.environ["PORT"]))
"""

# How each way of serving an app locally is started (in the app's folder), given its port.
COMMANDS = {
    "serve": lambda port: [SCRIPT, "serve", "--agent", "app:app", "--port", port, "--no-web"],
    "python -m agentscope_serverless.serve": lambda port: [
        *(sys.executable, "-m", "agentscope_serverless.serve"),
        *("--agent", "app:app", "--port", port),
    ],
    "app.run()": lambda port: [sys.executable, "app.py"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_second_sigterm_stops_a_server_waiting_for_a_request_at_once(
    tmp_path: Path, command: Callable[[str], list[str]]
) -> None:
    # python -m agentscope_serverless.serve and app.run() ignored the second signal: they
    # waited the whole grace (5 s), then for the run's cancellation.
    (tmp_path / "app.py").write_text(APP)
    keys = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys), "alice")
    port = free_port()
    with (tmp_path / "output.txt").open("w") as sink:
        process = subprocess.Popen(
            command(str(port)),
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "POWERTOOLS_LOG_LEVEL": "WARNING"}
            | {"PORT": str(port)}
            | {"AUTH_KEYS_BACKEND": "file", "AUTH_KEYS_FILE": str(keys)},
            start_new_session=True,
            preexec_fn=terminal_signals,
        )
    url = f"http://127.0.0.1:{port}"
    streamed: list[str] = []

    def ask() -> None:
        body = {"input": [{"role": "user", "content": "hi"}], "session_id": "s"}
        with (
            contextlib.suppress(httpx.HTTPError),  # cut as the server stops
            httpx.Client(timeout=60) as client,
            client.stream("POST", f"{url}/process", json=body, headers=bearer(key)) as response,
        ):
            streamed.extend(response.iter_lines())

    asking = threading.Thread(target=ask)
    try:
        wait_until_healthy(url, process, timeout=60)
        asking.start()
        deadline = time.monotonic() + 30
        while not any("first" in line for line in streamed):
            assert time.monotonic() < deadline, "the run did not begin"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        time.sleep(1)  # well within the grace for the request still open
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        asked_again = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        took = time.monotonic() - asked_again
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        asking.join(timeout=30)
    output = (tmp_path / "output.txt").read_text()
    assert "asked again to stop" in output, output
    # The graceful stop needed 4 s more: what remained of its grace, then the run's cancel.
    assert took < 2.5, output
    assert process.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), output
