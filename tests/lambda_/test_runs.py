"""Stored runs on the SAM-built functions: resume through the streamed process function, and a
cancel reaching a run that another function instance is executing."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lambda_.conftest import Artifact, RunningFunction
from tests.support.http import parse_sse, running
from tests.support.lambda_invoke import LambdaInvokeAPI
from tests.support.slow_agent import PIECES

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
StartFunction = Callable[..., RunningFunction]


@pytest.fixture(scope="module")
def instances(
    start_function: StartFunction, lambda_artifacts: Callable[[str], Artifact]
) -> tuple[RunningFunction, RunningFunction]:
    """Two execution environments of the streamed process function serving the slow agent."""
    artifact = lambda_artifacts("ProcessStreamFunction")
    path = f"{artifact.code_dir}:{artifact.layer_dir}:{ROOT}"
    agent = "tests.support.slow_agent:app"
    return (
        start_function("ProcessStreamFunction", AGENT_APP=agent, PYTHONPATH=path, INSTANCE="a"),
        start_function("ProcessStreamFunction", AGENT_APP=agent, PYTHONPATH=path, INSTANCE="b"),
    )


class Background:
    """A request served by one instance while the test talks to another."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        self.result = call()

    def join(self) -> Any:
        self._thread.join(120)
        return self.result


def _events(body: bytes) -> list[dict[str, Any]]:
    return list(parse_sse(body.decode().split("\n")[:-1]).data)


def _start_slow_run(first: RunningFunction, key: str, session_id: str) -> Background:
    body = {"input": [{"role": "user", "content": "take your time"}], "session_id": session_id}
    return Background(lambda: first.request("POST", "/process", key=key, body=body))


def _run_id_seen_by(other: RunningFunction, key: str, session_id: str) -> str:
    """The id of the session's run, once it is stored (read through another instance)."""
    deadline = time.monotonic() + 60
    while True:
        status, _, body, _ = other.request(
            "GET", "/runs", key=key, query=f"session_id={session_id}"
        )
        assert status == 200, body
        items = json.loads(body)["items"]
        if items:
            return str(items[0]["id"])
        assert time.monotonic() < deadline, "the run was never stored"
        time.sleep(0.1)


def test_a_run_resumes_through_another_instance_of_the_streamed_function(
    instances: tuple[RunningFunction, RunningFunction], api_key: str
) -> None:
    first, second = instances
    session_id = f"lambda-resume-{uuid.uuid4().hex[:8]}"
    running = _start_slow_run(first, api_key, session_id)
    run_id = _run_id_seen_by(second, api_key, session_id)
    status, headers, body, _ = second.request(
        "GET", f"/runs/{run_id}/events", key=api_key, query="after=2"
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    resumed = _events(body)
    assert [e["sequence_number"] for e in resumed] == list(range(3, 3 + len(resumed)))
    assert resumed[-1]["object"] == "response" and resumed[-1]["status"] == "completed"
    text = "".join(e["text"] for e in resumed if e.get("object") == "content" and e.get("delta"))
    assert text == "".join(f"piece {index}. " for index in range(PIECES))
    status, headers, original, _ = running.join()
    assert status == 200 and headers["x-run-id"] == run_id
    assert _events(original)[3:] == resumed


def test_a_cancel_reaches_the_run_another_instance_executes(
    instances: tuple[RunningFunction, RunningFunction],
    start_function: StartFunction,
    api_key: str,
) -> None:
    first, second = instances
    session_id = f"lambda-cancel-{uuid.uuid4().hex[:8]}"
    running = _start_slow_run(first, api_key, session_id)
    run_id = _run_id_seen_by(second, api_key, session_id)
    status, _, body, _ = second.request("POST", f"/runs/{run_id}/cancel", key=api_key)
    assert status == 202, body
    status, _, streamed, _ = running.join()
    events = _events(streamed)
    assert events[-1]["object"] == "response" and events[-1]["status"] == "canceled"
    pieces = [e for e in events if e.get("object") == "content" and e.get("delta")]
    assert len(pieces) < PIECES, "the agent was stopped before it finished"
    status, _, body, _ = second.request("GET", f"/runs/{run_id}", key=api_key)
    assert json.loads(body)["status"] == "canceled"
    state = start_function("StateFunction")
    status, _, body, _ = state.request("GET", f"/state/{session_id}", key=api_key)
    assert json.loads(body)["state"] == {"cleanup": True}
    sessions = start_function("SessionsFunction")
    status, _, body, _ = sessions.request("GET", f"/sessions/{session_id}/messages", key=api_key)
    history = json.loads(body)["items"]
    assert [m["role"] for m in history] == ["user", "assistant"]
    # The runs routes are served by the sessions function too.
    status, _, body, _ = sessions.request("GET", f"/runs/{run_id}/events", key=api_key)
    assert _events(body) == events


def _task_when_done(process: RunningFunction, key: str, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        status, _, body, _ = process.request("GET", f"/tasks/{task_id}", key=key)
        assert status == 200, body
        task: dict[str, Any] = json.loads(body)
        if task["status"] != "in_progress":
            return task
        assert time.monotonic() < deadline, "the task did not finish"
        time.sleep(0.2)


def test_a_background_task_runs_as_an_asynchronous_invocation_of_the_tasks_function(
    start_function: StartFunction, lambda_artifacts: Callable[[str], Artifact], api_key: str
) -> None:
    process_code = lambda_artifacts("ProcessStreamFunction")
    tasks_code = lambda_artifacts("TasksFunction")
    agent = "tests.support.slow_agent:app"
    tasks = start_function(
        "TasksFunction",
        AGENT_APP=agent,
        PYTHONPATH=f"{tasks_code.code_dir}:{tasks_code.layer_dir}:{ROOT}",
    )
    invoke_api = LambdaInvokeAPI({"TasksFunction": tasks.runtime})
    with running(invoke_api.app()) as lambda_url:
        process = start_function(
            "ProcessStreamFunction",
            AGENT_APP=agent,
            PYTHONPATH=f"{process_code.code_dir}:{process_code.layer_dir}:{ROOT}",
            TASKS_FUNCTION_NAME="TasksFunction",
            LAMBDA_ENDPOINT_URL=lambda_url,
        )
        status, _, body, _ = process.request("POST", "/jobs/double", key=api_key, body={"n": 21})
        assert status == 202, body
        task_id = json.loads(body)["task_id"]
        status, _, body, _ = process.request("POST", "/jobs/double", key=api_key, body={})
        failing_id = json.loads(body)["task_id"]
        done = _task_when_done(process, api_key, task_id)
        failed = _task_when_done(process, api_key, failing_id)
    assert done["status"] == "completed" and done["result"] == {"doubled": 42}
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "TASK_FAILED", "message": "KeyError: 'n'"}
    paths = [event["agentscope_task"]["path"] for event in invoke_api.events]
    assert paths == ["/jobs/double", "/jobs/double"]
    assert all(result.kind == "response" for result in invoke_api.results)
