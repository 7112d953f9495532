"""Hostile code against real sandboxes: secrets, totals, freezing, release races, shares,
kernel quotas counted per user.

These need what the server needs to enforce totals (root, cgroups, loop devices); on a host
without them the server refuses to start and the fixture fails saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.errors import (
    ConfigurationError,
    SandboxCapacityError,
    SandboxQuotaError,
)
from agentscope_serverless.sandbox_server.isolation import FIRST_HOST_UID, Toolchain
from agentscope_serverless.sandbox_server.jail import (
    CPU,
    DISK,
    FREEZE,
    MEMORY,
    NO_USERNS,
    PROCESSES,
    SYSCALLS,
    Cgroups,
    HostIsolation,
)
from agentscope_serverless.sandbox_server.manager import SandboxManager, ServerConfig
from agentscope_serverless.services.sandbox import SandboxService
from agentscope_serverless.services.sandbox.client import SandboxClient
from tests.support.sandbox_server import (
    RunningServer,
    proc_scan_code,
    start_server,
    stop_server,
)

CANARY = "canary-" + "c4n4ry" * 4
INOTIFY_QUOTA = "/proc/sys/fs/inotify/max_user_instances"
MiB = 1024**2


def stdout(result: Any) -> str:
    if not isinstance(result, dict):
        result = result.model_dump()
    return "".join(p["text"] for p in result["content"] if p.get("description") == "stdout")


@pytest.fixture(scope="module")
def hardened() -> Iterator[RunningServer]:
    """A server with the default 1 GiB memory total, a 128 MiB workspace, a canary in its
    environment, and small shares (3 sandboxes, 2 per owner)."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-isolation-"))
    os.environ["SANDBOX_TEST_CANARY"] = CANARY
    try:
        server = start_server(
            root,
            "--workspace-mb",
            "128",
            "--call-timeout",
            "30",
            "--max-sandboxes",
            "3",
            "--max-sandboxes-per-owner",
            "2",
        )
    finally:
        del os.environ["SANDBOX_TEST_CANARY"]
    yield server
    stop_server(server)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def client(hardened: RunningServer) -> AsyncIterator[SandboxClient]:
    client = SandboxClient(hardened.url, hardened.token, timeout=60)
    yield client
    await client.aclose()


async def _cell(client: SandboxClient, sandbox_id: str, code: str) -> Any:
    return await client.call_tool(sandbox_id, "run_ipython_cell", {"code": code})


async def _health(url: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"{url}/health")


async def test_no_token_canary_or_host_path_readable_anywhere_in_the_sandbox(
    client: SandboxClient, hardened: RunningServer
) -> None:
    sandbox_id = await client.create_from_pool("base", {})
    try:
        words = [hardened.token, CANARY, str(hardened.root)]
        report = json.loads(stdout(await _cell(client, sandbox_id, proc_scan_code(words))))
        assert report["hits"] == []
        assert 1 in report["pids"]  # its PID 1, whose environ was once the server's
    finally:
        await client.release(sandbox_id)
    # The server removed its token from its own environment after reading it.
    environ = await asyncio.to_thread(Path(f"/proc/{hardened.process.pid}/environ").read_bytes)
    assert hardened.token.encode() not in environ


async def test_embedded_server_gets_none_of_the_apps_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLM_API_KEY", CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY + "-aws")
    async with SandboxService() as service:
        embedded = service._embedded
        assert embedded is not None and embedded._process is not None
        server_environ = await asyncio.to_thread(
            Path(f"/proc/{embedded._process.pid}/environ").read_bytes
        )
        assert CANARY.encode() not in server_environ
        assert embedded.token.encode() not in server_environ
        [box] = await service.connect_async("canary-session", "u1")
        report = json.loads(
            stdout(await box.run_ipython_cell_async(proc_scan_code([CANARY, embedded.token])))
        )
        assert report["hits"] == []


