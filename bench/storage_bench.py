"""Storage benchmark of the session history and memory backends, on a local stack.

Run ``.venv/bin/python bench/storage_bench.py`` (``--quick`` for a smaller run). It starts
its own Redis and moto (DynamoDB) servers, then measures, per backend:

- appending one message to a session of 10 and of 10,000 messages,
- reading a 1,000-message session,
- memory search (top 10) over 1,000, 10,000 and 100,000 memories of one user,
- for DynamoDB, the requests each operation sends (counted with botocore's
  ``before-send`` events): moto is far slower than DynamoDB, so requests are what
  carries over to AWS, not its wall time;
- next to the plain Redis commands doing the same reads and writes through the same
  client: ``get_session`` of 2,000 messages against one ``LRANGE`` of that list, and
  adding 100,000 memories (search index included) against pipelined ``HSET``s of the same
  message documents;
- the longest script a Redis memory add runs for one 1 MiB document of 150,000 distinct
  words (Redis serves no other client meanwhile), from Redis's SLOWLOG: at most 50 ms.

``--targets`` runs only the last three.

It prints a table and writes the numbers to ``bench/results/storage-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aioboto3
from redis.asyncio import Redis

from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, LocalStack
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.agent_state.dynamodb import DynamoDBStateService
from agentscope_serverless.services.memory import InMemoryMemoryService, MemoryService
from agentscope_serverless.services.memory.redis import RedisMemoryService
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    SessionHistoryService,
)
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService

RESULTS = Path(__file__).parent / "results"
VOCABULARY = [f"word{rank}" for rank in range(5000)]
# Zipf-like word frequencies, as in natural language: a few words are in most memories.
CUMULATIVE_WEIGHTS = list(itertools.accumulate(1 / (rank + 1) ** 1.05 for rank in range(5000)))


def message(text: str, role: str = "user") -> Message:
    return Message(role=role, content=[TextContent(text=text)])  # type: ignore[arg-type]


def sentence(rng: random.Random, low: int = 4, high: int = 24) -> str:
    words = rng.choices(VOCABULARY, cum_weights=CUMULATIVE_WEIGHTS, k=rng.randint(low, high))
    return " ".join(words)


class RequestCounter:
    """Counts the DynamoDB requests a client sends, by operation."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, event_name: str, **_: Any) -> None:
        self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def total(self) -> int:
        return sum(self.counts.values())


def summary(samples: list[float], requests: list[int] | None = None) -> dict[str, Any]:
    ordered = sorted(samples)
    result: dict[str, Any] = {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 3),
        "runs": len(ordered),
    }
    if requests is not None:
        result["requests"] = max(requests)
    return result


async def measure(
    operation: Callable[[], Awaitable[Any]], runs: int, counter: RequestCounter | None
) -> dict[str, Any]:
    samples: list[float] = []
    requests: list[int] = []
    for _ in range(runs):
        before = counter.total() if counter else 0
        start = time.perf_counter()
        await operation()
        samples.append(time.perf_counter() - start)
        if counter:
            requests.append(counter.total() - before)
    return summary(samples, requests if counter else None)


async def fill_session(history: SessionHistoryService, session: Session, count: int) -> None:
    rng = random.Random(count)
    for start in range(0, count, 500):
        batch = [message(sentence(rng)) for _ in range(min(500, count - start))]
        await history.append_message(session, batch)
        session.messages.clear()


