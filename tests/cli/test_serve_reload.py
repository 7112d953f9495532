"""``agentscope-serverless serve --reload``, the edit-and-try loop, from a project made by
``init`` in its own folder: what restarts the server, what it does meanwhile, and how it
stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.cli.test_signals import in_session, left_in_session
from tests.support.http import free_port, running, wait_until_healthy
from tests.support.signals import terminal_signals

pytestmark = pytest.mark.timeout(180)

SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")

AGENT = textwrap.dedent(
    """
    from agentscope_serverless.app import AgentApp

    app = AgentApp(app_name="proj")


    @app.query(framework="text")
    async def query(self, msgs, request=None, **kwargs):
        yield "You said: " + (msgs[-1].get_text_content() or "")
    """
)
# An agent whose module never finishes importing (a service that never answers).
STUCK = AGENT + textwrap.dedent(
    """
    import time

    print("importing the stuck agent", flush=True)
    while True:
        time.sleep(1)
    """
)


class Reloading:
    """A ``serve --reload`` process of a project, started as a terminal does (its own
    process group), its output in a file."""

    def __init__(self, folder: Path, process: subprocess.Popen[bytes], output: Path) -> None:
        self.folder = folder
        self.process = process
        self.output_file = output
        self.url = ""
        self.key = ""

    @property
    def agent(self) -> Path:
        return self.folder / "proj" / "agent.py"

    def output(self) -> str:
        return self.output_file.read_text()

    def wait_for(self, marker: str, within: float = 60, after: int = 0) -> None:
        """Wait until ``marker`` is in the output (beyond its first ``after`` characters)."""
        deadline = time.monotonic() + within
        while marker not in self.output()[after:]:
            assert self.process.poll() is None, f"the server exited: {self.output()}"
            assert time.monotonic() < deadline, f"{marker!r} did not come: {self.output()}"
            time.sleep(0.1)

    def get(self, path: str = "/health", timeout: float = 10) -> httpx.Response:
        return httpx.get(
            self.url + path, headers={"Authorization": f"Bearer {self.key}"}, timeout=timeout
        )


def project(root: Path, agent: str = AGENT) -> Path:
    subprocess.run([SCRIPT, "init", "proj"], cwd=root, check=True, capture_output=True)
    folder = root / "proj"
    (folder / "proj" / "agent.py").write_text(agent)
    return folder


@contextmanager
def reloading(folder: Path, *options: str) -> Iterator[Reloading]:
    port = free_port()
    output = folder.parent / "serve.log"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--agent", "proj.agent:app", "--port", str(port), *options],
            cwd=folder,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=terminal_signals,
        )
    server = Reloading(folder, process, output)
    server.url = f"http://127.0.0.1:{port}"
    try:
        server.wait_for("ask_")
        server.key = next(line for line in server.output().splitlines() if line.startswith("ask_"))
        yield server
    finally:
        with_group_killed(process)


def with_group_killed(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    for pid in in_session(process.pid):
        os.kill(pid, signal.SIGKILL)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_worker_stuck_importing_the_agent_is_replaced_once_the_module_is_fixed(
    tmp_path: Path,
) -> None:
    with reloading(project(tmp_path, STUCK), "--reload") as server:
        server.wait_for("importing the stuck agent")
        # Meanwhile a request is answered, rather than left waiting.
        reply = server.get(timeout=5)
        assert reply.status_code == 503
        assert "the agent is still loading" in reply.json()["error"]["message"]
        server.agent.write_text(AGENT.replace("You said", "Fixed"))
        wait_until_healthy(server.url, server.process, timeout=60)
        reply = httpx.post(
            server.url + "/process",
            headers={"Authorization": f"Bearer {server.key}"},
            json={"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            timeout=30,
        )
        assert "Fixed: hi" in reply.text


def test_a_worker_stuck_in_its_start_is_killed_and_replaced_once_the_hook_is_fixed(
    tmp_path: Path,
) -> None:
    # A start hook blocking the event loop: the worker never acts on its stop signal.
    stuck = (
        AGENT + "\n\n@app.init\nasync def setup(self):\n    while True:\n        time.sleep(1)\n"
    )
    with reloading(project(tmp_path, "import time\n" + stuck), "--reload") as server:
        server.wait_for("Waiting for application startup")
        server.agent.write_text(AGENT)
        wait_until_healthy(server.url, server.process, timeout=60)
        assert "did not stop within 3 s: killed" in server.output()


@pytest.mark.parametrize("presses", [1, 2, 200])
def test_ctrl_c_stops_the_server_while_the_agent_is_still_importing(
    tmp_path: Path, presses: int
) -> None:
    with reloading(project(tmp_path, STUCK), "--reload") as server:
        server.wait_for("importing the stuck agent")
        # Once, twice, or held down until the server is gone (a press while it exits).
        gap = 0.2 if presses < 10 else 0.01
        for _ in range(presses):
            if server.process.poll() is not None:
                break
            os.killpg(server.process.pid, signal.SIGINT)  # as a terminal sends Ctrl-C
            time.sleep(gap)
        # As without --reload: Ctrl-C interrupts, whatever the agent's module is doing.
        assert server.process.wait(timeout=10) == 130, server.output()
        assert not left_in_session(server.process.pid), server.output()


def test_an_init_hook_raising_leaves_a_worker_answering_503_until_the_fix(
    tmp_path: Path,
) -> None:
    failing = AGENT + "\n\n@app.init\nasync def setup(self):\n    raise RuntimeError('no db')\n"
    with reloading(project(tmp_path, failing), "--reload") as server:
        server.wait_for("Application startup complete")
        [said] = [line for line in server.output().splitlines() if line.startswith("error:")]
        assert "the agent could not start: the @app.init hook setup() failed" in said
        assert "RuntimeError: no db" in said
        assert "Traceback" not in server.output()
        reply = server.get()
        assert reply.status_code == 503
        assert "the agent could not be loaded or started" in reply.json()["error"]["message"]
        server.agent.write_text(AGENT)
        wait_until_healthy(server.url, server.process, timeout=60)


def test_an_idle_server_neither_polls_nor_restarts_for_a_virtualenv_in_the_project(
    tmp_path: Path,
) -> None:
    folder = project(tmp_path)
    venv = folder / ".venv"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    # A virtualenv's library, many modules (hard links: no extra disk).
    subprocess.run(["cp", "-al", str(Path(sys.executable).parent.parent / "lib"), str(venv)])
    assert sum(1 for _ in venv.rglob("*.py")) > 2000
    with reloading(folder, "--reload") as server:
        wait_until_healthy(server.url, server.process, timeout=60)
        time.sleep(1)
        before = cpu_seconds(server.process.pid)
        time.sleep(4)
        assert cpu_seconds(server.process.pid) - before < 0.3
        seen = len(server.output())
        (venv / "lib" / "installed_now.py").write_text("x = 1\n")
        (folder / "__pycache__").mkdir()
        (folder / "__pycache__" / "cached.py").write_text("x = 1\n")
        time.sleep(3)
        assert "Reloading" not in server.output()[seen:]


@pytest.mark.parametrize("changed", ["requirements.txt", ".env", "pyproject.toml", "proj/x.py"])
def test_a_change_of_the_projects_requirements_or_configuration_restarts_the_server(
    tmp_path: Path, changed: str
) -> None:
    with reloading(project(tmp_path, AGENT + "\nimport not_there_xyz\n"), "--reload") as server:
        server.wait_for("Application startup complete")
        # The 503 and the error line say what restarts the server: a requirement installed
        # and listed, as the import error advises, is one.
        reply = server.get()
        assert reply.status_code == 503
        assert "requirements*.txt" in reply.json()["error"]["message"]
        seen = len(server.output())
        (server.folder / changed).write_text("# changed\n")
        server.wait_for("Reloading", after=seen)
        server.wait_for("Started server process", after=seen)


@pytest.mark.parametrize("reload", [False, True])
def test_a_middleware_added_with_a_wrong_argument_is_one_line_at_start(
    tmp_path: Path, reload: bool
) -> None:
    agent = AGENT + textwrap.dedent(
        """
        from fastapi.middleware.cors import CORSMiddleware

        fa = app.get_fastapi_app()
        fa.add_middleware(CORSMiddleware, allow_origin=["*"])  # for allow_origins
        """
    )
    folder = project(tmp_path, agent)
    said = (
        "error: the middleware CORSMiddleware could not be built: TypeError: "
        "CORSMiddleware.__init__() got an unexpected keyword argument 'allow_origin'"
    )
    if not reload:
        done = subprocess.run(
            [SCRIPT, "serve", "--agent", "proj.agent:app", "--port", str(free_port())],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        assert said in done.stderr
        assert "Traceback" not in done.stderr
        return
    with reloading(folder, "--reload") as server:
        server.wait_for("Application startup complete")
        assert said in server.output()
        assert "lifespan" not in server.output()
        assert server.get().status_code == 503
        assert "Traceback" not in server.output()


def test_an_app_built_before_its_query_handler_serves_the_handler(tmp_path: Path) -> None:
    # FastAPI's usual order: the application first, its routes, then the handler.
    agent = textwrap.dedent(
        """
        from agentscope_serverless.app import AgentApp

        app = AgentApp(app_name="proj")
        fa = app.get_fastapi_app()


        @fa.get("/hello")
        async def hello():
            return {"hello": 1}


        @app.query(framework="text")
        async def query(self, msgs, request=None, **kwargs):
            yield "ok"
        """
    )
    with reloading(project(tmp_path, agent), "--reload") as server:
        wait_until_healthy(server.url, server.process, timeout=60)
        assert server.get("/hello").json() == {"hello": 1}
        reply = httpx.post(
            server.url + "/process",
            headers={"Authorization": f"Bearer {server.key}"},
            json={"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            timeout=30,
        )
        assert reply.status_code == 200
        assert '"ok"' in reply.text


@pytest.mark.parametrize("method", ["GET", "OPTIONS", "TRACE", "PROPFIND"])
def test_a_worker_whose_agent_failed_answers_every_method_503_with_its_request_id(
    method: str,
) -> None:
    from agentscope_serverless.serve import _not_loaded

    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}
    with running(_not_loaded()) as url:
        reply = httpx.request(method, f"{url}/process", headers=preflight)
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "UNAVAILABLE"
    assert "could not be loaded or started" in reply.json()["error"]["message"]
    assert reply.headers["x-request-id"]


# An agent answering a word, then taking its time.
SLOW = AGENT + textwrap.dedent(
    """

    import asyncio


    @app.query(framework="text")
    async def slow(self, msgs, request=None, **kwargs):
        yield "first "
        await asyncio.sleep(600)
    """
)


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_reloader_lets_its_worker_send_each_client_the_runs_canceled_end(
    tmp_path: Path, stop: str
) -> None:
    # The worker was killed 3 s into its stop, before its 5 s grace ended and its runs were
    # canceled: the streamed client's body was cut, its last event a delta.
    with reloading(project(tmp_path, SLOW), "--reload") as server:
        wait_until_healthy(server.url, server.process, timeout=60)
        body = {"input": [{"role": "user", "content": "hi"}], "session_id": "s"}
        headers = {"Authorization": f"Bearer {server.key}"}
        lines: list[str] = []
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", f"{server.url}/process", json=body, headers=headers) as reply,
        ):
            for line in reply.iter_lines():
                lines.append(line)
                if '"first "' not in line or lines.count("stopped"):
                    continue
                lines.append("stopped")  # once
                if stop == "SIGTERM":  # as a process manager stops the server
                    server.process.send_signal(signal.SIGTERM)
                else:  # as a terminal sends Ctrl-C, to the reloader and its worker
                    os.killpg(server.process.pid, signal.SIGINT)
        code = server.process.wait(timeout=60)
    events = [json.loads(line.removeprefix("data:")) for line in lines if line.startswith("data:")]
    assert (events[-1]["object"], events[-1]["status"]) == ("response", "canceled"), lines
    assert "did not stop" not in server.output(), server.output()
    assert code == (143 if stop == "SIGTERM" else 130), server.output()


# An agent whose stop hook hangs.
HANGING_STOP = AGENT + textwrap.dedent(
    """

    import asyncio
    from pathlib import Path


    @app.shutdown
    async def shutdown(self):
        Path("stopping").touch()
        await asyncio.sleep(60)
    """
)


def test_a_second_signal_to_a_stopping_reloader_kills_its_worker_at_once(
    tmp_path: Path,
) -> None:
    # Its worker is left its whole stop by the first signal (up to its stop hooks' 10 s).
    with reloading(project(tmp_path, HANGING_STOP), "--reload") as server:
        wait_until_healthy(server.url, server.process, timeout=60)
        server.process.send_signal(signal.SIGTERM)
        stopping = server.folder / "stopping"
        deadline = time.monotonic() + 30
        while not stopping.exists():
            assert time.monotonic() < deadline, f"the stop hook did not run: {server.output()}"
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        asked_again = time.monotonic()
        code = server.process.wait(timeout=60)
        took = time.monotonic() - asked_again
    assert took < 3, server.output()
    assert code == 143, server.output()
    assert not left_in_session(server.process.pid), server.output()
