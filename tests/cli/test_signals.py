"""Clean shutdowns: SIGTERM or SIGINT stops each server program with no traceback and no
process of its own left behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agentscope_serverless.services.sandbox import SandboxService
from tests.support.http import free_port, wait_until_healthy
from tests.support.sandbox_server import TOKEN, require_sandbox_tools
from tests.support.signals import terminal_signals

SIGNALS = [signal.SIGTERM, signal.SIGINT]
SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    return raw[raw.rindex(")") + 2 :].split()


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid``."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def in_session(session: int) -> set[int]:
    """Living processes of the session ``session`` (a program started in its own session)."""
    found = set()
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z" and int(fields[3]) == session:
            found.add(int(entry.name))
    return found


def left_in_session(session: int, seconds: float = 10) -> set[int]:
    """The processes of ``session`` still living after ``seconds``: none once its leader's
    helpers (multiprocessing's resource tracker, which stops when the leader's end of its pipe
    closes) have exited."""
    deadline = time.monotonic() + seconds
    while (living := in_session(session)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return living


def stop_and_check(
    process: subprocess.Popen[str], signum: int, minimum_children: int
) -> tuple[str, str]:
    """Send ``signum``; assert a clean exit with every child gone; return stdout, stderr."""
    children = descendants(process.pid)
    assert len(children) >= minimum_children, f"expected child processes, found {children}"
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr
    assert process.returncode in (0, 128 + signum, -signum), (process.returncode, stderr)
    deadline = time.monotonic() + 10
    while any(alive(child) for child in children) or in_session(process.pid):
        assert time.monotonic() < deadline, (
            f"left behind: {[c for c in children if alive(c)]} {in_session(process.pid)}"
        )
        time.sleep(0.1)
    return stdout, stderr


def start(command: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        start_new_session=True,
        preexec_fn=terminal_signals,
    )


def read_until(process: subprocess.Popen[str], done: Callable[[str], bool]) -> list[str]:
    """Lines of stdout until one satisfies ``done``."""
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if done(line):
            return lines
    pytest.fail(f"the program ended first: {''.join(lines)}")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_local_stack_stops_its_servers(signum: int) -> None:
    process = start([sys.executable, "-m", "agentscope_serverless.local_stack"])
    try:
        lines = read_until(process, lambda line: line.startswith("# local stack running"))
    except BaseException:
        process.kill()
        raise
    banner = lines[-1]
    env = dict(line.removeprefix("export ").strip().split("=", 1) for line in lines[:-1])
    redis_port = env["REDIS_URL"].rsplit(":", 1)[1].split("/")[0]
    dynamodb_port = env["DYNAMODB_ENDPOINT_URL"].rsplit(":", 1)[1]
    assert f"Redis on 127.0.0.1:{redis_port}" in banner
    assert f"DynamoDB on 127.0.0.1:{dynamodb_port}" in banner
    assert httpx.get(env["DYNAMODB_ENDPOINT_URL"] + "/moto-api/").status_code == 200
    _, stderr = stop_and_check(process, signum, minimum_children=2)
    assert "starting redis-server" in stderr and "creating the DynamoDB tables" in stderr


def test_the_local_stack_help_starts_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentscope_serverless.local_stack", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "usage:" in done.stdout and "export" not in done.stdout
    assert "starting" not in done.stderr


async def _use_a_sandbox(url: str) -> None:
    async with SandboxService(url, TOKEN) as sandboxes:
        [box] = await sandboxes.connect_async("signals", "user")
        result = await box.run_ipython_cell_async("print(6 * 7)")
        assert "42" in result["content"][0]["text"]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_sandbox_server_stops_its_sandboxes(signum: int) -> None:
    require_sandbox_tools()
    # Not under pytest's own temp dir: the sandbox uid must be able to reach the workspaces.
    root = Path(tempfile.mkdtemp(prefix="sandbox-signals-"))
    root.chmod(0o711)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "agentscope_serverless.sandbox_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--root",
        str(root / "data"),
    ]
    process = start(command, SANDBOX_SERVER_TOKEN=TOKEN)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        asyncio.run(_use_a_sandbox(url))
    except BaseException:
        process.kill()
        raise
    try:
        stop_and_check(process, signum, minimum_children=0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_the_local_server_on_the_stack_stops_cleanly(signum: int) -> None:
    port = free_port()
    process = start([SCRIPT, "serve", "--stack", "--port", str(port), "--log-level", "warning"])
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
    except BaseException:
        process.kill()
        raise
    stdout, stderr = stop_and_check(process, signum, minimum_children=2)
    assert "starting redis-server" in stdout + stderr


HANGING_AGENT = """
import pathlib
import time

