"""A function whose Secrets Manager does not answer, or names a secret it cannot read: the
start fails soon, saying which setting, and the streaming function's server keeps acting
(its event loop free, SIGTERM obeyed) while it waits (real sockets on loopback, moto's
Secrets Manager over HTTP, uvicorn in a process of its own)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.http.lambda_handler import build_web_adapter_app, make_handler
from agentscope_serverless.local_stack import DynamoDBServer
from agentscope_serverless.log import logger
from tests.support.lambda_runtime import function_url_event

PROCESS_STREAM = Path(__file__).resolve().parents[2] / "functions" / "process_stream"


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A Secrets Manager endpoint on loopback taking connections and never answering."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listening:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


@pytest.fixture
def secrets_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")


def test_the_streaming_function_keeps_its_event_loop_while_it_reads_a_secret(
    secrets_environment: None, silent_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The secret was read on the event loop: nothing else ran, uvicorn could not act on a
    # signal, for as long as Secrets Manager took.
    monkeypatch.setenv("SECRETS_ARN", "arn:aws:secretsmanager:us-east-1:123456789012:secret:s")
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", silent_endpoint)

    async def start() -> tuple[int, list[dict[str, Any]], float]:
        app = build_web_adapter_app(["sessions"])
        received: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await received.put({"type": "lifespan.startup"})
        sent: list[dict[str, Any]] = []

        async def send(message: Any) -> None:
            sent.append(message)

        began = time.monotonic()
        lifespan = asyncio.ensure_future(app({"type": "lifespan"}, received.get, send))
        ticks = 0
        while not sent:
            await asyncio.sleep(0.1)
            ticks += 1
        took = time.monotonic() - began
        await received.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(lifespan, 10)
        return ticks, sent, took

    ticks, sent, took = asyncio.run(start())
    assert sent[0] == {"type": "lifespan.startup.complete"}  # the server serves, 503 each
    assert took < 20, took  # the read's timeouts, not the AWS SDK's 5 x 60 s
    assert ticks >= 10, ticks  # the loop ran all along (a tick every 0.1 s)


_SERVER_SCRIPT = """
import sys, uvicorn
from agentscope_serverless import aws_secrets
aws_secrets.SECRETS_READ_TIMEOUT_SECONDS = 120.0  # a read that lasts, as the SDK's did
sys.path.insert(0, ".")
uvicorn.run("agentscope_handler:create", factory=True, host="127.0.0.1", port=int(sys.argv[1]))
"""


def test_the_streaming_function_stops_on_sigterm_while_it_reads_a_secret(
    silent_endpoint: str, tmp_path: Path
) -> None:
    # It ignored SIGTERM until the read ended (300 s with the SDK's defaults).
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "SECRETS_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:s",
        "SECRETS_ENDPOINT_URL": silent_endpoint,
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(tmp_path / "keys.json"),
        "POWERTOOLS_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",  # a process ended by SIGTERM flushes nothing
    }
    log = tmp_path / "server.log"
    with log.open("w") as output_file:
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER_SCRIPT, str(port)],
            cwd=PROCESS_STREAM,
            env=environment,
            stdout=output_file,
            stderr=subprocess.STDOUT,
        )
    try:
        waited = time.monotonic()
        # The application is starting: the secret is being read.
        while "Waiting for application startup" not in log.read_text():
            assert server.poll() is None and time.monotonic() - waited < 60, log.read_text()
            time.sleep(0.1)
        time.sleep(1)
        server.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        server.wait(timeout=60)
        took = time.monotonic() - stopped
    finally:
        server.kill()
        server.wait()
    output = log.read_text()
    assert took < 15, (took, output)
    assert "the server was stopped as the function started" in output, output


def test_a_secret_that_does_not_exist_fails_the_start_as_a_setting_in_one_line(
    secrets_environment: None,
    dynamodb_server: DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It was logged as Secrets Manager unavailable, with a traceback.
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:missing-AbCdEf"
    monkeypatch.setenv("AGENT_SECRETS_ARN", arn)
    monkeypatch.setenv("SECRETS_ENDPOINT_URL", dynamodb_server.endpoint_url)
    level = logger.level
    logger.setLevel("INFO")
    try:
        answer = make_handler(["sessions"])(function_url_event("GET", "/health"), None)
    finally:
        logger.setLevel(level)
    assert answer["statusCode"] == 503
    assert json.loads(answer["body"])["error"]["code"] == "UNAVAILABLE"
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (failure,) = [line for line in lines if line["level"] == "ERROR"]
    assert failure["message"] == (
        "the function could not start: cannot read the secret of AGENT_SECRETS_ARN: it does "
        "not exist in region eu-west-1 (ResourceNotFoundException): check the ARN and the "
        "function's role"
    )
    assert "exception" not in failure
