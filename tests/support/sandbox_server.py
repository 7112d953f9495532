"""A real sandbox server (our program, as a subprocess on a loopback port) for the tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

TOKEN = "test-token-" + "x" * 24
# Tight limits keep the containment tests fast.
LIMITS = [
    "--call-timeout",
    "4",
    "--cpu-seconds",
    "2",
    "--interpreter-cpu-seconds",
    "30",
    "--memory-mb",
    "512",
    "--file-size-mb",
    "8",
    "--max-processes",
    "32",
]
# Kernel-enforced totals need root (cgroups, loop devices). Without root, the tool tests run
# on the jail alone; the tests of the totals (tests/sandbox/test_isolation.py) start their own
# servers without this and fail, saying what the host lacks.
if os.geteuid() != 0:
    LIMITS.append("--weaker-isolation")


def require_sandbox_tools() -> None:
    """Fail (never skip) when the host lacks what sandboxes need."""
    if shutil.which("bwrap") is None:
        pytest.fail(
            "bwrap (bubblewrap) is missing: install it with `apt-get install -y bubblewrap` "
            "or run ./scripts/bootstrap"
        )
    if shutil.which("prlimit") is None:
        pytest.fail("prlimit is missing: install it with `apt-get install -y util-linux`")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    token: str
    root: Path
    port: int
    process: subprocess.Popen[bytes]
    log: Path


def start_server(
    root: Path, *extra: str, open_files: int | None = None, cgroup: Path | None = None
) -> RunningServer:
    """Start the server on ``root``; ``open_files`` caps its file descriptors, ``cgroup`` (a
    group's directory) is where it runs."""
    require_sandbox_tools()
    capped = [] if open_files is None else ["prlimit", f"--nofile={open_files}", "--"]
    if cgroup is not None:
        capped = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *capped]
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)
    port = free_port()
    log = root / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                *capped,
                sys.executable,
                "-m",
                "agentscope_serverless.sandbox_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--root",
                str(root / "data"),
                *extra,
            ],
            env={**os.environ, "SANDBOX_SERVER_TOKEN": TOKEN},
            stdout=out,
            stderr=out,
        )
    url = f"http://127.0.0.1:{port}"
    # Generous: a loaded machine has been seen taking over 20 s to start one.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the sandbox server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return RunningServer(url, TOKEN, root / "data", port, process, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"the sandbox server did not start: {log.read_text()}")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


# Walks every readable file under /proc (environ and cmdline of every pid, mountinfo...) and
# where its links lead (a descriptor's file, a cwd), the environment and /dev, and prints
# which of the words appear where.
SCAN = r"""
import json, os
words = WORDS
hits = []
skip = {"kcore", "kmsg", "pagemap", "mem", "clear_refs", "kpagecount", "kpageflags",
        "kpagecgroup", "oom_score_adj", "attr", "map_files"}
def scan(path, data):
    for word in words:
        if word.encode() in data:
            hits.append([path, word])
for top, dirs, files in os.walk("/proc", followlinks=False):
    top_level = ("sys", "self", "thread-self") if top == "/proc" else ()
    dirs[:] = [d for d in dirs if d not in skip and d not in top_level]
    if top.count("/") > 4:
        dirs[:] = []
    for name in dirs + files:
        path = os.path.join(top, name)
        try:
            scan(path + " ->", os.readlink(path).encode())
        except OSError:
            pass
    for name in files:
        if name in skip:
            continue
        path = os.path.join(top, name)
        try:
            with open(path, "rb") as handle:
                scan(path, handle.read(1 << 20))
        except OSError:
            pass
scan("environ", "\0".join(f"{k}={v}" for k, v in os.environ.items()).encode())
for top, dirs, files in os.walk("/dev"):
    scan(top, " ".join(dirs + files).encode())
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps({"hits": hits, "pids": pids}))
"""


def proc_scan_code(words: list[str]) -> str:
    """Python for a cell that prints JSON ``{"hits": [[where, word]...], "pids": [...]}``."""
    return SCAN.replace("WORDS", json.dumps(words))
