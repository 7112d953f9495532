"""The sandbox server as a program: start-up checks, the token, idle reaping."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentscope_serverless.errors import SandboxNotFoundError, SandboxUnavailableError
from agentscope_serverless.services.sandbox import SandboxClient, SandboxService
from tests.sandbox.conftest import (
    TOKEN,
    RunningServer,
    free_port,
    require_sandbox_tools,
    start_server,
    stop_server,
)
from tests.support.http import closed_by_the_server

SERVER = [sys.executable, "-m", "agentscope_serverless.sandbox_server"]


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sandbox-program-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def run_briefly(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=20)


def test_the_server_refuses_to_start_without_a_token(scratch: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_SERVER_TOKEN"}
    done = run_briefly([*SERVER, "--port", str(free_port()), "--root", str(scratch)], env)
    assert done.returncode == 2
    assert "no bearer token" in done.stderr


@pytest.mark.parametrize("seconds", ["0", "nan", "inf"])
def test_the_server_refuses_a_header_timeout_that_is_no_finite_positive_number(
    scratch: Path, seconds: str
) -> None:
    # "inf" turned the limit off, unsaid: half-sent requests held connections forever again.
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN}
    args = ["--port", str(free_port()), "--root", str(scratch), "--header-timeout", seconds]
    done = run_briefly([*SERVER, *args], env)
    assert done.returncode == 2
    assert f"{seconds!r} is not a finite number of seconds above 0" in done.stderr


@pytest.mark.parametrize(
    ("option", "value", "wanted"),
    [
        ("--call-timeout", "inf", "a finite number of seconds above 0"),
        ("--call-timeout", "0", "a finite number of seconds above 0"),
        ("--idle-timeout", "nan", "a finite number of seconds above 0"),
        ("--idle-timeout", "-1", "a finite number of seconds above 0"),
        ("--cpus", "-1", "a finite number of CPUs, 0 or more"),
        ("--cpus", "nan", "a finite number of CPUs, 0 or more"),
        ("--cpus", "inf", "a finite number of CPUs, 0 or more"),
        ("--memory-mb", "-1", "a whole number, 0 or more"),
        ("--max-tasks", "-5", "a whole number, 0 or more"),
        ("--file-size-mb", "-1", "a whole number, 0 or more"),
        ("--cpu-seconds", "0", "a whole number, 1 or more"),
        ("--max-sandboxes", "0", "a whole number, 1 or more"),
        ("--max-sandboxes-per-owner", "-3", "a whole number, 1 or more"),
        ("--max-output-bytes", "0", "a whole number, 1 or more"),
        ("--max-processes", "x", "a whole number, 1 or more"),
    ],
)
def test_the_server_refuses_a_limit_out_of_its_range_naming_it(
    scratch: Path, option: str, value: str, wanted: str
) -> None:
    # A negative --cpus was a negative CFS quota, which cgroup v1 reads as no limit at all;
    # nan and inf failed every sandbox creation; a timeout of inf never reaped or cut a call.
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN}
    args = ["--port", str(free_port()), "--root", str(scratch), option, value]
    done = run_briefly([*SERVER, *args], env)
    assert done.returncode == 2
    assert f"argument {option}: {value!r} is not {wanted}" in done.stderr


def test_the_server_refuses_a_short_token(scratch: Path) -> None:
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": "short"}
    done = run_briefly([*SERVER, "--port", str(free_port()), "--root", str(scratch)], env)
    assert done.returncode == 2
    assert "at least 16 characters" in done.stderr
    assert "short" not in done.stderr.replace("at least", "")


def test_dev_mode_makes_a_random_token_and_prints_it(scratch: Path) -> None:
    require_sandbox_tools()
    env = {k: v for k, v in os.environ.items() if k != "SANDBOX_SERVER_TOKEN"}
    port = free_port()
    process = subprocess.Popen(
        [*SERVER, "--dev", "--port", str(port), "--root", str(scratch / "data")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        token = line.rsplit(" ", 1)[-1].strip()
        assert line.startswith("sandbox server bearer token (dev mode):") and len(token) >= 32
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        body = {"session_ctx_id": "s"}
        assert httpx.post(f"{url}/get_session_mapping", json=body).status_code == 401
        authorized = {"Authorization": f"Bearer {token}"}
        reply = httpx.post(f"{url}/get_session_mapping", json=body, headers=authorized)
        assert reply.json() == {"data": []}
    finally:
        process.terminate()
        process.wait(10)


def test_the_server_says_how_to_install_a_missing_bubblewrap(scratch: Path) -> None:
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN, "PATH": str(scratch)}
    done = run_briefly([*SERVER, "--port", str(free_port()), "--root", str(scratch)], env)
    assert done.returncode == 2
    assert "apt-get install -y bubblewrap" in done.stderr


# bubblewrap before 0.8.0: everything but --disable-userns.
OLD_BWRAP = """#!/bin/sh
for option; do
    if [ "$option" = --disable-userns ]; then
        echo "bwrap: Unknown option --disable-userns" >&2
        exit 1
    fi
