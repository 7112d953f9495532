"""Sandbox latency: connecting a fresh sandbox, and the round trip of small tool calls.

Starts our sandbox server on a loopback port (or uses ``--url``/``--token``), then measures
with the real client over HTTP:

- ``connect``: ``SandboxService.connect_async`` for a new session (mapping lookup + create),
- ``first cell``: the first ``run_ipython_cell`` of that sandbox (interpreter start-up),
- ``cell``: a small ``run_ipython_cell`` on a warm sandbox,
- ``shell``: a small ``run_shell_command`` on a warm sandbox,
- ``cell, frozen`` and ``cell, no freeze``: warm cells alternating between this server and a
  second one started with ``--no-freeze``; the median of their differences is the
  freeze/resume overhead of a call (local server only).

Prints a table (median and p95 in milliseconds) and writes JSON to ``bench/results/``::

    .venv/bin/python bench/sandbox_bench.py --runs 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from agentscope_serverless.services.sandbox import Sandbox, SandboxService

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "runs": len(samples),
        "median_ms": statistics.median(samples) * 1000,
        "p95_ms": percentile(samples, 0.95) * 1000,
        "min_ms": min(samples) * 1000,
        "max_ms": max(samples) * 1000,
    }


async def timed(call: Awaitable[Any]) -> float:
    """Seconds until ``call`` (a coroutine, which runs only once awaited) completes."""
    started = time.perf_counter()
    await call
    return time.perf_counter() - started


def start_local_server(root: Path, token: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentscope_serverless.sandbox_server",
            "--port",
            str(port),
            "--root",
            str(root),
            "--log-level",
            "warning",
            *extra,
        ],
        env={**os.environ, "SANDBOX_SERVER_TOKEN": token},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("the sandbox server did not start")


async def connect(service: SandboxService, session: str, into: list[Sandbox]) -> None:
    into.extend(await service.connect_async(session))


async def freeze_overhead(
    url: str, unfrozen_url: str, token: str, runs: int
) -> dict[str, list[float]]:
    """Warm cells alternating between a freezing server and a ``--no-freeze`` one, so both
    see the same load; the median difference is the freeze/resume overhead of a call."""
    samples: dict[str, list[float]] = {"cell, frozen": [], "cell, no freeze": []}
    async with SandboxService(url, token) as frozen, SandboxService(unfrozen_url, token) as plain:
        session = f"bench-freeze-{secrets.token_hex(4)}"
        [one] = await frozen.connect_async(session)
        [other] = await plain.connect_async(session)
        for box in (one, other):
            await box.run_ipython_cell_async("total = 0")
        for _ in range(runs):
            for name, box in (("cell, frozen", one), ("cell, no freeze", other)):
                samples[name].append(await timed(box.run_ipython_cell_async("total += 1\ntotal")))
        await frozen.release_async(session)
        await plain.release_async(session)
    return samples


async def measure(url: str, token: str, runs: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {"connect": [], "first cell": [], "cell": [], "shell": []}
    async with SandboxService(url, token) as service:
        await service.health()  # open the connection, so figures are the steady state
        for run in range(runs):
            session = f"bench-{run}-{secrets.token_hex(4)}"
            connected: list[Sandbox] = []
            samples["connect"].append(await timed(connect(service, session, connected)))
            first_cell = connected[0].run_ipython_cell_async("1")
            samples["first cell"].append(await timed(first_cell))
            await service.release_async(session)

        session = f"bench-warm-{secrets.token_hex(4)}"
        [warm] = await service.connect_async(session)
        await warm.run_ipython_cell_async("total = 0")
        for _ in range(runs):
            samples["cell"].append(await timed(warm.run_ipython_cell_async("total += 1\ntotal")))
            samples["shell"].append(await timed(warm.run_shell_command_async("echo hi")))
        await service.release_async(session)
    return {name: summary(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description="Sandbox connect and tool-call latency.")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--url", help="an existing sandbox server (default: start one)")
    parser.add_argument("--token", default=os.environ.get("SANDBOX_SERVER_TOKEN"))
    args = parser.parse_args()

    process = None
    root = None
    url, token = args.url, args.token
    if url is None:
        token = secrets.token_urlsafe(32)
        root = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
        root.chmod(0o711)
        process, url = start_local_server(root / "data", token)
    unfrozen = None
    try:
        figures = asyncio.run(measure(url, token, args.runs))
        if root is not None:
            unfrozen, unfrozen_url = start_local_server(root / "nofreeze", token, "--no-freeze")
            pairs = asyncio.run(freeze_overhead(url, unfrozen_url, token, args.runs))
            figures.update({name: summary(values) for name, values in pairs.items()})
            overhead = statistics.median(
                a - b for a, b in zip(pairs["cell, frozen"], pairs["cell, no freeze"], strict=True)
            )
            figures["freeze overhead"] = {"runs": args.runs, "median_ms": overhead * 1000}
            print(f"freeze/resume overhead per call (median of pairs): {overhead * 1000:.2f} ms")
    finally:
        for started in (process, unfrozen):
            if started is not None:
                started.terminate()
                started.wait(10)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    print(f"{'operation':<16} {'runs':>5} {'median ms':>10} {'p95 ms':>10} {'max ms':>10}")
    for name, figure in figures.items():
        if "p95_ms" not in figure:
            continue
        print(
            f"{name:<16} {figure['runs']:>5} {figure['median_ms']:>10.1f} "
            f"{figure['p95_ms']:>10.1f} {figure['max_ms']:>10.1f}"
        )
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    output = RESULTS / f"sandbox_bench-{stamp}.json"
    record = {
        "benchmark": "sandbox",
        "when": stamp,
        "server": "local" if args.url is None else "remote",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "results": figures,
    }
    output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
