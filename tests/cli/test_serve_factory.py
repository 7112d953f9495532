"""``uvicorn --factory agentscope_serverless.serve:create``, as the README names it: the
application of a server started by uvicorn itself, on the embedded defaults."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.http import free_port, wait_until_healthy

FAILING_INIT = textwrap.dedent(
    """
    from agentscope_serverless.app import AgentApp

    app = AgentApp()


    @app.init
    async def setup(self):
        raise ConnectionError("cannot reach postgresql://app:s3cret-pw@db/x")


    @app.query(framework="text")
    async def query(self, msgs, **kwargs):
        yield "hi"
    """
)


@contextmanager
def factory(folder: Path, agent: str) -> Iterator[tuple[str, subprocess.Popen[str], Path]]:
    """uvicorn serving ``create()`` for ``agent`` from ``folder``; its URL, process and the
    file of its output."""
    port = free_port()
    command = ["-m", "uvicorn", "--factory", "agentscope_serverless.serve:create"]
    output = folder / "uvicorn.log"
    env = {**os.environ, "AGENT_APP": agent, "AGENTSCOPE_APP_DIR": str(folder)}
    env.pop("AUTH_KEYS_BACKEND", None)
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, *command, "--port", str(port)],
            cwd=folder,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield f"http://127.0.0.1:{port}", process, output
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_factory_on_the_in_memory_key_store_prints_a_development_key_that_works(
    tmp_path: Path,
) -> None:
    # It printed nothing of keys: every request was refused 401, and no key could be made.
    with factory(tmp_path, "agentscope_serverless.agents.demo:app") as (url, process, output):
        wait_until_healthy(url, process, timeout=60)
        [line] = [line for line in output.read_text().splitlines() if "ask_" in line]
        assert line.startswith("development key (user 'dev', valid while this server runs): ")
        key = line.rsplit(" ", 1)[1]
        answer = httpx.get(f"{url}/sessions", headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text


def test_the_factory_prints_no_key_for_an_agent_whose_start_fails(tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text(FAILING_INIT)
    with factory(tmp_path, "failing:app") as (url, process, output):
        deadline = time.monotonic() + 60
        while "Application startup complete" not in output.read_text():
            assert process.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.1)
        assert httpx.get(f"{url}/sessions").status_code == 503
        said = output.read_text()
    assert "ask_" not in said
    [line] = [line for line in said.splitlines() if line.startswith("error:")]
    assert "the @app.init hook setup() failed: ConnectionError: cannot reach " in line
    assert "postgresql://****@db/x" in line and "s3cret-pw" not in said
