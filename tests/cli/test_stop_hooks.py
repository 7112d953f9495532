"""A server told to stop (SIGTERM) while its stop hook hangs, or a background task runs: a
second signal cuts the stop short, and a task still running is stored as stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.services.runs.base import RunRecord
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.tasks import TASK_STOPPED
from tests.support.http import free_port, wait_until_healthy
from tests.support.signals import terminal_signals

SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")

AGENT = """
import asyncio
from pathlib import Path
from agentscope_serverless.app import AgentApp

app = AgentApp(app_name="stopping")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    yield "ok"


@app.shutdown
async def shutdown(self):
    Path("stopping").touch()
    await asyncio.sleep(60)


@app.task("/jobs/slow")
async def slow(payload):
    Path("started").touch()
    await asyncio.sleep(600)
"""


def _serve(tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], str]:
    """A server of ``AGENT`` in ``tmp_path`` (its output in ``output.txt``), and its URL."""
    (tmp_path / "stopping_agent.py").write_text(textwrap.dedent(AGENT))
    port = free_port()
    with (tmp_path / "output.txt").open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--agent", "stopping_agent:app", "--port", str(port), "--no-web"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "POWERTOOLS_LOG_LEVEL": "WARNING", **env},
            start_new_session=True,
            preexec_fn=terminal_signals,
        )
    url = f"http://127.0.0.1:{port}"
    wait_until_healthy(url, process, timeout=60)
    return process, url


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.05)


def test_a_second_sigterm_cuts_a_hanging_stop_hook_short(tmp_path: Path) -> None:
    # A second SIGTERM did nothing: the server exited once its hook had slept 60 s.
    process, _ = _serve(tmp_path)
    try:
        process.send_signal(signal.SIGTERM)
        _wait_for(tmp_path / "stopping")
        process.send_signal(signal.SIGTERM)
        asked_again = time.monotonic()
        process.wait(timeout=30)
        took = time.monotonic() - asked_again
    finally:
        process.kill()
        process.wait()
    output = (tmp_path / "output.txt").read_text()
    assert took < 5, output
    assert "asked again to stop" in output and "Traceback" not in output, output


async def _task(redis_url: str, task_id: str) -> RunRecord | None:
    async with RedisRunsService(redis_url=redis_url) as runs:
        return await runs.get_run("dev", task_id)


def test_a_task_running_as_the_server_stops_is_stored_as_stopped(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # It stayed in_progress until read as lost (RUN_LOST) a minute later.
    process, url = _serve(tmp_path, RUNS_BACKEND="redis", REDIS_URL=redis_server.url)
    try:
        key = next(
            line.strip()
            for line in (tmp_path / "output.txt").read_text().splitlines()
            if line.startswith("ask_")
        )
        answer = httpx.post(
            f"{url}/jobs/slow", json={}, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        task_id = answer.json()["task_id"]
        _wait_for(tmp_path / "started")
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        process.kill()
        process.wait()
    task = asyncio.run(_task(redis_server.url, task_id))
    assert task is not None and task.status == "failed", task
    assert task.error is not None and task.error["code"] == TASK_STOPPED
    assert "stopped before the task ended" in task.error["message"]