async def bench_history(
    history: SessionHistoryService, counter: RequestCounter | None, appends: int, reads: int
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    user = f"bench-{time.time_ns()}"
    rng = random.Random(1)
    for size in (10, 10_000):
        session = await history.create_session(user, f"session-{size}")
        await fill_session(history, session, size)

        async def append_one(session: Session = session) -> None:
            await history.append_message(session, message(sentence(rng)))
            session.messages.clear()

        results[f"append_to_{size}"] = await measure(append_one, appends, counter)
    session = await history.create_session(user, "session-read")
    await fill_session(history, session, 1000)
    results["read_1000"] = await measure(
        lambda: history.get_session(user, "session-read"), reads, counter
    )
    if counter:
        results["create_session"] = await measure(
            lambda: history.create_session(user, f"new-{time.time_ns()}"), 3, counter
        )
        results["list_sessions_page"] = await measure(
            lambda: history.list_sessions_page(user, limit=50), 3, counter
        )
    return results


async def bench_state(state: DynamoDBStateService, counter: RequestCounter) -> dict[str, Any]:
    user = f"bench-{time.time_ns()}"
    return {
        "save_state": await measure(lambda: state.save_state(user, {"step": 1}), 5, counter),
        "export_state": await measure(lambda: state.export_state(user), 5, counter),
    }


async def bench_memory(memory: MemoryService, sizes: list[int], queries: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    user = f"bench-{time.time_ns()}"
    rng = random.Random(7)
    stored = 0
    for size in sizes:
        start = time.perf_counter()
        while stored < size:
            batch = [message(sentence(rng)) for _ in range(min(1000, size - stored))]
            await memory.add_memory(user, batch)
            stored += len(batch)
        build_seconds = time.perf_counter() - start
        query_rng = random.Random(size)
        natural = [[message(sentence(query_rng, 3, 6))] for _ in range(queries)]
        common = [[message("word0 word1 word2")]]
        samples = []
        for query in natural:
            begin = time.perf_counter()
            await memory.search_memory(user, query, filters={"top_k": 10})
            samples.append(time.perf_counter() - begin)
        common_samples = []
        for _ in range(max(5, queries // 20)):
            begin = time.perf_counter()
            await memory.search_memory(user, common[0], filters={"top_k": 10})
            common_samples.append(time.perf_counter() - begin)
        results[f"search_{size}"] = summary(samples) | {"build_seconds": round(build_seconds, 1)}
        results[f"search_{size}_common_words"] = summary(common_samples)
    return results


async def bench_redis_read_against_lrange(url: str, size: int, runs: int) -> dict[str, Any]:
    """``get_session`` of ``size`` messages, and a plain ``LRANGE`` of its list."""
    client = Redis.from_url(url)
    try:
        async with RedisSessionHistoryService(redis_client=client) as history:
            user = f"bench-{time.time_ns()}"
            session = await history.create_session(user, "read")
            await fill_session(history, session, size)
            key = f"agentscope:session:{{{user}}}:s:read:messages"
            assert await client.llen(key) == size
            # Alternate the two, so a change in the machine's load affects both alike.
            plain: list[float] = []
            ours: list[float] = []
            for _ in range(runs):
                start = time.perf_counter()
                await client.lrange(key, 0, -1)
                plain.append(time.perf_counter() - start)
                start = time.perf_counter()
                await history.get_session(user, "read")
                ours.append(time.perf_counter() - start)
    finally:
        await client.aclose()
    return {f"get_session_{size}": summary(ours), f"plain_lrange_{size}": summary(plain)}


async def bench_redis_bulk_add_against_hset(url: str, size: int) -> dict[str, Any]:
    """Adding ``size`` memories, and pipelined ``HSET``s of the same message documents."""
    rng = random.Random(11)
    messages = [message(sentence(rng)) for _ in range(size)]
    client = Redis.from_url(url)
    try:
        start = time.perf_counter()
        for first in range(0, size, 1000):
            pipeline = client.pipeline(transaction=False)
            for seq, item in enumerate(messages[first : first + 1000], start=first):
                pipeline.hset("plain:{bench}:docs", str(seq), item.model_dump_json())
            await pipeline.execute()
        plain = time.perf_counter() - start
        async with RedisMemoryService(redis_client=client) as memory:
            start = time.perf_counter()
            await memory.add_memory(f"bench-{time.time_ns()}", messages)
            ours = time.perf_counter() - start
    finally:
        await client.aclose()
    return {
        f"add_memory_{size}": {"median_ms": round(ours * 1000, 1), "p95_ms": 0, "runs": 1},
        f"plain_hset_{size}": {"median_ms": round(plain * 1000, 1), "p95_ms": 0, "runs": 1},
    }


# The longest a memory add may hold Redis in one script: every other client waits meanwhile.
MAX_SCRIPT_MS = 50.0


async def bench_redis_document_add(url: str, words: int) -> dict[str, Any]:
    """Adding one document of ``words`` distinct words (about 1 MiB at 150,000): the whole
    add, and the longest script it ran (from Redis's SLOWLOG, which times each command)."""
    document = message(" ".join(f"w{i}" for i in range(words)))
    client = Redis.from_url(url)
    try:
        before = await client.config_get("slowlog-log-slower-than")
        await client.config_set("slowlog-log-slower-than", 0)
        await client.config_set("slowlog-max-len", 100_000)
        await client.slowlog_reset()
        async with RedisMemoryService(redis_client=client) as memory:
            start = time.perf_counter()
            await memory.add_memory(f"bench-document-{time.time_ns()}", [document])
            total = time.perf_counter() - start
        scripts = [
            entry["duration"] / 1000
            for entry in await client.slowlog_get(100_000)
            if entry["command"].split(b" ", 1)[0].upper() in (b"EVALSHA", b"EVAL")
        ]
        await client.config_set("slowlog-log-slower-than", before["slowlog-log-slower-than"])
    finally:
        await client.aclose()
    # As the table's rows: its "requests" column counts the scripts.
    return {
        f"add_document_{words}": {"median_ms": round(total * 1000, 1), "p95_ms": 0, "runs": 1},
        "longest_script": {
            "median_ms": round(max(scripts), 1),
            "p95_ms": 0,
            "runs": 1,
            "requests": len(scripts),
        },
    }


async def run_targets(stack: LocalStack, quick: bool) -> dict[str, Any]:
    url = stack.redis.url
    reads = await bench_redis_read_against_lrange(url, 2000, 10 if quick else 40)
    adds = await bench_redis_bulk_add_against_hset(url, 10_000 if quick else 100_000)
    document = await bench_redis_document_add(url, 150_000)
    return {
        "redis get_session vs LRANGE": reads,
        "redis add_memory vs HSET": adds,
        "redis add of a 1 MiB document": document,
    }


def target_checks(targets: dict[str, Any]) -> dict[str, Any]:
    reads = targets["redis get_session vs LRANGE"]
    read_ratio = reads["get_session_2000"]["median_ms"] / reads["plain_lrange_2000"]["median_ms"]
    adds = targets["redis add_memory vs HSET"]
    longest = targets["redis add of a 1 MiB document"]["longest_script"]
    ours = next(v for k, v in adds.items() if k.startswith("add_memory"))["median_ms"]
    plain = next(v for k, v in adds.items() if k.startswith("plain_hset"))["median_ms"]
    return {
        "redis get_session of 2,000 messages <= 2x plain LRANGE": {
            "ok": read_ratio <= 2,
            "detail": f"{read_ratio:.2f}x",
        },
        "redis add_memory in bulk <= 2x plain pipelined HSETs": {
            "ok": ours / plain <= 2,
            "detail": f"{ours / plain:.2f}x",
        },
        f"redis add of a 1 MiB document holds Redis <= {MAX_SCRIPT_MS:g} ms at a time": {
            "ok": longest["median_ms"] <= MAX_SCRIPT_MS,
            "detail": f"longest of {longest['requests']} scripts: {longest['median_ms']} ms",
        },
    }


def print_table(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str, str, str]] = []
    for backend, operations in results["backends"].items():
        for operation, numbers in operations.items():
            rows.append(
                (
                    backend,
                    operation,
                    f"{numbers['median_ms']:.3f}",
                    f"{numbers['p95_ms']:.3f}",
                    str(numbers.get("requests", "")),
                )
            )
    header = ("backend", "operation", "median ms", "p95 ms", "requests")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(5)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    print(line.format(*header))
    print(line.format(*("-" * w for w in widths)))
    for row in rows:
        print(line.format(*row))
    print()
    for check, verdict in results["checks"].items():
        print(f"{'PASS' if verdict['ok'] else 'FAIL'}  {check}: {verdict['detail']}")


def checks(backends: dict[str, Any], largest: int) -> dict[str, Any]:
    redis = backends["redis session history"]
    dynamodb = backends["dynamodb session history"]
    redis_ratio = redis["append_to_10000"]["median_ms"] / redis["append_to_10"]["median_ms"]
    dynamo_ratio = dynamodb["append_to_10000"]["requests"] / dynamodb["append_to_10"]["requests"]
    search = backends["redis memory"][f"search_{largest}"]["median_ms"]
    return {
        "redis append, 10,000 vs 10 messages (time) <= 1.5x": {
            "ok": redis_ratio <= 1.5,
            "detail": f"{redis_ratio:.2f}x",
        },
        "dynamodb append, 10,000 vs 10 messages (requests) <= 1.5x": {
            "ok": dynamo_ratio <= 1.5,
            "detail": f"{dynamo_ratio:.2f}x",
        },
        f"redis memory search at {largest:,} memories, median < 10 ms": {
            "ok": search < 10,
            "detail": f"{search:.2f} ms",
        },
    }


async def run(stack: LocalStack, quick: bool, targets_only: bool) -> dict[str, Any]:
    targets = await run_targets(stack, quick)
    if targets_only:
        return {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
            "quick": quick,
            "backends": targets,
            "checks": target_checks(targets),
        }
    assert stack.dynamodb is not None
    appends, reads, queries = (50, 10, 50) if quick else (200, 30, 200)
    sizes = [1000, 10_000] if quick else [1000, 10_000, 100_000]
    backends: dict[str, Any] = {}

    async with InMemorySessionHistoryService() as history:
        backends["in_memory session history"] = await bench_history(history, None, appends, reads)
    async with RedisSessionHistoryService(stack.redis.url) as history:
        backends["redis session history"] = await bench_history(history, None, appends, reads)

    counter = RequestCounter()
    session = aioboto3.Session(region_name=stack.dynamodb.region, **LOCAL_AWS_CREDENTIALS)
    async with session.client("dynamodb", endpoint_url=stack.dynamodb.endpoint_url) as client:
        client.meta.events.register("before-send.dynamodb", counter)
        table = stack.dynamodb.sessions_table
        async with DynamoDBSessionHistoryService(table, client=client) as history:
            backends["dynamodb session history"] = await bench_history(
                history, counter, appends // 4, reads // 3
            )
        async with DynamoDBStateService(stack.dynamodb.state_table, client=client) as state:
            backends["dynamodb state"] = await bench_state(state, counter)

    async with InMemoryMemoryService() as memory:
        backends["in_memory memory"] = await bench_memory(memory, sizes, queries)
    async with RedisMemoryService(stack.redis.url) as memory:
        backends["redis memory"] = await bench_memory(memory, sizes, queries)

    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "quick": quick,
        "backends": backends | targets,
        "checks": checks(backends, sizes[-1]) | target_checks(targets),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, up to 10,000 memories")
    parser.add_argument("--targets", action="store_true", help="only the comparisons with Redis")
    arguments = parser.parse_args()
    with LocalStack(dynamodb=not arguments.targets) as stack:
        results = asyncio.run(run(stack, arguments.quick, arguments.targets))
    print_table(results)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"storage-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
