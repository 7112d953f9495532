"""The streaming function's log (``run.sh``: uvicorn serving the application) is JSON lines,
one per record, whatever writes them: uvicorn, Python's warnings, a thread's exception."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import agentscope_serverless
from agentscope_serverless.auth.file import FileKeyStore
from tests.support.http import bearer, free_port, issue_key, user_message, wait_until_healthy
from tests.support.warning_agent import THREAD_ERROR, THREAD_NAME, WARNING

ROOT = Path(__file__).resolve().parents[2]
RUN_SH = ROOT / "functions" / "process_stream" / "run.sh"


def _served_turn(tmp_path: Path) -> list[str]:
    """The lines the streaming function's server wrote serving one turn of the warning
    agent, as an invocation of id ``invocation-1`` (its client sent ``X-Request-Id``)."""
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "log-user")
    port = free_port()
    shared = Path(agentscope_serverless.__file__).resolve().parents[1]
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": f"{shared}:{ROOT}",
        "PORT": str(port),
        "AGENT_APP": "tests.support.warning_agent:app",
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys_file),
        "SESSION_HISTORY_BACKEND": "in_memory",
        "STATE_BACKEND": "in_memory",
        "MEMORY_BACKEND": "in_memory",
        "RUNS_BACKEND": "in_memory",
        "POWERTOOLS_LOG_LEVEL": "INFO",
    }
    log = tmp_path / "log"
    with log.open("wb") as output:
        server = subprocess.Popen(
            ["sh", str(RUN_SH)], env=env, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(url, server)
        context = {"request_id": "invocation-1", "deadline": int((time.time() + 60) * 1000)}
        headers = {
            **bearer(key),
            "x-amzn-lambda-context": json.dumps(context),
            "X-Request-Id": "client-1",
        }
        body = {"input": [user_message("the weather")], "stream": False}
        answer = httpx.post(f"{url}/process", json=body, headers=headers, timeout=30)
        assert answer.json()["status"] == "completed", answer.text
    finally:
        server.terminate()
        server.wait(30)
    return log.read_text().splitlines()


def test_warnings_thread_errors_and_uvicorns_lines_are_one_json_line_each(
    tmp_path: Path,
) -> None:
    """A warning and a thread's exception were plain text on stderr, a CloudWatch event per
    line and no request id; uvicorn's lines carried their text again with terminal colours
    (``color_message``)."""
    text = _served_turn(tmp_path)
    lines: list[dict[str, Any]] = [json.loads(line) for line in text]  # every one JSON
    assert all(isinstance(line, dict) for line in lines), text
    assert not [line for line in lines if "color_message" in line]
    assert [line for line in lines if line["message"].startswith("Uvicorn running on")]
    (warned,) = [line for line in lines if line["message"] == WARNING]
    assert warned["level"] == "WARNING" and warned["category"] == "UserWarning"
    assert "warning_agent.py:" in warned["warned_at"]
    assert warned["request_id"] == "invocation-1"
    assert warned["client_request_id"] == "client-1"
    (failed,) = [line for line in lines if line["message"] == "an exception was raised in a thread"]
    assert failed["level"] == "ERROR" and failed["thread_name"] == THREAD_NAME
    assert failed["exception_name"] == "RuntimeError"
    assert failed["exception"].endswith(f"RuntimeError: {THREAD_ERROR}")