async def test_processes_together_stay_within_the_memory_total(
    client: SandboxClient, hardened: RunningServer
) -> None:
    sandbox_id = await client.create_from_pool("base", {})
    try:
        code = r"""
import subprocess
child = (
    "import time\n"
    "b = bytearray(500 * 1024 * 1024)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "print('granted', flush=True)\n"
    "time.sleep(3)\n"
)
run = ["python3", "-c", child]
out, err = subprocess.PIPE, subprocess.DEVNULL
procs = [subprocess.Popen(run, stdout=out, stderr=err) for _ in range(6)]
granted = sum(p.communicate()[0].count(b"granted") for p in procs)
print(granted)
"""
        granted = int(stdout(await _cell(client, sandbox_id, code)).strip() or 0)
        assert granted < 6
        assert (await _health(hardened.url)).json()["status"] in ("ok", "full")
    finally:
        await client.release(sandbox_id)


@pytest.mark.parametrize("directory", ["/tmp", "/workspace"])
async def test_writing_4_gib_stops_at_the_cap_with_an_error(
    client: SandboxClient, hardened: RunningServer, directory: str
) -> None:
    sandbox_id = await client.create_from_pool("base", {})
    try:
        # 4 GiB in 64 files of 64 MiB (the file size limit): the first failure ends it.
        code = f"""
import os
written, error = 0, None
chunk = b"x" * (1024 * 1024)
try:
    for n in range(64):
        with open("{directory}/fill-%d" % n, "wb") as handle:
            for _ in range(64):
                handle.write(chunk)
                written += len(chunk)
except OSError as exc:
    error = exc.strerror
print(written // (1024 * 1024), error)
"""
        written_mib, error = stdout(await _cell(client, sandbox_id, code)).split(maxsplit=1)
        assert "No space left on device" in error
        assert int(written_mib) <= 512  # the workspace cap (128) or /tmp (half of 1 GiB)
        follow = await _cell(client, sandbox_id, "print('still here')")
        assert stdout(follow) == "still here\n"
        assert (await _health(hardened.url)).status_code == 200
    finally:
        await client.release(sandbox_id)


async def test_each_sandbox_runs_as_a_host_uid_of_its_own(
    client: SandboxClient, hardened: RunningServer
) -> None:
    sandbox_ids = [await client.create_from_pool("base", {}) for _ in range(2)]
    try:
        owners = []
        for sandbox_id in sandbox_ids:
            inside = await client.call_tool(
                sandbox_id, "run_shell_command", {"command": "touch mine; id -u"}
            )
            assert stdout(inside) == "65534\n"
            mine = hardened.root / "sandboxes" / sandbox_id / "workspace" / "mine"
            owners.append((await asyncio.to_thread(mine.stat)).st_uid)
        assert len(set(owners)) == 2
        assert all(FIRST_HOST_UID <= owner < FIRST_HOST_UID + 3 for owner in owners)
    finally:
        for sandbox_id in sandbox_ids:
            await client.release(sandbox_id)


