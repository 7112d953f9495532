"""Stored runs across server processes: resume a dropped stream elsewhere, cancel from elsewhere.

Two ``agentscope-serverless serve`` processes share the stores (Redis, or moto's DynamoDB
server) and a key file; the slow agent yields a piece every 200 ms for 5 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.auth import FileKeyStore
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from tests.support.http import bearer, free_port, issue_key, parse_sse, user_message
from tests.support.slow_agent import PIECES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(sys.executable).parent / "agentscope-serverless")


class Cluster:
    """Two server processes on the same stores, and the keys of three users (carol's data
    is erased)."""

    def __init__(self, urls: list[str], alice: str, bob: str, carol: str) -> None:
        self.urls, self.alice, self.bob, self.carol = urls, alice, bob, carol

    def client(self, index: int, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.urls[index], headers=bearer(key or self.alice), timeout=30
        )


def _environment(backend: str, redis: RedisServer, dynamodb: DynamoDBServer) -> dict[str, str]:
    if backend == "redis":
        stores = {
            "SESSION_HISTORY_BACKEND": "redis",
            "STATE_BACKEND": "redis",
            "RUNS_BACKEND": "redis",
        }
    else:
        stores = {
            "SESSION_HISTORY_BACKEND": "dynamodb",
            "STATE_BACKEND": "dynamodb",
            "RUNS_BACKEND": "dynamodb",
            "DYNAMODB_ENDPOINT_URL": dynamodb.endpoint_url,
            "DYNAMODB_SESSIONS_TABLE": dynamodb.sessions_table,
            "DYNAMODB_STATE_TABLE": dynamodb.state_table,
            "DYNAMODB_RUNS_TABLE": dynamodb.runs_table,
            "AWS_REGION": dynamodb.region,
            "AWS_ACCESS_KEY_ID": LOCAL_AWS_CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": LOCAL_AWS_CREDENTIALS["aws_secret_access_key"],
        }
    return {"MEMORY_BACKEND": "redis", "REDIS_URL": redis.url, **stores}


@pytest.fixture(scope="module", params=["redis", "dynamodb"])
def cluster(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    dynamodb_server: DynamoDBServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    store = FileKeyStore(keys_file)
    alice = issue_key(store, f"alice-{uuid.uuid4().hex[:8]}")
    bob = issue_key(store, f"bob-{uuid.uuid4().hex[:8]}")
    carol = issue_key(store, f"carol-{uuid.uuid4().hex[:8]}")
    env = {
        **os.environ,
        **_environment(request.param, redis_server, dynamodb_server),
        "AUTH_KEYS_BACKEND": "file",
        "AUTH_KEYS_FILE": str(keys_file),
        "PYTHONPATH": str(ROOT),
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",
    }
    processes: list[subprocess.Popen[Any]] = []
    urls = []
    try:
        for _ in range(2):
            port = free_port()
            command = [SCRIPT, "serve", "--port", str(port), "--log-level", "warning"]
            command += ["--agent", "tests.support.slow_agent:app"]
            processes.append(
                subprocess.Popen(
                    command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            _wait_until_healthy(url, process)
        yield Cluster(urls, alice, bob, carol)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def _wait_until_healthy(url: str, process: subprocess.Popen[Any]) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, "the server process exited"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.1)


def _read_events(lines: Iterator[str], count: int) -> list[tuple[str, dict[str, Any]]]:
    """The first ``count`` events (id, data) of an SSE line stream."""
    events: list[tuple[str, dict[str, Any]]] = []
    block: list[str] = []
    for line in lines:
        block.append(line)
        if line == "" and any(part.startswith("data: ") for part in block):
            parsed = parse_sse(block)
            events.append((str(parsed.ids[0]), parsed.data[0]))
            block = []
            if len(events) == count:
                break
    return events


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e.get("object") == "content" and e.get("delta"))


def _slow_run(session_id: str) -> dict[str, Any]:
    return {"input": [user_message("take your time")], "session_id": session_id}


def test_a_dropped_stream_resumes_on_another_server_from_its_last_event(cluster: Cluster) -> None:
    session_id = f"resume-{uuid.uuid4().hex[:8]}"
    with (
        cluster.client(0) as first,
        first.stream("POST", "/process", json=_slow_run(session_id)) as response,
    ):
        assert response.status_code == 200
        run_id = response.headers["X-Run-Id"]
        head = _read_events(response.iter_lines(), 3)
    # The connection is closed here, after the third event.
    assert [event_id for event_id, _ in head] == ["0", "1", "2"]
    assert head[0][1]["id"] == run_id
    with cluster.client(1) as second:
        headers = {"Last-Event-ID": "2"}
        with second.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
            assert response.status_code == 200
            rest = parse_sse(list(response.iter_lines()))
        numbers = [event["sequence_number"] for event in rest.data]
        assert numbers == list(range(3, 3 + len(numbers)))
        assert rest.ids == [str(n) for n in numbers]
        final = rest.data[-1]
        assert final["object"] == "response" and final["status"] == "completed"
        assert final["id"] == run_id
        expected = "".join(f"piece {index}. " for index in range(PIECES))
        assert _text(rest.data) == expected
        run = second.get(f"/runs/{run_id}").json()
        assert run["status"] == "completed" and run["session_id"] == session_id
        listed = second.get("/runs", params={"session_id": session_id}).json()["items"]
        assert [item["id"] for item in listed] == [run_id]
        # A finished run replays from the start and ends.
        with second.stream("GET", f"/runs/{run_id}/events") as response:
            replay = parse_sse(list(response.iter_lines()))
        assert [e["sequence_number"] for e in replay.data] == list(range(len(replay.data)))
        assert replay.data[3:] == rest.data


def test_a_run_cancelled_from_another_server_stops_and_keeps_its_partial_reply(
    cluster: Cluster,
) -> None:
    session_id = f"cancel-{uuid.uuid4().hex[:8]}"
    with cluster.client(0) as first, cluster.client(1) as second:
        with first.stream("POST", "/process", json=_slow_run(session_id)) as response:
            run_id = response.headers["X-Run-Id"]
            lines = response.iter_lines()
            head = _read_events(lines, 6)
            cancelled = second.post(f"/runs/{run_id}/cancel")
            assert cancelled.status_code == 202
            assert cancelled.json()["cancel_requested"] is True
            tail = parse_sse(list(lines))
        streamed = [data for _, data in head] + tail.data
        final = streamed[-1]
        assert final["object"] == "response" and final["status"] == "canceled"
        assert final["id"] == run_id
        pieces = [e for e in streamed if e.get("object") == "content" and e.get("delta")]
        assert 3 <= len(pieces) < PIECES, "the agent was stopped before it finished"
        numbers = [e["sequence_number"] for e in streamed]
        assert numbers == list(range(len(numbers)))
        # The handler's finally block ran.
        assert second.get(f"/state/{session_id}").json()["state"] == {"cleanup": True}
        # The partial reply is in the session history, after the input.
        history = second.get(f"/sessions/{session_id}/messages").json()["items"]
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[1]["content"][0]["text"] == _text(streamed)
        run = second.get(f"/runs/{run_id}").json()
        assert run["status"] == "canceled"
        stored = first.get(f"/runs/{run_id}/events")
        stored_events = parse_sse(stored.text.split("\n")[:-1]).data
        assert stored_events == streamed
        time.sleep(1)
        again = parse_sse(first.get(f"/runs/{run_id}/events").text.split("\n")[:-1]).data
        assert again == stored_events, "nothing is stored after the canceled event"
        assert second.post(f"/runs/{run_id}/cancel").status_code == 409


def test_runs_belong_to_their_user(cluster: Cluster) -> None:
    session_id = f"mine-{uuid.uuid4().hex[:8]}"
    with (
        cluster.client(0) as alice,
        cluster.client(1, cluster.bob) as bob,
        alice.stream("POST", "/process", json=_slow_run(session_id)) as response,
    ):
        run_id = response.headers["X-Run-Id"]
        _read_events(response.iter_lines(), 3)
        assert bob.get(f"/runs/{run_id}").status_code == 404
        assert bob.get(f"/runs/{run_id}/events").status_code == 404
        assert bob.post(f"/runs/{run_id}/cancel").status_code == 404
        assert bob.get("/runs", params={"session_id": session_id}).json()["items"] == []
        assert httpx.get(f"{cluster.urls[1]}/runs/{run_id}").status_code == 401
        assert alice.post(f"/runs/{run_id}/cancel").status_code == 202


@pytest.mark.parametrize("erase", ["user", "session"])
# After its first event only, the run is not stored yet: it is, 50 ms later.
@pytest.mark.parametrize("events_seen", [1, 6])
def test_erasing_stops_a_run_in_progress_on_another_server_before_deleting(
    cluster: Cluster, erase: str, events_seen: int
) -> None:
    session_id = f"erased-{uuid.uuid4().hex[:8]}"
    with cluster.client(0, cluster.carol) as first, cluster.client(1, cluster.carol) as second:
        with first.stream("POST", "/process", json=_slow_run(session_id)) as response:
            run_id = response.headers["X-Run-Id"]
            lines = response.iter_lines()
            _read_events(lines, events_seen)
            path = "/users/me/data" if erase == "user" else f"/sessions/{session_id}"
            assert second.delete(path).status_code == 204
            tail = parse_sse(list(lines))
        assert tail.data[-1]["status"] == "canceled"
        # The run ended before the erase went on: neither its turn nor its events came back.
        for _ in range(2):
            for client in (first, second):
                assert client.get(f"/sessions/{session_id}").status_code == 404
                assert client.get(f"/runs/{run_id}").status_code == 404
                assert client.get("/runs", params={"session_id": session_id}).json()["items"] == []
            time.sleep(1)
        if erase == "user":  # the agent state of the session, saved as the run ended
            assert second.get(f"/state/{session_id}").status_code == 404
