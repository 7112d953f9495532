"""``app.run()`` as AgentScope Runtime 1.0.5's: with no arguments it listens where the
``HOST`` and ``PORT`` environment variables say (what a platform running the script sets),
and takes the ``mode`` AgentScope's generated entry scripts pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from agentscope_serverless.auth.file import FileKeyStore
from tests.support.http import bearer, free_port, issue_key, wait_until_healthy

SCRIPT = """
from agentscope_serverless import AgentApp
from agentscope_serverless.deployers.base import DeploymentMode

app = AgentApp(app_name="Friday")

@app.query(framework="text")
async def query_func(self, msgs, request=None, **kwargs):
    yield "Hi! My name is Friday."

app.run(mode=DeploymentMode.DETACHED_PROCESS)
"""


def _environment(tmp_path: Path, **variables: str) -> dict[str, str]:
    return {
        **os.environ,
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(tmp_path / "keys.json"),
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",
        **variables,
    }


def test_run_without_arguments_listens_on_host_and_port_of_the_environment(
    tmp_path: Path,
) -> None:
    (tmp_path / "friday.py").write_text(SCRIPT)
    key = issue_key(FileKeyStore(tmp_path / "keys.json"), "alice")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "friday.py"],
        cwd=tmp_path,
        env=_environment(tmp_path, HOST="127.0.0.1", PORT=str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        body = {"input": [{"role": "user", "content": "Who are you?"}], "stream": False}
        reply = httpx.post(f"{url}/process", json=body, headers=bearer(key), timeout=30)
        assert reply.json()["output"][0]["content"][0]["text"] == "Hi! My name is Friday."
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_port_that_is_not_a_number_is_refused_naming_the_variable(tmp_path: Path) -> None:
    (tmp_path / "friday.py").write_text(SCRIPT.replace("mode=DeploymentMode.DETACHED_PROCESS", ""))
    result = subprocess.run(
        [sys.executable, "friday.py"],
        cwd=tmp_path,
        env=_environment(tmp_path, PORT="80a80"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "PORT must be a port number" in result.stderr
    assert "80a80" not in result.stderr