async def test_no_other_host_user_reads_a_sandboxs_files_through_its_disk_image(
    client: SandboxClient, hardened: RunningServer
) -> None:
    # /proc/mounts tells every host user where each workspace's image is.
    sandbox_id = await client.create_from_pool("base", {})
    try:
        await client.call_tool(sandbox_id, "write_file", {"path": "notes.txt", "content": CANARY})
        await client.call_tool(sandbox_id, "run_shell_command", {"command": "sync"})
        image = hardened.root / "sandboxes" / sandbox_id / "workspace.img"
        mounts = await asyncio.to_thread(Path("/proc/mounts").read_text)
        assert str(image.parent / "workspace") in mounts
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        for path in (image, hardened.root / "template" / "workspace.img"):
            read = await asyncio.to_thread(
                subprocess.run,
                [*as_nobody, "grep", "-c", CANARY, str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
            assert "Permission denied" in read.stderr, (path, read)
        found = await asyncio.to_thread(
            subprocess.run, ["grep", "-c", CANARY, str(image)], capture_output=True, check=False
        )
        assert found.returncode == 0  # the secret is there, for root only
    finally:
        await client.release(sandbox_id)


async def test_the_environment_a_sandbox_is_created_with_is_in_no_command_line(
    client: SandboxClient,
) -> None:
    # Every host user reads every process's command line (ps); like the server's token, a
    # secret given to a sandbox must not be there.
    sandbox_id = await client.create("base", environment={"API_KEY": CANARY, "BIG": "x" * 30_000})
    try:
        seen = await client.call_tool(
            sandbox_id, "run_shell_command", {"command": "echo $API_KEY ${#BIG}"}
        )
        assert stdout(seen) == f"{CANARY} 30000\n"

        def command_lines() -> list[bytes]:
            lines = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                with contextlib.suppress(OSError):
                    lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            return lines

        assert not [
            line for line in await asyncio.to_thread(command_lines) if CANARY.encode() in line
        ]
    finally:
        await client.release(sandbox_id)


async def test_a_sandbox_using_up_a_per_user_kernel_quota_leaves_the_others_theirs(
    client: SandboxClient,
) -> None:
    greedy, other = [await client.create_from_pool("base", {}) for _ in range(2)]
    take_all = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "held = []\n"
        "while (fd := libc.inotify_init1(0)) >= 0:\n"
        "    held.append(fd)\n"
        "print(len(held))\n"
    )
    # The kernel counts inotify instances per user (128 by default, within a sandbox's 256
    # descriptors).
    quota = int(await asyncio.to_thread(Path(INOTIFY_QUOTA).read_text))
    try:
        assert int(stdout(await _cell(client, greedy, take_all))) == quota
        watched = await client.call_tool(
            other, "run_shell_command", {"command": "touch f; timeout 1 tail -f f"}
        )
        assert "inotify cannot be used" not in json.dumps(watched.model_dump())
        assert int(stdout(await _cell(client, other, take_all))) == quota
    finally:
        await client.release(greedy)
        await client.release(other)


async def test_nothing_runs_between_calls(client: SandboxClient, hardened: RunningServer) -> None:
    sandbox_id = await client.create_from_pool("base", {})
    tick = hardened.root / "sandboxes" / sandbox_id / "workspace" / "tick"
    try:
        started = """
import threading, time, subprocess
def loop():
    n = 0
    while True:
        n += 1
        with open("/workspace/tick", "w") as handle:
            handle.write(str(n))
        time.sleep(0.01)
threading.Thread(target=loop, daemon=True).start()
shell = "while true; do date +%s%N >> /workspace/shell-tick; sleep 0.01; done"
subprocess.Popen(["sh", "-c", shell])
time.sleep(0.5)
"""
        await _cell(client, sandbox_id, started)
        before = (tick.read_text(), tick.with_name("shell-tick").read_text())
        await asyncio.sleep(1.5)
        after = (tick.read_text(), tick.with_name("shell-tick").read_text())
        assert before == after
        # The next call resumes them.
        await _cell(client, sandbox_id, "import time; time.sleep(0.5)")
        assert tick.read_text() != after[0]
    finally:
        await client.release(sandbox_id)


def _jail_pids(server_pid: int) -> list[int]:
    """Processes in the server's sandbox cgroups, or bwrap children of the server."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroups = (entry / "cgroup").read_text()
            status = (entry / "status").read_text()
        except OSError:
            continue
        parent = next(
            (line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), ""
        )
        if f"agentscope-sandbox-{server_pid}/" in cgroups or parent == str(server_pid):
            found.append(int(entry.name))
    return found


def _bwrap_uids_of_children(parent: int) -> set[int]:
    uids = set()
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if command.startswith(b"/usr/bin/bwrap\0") and fields["PPid"].strip() == str(parent):
            uids.add(int(fields["Uid"].split()[0]))
    return uids


def _leftovers(server_pid: int, sandbox_id: str) -> list[str]:
    """Mounts, processes and cgroups left by a server (its cgroups sit below this test's)."""
    found = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    found = [line for line in found if sandbox_id in line]
    found += [f"pid {pid}" for pid in _jail_pids(server_pid)]
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        hierarchy = Path("/sys/fs/cgroup")
        if controllers:
            hierarchy /= controllers.split(",")[0]
        parent = hierarchy / path.lstrip("/") / f"agentscope-sandbox-{server_pid}"
        if parent.exists():
            found.append(str(parent))
    return found


@pytest.fixture
def cpu_burners() -> Iterator[None]:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for burner in burners:
        burner.kill()
        burner.wait()


async def test_200_create_release_pairs_in_random_order_under_load_leave_nothing(
    tmp_path: Path, cpu_burners: None
) -> None:
    root = Path(tempfile.mkdtemp(prefix="sandbox-races-"))
    # Small memory limits: 25 sandboxes at once fit a host of a few GiB.
    server = start_server(
        root, "--workspace-mb", "16", "--max-sandboxes", "64", "--memory-mb", "128"
    )
    durations: list[float] = []
    rng = random.Random(10)
    client = SandboxClient(server.url, server.token, timeout=60)

    async def pair(number: int) -> None:
        sandbox_id = await client.create_from_pool("base", {"session_ctx_id": f"s{number}"})
        mode = rng.choice(["now", "starting", "calling", "twice", "after-call"])
        call = None
        if mode == "starting":
            await asyncio.sleep(rng.uniform(0, 0.2))
        elif mode in ("calling", "after-call"):
            call = asyncio.create_task(
                client.call_tool(sandbox_id, "run_shell_command", {"command": "sleep 20 & sleep 1"})
            )
            if mode == "after-call":
                await call
                call = None
            else:
                await asyncio.sleep(rng.uniform(0, 0.5))
        started = time.monotonic()
        if mode == "twice":
            await asyncio.gather(client.release(sandbox_id), client.release(sandbox_id))
        else:
            await client.release(sandbox_id)
        durations.append(time.monotonic() - started)
        if call is not None:
            await asyncio.gather(call, return_exceptions=True)

    try:
        pending = list(range(200))
        while pending:
            batch, pending = pending[:25], pending[25:]
            await asyncio.gather(*(pair(n) for n in batch))
        assert len(durations) == 200
        # No release waited for the background sleep of its call (20 s): each killed it.
        assert max(durations) < 20.0
        assert list((server.root / "sandboxes").iterdir()) == []
        assert _jail_pids(server.process.pid) == []
        assert (await _health(server.url)).json()["sandboxes"] == 0
        # Shutdown with sandboxes running mid-call: SIGTERM stops them all and exits.
        ids = [await client.create_from_pool("base", {}) for _ in range(3)]
        calls = [
            asyncio.create_task(client.call_tool(i, "run_shell_command", {"command": "sleep 30"}))
            for i in ids
        ]
        await asyncio.sleep(1.0)
        server.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(server.process.wait, 15)
        await asyncio.gather(*calls, return_exceptions=True)
        assert _jail_pids(server.process.pid) == []
        assert list((server.root / "sandboxes").iterdir()) == []
    finally:
        await client.aclose()
        stop_server(server)
        shutil.rmtree(root, ignore_errors=True)


async def test_one_user_fills_their_share_and_the_next_user_still_gets_a_sandbox(
    hardened: RunningServer,
) -> None:
    async with SandboxService(hardened.url, hardened.token) as service:
        await service.connect_async("a1", "alice")
        await service.connect_async("a2", "alice")
        with pytest.raises(SandboxQuotaError) as refused:
            await service.connect_async("a3", "alice")
        assert refused.value.code == "SANDBOX_QUOTA"
        await service.connect_async("b1", "bob")  # the third, last sandbox of the server
        health = (await _health(hardened.url)).json()
        assert (health["status"], health["sandboxes"], health["available"]) == ("full", 3, 0)
        with pytest.raises(SandboxCapacityError) as full:
            await service.connect_async("c1", "carol")
        assert full.value.code == "SANDBOX_CAPACITY"
        response = await asyncio.to_thread(
            httpx.post,
            f"{hardened.url}/create_from_pool",
            json={"sandbox_type": "base", "meta": {}},
            headers={"Authorization": f"Bearer {hardened.token}"},
        )
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) > 0
        assert response.json()["code"] == "SANDBOX_CAPACITY"
        for session, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob")):
            await service.release_async(session, user)


def test_a_chunked_body_past_the_cap_is_refused(hardened: RunningServer) -> None:
    head = (
        f"POST /call_tool HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {hardened.token}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b"%x\r\n%s\r\n" % (MiB, b" " * MiB)
    with socket.create_connection(("127.0.0.1", hardened.port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for _ in range(100):
                sock.sendall(chunk)
        except OSError:
            pass  # the server answered and closed before the 100 MiB were sent
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413")
    assert httpx.get(f"{hardened.url}/health").status_code == 200


@pytest.mark.parametrize("path", ["/call_tool", "/call_tool_async"])
def test_a_body_nesting_past_what_a_parser_follows_is_refused(
    hardened: RunningServer, path: str
) -> None:
    body = '{"sandbox_id": "x", "tool_name": "run_shell_command", "arguments": '
    body += "[" * 200_000 + "]" * 200_000 + "}"
    response = httpx.post(
        f"{hardened.url}{path}",
        content=body,
        headers={"Authorization": f"Bearer {hardened.token}", "Content-Type": "application/json"},
    )
    assert response.status_code in (400, 422), response.text
    assert "pars" in response.json()["detail"] or "not valid JSON" in response.json()["detail"]


async def test_a_bound_the_host_cannot_enforce_stops_the_server_unless_weaker() -> None:
    # Not under pytest's own temp dir: the sandbox uid must be able to reach the workspaces.
    tmp_path = Path(tempfile.mkdtemp(prefix="sandbox-weaker-"))
    os.chmod(tmp_path, 0o711)
    toolchain = Toolchain.find("/usr/bin/python3")
    # A host without cgroups or loop devices, whose bwrap is older than 0.8.0.
    nothing = HostIsolation(Cgroups(), None, None, disables_userns=False)
    strict = SandboxManager(ServerConfig(tmp_path / "strict"), toolchain, nothing)
    with pytest.raises(ConfigurationError) as refused:
        await strict.start()
    assert "memory, processes, cpu, freeze, workspace disk, no nested user" in str(refused.value)
    assert "bubblewrap 0.8.0 or later" in str(refused.value)
    assert "apt-get install libseccomp2" in str(refused.value)
    weaker = SandboxManager(
        ServerConfig(tmp_path / "weaker", weaker_isolation=True), toolchain, nothing
    )
    await weaker.start()
    try:
        health = weaker.health()
        assert health["enforced"] == []
        assert health["not_enforced"] == [MEMORY, PROCESSES, CPU, FREEZE, DISK, NO_USERNS, SYSCALLS]
        # Still jailed, as an unprivileged uid, only without what the host cannot enforce.
        sandbox_id = await weaker.create_from_pool("base", {})
        command = {"command": "sleep 1"}
        call = asyncio.create_task(weaker.call_tool(sandbox_id, "run_shell_command", command))
        await asyncio.sleep(0.5)
        owners = await asyncio.to_thread(_bwrap_uids_of_children, os.getpid())
        await call
        assert owners == {FIRST_HOST_UID if os.geteuid() == 0 else os.geteuid()}
    finally:
        await weaker.close()
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_sandbox_uids_a_host_user_holds_stop_the_server() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="sandbox-uids-"))
    os.chmod(tmp_path, 0o711)
    toolchain = Toolchain.find("/usr/bin/python3")
    nothing = HostIsolation(Cgroups(), None, None)
    # The range 65500-65563 holds nobody's uid, 65534.
    config = ServerConfig(tmp_path / "root", weaker_isolation=True, first_sandbox_uid=65500)
    manager = SandboxManager(config, toolchain, nothing)
    try:
        with pytest.raises(ConfigurationError, match=r"user nobody \(65534\)"):
            await manager.start()
    finally:
        await manager.close()
        shutil.rmtree(tmp_path, ignore_errors=True)


async def test_an_embedded_server_killed_leaves_nothing_once_its_service_stops() -> None:
    # Its root is a directory of its own, which no server starts on again to clean it.
    service = SandboxService()
    await service.start()
    embedded = service._embedded
    assert embedded is not None and embedded._process is not None
    directory, server = Path(embedded.socket_path).parent, embedded._process
    [box] = await service.connect_async("killed-embedded", "u1")
    await box.write_file_async("notes.txt", "x" * MiB)
    server.kill()
    await asyncio.to_thread(server.wait)
    await service.stop()  # the server is gone: nothing to release there
    assert not directory.exists()
    assert await asyncio.to_thread(_leftovers, server.pid, box.sandbox_id) == []


# An app using an embedded sandbox server: it prints the server's directory once its
# sandbox holds a file, then waits to be killed.
APP_WITH_AN_EMBEDDED_SERVER = """
import asyncio, pathlib
from agentscope_serverless.services.sandbox import SandboxService

async def main():
    service = SandboxService()
    await service.start()
    [box] = await service.connect_async("app-killed", "u1")
    await box.write_file_async("notes.txt", "x" * 1024)
    print(pathlib.Path(service._embedded.socket_path).parent, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_an_embedded_server_whose_app_is_killed_leaves_nothing() -> None:
    # The app never stops it: the server went, its directory (1 GiB workspace image, log,
    # socket) stayed in /tmp, one per crash.
    app = subprocess.Popen(
        [sys.executable, "-c", APP_WITH_AN_EMBEDDED_SERVER],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert app.stdout is not None
        directory = Path(app.stdout.readline().decode().strip())
        assert (directory / "root").is_dir()
    finally:
        app.kill()
        app.wait()
    deadline = time.monotonic() + 30
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not directory.exists()


async def test_a_server_killed_mid_call_leaves_nothing_once_restarted_on_its_root() -> None:
    root = Path(tempfile.mkdtemp(prefix="sandbox-crash-"))
    first = start_server(root, "--workspace-mb", "16")
    try:
        client = SandboxClient(first.url, first.token, timeout=30)
        sandbox_id = await client.create_from_pool("base", {})
        call = asyncio.create_task(
            client.call_tool(sandbox_id, "run_shell_command", {"command": "sleep 30"})
        )
        await asyncio.sleep(1.0)
        first.process.kill()
        await asyncio.to_thread(first.process.wait)
        await asyncio.gather(call, return_exceptions=True)
        await client.aclose()
        assert (first.root / "sandboxes" / sandbox_id).exists()
        second = start_server(root, "--workspace-mb", "16")
        try:
            assert list((second.root / "sandboxes").iterdir()) == []
            assert await asyncio.to_thread(_leftovers, first.process.pid, sandbox_id) == []
        finally:
            stop_server(second)
    finally:
        stop_server(first)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_workspace_nested_past_pythons_recursion_limit_is_deleted_on_release() -> None:
    # Without a workspace image (--workspace-mb 0, or no loop devices) the workspace is a
    # host directory, deleted entry by entry.
    root = Path(tempfile.mkdtemp(prefix="sandbox-deep-"))
    nest = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')"
    first = start_server(root, "--workspace-mb", "0")
    try:
        client = SandboxClient(first.url, first.token, timeout=30)
        released, left = [await client.create_from_pool("base", {}) for _ in range(2)]
        for sandbox_id in (released, left):
            assert not (await _cell(client, sandbox_id, nest)).isError
        assert await client.release(released) is True
        assert not (first.root / "sandboxes" / released).exists()
        await client.aclose()
        first.process.kill()  # leaves the other for the next server on the root
        await asyncio.to_thread(first.process.wait)
        second = start_server(root, "--workspace-mb", "0")
        try:
            assert list((second.root / "sandboxes").iterdir()) == []
        finally:
            stop_server(second)
    finally:
        stop_server(first)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def small_disk() -> Iterator[RunningServer]:
    """A server whose root is an 80 MiB file system, with 32 MiB workspaces: room for two to
    fill up, not three."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-small-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(root)], check=True)
    try:
        server = start_server(root, "--workspace-mb", "32", "--call-timeout", "30")
        yield server
        stop_server(server)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_workspace_is_made_only_while_the_host_disk_has_room_for_all_to_fill(
    small_disk: RunningServer,
) -> None:
    # Each workspace is a sparse image: made freely, 64 of them could promise more than the
    # host's disk holds, and sandboxes filling theirs then filled the host's (every sandbox's
    # writes, and the host's own, failed for want of space).
    client = SandboxClient(small_disk.url, small_disk.token, timeout=60)
    try:
        first = await client.create("base")
        second = await client.create("base")
        with pytest.raises(SandboxCapacityError, match=r"disk has \d+ MiB free") as refused:
            await client.create("base")
        assert "32 MiB each" in str(refused.value)
        health = (await _health(small_disk.url)).json()
        assert health["status"] == "full"
        assert "disk has" in health["reason"]
        fill = "dd if=/dev/zero of=big bs=1M count=64 2>&1; sync; df -m . | tail -1"
        for sandbox_id in (first, second):
            filled = await client.call_tool(sandbox_id, "run_shell_command", {"command": fill})
            assert "No space left on device" in stdout(filled)  # its cap, not the host's
        free = os.statvfs(small_disk.root)
        assert free.f_bavail * free.f_frsize > 0
        await client.release(first)
        third = await client.create("base")  # the room the first one left
        await client.release(third)
        await client.release(second)
    finally:
        await client.aclose()
