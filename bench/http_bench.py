"""Request benchmark: ``/process`` with the demo agent, next to a bare FastAPI endpoint.

The bare endpoint answers with the very SSE bytes ``/process`` produced for the same request
(recorded first), so the difference between the two is what the runtime costs per request:
authentication, the session history and memory reads and writes, running the agent, building
and serialising the events, logging. Both servers run the same way: uvicorn in a subprocess
on loopback (one worker), started by this script. The driver is an ``httpx.AsyncClient``
with bounded concurrency (4 by default: the client shares the machine with the server) that
reads every streamed reply to its end; the two servers take turns in rounds, so a change in
the machine's load affects both alike. Each request to ``/process`` acts for a new user (a
service key with ``X-User-Id``), as requests from many users would.

    .venv/bin/python bench/http_bench.py [--requests 2000] [--concurrency 4] [--rounds 4]

Prints a table and writes the figures as JSON to ``bench/results/``. Exits with status 1 when
the runtime takes more than twice the bare endpoint's time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

RESULTS = Path(__file__).resolve().parent / "results"
MAX_OVERHEAD = 2.0
BODY = {"input": [{"role": "user", "content": "hello"}], "stream": True}


def serve(kind: str, port: int, recording: str | None) -> None:
    """Run one of the two servers in this process (the benchmark starts it as a subprocess)."""
    import uvicorn

    if kind == "runtime":
        from agentscope_serverless.http import create_app
        from agentscope_serverless.settings import load_settings

        app = create_app(settings=load_settings())  # this server process is the root
    else:
        app = bare_app(Path(recording or "").read_bytes())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def bare_app(recorded: bytes) -> FastAPI:
    """A FastAPI app whose ``POST /process`` streams ``recorded``, one SSE event per chunk."""
    chunks = [part + b"\n\n" for part in recorded.split(b"\n\n") if part]
    app = FastAPI()

    @app.post("/process")
    async def process(request: Request) -> StreamingResponse:
        await request.body()

        async def body() -> Any:
            for chunk in chunks:
                yield chunk

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(kind: str, env: dict[str, str], recording: Path | None = None) -> tuple[Any, str]:
    port = free_port()
    command = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    if recording is not None:
        command += ["--recording", str(recording)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the {kind} server exited: {process.stderr.read().decode()}")
        try:
            if httpx.post(f"{url}/process", json=BODY).status_code in (200, 401, 422):
                return process, url
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise SystemExit(f"the {kind} server did not start") from None
            time.sleep(0.1)


async def drive(url: str, key: str, requests: int, concurrency: int) -> tuple[float, list[float]]:
    """Send ``requests`` requests, ``concurrency`` at a time; (seconds, latencies in ms)."""
    counter = iter(range(10**9))
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def one() -> None:
            headers = {"Authorization": f"Bearer {key}", "X-User-Id": f"bench-{next(counter)}"}
            started = time.perf_counter()
            async with client.stream("POST", "/process", json=BODY, headers=headers) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    raise SystemExit(f"{url} answered HTTP {reply.status_code}: {reply.text}")
                async for _ in reply.aiter_raw():
                    pass
            latencies.append((time.perf_counter() - started) * 1000)

        async def worker(count: int) -> None:
            for _ in range(count):
                await one()

        share, extra = divmod(requests, concurrency)
        started = time.perf_counter()
        await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
        return time.perf_counter() - started, latencies


def summarise(
    runs: list[tuple[float, list[float]]], concurrency: int, reply_bytes: int
) -> dict[str, Any]:
    seconds = sum(elapsed for elapsed, _ in runs)
    ordered = sorted(ms for _, latencies in runs for ms in latencies)
    return {
        "requests": len(ordered),
        "concurrency": concurrency,
        "seconds": round(seconds, 3),
        "requests_per_second": round(len(ordered) / seconds, 1),
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1], 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 3),
        "reply_bytes": reply_bytes,
    }


def service_key(key_file: Path) -> str:
    from agentscope_serverless.auth import FileKeyStore

    async def create() -> str:
        async with FileKeyStore(key_file) as store:
            return (await store.create_key(kind="service")).key

    return asyncio.run(create())


def record_reply(url: str, key: str) -> bytes:
    headers = {"Authorization": f"Bearer {key}", "X-User-Id": "bench-recording"}
    with httpx.stream("POST", f"{url}/process", json=BODY, headers=headers) as reply:
        return reply.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--serve", choices=["runtime", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--recording", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.recording)
        return

    with tempfile.TemporaryDirectory() as workdir:
        key_file = Path(workdir) / "keys.json"
        key = service_key(key_file)
        env = {
            **os.environ,
            "AUTH_KEYS_BACKEND": "file",
            "AUTH_KEYS_FILE": str(key_file),
            "AGENT_APP": "agentscope_serverless.agents.demo:app",
        }
        runtime, runtime_url = start("runtime", env)
        bare = None
        try:
            recording = Path(workdir) / "reply.sse"
            recording.write_bytes(record_reply(runtime_url, key))
            bare, bare_url = start("bare", env, recording)
            urls = {"runtime": runtime_url, "bare": bare_url}
            runs: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in urls}
            # Alternate the two servers in rounds, so a change in the machine's load (other
            # processes) affects both alike.
            for url in urls.values():
                asyncio.run(drive(url, key, args.warmup, args.concurrency))
            for _ in range(args.rounds):
                for name, url in urls.items():
                    batch = args.requests // args.rounds
                    runs[name].append(asyncio.run(drive(url, key, batch, args.concurrency)))
        finally:
            for process in (runtime, bare):
                if process is not None:
                    process.terminate()
                    process.wait(timeout=30)
        size = len(recording.read_bytes())
        results = {name: summarise(rows, args.concurrency, size) for name, rows in runs.items()}

    runtime_ms, bare_ms = results["runtime"]["median_ms"], results["bare"]["median_ms"]
    overhead = {
        "median_latency_ratio": round(runtime_ms / bare_ms, 3),
        "throughput_ratio": round(
            results["bare"]["requests_per_second"] / results["runtime"]["requests_per_second"], 3
        ),
    }
    passed = max(overhead.values()) <= MAX_OVERHEAD
    report = {
        "benchmark": "http_bench",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "results": results,
        "overhead": overhead,
        "max_overhead": MAX_OVERHEAD,
        "passed": passed,
    }
    print(
        f"{'server':<10}{'requests':>10}{'conc.':>7}{'req/s':>10}{'median ms':>11}"
        f"{'p90 ms':>9}{'p99 ms':>9}{'bytes':>8}"
    )
    for name, row in results.items():
        print(
            f"{name:<10}{row['requests']:>10}{row['concurrency']:>7}"
            f"{row['requests_per_second']:>10.1f}{row['median_ms']:>11.2f}"
            f"{row['p90_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['reply_bytes']:>8}"
        )
    print(
        f"runtime / bare: median latency x{overhead['median_latency_ratio']}, "
        f"throughput x{overhead['throughput_ratio']} (limit x{MAX_OVERHEAD}): "
        f"{'PASS' if passed else 'FAIL'}"
    )
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"http_bench-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {path}")
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
