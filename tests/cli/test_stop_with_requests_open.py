"""A server told to stop (SIGTERM, Ctrl-C) while requests are still open on plain functions
that block (a sync agent, a sync endpoint) exits within seconds, its runs ended canceled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.services.runs.base import RunRecord
from agentscope_serverless.services.runs.redis import RedisRunsService
from tests.support.http import free_port, wait_until_healthy
from tests.support.signals import terminal_signals

SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")

AGENT = """
import time
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="blocking")


@app.query(framework="text")
def query(self, msgs, **kwargs):
    time.sleep(600)
    yield "slept"


@app.endpoint("/blocking", methods=["GET"])
def blocking():
    time.sleep(600)
    return {"slept": True}
"""


async def _run_of(redis_url: str, run_id: str) -> RunRecord | None:
    async with RedisRunsService(redis_url=redis_url) as runs:
        return await runs.get_run("dev", run_id)


def _serve(tmp_path: Path, agent: str, redis_url: str) -> tuple[subprocess.Popen[str], str]:
    """``serve`` started on ``agent`` (its module's source), its runs stored in Redis."""
    (tmp_path / "served_agent.py").write_text(textwrap.dedent(agent))
    port = free_port()
    process = subprocess.Popen(
        [
            *(SCRIPT, "serve", "--agent", "served_agent:app", "--app-dir", str(tmp_path)),
            *("--port", str(port), "--no-web", "--dev-user", "dev"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "RUNS_BACKEND": "redis"}
        | {"REDIS_URL": redis_url},
        start_new_session=True,
        preexec_fn=terminal_signals,
    )
    return process, f"http://127.0.0.1:{port}"


def _authorized(process: subprocess.Popen[str], url: str) -> dict[str, str]:
    """The headers of a call to the started server, once it is up, with its development key."""
    wait_until_healthy(url, process, timeout=60)
    assert process.stdout is not None
    key = next(line.strip() for line in process.stdout if line.startswith("ask_"))
    return {"Authorization": f"Bearer {key}"}


def _stop_mid_requests(
    process: subprocess.Popen[str], clients: list[Callable[[], None]], begun: list[Any], signum: int
) -> None:
    """Run ``clients`` in threads; once ``begun`` holds something (the run began) and half a
    second more, send ``signum`` to the server; return once it and the clients have ended."""
    threads = [threading.Thread(target=client) for client in clients]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while not begun:
        assert time.monotonic() < deadline, "the run did not begin"
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signum)
    process.communicate(timeout=40)
    for thread in threads:
        thread.join(timeout=30)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_server_stopped_with_blocking_requests_open_exits_its_runs_canceled(
    tmp_path: Path, redis_server: RedisServer, signum: int
) -> None:
    # It waited for the requests without limit ("Waiting for connections to close").
    process, url = _serve(tmp_path, AGENT, redis_server.url)
    try:
        headers = _authorized(process, url)
        run_ids: list[str] = []

        def ask() -> None:
            body = {"input": [{"role": "user", "content": "hi"}], "session_id": "s"}
            with (
                contextlib.suppress(httpx.HTTPError),  # cut as the server stops
                httpx.Client(timeout=120) as client,
                client.stream("POST", f"{url}/process", json=body, headers=headers) as response,
            ):
                run_ids.append(response.headers["X-Run-Id"])
                for _ in response.iter_lines():
                    pass

        def call() -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{url}/blocking", headers=headers, timeout=120)

        # Both requests in their plain functions.
        _stop_mid_requests(process, [ask, call], run_ids, signum)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    run = asyncio.run(_run_of(redis_server.url, run_ids[0]))
    assert run is not None and run.status == "canceled"


SLOW_AGENT = """
import asyncio
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="slow")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    for i in range(600):
        yield f"t{i} "
        await asyncio.sleep(0.1)
"""


def test_a_server_stopped_mid_run_sends_each_client_the_runs_canceled_end(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # The connections were dropped at the grace's end: the streamed client's last event was a
    # delta (its body cut mid-chunk), the non-streamed one got a text/plain 500, while the
    # store held the runs canceled with a final event no client got.
    process, url = _serve(tmp_path, SLOW_AGENT, redis_server.url)
    streamed: list[str] = []
    whole = threading.Event()  # the chunked body came to its end
    answered: list[httpx.Response] = []
    try:
        headers = _authorized(process, url)

        def stream() -> None:
            body = {"input": [{"role": "user", "content": "hi"}], "session_id": "s1"}
            with (
                httpx.Client(timeout=60) as client,
                client.stream("POST", f"{url}/process", json=body, headers=headers) as response,
            ):
                streamed.extend(line for line in response.iter_lines() if line)
            whole.set()

        def ask() -> None:
            body = {"input": [{"role": "user", "content": "hi"}], "session_id": "s2"}
            reply = httpx.post(
                f"{url}/process", json={**body, "stream": False}, headers=headers, timeout=60
            )
            answered.append(reply)

        _stop_mid_requests(process, [stream, ask], streamed, signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert whole.is_set()
    last = json.loads(streamed[-1].removeprefix("data:"))
    assert (last["object"], last["status"]) == ("response", "canceled")
    [reply] = answered
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["status"] == "canceled"


# Each A2A stream of a message: (path, body, headers), and its final event's status update.
A2A_STREAMS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "SendStreamingMessage": (
        "/a2a",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendStreamingMessage",
            "params": {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
            },
        },
        {"A2A-Version": "1.0"},
    ),
    "message/stream": (
        "/a2a",
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "message/stream",
            "params": {
                "message": {
                    "messageId": "m2",
                    "role": "user",
                    "kind": "message",
                    "parts": [{"kind": "text", "text": "hi"}],
                }
            },
        },
        {},
    ),
    "message:stream": (
        "/a2a/message:stream",
        {"message": {"messageId": "m3", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
        {"A2A-Version": "1.0"},
    ),
}


def _status_update(event: dict[str, Any]) -> dict[str, Any]:
    """The status update an A2A stream's ``event`` (of either version, either binding) is."""
    result = event.get("result", event)
    return result.get("statusUpdate", result)


def test_a_server_stopped_mid_run_ends_each_a2a_stream_with_its_canceled_status(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # The SDK's streams watched for the server's stop themselves and were cut at once, with
    # no final event ("incomplete chunked read"), while their tasks ran on.
    process, url = _serve(tmp_path, SLOW_AGENT, redis_server.url)
    streamed: dict[str, list[str]] = {name: [] for name in A2A_STREAMS}
    ended: list[str] = []  # the streams whose chunked body came to its end
    begun: list[str] = []  # once every stream has begun
    try:
        headers = _authorized(process, url)

        def stream(name: str) -> None:
            path, body, extra = A2A_STREAMS[name]
            with (
                httpx.Client(timeout=60) as client,
                client.stream(
                    "POST", f"{url}{path}", json=body, headers={**headers, **extra}
                ) as response,
            ):
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        streamed[name].append(line)
                        # Each stream has its working status and the reply's first text.
                        if all(len(events) >= 3 for events in streamed.values()) and not begun:
                            begun.append(name)
            ended.append(name)

        clients = [lambda name=name: stream(name) for name in A2A_STREAMS]  # type: ignore[misc]
        _stop_mid_requests(process, clients, begun, signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert sorted(ended) == sorted(A2A_STREAMS)
    for name, lines in streamed.items():
        update = _status_update(json.loads(lines[-1].removeprefix("data:")))
        assert update["status"]["state"] in ("TASK_STATE_CANCELED", "canceled"), (name, update)
        if name == "message/stream":
            assert update["final"] is True
