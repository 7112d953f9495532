"""A server told to stop (SIGTERM, Ctrl-C) while requests are still open on plain functions
that block (a sync agent, a sync endpoint) exits within seconds, its runs ended canceled."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_server_stopped_with_blocking_requests_open_exits_its_runs_canceled(
    tmp_path: Path, redis_server: RedisServer, signum: int
) -> None:
    # It waited for the requests without limit ("Waiting for connections to close").
    (tmp_path / "blocking_agent.py").write_text(textwrap.dedent(AGENT))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            *(SCRIPT, "serve", "--agent", "blocking_agent:app", "--app-dir", str(tmp_path)),
            *("--port", str(port), "--no-web", "--dev-user", "dev"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "RUNS_BACKEND": "redis",
            "REDIS_URL": redis_server.url,
        },
        start_new_session=True,
        preexec_fn=terminal_signals,
    )
    try:
        wait_until_healthy(url, process, timeout=60)
        assert process.stdout is not None
        key = next(line.strip() for line in process.stdout if line.startswith("ask_"))
        headers = {"Authorization": f"Bearer {key}"}
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

        clients = [threading.Thread(target=ask), threading.Thread(target=call)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 30
        while not run_ids:
            assert time.monotonic() < deadline, "the run did not begin"
            time.sleep(0.05)
        time.sleep(0.5)  # both requests in their plain functions
        process.send_signal(signum)
        process.communicate(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    for client in clients:
        client.join(timeout=30)
    run = asyncio.run(_run_of(redis_server.url, run_ids[0]))
    assert run is not None and run.status == "canceled"
