"""The host's memory against real sandboxes and request bodies: sandboxes are made only while
their memory limits fit the host's memory, the kernel's OOM killer chooses sandboxes before
the server, and the request bodies held at once stay within the server's budget.

The host with little memory is a memory cgroup the server runs in (as in a container with a
memory limit), which needs root and cgroups, as the other tests of the totals do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.errors import SandboxCapacityError
from agentscope_serverless.sandbox_server.isolation import Limits, Toolchain
from agentscope_serverless.sandbox_server.jail import CGROUP_ROOT, Cgroups, HostIsolation
from agentscope_serverless.sandbox_server.manager import (
    SERVER_MEMORY_BYTES,
    SandboxManager,
    ServerConfig,
)
from agentscope_serverless.services.sandbox.client import SandboxClient
from tests.support.sandbox_server import RunningServer, start_server, stop_server

MiB = 1024**2
SANDBOX_MB = 384
CAP_SYS_RESOURCE = 24


@contextlib.contextmanager
def memory_limited_group(limit: int) -> Iterator[Path]:
    """A memory cgroup of ``limit`` bytes (v2, or v1's memory hierarchy under ours)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        group, limit_file = CGROUP_ROOT / f"sandbox-test-host-{os.getpid()}", "memory.max"
    else:
        own = next(
            line.split(":", 2)[2]
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if "memory" in line.split(":")[1].split(",")
        )
        group = CGROUP_ROOT / "memory" / own.lstrip("/") / f"sandbox-test-host-{os.getpid()}"
        limit_file = "memory.limit_in_bytes"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(limit))
        yield group
    finally:
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def server_on_small_host(*extra: str) -> Iterator[RunningServer]:
    """A server whose host has room for two sandboxes of ``SANDBOX_MB`` besides the server's
    own memory."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-small-host-"))
    limit = SERVER_MEMORY_BYTES + 2 * SANDBOX_MB * MiB
    try:
        with memory_limited_group(limit) as group:
            server = start_server(
                root, "--memory-mb", str(SANDBOX_MB), "--workspace-mb", "16", *extra, cgroup=group
            )
            try:
                yield server
            finally:
                stop_server(server)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def create(server: RunningServer) -> httpx.Response:
    return httpx.post(
        f"{server.url}/create_from_pool",
        json={"sandbox_type": "base", "meta": {}},
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=60,
    )


def test_a_sandbox_past_the_hosts_memory_is_refused_as_the_server_is_full() -> None:
    # Each sandbox within its own limit, 64 of them at 1 GiB were admitted on a 24 GiB host:
    # together they ran it out of memory, and the OOM killer killed the server.
    with server_on_small_host() as server:
        first, second = (create(server) for _ in range(2))
        assert (first.status_code, second.status_code) == (200, 200)
        refused = create(server)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) > 0
        assert refused.json()["code"] == "SANDBOX_CAPACITY"
        detail = refused.json()["detail"]
        assert "the host's memory gives sandboxes 768 MiB" in detail
        assert "3 sandboxes of 384 MiB each may take 1152 MiB" in detail
        health = httpx.get(f"{server.url}/health").json()
        assert (health["status"], health["available"]) == ("full", 0)
        assert "the host's memory gives sandboxes 768 MiB" in health["reason"]
        released = httpx.post(
            f"{server.url}/release",
            json={"identity": first.json()["data"]},
            headers={"Authorization": f"Bearer {server.token}"},
        )
        assert released.json()["data"] is True
        assert create(server).status_code == 200  # the room the first one left


def test_an_operator_may_overcommit_the_hosts_memory() -> None:
    with server_on_small_host("--memory-overcommit", "1.5") as server:
        assert [create(server).status_code for _ in range(3)] == [200, 200, 200]
        refused = create(server)
        assert refused.status_code == 429, refused.text
        assert "1.5 times over" in refused.json()["detail"]


async def test_without_cgroups_sandboxes_are_admitted_by_their_memory_limits_too() -> None:
    # Without cgroups (not root, or --weaker-isolation) a sandbox's memory is a limit per
    # process: the same sum of limits is what the host must hold.
    root = Path(tempfile.mkdtemp(prefix="sandbox-weaker-memory-"))
    os.chmod(root, 0o711)
    size = 256 * MiB
    config = ServerConfig(
        root / "root",
        limits=Limits(memory_bytes=size, total_memory_bytes=size, workspace_bytes=0),
        weaker_isolation=True,
        host_memory_bytes=SERVER_MEMORY_BYTES + 2 * size,
    )
    nothing = HostIsolation(Cgroups(), None, None, disables_userns=False)
    manager = SandboxManager(config, Toolchain.find("/usr/bin/python3"), nothing)
    await manager.start()
    try:
        first = await manager.create_from_pool("base", {})
        await manager.create_from_pool("base", {})
        with pytest.raises(SandboxCapacityError, match="3 sandboxes of 256 MiB each"):
            await manager.create_from_pool("base", {})
        assert manager.health()["status"] == "full"
        score = await manager.call_tool(
            first, "run_shell_command", {"command": "cat /proc/self/oom_score_adj"}
        )
        assert _stdout(score.model_dump()).strip() == "1000"
    finally:
        await manager.close()
        shutil.rmtree(root, ignore_errors=True)


def test_the_oom_killer_chooses_sandboxes_before_the_server(
    sandbox_server: RunningServer,
) -> None:
    headers = {"Authorization": f"Bearer {sandbox_server.token}"}
    made = httpx.post(
        f"{sandbox_server.url}/create_from_pool",
        json={"sandbox_type": "base", "meta": {}},
        headers=headers,
        timeout=60,
    )
    identity = made.json()["data"]
    try:
        called = httpx.post(
            f"{sandbox_server.url}/call_tool",
            json={
                "identity": identity,
                "tool_name": "run_shell_command",
                "arguments": {"command": "cat /proc/self/oom_score_adj"},
            },
            headers=headers,
            timeout=60,
        )
        assert _stdout(called.json()["data"]).strip() == "1000"
        server_pid = sandbox_server.process.pid
        children = _children(server_pid)
        assert children  # the sandbox's bwrap
        assert {_oom_score_adj(pid) for pid in children} == {1000}
        # Lowering its own score needs CAP_SYS_RESOURCE (root, in most containers).
        assert _oom_score_adj(server_pid) == (-500 if _may_lower_oom_score() else 0)
    finally:
        httpx.post(f"{sandbox_server.url}/release", json={"identity": identity}, headers=headers)


@pytest.fixture(scope="module")
def small_budget() -> Iterator[RunningServer]:
    """A server holding 16 MiB of request bodies at once."""
    root = Path(tempfile.mkdtemp(prefix="sandbox-bodies-"))
    server = start_server(root, "--request-bodies-mb", "16", "--workspace-mb", "16")
    yield server
    stop_server(server)
    shutil.rmtree(root, ignore_errors=True)


async def _timed_cells(server: RunningServer, sleep: float) -> tuple[Any, Any]:
    """Two calls, each with a 10 MiB body, on two sandboxes: the first sleeps ``sleep`` s and
    prints when it ended, the second, sent 0.5 s later, prints when it began. Meanwhile,
    requests without a body or with a small one are answered at once."""
    client = SandboxClient(server.url, server.token, timeout=60)
    try:
        first, second = [await client.create("base") for _ in range(2)]
        padding = "\n#" + "x" * (10 * MiB)
        headers = {"Authorization": f"Bearer {server.token}"}

        async def cell(identity: str, code: str) -> httpx.Response:
            body = {
                "identity": identity,
                "tool_name": "run_ipython_cell",
                "arguments": {"code": code + padding},
            }
            async with httpx.AsyncClient(timeout=60) as http:
                return await http.post(f"{server.url}/call_tool", json=body, headers=headers)

        sleeping = asyncio.create_task(
            cell(first, f"import time\ntime.sleep({sleep})\nprint(time.time())")
        )
        await asyncio.sleep(0.5)
        waiting = asyncio.create_task(cell(second, "import time\nprint(time.time())"))
        await asyncio.sleep(0.5)
        async with httpx.AsyncClient(timeout=1) as http:
            assert (await http.get(f"{server.url}/health")).status_code == 200
            info = {"identity": first}
            answer = await http.post(f"{server.url}/get_info", json=info, headers=headers)
            assert answer.status_code == 200
        return await sleeping, await waiting
    finally:
        await client.aclose()


async def test_a_body_past_the_budget_of_bodies_held_waits_for_room(
    small_budget: RunningServer,
) -> None:
    # Every body was held at once: 12 calls of 60 MiB took the server to 2.4 GB.
    sleeping, waiting = await _timed_cells(small_budget, 2.0)
    assert (sleeping.status_code, waiting.status_code) == (200, 200), waiting.text
    ended = float(_stdout(sleeping.json()["data"]))
    began = float(_stdout(waiting.json()["data"]))
    assert began >= ended  # read once the first one's request was answered


async def test_a_body_finding_no_room_in_time_is_answered_503_to_retry(
    small_budget: RunningServer,
) -> None:
    sleeping, refused = await _timed_cells(small_budget, 8.0)
    assert sleeping.status_code == 200
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) > 0
    assert refused.json()["code"] == "SANDBOX_UNAVAILABLE"
    assert "holds 16777216 bytes of request bodies at most" in refused.json()["detail"]


def _stdout(result: dict[str, Any]) -> str:
    return "".join(p["text"] for p in result["content"] if p.get("description") == "stdout")


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            status = (entry / "status").read_text()
            if f"\nPPid:\t{parent}\n" in status:
                found.append(int(entry.name))
    return found


def _oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def _may_lower_oom_score() -> bool:
    status = Path("/proc/self/status").read_text()
    effective = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff"))
    return bool(int(effective, 16) >> CAP_SYS_RESOURCE & 1)