done
exec BWRAP "$@"
"""


def test_a_server_not_run_as_root_says_its_sandboxes_share_its_uid_quotas(scratch: Path) -> None:
    # One sandbox holding every inotify instance of the uid (a per-uid kernel quota) made
    # inotify_init fail in every other sandbox and in the server's uid, and nothing said so.
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare is missing: apt-get install -y util-linux"
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN}
    args = ["--port", str(free_port()), "--root", str(scratch / "root"), "--weaker-isolation"]
    # A user namespace of its own: the server's uid is not 0 there (it is not root).
    server = subprocess.Popen(
        [unshare, "--user", "--", *SERVER, *args],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stderr is not None
        said = []
        for line in server.stderr:
            said.append(line)
            if "Started server process" in line:
                break
    finally:
        server.terminate()
        server.wait(20)
    warning = next(line for line in said if "per-uid kernel quotas" in line)
    assert warning.startswith("agentscope-sandbox-server: not run as root, every sandbox runs")
    assert "(inotify instances and watches, among others)" in warning
    assert "shared between sandboxes and with the server" in warning


def test_a_bubblewrap_older_than_0_8_stops_the_server_unless_weaker(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_sandbox_tools()
    programs = scratch / "bin"
    programs.mkdir(mode=0o755)
    old_bwrap = programs / "bwrap"
    old_bwrap.write_text(OLD_BWRAP.replace("BWRAP", str(shutil.which("bwrap"))))
    old_bwrap.chmod(0o755)
    monkeypatch.setenv("PATH", f"{programs}:{os.environ['PATH']}")
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN}
    refused = run_briefly([*SERVER, "--port", str(free_port()), "--root", str(scratch)], env)
    assert refused.returncode == 2
    assert "NOT enforced: no nested user namespaces" in refused.stderr
    assert "install bubblewrap 0.8.0 or later" in refused.stderr
    assert "per-uid kernel quotas" not in refused.stderr  # as root each sandbox has its uid
    server = start_server(scratch / "weaker", "--weaker-isolation")
    try:
        health = httpx.get(f"{server.url}/health").json()
        assert health["not_enforced"] == ["no nested user namespaces"]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        sandbox_id = httpx.post(
            f"{server.url}/create_from_pool", json={"sandbox_type": "base"}, headers=headers
        ).json()["data"]
        ran = httpx.post(
            f"{server.url}/call_tool",
            json={
                "identity": sandbox_id,
                "tool_name": "run_shell_command",
                "arguments": {"command": "unshare -U true && echo unshared"},
            },
            headers=headers,
            timeout=30,
        ).json()["data"]
        # As /health says, bwrap does not stop it; the system call filter refuses unshare(2)
        # all the same (not clone(2) making one, which --disable-userns stops too).
        assert "unshared" not in ran["content"][0]["text"]
        assert "Operation not permitted" in json.dumps(ran["content"])
    finally:
        stop_server(server)


def test_only_the_protocol_operations_exist(scratch: Path) -> None:
    server = start_server(scratch)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/docs", "/openapi.json", "/run_command", "/desktop/x"):
            assert httpx.post(f"{server.url}{path}", json={}, headers=headers).status_code in (
                404,
                405,
            )
        for path in ("/cleanup", "/cleanup_async"):
            refused = httpx.post(f"{server.url}{path}", json={}, headers=headers)
            assert refused.status_code == 403
            assert "release your own" in refused.json()["detail"]
        reply = httpx.post(
            f"{server.url}/create_from_pool",
            json={"sandbox_type": "base", "mount_dir": "/root"},
            headers=headers,
        )
        assert reply.status_code == 422
        assert isinstance(reply.json()["detail"], str)
    finally:
        stop_server(server)


def test_a_client_sending_half_a_request_head_is_cut_off(scratch: Path) -> None:
    # Connections that sent half a request line, or nothing, were held open for as long as
    # their client wanted, each taking one of the server's file descriptors.
    server = start_server(scratch, "--header-timeout", "0.5")
    address = ("127.0.0.1", server.port)
    try:
        with socket.create_connection(address) as half_line:
            half_line.sendall(b"POST /create_from_po")
            assert closed_by_the_server(half_line)
        with socket.create_connection(address) as silent:
            assert closed_by_the_server(silent)
        with socket.create_connection(address) as kept_alive:
            kept_alive.sendall(b"GET /health HTTP/1.1\r\nHost: sandbox\r\n\r\n")
            answer = kept_alive.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200")
            kept_alive.sendall(b"POST /release HTTP/1.1\r\nHost: sandbox\r\n")
            assert closed_by_the_server(kept_alive)
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        stop_server(server)


def test_a_client_answered_before_its_body_is_sent_is_cut_off(scratch: Path) -> None:
    # A request head and one byte of its body, without a token: the 401 came at once, then
    # the connection stayed open, idle, for as long as the client wanted (no head or
    # keep-alive timeout applied); a few hundred such clients took every file descriptor.
    server = start_server(scratch)
    address = ("127.0.0.1", server.port)
    head = b"POST /call_tool HTTP/1.1\r\nHost: sandbox\r\nContent-Length: 100000\r\n\r\n"
    try:
        with socket.create_connection(address) as trickling:
            trickling.sendall(head)
            time.sleep(0.3)
            trickling.sendall(b"a")
            answer = trickling.recv(4096)
            assert answer.startswith(b"HTTP/1.1 401")
            assert b"connection: close" in answer.lower()
            started = time.monotonic()
            assert closed_by_the_server(trickling)
            assert time.monotonic() - started < 10
        # A client still sending its body when answered reads the answer: the connection is
        # not reset under it.
        with socket.create_connection(address) as uploading:
            uploading.sendall(head)
            uploading.sendall(b"a" * 100000)
            reply = b""
            while chunk := uploading.recv(4096):
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 401"), reply
            assert b"missing or invalid bearer token" in reply
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        stop_server(server)


def test_a_request_body_that_stops_arriving_is_cut_off_and_a_slow_one_is_not(
    scratch: Path,
) -> None:
    # A body that stopped arriving held its connection forever, token or not.
    server = start_server(scratch, "--body-timeout", "0.5")
    address = ("127.0.0.1", server.port)
    body = b'{"identity": "no-such-sandbox"}'
    head = (
        b"POST /get_info HTTP/1.1\r\nHost: sandbox\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    try:
        with socket.create_connection(address) as stalled:
            stalled.sendall(head + body[:5])
            started = time.monotonic()
            assert closed_by_the_server(stalled)
            assert time.monotonic() - started < 10
        with socket.create_connection(address) as slow:
            slow.sendall(head)
            for byte in range(0, len(body), 4):  # 2.4 s in all, 0.3 s at most between parts
                time.sleep(0.3)
                slow.sendall(body[byte : byte + 4])
            slow.settimeout(10)
            answer = slow.recv(4096)
            assert answer.startswith(b"HTTP/1.1 404"), answer
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        stop_server(server)


async def test_idle_sandboxes_are_reaped_and_leave_the_session_mapping(scratch: Path) -> None:
    server = start_server(scratch, "--idle-timeout", "1")
    try:
        async with SandboxService(server.url, server.token) as service:
            [box] = await service.connect_async("idle-session")
            await box.run_ipython_cell_async("1")
            client = service.client
            directory = server.root / "sandboxes" / box.sandbox_id
            for _ in range(50):  # the reaper runs every 0.5 s here
                if not await client.get_session_mapping("idle-session") and not directory.exists():
                    break
                await asyncio.sleep(0.2)
            assert await client.get_session_mapping("idle-session") == []
            with pytest.raises(SandboxNotFoundError):
                await box.run_ipython_cell_async("1")
            assert not directory.exists()
    finally:
        stop_server(server)


def test_a_server_out_of_file_descriptors_says_so_and_leaves_nothing_behind(
    scratch: Path,
) -> None:
    # Clients holding every descriptor of the server: a create answered 500, left its
    # sandbox's directory behind, and each retry of accept() logged a hundred tracebacks.
    server = start_server(scratch, "--idle-timeout", "2", "--header-timeout", "4", open_files=64)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    held: list[socket.socket] = []
    try:
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
            assert client.get("/health").status_code == 200  # its connection is kept
            for _ in range(80):
                held.append(socket.create_connection(("127.0.0.1", server.port)))
            time.sleep(2.5)  # accepted until none is left, accept() retried twice
            refused = client.post("/create_from_pool", json={"sandbox_type": "base"})
            assert refused.status_code == 503, refused.text
            assert "out of resources (Too many open files)" in refused.json()["detail"]
            assert refused.headers["Retry-After"] == "10"
        for connection in held:
            connection.close()
        sandboxes = server.root / "sandboxes"
        deadline = time.monotonic() + 15
        while any(sandboxes.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(sandboxes.iterdir())
        made = httpx.post(
            f"{server.url}/create_from_pool", json={"sandbox_type": "base"}, headers=headers
        )
        assert made.status_code == 200, made.text
    finally:
        for connection in held:
            connection.close()
        stop_server(server)
    log = server.log.read_text()
    assert len(log.splitlines()) < 30, log[-3000:]
    assert "cannot accept connections: [Errno 24] Too many open files" in log


def test_a_root_the_sandbox_user_cannot_reach_stops_the_server(scratch: Path) -> None:
    private = scratch / "private"
    private.mkdir(mode=0o700)
    env = {**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN}
    done = run_briefly([*SERVER, "--port", str(free_port()), "--root", str(private / "data")], env)
    assert done.returncode != 0
    assert "is not searchable by others" in done.stderr


async def test_without_a_base_url_the_service_runs_an_embedded_server() -> None:
    service = SandboxService()
    async with service:
        assert await service.health() is True
        [box] = await service.connect_async("local", "me")
        await box.run_ipython_cell_async("answer = 42")
        assert (await box.run_ipython_cell_async("answer"))["content"][0]["text"] == "42\n"
        [again] = service.connect("local", "me")
        assert again.sandbox_id == box.sandbox_id
        embedded = service._embedded
        assert embedded is not None
        socket_path = embedded.socket_path
        assert await asyncio.to_thread(os.path.exists, socket_path)
    assert not await asyncio.to_thread(os.path.exists, os.path.dirname(socket_path))
    assert await service.health() is False


async def test_a_call_in_flight_when_the_server_is_terminated_gets_a_503_saying_so(
    scratch: Path,
) -> None:
    server = start_server(scratch)
    try:
        async with SandboxService(server.url, server.token) as service:
            [box] = await service.connect_async("terminated")
            running = asyncio.create_task(box.run_shell_command_async("sleep 30"))
            await asyncio.sleep(0.5)
            started = time.perf_counter()
            server.process.terminate()
            with pytest.raises(SandboxUnavailableError, match="503 the sandbox server is shut"):
                await running
            assert time.perf_counter() - started < 4
            await asyncio.to_thread(server.process.wait, 10)  # it exits, with its signal
    finally:
        stop_server(server)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (a sandbox's orphans are its PID 1's children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # The name in parentheses may hold spaces: the parent comes after it.
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found: set[int] = set()
    level = [pid]
    while level:
        level = [child for parent in level for child in children.get(parent, [])]
        found.update(level)
    return found


def leave_a_call(server: RunningServer, sandbox_id: str, tool: str, arguments: object) -> set[int]:
    """Send a call on a connection of its own and close it once the call is under way (it
    wrote /workspace/started); the server's processes just before closing."""
    body = json.dumps({"identity": sandbox_id, "tool_name": tool, "arguments": arguments})
    started = server.root / "sandboxes" / sandbox_id / "workspace" / "started"
    with socket.create_connection(("127.0.0.1", server.port)) as connection:
        connection.sendall(
            (
                "POST /call_tool HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {server.token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline, "the call did not start"
            time.sleep(0.05)
        return descendants(server.process.pid)


# Each writes /workspace/started once under way, then holds the sandbox far past the test's
# deadlines: asleep in the interpreter, or in processes of its own (which wrote
# /workspace/child-*) that ignore SIGTERM and leave its session.
HOLDING_CALLS = {
    "a sleeping cell": (
        "run_ipython_cell",
        {"code": "import time\nopen('/workspace/started', 'w').close()\ntime.sleep(600)"},
    ),
    "a cell forking children that ignore SIGTERM": (
        "run_ipython_cell",
        {
            "code": "import glob, os, signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "for _ in range(3):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        if os.fork() == 0:\n"
            "            open(f'/workspace/child-{os.getpid()}', 'w').close()\n"
            "            time.sleep(600)\n"
            "        os._exit(0)\n"
            "while len(glob.glob('/workspace/child-*')) < 3:\n"
            "    time.sleep(0.01)\n"
            "open('/workspace/started', 'w').close()\n"
            "time.sleep(600)"
        },
    ),
    "a command whose processes ignore SIGTERM": (
        "run_shell_command",
        {
            "command": "trap '' TERM; "
            "(setsid sh -c 'touch /workspace/child-1; exec sleep 600' & sleep 600) & "
            "until [ -e /workspace/child-1 ]; do sleep 0.01; done; "
            "touch /workspace/started; sleep 600"
        },
    ),
}


@pytest.fixture(scope="module")
def patient_server() -> Iterator[RunningServer]:
    """A server whose calls may run 10 minutes: far longer than a test waits."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-program-"))
    root.chmod(0o711)
    server = start_server(root, "--call-timeout", "600")
    yield server
    stop_server(server)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("holding", HOLDING_CALLS.values(), ids=list(HOLDING_CALLS))
async def test_a_call_whose_client_leaves_while_it_runs_is_stopped_and_frees_the_sandbox(
    patient_server: RunningServer, holding: tuple[str, dict[str, str]]
) -> None:
    server = patient_server
    async with SandboxService(server.url, server.token) as service:
        [box] = await service.connect_async("leaving")
        try:
            await box.run_ipython_cell_async("kept = 1")
            running = await asyncio.to_thread(leave_a_call, server, box.sandbox_id, *holding)
            assert running, "the call runs in no process of the server"
            deadline = time.monotonic() + 30  # far within the call's time limit (600 s)
            while descendants(server.process.pid):
                assert time.monotonic() < deadline, "the call's processes outlived its client"
                await asyncio.sleep(0.1)
            # The sandbox stays, free: the next call runs at once in a fresh interpreter.
            assert await service.client.get_status(box.sandbox_id) == "running"
            impatient = SandboxClient(server.url, server.token, timeout=30)
            try:
                result = await impatient.call_tool(
                    box.sandbox_id,
                    "run_ipython_cell",
                    {"code": "print(6 * 7, globals().get('kept'))"},
                )
            finally:
                await impatient.aclose()
            assert result.part("stdout") == "42 None\n"
            assert result.isError is False
        finally:
            await service.release_async("leaving")