from agentscope_serverless.app.agent_app import AgentApp

app = AgentApp(app_name="hanging")


def hang(what):
    pathlib.Path(__file__).with_name("started").write_text(what)
    time.sleep(600)


@app.task("/jobs/hang")
def task(payload):
    hang("task")


@app.query(framework="text")
def query(self, msgs, **kwargs):
    hang("query")
    yield "never"


@app.endpoint("/stream", methods=["GET"])
def stream():
    hang("stream")
    yield "never"


@app.endpoint("/plain", methods=["GET"])
def plain():
    hang("plain")
"""

# What starts each plain function that never returns: a request (method, path, JSON body).
HANGING = {
    "task": ("POST", "/jobs/hang", {}),
    "query": ("POST", "/process", {"input": [{"role": "user", "content": "hi"}]}),
    "stream": ("GET", "/stream", None),
    "plain": ("GET", "/plain", None),
}


def _send(port: int, key: str, method: str, path: str, body: object) -> socket.socket:
    """A connection that sent the request, its answer left unread."""
    data = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(head.encode() + data)
    return connection


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("work", "signum"),
    [
        ("task", signal.SIGTERM),
        ("task", signal.SIGINT),
        ("query", signal.SIGINT),
        ("stream", signal.SIGINT),
        ("plain", signal.SIGINT),
    ],
    ids=lambda value: signal.Signals(value).name if isinstance(value, int) else value,
)
def test_the_local_server_exits_while_a_plain_function_never_returns(
    tmp_path: Path, work: str, signum: int
) -> None:
    (tmp_path / "hanging.py").write_text(HANGING_AGENT)
    port = free_port()
    output = tmp_path / "output.txt"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--port", str(port), "--agent", "hanging:app", "--no-web"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=terminal_signals,
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        key = next(line for line in output.read_text().splitlines() if line.startswith("ask_"))
        with _send(port, key, *HANGING[work]):
            _wait_for((tmp_path / "started").exists, f"the start of the {work}")
            process.send_signal(signum)
            if work != "task":
                # A request in progress is waited for until a second Ctrl-C (uvicorn's way).
                _wait_for(lambda: "Waiting for connections" in output.read_text(), "the wait")
                process.send_signal(signum)
            # The function's thread goes on (nothing can stop it): the process exits all the
            # same, without waiting for it.
            process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert "Finished server process" in output.read_text()


STUBBORN_AGENT = """
import asyncio
import pathlib

from agentscope_serverless.app.agent_app import AgentApp

app = AgentApp(app_name="stubborn")


async def ignore_cancellation(what):
    pathlib.Path(__file__).with_name("started").write_text(what)
    while True:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            pass


@app.task("/jobs/stubborn")
async def task(payload):
    await ignore_cancellation("task")


@app.query(framework="text")
async def query(self, msgs, **kwargs):
    yield "started"
    await ignore_cancellation("query")
"""


@pytest.mark.parametrize(("work", "signals"), [("task", 1), ("task", 2), ("query", 1)])
def test_the_local_server_exits_while_a_coroutine_ignores_its_cancellation(
    tmp_path: Path, work: str, signals: int
) -> None:
    # asyncio.run waited for the abandoned coroutine to end, however long: the process never
    # exited, a second SIGTERM neither.
    (tmp_path / "stubborn.py").write_text(STUBBORN_AGENT)
    port = free_port()
    output = tmp_path / "output.txt"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--port", str(port), "--agent", "stubborn:app", "--no-web"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "POWERTOOLS_LOG_LEVEL": "WARNING"},
            start_new_session=True,
            preexec_fn=terminal_signals,
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        key = next(line for line in output.read_text().splitlines() if line.startswith("ask_"))
        request = ("POST", "/jobs/stubborn", {}) if work == "task" else HANGING["query"]
        with _send(port, key, *request):
            _wait_for((tmp_path / "started").exists, f"the start of the {work}")
            for _ in range(signals):
                process.send_signal(signal.SIGTERM)
            process.wait(timeout=45)
    finally:
        process.kill()
        process.wait()
    logged = output.read_text()
    assert "Finished server process" in logged
    left = next(line for line in logged.splitlines() if "were left behind" in line)
    assert "stubborn.ignore_cancellation:" in left, left
