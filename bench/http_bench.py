"""Request benchmark: ``/process`` with the demo agent, next to a bare endpoint, under ``wrk``.

Two servers run the same way (uvicorn in a subprocess on loopback, one worker, started by
this script): the runtime (``create_app()`` with the demo agent, in-memory services and a
key file) and a bare FastAPI app whose ``POST /process`` answers with the very bytes the
runtime produced for the same request (recorded first), streamed as SSE or as one JSON body.
The difference between the two is what the runtime costs per request.

The load comes from ``wrk`` (Debian package ``wrk``: ``./scripts/bootstrap debian
'the request benchmark' wrk`` installs it), a separate process, so the driver does
not share the server's interpreter. Each scenario is one function returning a row per
server; a Lua ``request()`` function makes each request's user and session ids:

- ``new user``: a new user per request (service key with ``X-User-Id``);
- ``reused session``: one session, grown to ``--history`` messages before the run;
- ``window session``: the same with a session grown to the history window (100 messages),
  so both turns read a full window: their CPU differs only by what the session's length
  costs;
- ``new session``: the same user, a new session each time (that user's memory grows).

Each runs streamed and with ``"stream": false``, on the bare endpoint then on the runtime,
``--rounds`` times (both servers on one CPU, wrk on another when there is one): this
machine's speed drifts by tens of percent within seconds, so each runtime run is compared
with the bare run just before it. A row reports the medians of the rounds: req/s, p50 and
p99 latency (from wrk) and the server's CPU per request, the user+system time of its
process (``/proc/<pid>/stat``) over the run divided by the requests wrk completed. The
targets compare the runtime's CPU to the bare endpoint's of the same round (:func:`checks`).

    .venv/bin/python bench/http_bench.py [--duration 5] [--connections 8] [--history 1000]
                                         [--rounds 3]
    .venv/bin/python bench/http_bench.py --guard-cost [--guard-requests 300]
    .venv/bin/python bench/http_bench.py --storage-cost [--rounds 8]

Prints a table, writes the figures as JSON to ``bench/results/``, and exits with status 1
when a target is missed: runtime CPU per request at most 2x the bare endpoint's (new user);
the reused session within 1.2x of the new-user CPU, and of the window session's; p99 at
most 4x p50.

``--storage-cost`` measures instead what storing each run's events costs ``/process``
(:func:`storage_cost`): the same runtime with ``RUNS_BACKEND=none`` and with the runs stored,
in memory and on Redis (a redis-server started for the run, session history on it too), the
two servers of each comparison side by side on one CPU. It exits with status 1 when storing
on Redis is more than 15% slower (median latency or throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

RESULTS = Path(__file__).resolve().parent / "results"
MAX_CPU_OVER_BARE = 2.0
MAX_REUSED_OVER_NEW = 1.2
MAX_P99_OVER_P50 = 4.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the servers ------------------------------------------------------------------------


def serve(kind: str, port: int, recording: str | None) -> None:
    """Run one of the servers in this process (the benchmark starts it as a subprocess)."""
    import uvicorn

    if kind == "runtime":
        from agentscope_serverless.http import create_app
        from agentscope_serverless.settings import load_settings

        app = create_app(settings=load_settings())  # this server process is the root
    else:
        app = bare_app(json.loads(Path(recording or "").read_text()))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def bare_app(recorded: dict[str, str]) -> FastAPI:
    """A FastAPI app whose ``POST /process`` answers with a recorded reply of the runtime."""
    streamed = recorded["stream"].encode()
    chunks = [part + b"\n\n" for part in streamed.split(b"\n\n") if part]
    final = recorded["json"].encode()
    app = FastAPI()

    @app.post("/process")
    async def process(request: Request) -> Response:
        body = await request.json()
        if body.get("stream", True) is False:
            return Response(final, media_type="application/json")

        async def events() -> Any:
            for chunk in chunks:
                yield chunk

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    url: str

    def cpu_seconds(self) -> float:
        """User+system CPU time the server process has used so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(
    kind: str,
    env: dict[str, str],
    recording: Path | None = None,
    name: str | None = None,
    cpu: int | None = None,
) -> Server:
    """Start a server; with ``cpu``, it runs on that CPU only."""
    port = free_port()
    command = [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    if recording is not None:
        command += ["--recording", str(recording)]
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            assert process.stderr is not None
            raise SystemExit(f"the {kind} server exited: {process.stderr.read().decode()}")
        try:
            httpx.get(f"{url}/health")
            return Server(name or kind, process, url)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise SystemExit(f"the {kind} server did not start") from None
            time.sleep(0.1)


# --- the load generator -----------------------------------------------------------------

# wrk calls request() for every request; ids() gives the user and session of request n.
WRK_SCRIPT = """
local counter = 0
local key = "%(key)s"
local stream = "%(stream)s"
local prefix = "%(prefix)s"
%(ids)s
request = function()
  counter = counter + 1
  local user, session = ids(counter)
  local body = '{"input":[{"role":"user","content":"hello"}],"stream":' .. stream
  if session then body = body .. ',"session_id":"' .. session .. '"' end
  body = body .. '}'
  return wrk.format("POST", "/process", {
    ["Authorization"] = "Bearer " .. key,
    ["X-User-Id"] = user,
    ["Content-Type"] = "application/json",
  }, body)
end
done = function(summary, latency, requests)
  local bad = summary.errors.status + summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout
  io.write(string.format(
    'RESULT {"requests":%%d,"seconds":%%.6f,"errors":%%d,"p50_us":%%d,"p99_us":%%d,"bytes":%%d}\\n',
    summary.requests, summary.duration / 1e6, bad,
    latency:percentile(50), latency:percentile(99), summary.bytes))
end
"""


@dataclass
class Bench:
    """What every scenario needs: the servers, the key, the load options."""

    key: str
    servers: dict[str, Server]
    workdir: Path
    duration: int
    connections: int
    history: int
    rounds: int = 1
    rows: list[dict[str, Any]] = field(default_factory=list)
    # The runtime's CPU per request over the bare endpoint's, per round, by (scenario, stream).
    relative: dict[tuple[str, bool], list[float]] = field(default_factory=dict)
    _runs: int = 0

    def load_together(
        self, servers: list[Server], scenario: str, stream: bool, ids: str
    ) -> list[dict[str, Any]]:
        """Run one wrk per server, all at the same time; their rows, in order."""
        started: list[tuple[Server, subprocess.Popen[str], float]] = []
        for server in servers:
            self._runs += 1
            script = self.workdir / f"{server.name}-{self._runs}.lua"
            script.write_text(
                WRK_SCRIPT
                % {
                    "key": self.key,
                    "stream": "true" if stream else "false",
                    "prefix": f"{scenario.replace(' ', '-')}-{server.name}-{time.time_ns()}",
                    "ids": ids,
                }
            )
            wrk = subprocess.Popen(
                [
                    "wrk",
                    "-t1",
                    f"-c{self.connections}",
                    f"-d{self.duration}s",
                    "--timeout",
                    "30s",
                    "-s",
                    str(script),
                    server.url,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            started.append((server, wrk, server.cpu_seconds()))
        return [self._row(scenario, stream, *run) for run in started]

    def _row(
        self,
        scenario: str,
        stream: bool,
        server: Server,
        wrk: subprocess.Popen[str],
        cpu_before: float,
    ) -> dict[str, Any]:
        stdout, stderr = wrk.communicate()
        if wrk.returncode != 0:
            raise SystemExit(f"wrk failed: {stdout}{stderr}")
        cpu = server.cpu_seconds() - cpu_before
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        result = json.loads(line.removeprefix("RESULT "))
        if result["errors"]:
            raise SystemExit(f"{server.name} {scenario}: {result['errors']} failed requests")
        requests = result["requests"]
        row = {
            "scenario": scenario,
            "stream": stream,
            "server": server.name,
            "requests": requests,
            "requests_per_second": round(requests / result["seconds"], 1),
            "p50_ms": result["p50_us"] / 1000,
            "p99_ms": result["p99_us"] / 1000,
            "cpu_ms_per_request": round(cpu * 1000 / requests, 3),
            "bytes_per_request": result["bytes"] // requests,
        }
        return row

    def both(self, scenario: str, stream: bool, ids: str) -> None:
        """The scenario on the bare endpoint, then on the runtime, ``rounds`` times: a row of
        each server's medians, and the runtime's CPU per request over the bare endpoint's in
        each round (:attr:`relative`)."""
        pair = [self.servers["bare"], self.servers["runtime"]]
        runs = [
            [self.load_together([server], scenario, stream, ids)[0] for server in pair]
            for _ in range(self.rounds)
        ]
        self.relative[(scenario, stream)] = [
            runtime["cpu_ms_per_request"] / max(bare["cpu_ms_per_request"], 0.001)
            for bare, runtime in runs
        ]
        for server in (0, 1):
            self.rows.append(median_row([run[server] for run in runs]))


# --- the scenarios ----------------------------------------------------------------------


def new_user(bench: Bench, stream: bool) -> None:
    """A new user per request: nothing to read but the key."""
    bench.both("new user", stream, "function ids(n) return prefix .. '-' .. n, nil end")


def reused_session(bench: Bench, stream: bool) -> None:
    """One user's one session, holding ``bench.history`` messages before the run starts."""
    one_session(bench, stream, "reused session", bench.history)


def window_session(bench: Bench, stream: bool) -> None:
    """The same, with a session of as many messages as a turn reads (the history window)."""
    from agentscope_serverless.runner import DEFAULT_HISTORY_WINDOW

    one_session(bench, stream, "window session", DEFAULT_HISTORY_WINDOW)


def one_session(bench: Bench, stream: bool, scenario: str, messages: int) -> None:
    user, session = f"{scenario.replace(' ', '-')}-{time.time_ns()}", "the-session"
    grow(bench.servers["runtime"].url, bench.key, user, session, messages)
    bench.both(scenario, stream, f"function ids(n) return '{user}', '{session}' end")


def new_session(bench: Bench, stream: bool) -> None:
    """The same user with a new session per request: the user's memory grows."""
    bench.both(
        "new session",
        stream,
        "function ids(n) return prefix .. '-user', 'session-' .. n end",
    )


# Scenarios run in this order, each streamed and not.
SCENARIOS: dict[str, Callable[[Bench, bool], None]] = {
    "new user": new_user,
    "reused session": reused_session,
    "window session": window_session,
    "new session": new_session,
}


def grow(url: str, key: str, user: str, session: str, messages: int) -> None:
    """Fill ``session`` with ``messages`` messages (two per turn) through ``/process``."""

    async def fill() -> None:
        headers = {"Authorization": f"Bearer {key}", "X-User-Id": user}
        body = {"input": [{"role": "user", "content": "hello"}], "session_id": session}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            turns = iter(range(messages // 2))

            async def worker() -> None:
                for _ in turns:
                    reply = await client.post("/process", json={**body, "stream": False})
                    reply.raise_for_status()

            await asyncio.gather(*(worker() for _ in range(4)))

    asyncio.run(fill())


# --- the run ----------------------------------------------------------------------------


def service_key(key_file: Path) -> str:
    from agentscope_serverless.auth import FileKeyStore

    async def create() -> str:
        async with FileKeyStore(key_file) as store:
            return (await store.create_key(kind="service")).key

    return asyncio.run(create())


def record_replies(url: str, key: str) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}", "X-User-Id": "bench-recording"}
    body = {"input": [{"role": "user", "content": "hello"}]}
    streamed = httpx.post(f"{url}/process", json=body, headers=headers, timeout=30)
    final = httpx.post(
        f"{url}/process", json={**body, "stream": False}, headers=headers, timeout=30
    )
    return {"stream": streamed.text, "json": final.text}


def checks(
    rows: list[dict[str, Any]], relative: dict[tuple[str, bool], list[float]]
) -> dict[str, dict[str, Any]]:
    """The targets, from the rows and the runtime's CPU relative to the bare endpoint's.

    Every CPU figure is taken relative to the bare endpoint measured at the same time (the
    median over the rounds): the bare endpoint does the same work in every scenario, so it
    gauges the machine's speed of the moment, which drifts by tens of percent within
    seconds here. The reused session over the new user is the ratio of their relative
    figures.
    """

    def cpu(scenario: str, stream: bool) -> float:
        return statistics.median(relative[(scenario, stream)])

    def row(scenario: str, stream: bool, server: str) -> dict[str, Any]:
        return next(
            r
            for r in rows
            if (r["scenario"], r["stream"], r["server"]) == (scenario, stream, server)
        )

    results: dict[str, dict[str, Any]] = {}
    for stream in (True, False):
        mode = "streamed" if stream else "not streamed"
        new = cpu("new user", stream)
        reused = cpu("reused session", stream)
        results[f"{mode}: new-user CPU/request <= {MAX_CPU_OVER_BARE}x bare"] = {
            "ratio": round(new, 2),
            "ok": new <= MAX_CPU_OVER_BARE,
        }
        results[f"{mode}: reused-session CPU/request <= {MAX_REUSED_OVER_NEW}x new-user"] = {
            "ratio": round(reused / new, 2),
            "ok": reused <= MAX_REUSED_OVER_NEW * new,
        }
        window = cpu("window session", stream)
        results[f"{mode}: reused-session CPU/request <= {MAX_REUSED_OVER_NEW}x window-session"] = {
            "ratio": round(reused / window, 2),
            "ok": reused <= MAX_REUSED_OVER_NEW * window,
        }
        for scenario in SCENARIOS:
            if not any(r["scenario"] == scenario for r in rows):
                continue
            runtime = row(scenario, stream, "runtime")
            ratio = runtime["p99_ms"] / max(runtime["p50_ms"], 0.001)
            results[f"{mode}: {scenario} p99 <= {MAX_P99_OVER_P50}x p50"] = {
                "ratio": round(ratio, 2),
                "ok": ratio <= MAX_P99_OVER_P50,
            }
    return results


# --- the cost of storing runs ------------------------------------------------------------

MAX_STORAGE_COST = 1.15


def storage_cost(args: argparse.Namespace, workdir: Path, key: str) -> dict[str, Any]:
    """p50, req/s and CPU of ``/process`` without and with stored runs, in memory and on Redis.

    The two servers of a comparison (runs not stored, runs stored) run side by side on one
    CPU, each under its own wrk load at the same time (a new user per request, streamed),
    ``--rounds`` times. Each cost is the median of its rounds' ratios.

    Why side by side: this machine's speed drifts by tens of percent within seconds, so two
    servers measured one after the other differ by chance as much as the cost measured. Two
    identical servers (both without stored runs) gave p50 ratios from 0.66 to 1.54 over the
    rounds when measured one after the other, and from 0.91 to 1.01 side by side on one
    CPU. Sharing a CPU, each server gets half of it, so a server that needs more CPU per
    request serves fewer requests and waits longer: the ratios are those of running each
    alone.
    """
    from agentscope_serverless.local_stack import RedisServer

    base = {
        **os.environ,
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(workdir / "keys.json"),
        "AGENT_APP": "agentscope_serverless.agents.demo:app",
        "POWERTOOLS_LOG_LEVEL": os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
    }
    cpu = max(os.sched_getaffinity(0))  # the servers' CPU; wrk and Redis go where they may
    with RedisServer() as redis:
        on_redis = {"SESSION_HISTORY_BACKEND": "redis", "REDIS_URL": redis.url}
        configurations = {
            "memory/none": {"RUNS_BACKEND": "none"},
            "memory/stored": {"RUNS_BACKEND": "in_memory"},
            "redis/none": {**on_redis, "RUNS_BACKEND": "none"},
            "redis/stored": {**on_redis, "RUNS_BACKEND": "redis"},
        }
        servers: dict[str, Server] = {}
        try:
            for name, env in configurations.items():
                servers[name] = start(
                    "runtime", {**base, **env}, name=name.replace("/", "-"), cpu=cpu
                )
            bench = Bench(key, servers, workdir, args.duration, args.connections, 0)
            ids = "function ids(n) return prefix .. '-' .. n, nil end"
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
            for _ in range(args.rounds or 8):
                for store in ("memory", "redis"):
                    pair = [f"{store}/none", f"{store}/stored"]
                    rows = bench.load_together([servers[n] for n in pair], "new user", True, ids)
                    for name, row in zip(pair, rows, strict=True):
                        rounds[name].append(row)
            results = {name: median_row(rows) for name, rows in rounds.items()}
        finally:
            for server in servers.values():
                server.process.terminate()
                server.process.wait(timeout=30)
    costs = {}
    for store in ("memory", "redis"):
        pairs = list(zip(rounds[f"{store}/none"], rounds[f"{store}/stored"], strict=True))
        p50 = [stored["p50_ms"] / max(without["p50_ms"], 0.001) for without, stored in pairs]
        throughput = [
            without["requests_per_second"] / stored["requests_per_second"]
            for without, stored in pairs
        ]
        costs[store] = {
            "p50_ratio": round(statistics.median(p50), 3),
            "throughput_ratio": round(statistics.median(throughput), 3),
            "p50_ratios": [round(ratio, 3) for ratio in p50],
            "throughput_ratios": [round(ratio, 3) for ratio in throughput],
        }
    return {"results": results, "storage_cost": costs}


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of figures: the median of each across ``rows`` (requests: their total)."""
    merged = dict(rows[0])
    for name in ("requests_per_second", "p50_ms", "p99_ms", "cpu_ms_per_request"):
        merged[name] = statistics.median(row[name] for row in rows)
    merged["requests"] = sum(row["requests"] for row in rows)
    return merged


def report_storage_cost(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        measured = storage_cost(args, workdir, service_key(workdir / "keys.json"))
    redis_cost = measured["storage_cost"]["redis"]
    passed = max(redis_cost["p50_ratio"], redis_cost["throughput_ratio"]) <= MAX_STORAGE_COST
    print(f"{'runtime':<15}{'requests':>10}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms':>9}")
    for name, row in measured["results"].items():
        print(
            f"{name:<15}{row['requests']:>10}{row['requests_per_second']:>10.1f}"
            f"{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['cpu_ms_per_request']:>9.3f}"
        )
    for store, cost in measured["storage_cost"].items():
        print(
            f"storing runs ({store}): p50 x{cost['p50_ratio']}, "
            f"throughput x{cost['throughput_ratio']} (medians of the rounds: p50 "
            f"{cost['p50_ratios']}, throughput {cost['throughput_ratios']})"
        )
    print(f"limit on Redis x{MAX_STORAGE_COST}: {'PASS' if passed else 'FAIL'}")
    if not passed:
        raise SystemExit(1)


# --- what the request guards and Idempotency-Key cost ---------------------------------
#
# p50 latency of ``/process`` (streamed, read to the end) and of a message append
# (``POST /sessions/{id}/messages``), one request at a time, without and with an
# ``Idempotency-Key`` (a new key each request, so every request claims and completes a
# record). Run it on the code before a change with ``PYTHONPATH=<old checkout>/shared`` to
# get the "before" figures (an older server ignores the header).

GUARD_CASES = ("process", "process+key", "append", "append+key")
GUARD_BODY = {"input": [{"role": "user", "content": "hello"}], "stream": True}


async def guard_latencies(url: str, key: str, case: str, requests: int) -> list[float]:
    """Latencies (ms) of ``requests`` sequential requests of ``case`` for one user."""
    user = f"bench-guard-{os.getpid()}-{case}"
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for i in range(requests):
            headers = {"Authorization": f"Bearer {key}", "X-User-Id": user}
            if case.endswith("+key"):
                headers["Idempotency-Key"] = f"{case}-{i}-{time.time_ns()}"
            started = time.perf_counter()
            if case.startswith("process"):
                body = {**GUARD_BODY, "session_id": f"guard-{i % 50}"}
                async with client.stream("POST", "/process", json=body, headers=headers) as reply:
                    async for _ in reply.aiter_raw():
                        pass
            else:
                message = {"role": "user", "content": [{"type": "text", "text": f"note {i}"}]}
                reply = await client.post(
                    f"/sessions/guard-{i % 50}/messages",
                    json={"messages": [message]},
                    headers=headers,
                )
            if reply.status_code not in (200, 201):
                raise SystemExit(f"{case} answered HTTP {reply.status_code}")
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def measure_guard_cost(env: dict[str, str], key: str, requests: int) -> dict[str, Any]:
    """p50/p90 per case in :data:`GUARD_CASES`, on the backends ``env`` selects."""
    server = start("runtime", env)
    url = server.url
    try:
        for case in GUARD_CASES:  # warm-up
            asyncio.run(guard_latencies(url, key, case, 50))
        figures: dict[str, Any] = {}
        for case in GUARD_CASES:
            ordered = sorted(asyncio.run(guard_latencies(url, key, case, requests)))
            figures[case] = {
                "requests": len(ordered),
                "p50_ms": round(ordered[len(ordered) // 2], 3),
                "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1], 3),
            }
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)
    return figures


def guard_cost_report(args: argparse.Namespace) -> None:
    """Print and write the guard cost figures (``--guard-cost``)."""
    from agentscope_serverless.local_stack import RedisServer

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as workdir, RedisServer() as redis:
        key_file = Path(workdir) / "keys.json"
        key = service_key(key_file)
        base = {
            **os.environ,
            "AUTH_KEYS_BACKEND": "file",
            "AUTH_KEYS_FILE": str(key_file),
            "AGENT_APP": "agentscope_serverless.agents.demo:app",
        }
        on_redis = {
            "SESSION_HISTORY_BACKEND": "redis",
            "MEMORY_BACKEND": "redis",
            "STATE_BACKEND": "redis",
            "REDIS_URL": redis.url,
        }
        for backend, extra in (("in_memory", {}), ("redis", on_redis)):
            results[backend] = measure_guard_cost({**base, **extra}, key, args.guard_requests)
    print(f"{'backend':<11}{'case':<13}{'p50 ms':>9}{'p90 ms':>9}")
    for backend, figures in results.items():
        for case, row in figures.items():
            print(f"{backend:<11}{case:<13}{row['p50_ms']:>9.2f}{row['p90_ms']:>9.2f}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"http_bench-guards-{stamp}.json"
    report = {"benchmark": "http_bench guard cost", "when": stamp, "results": results}
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--history", type=int, default=1000, help="messages, reused session")
    parser.add_argument("--serve", choices=["runtime", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--recording", help=argparse.SUPPRESS)
    parser.add_argument(
        "--storage-cost", action="store_true", help="Measure the cost of storing runs instead."
    )
    parser.add_argument(
        "--guard-cost",
        action="store_true",
        help="measure only what the request guards and Idempotency-Key cost",
    )
    parser.add_argument("--guard-requests", type=int, default=300)
    parser.add_argument(
        "--rounds",
        type=int,
        help="turns of each pair of servers (default 3; with --storage-cost, 8)",
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.recording)
        return
    if args.guard_cost:
        guard_cost_report(args)
        return
    if shutil.which("wrk") is None:
        raise SystemExit(
            "wrk is not installed: ./scripts/bootstrap debian 'the request benchmark' wrk"
        )
    if args.storage_cost:
        report_storage_cost(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        key_file = workdir / "keys.json"
        key = service_key(key_file)
        env = {
            **os.environ,
            "AUTH_KEYS_BACKEND": "file",
            "AUTH_KEYS_FILE": str(key_file),
            "AGENT_APP": "agentscope_serverless.agents.demo:app",
            "POWERTOOLS_LOG_LEVEL": os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
        }
        servers: dict[str, Server] = {}
        try:
            cpu = max(os.sched_getaffinity(0))  # the servers' CPU; wrk goes where it may
            # (one server loaded at a time)
            servers["runtime"] = start("runtime", env, cpu=cpu)
            recording = workdir / "replies.json"
            recording.write_text(json.dumps(record_replies(servers["runtime"].url, key)))
            servers["bare"] = start("bare", env, recording, cpu=cpu)
            bench = Bench(
                key,
                servers,
                workdir,
                args.duration,
                args.connections,
                args.history,
                rounds=args.rounds or 3,
            )
            for stream in (True, False):
                for scenario in SCENARIOS.values():
                    scenario(bench, stream)
        finally:
            for server in servers.values():
                server.process.terminate()
                server.process.wait(timeout=30)

    verdicts = checks(bench.rows, bench.relative)
    report = {
        "benchmark": "http_bench",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": os.getloadavg(),
        },
        "options": {
            "duration": args.duration,
            "connections": args.connections,
            "history": args.history,
            "rounds": bench.rounds,
        },
        "rows": bench.rows,
        "relative_cpu": {
            f"{scenario}, {'streamed' if stream else 'not streamed'}": [round(r, 3) for r in ratios]
            for (scenario, stream), ratios in bench.relative.items()
        },
        "checks": verdicts,
    }
    print(
        f"{'scenario':<16}{'stream':>7}{'server':>9}{'requests':>10}{'req/s':>9}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'CPU ms/req':>12}"
    )
    for r in bench.rows:
        print(
            f"{r['scenario']:<16}{'yes' if r['stream'] else 'no':>7}{r['server']:>9}"
            f"{r['requests']:>10}{r['requests_per_second']:>9.1f}{r['p50_ms']:>9.2f}"
            f"{r['p99_ms']:>9.2f}{r['cpu_ms_per_request']:>12.3f}"
        )
    print()
    for name, verdict in verdicts.items():
        print(f"{'PASS' if verdict['ok'] else 'FAIL'}  {name}: x{verdict['ratio']}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"http_bench-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {path}")
    if not all(v["ok"] for v in verdicts.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
