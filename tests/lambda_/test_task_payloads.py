"""The payload of a background task submitted on Lambda reaches the tasks function in an
asynchronous invocation, which Lambda takes up to 1 MB: a payload the request limit admits
is sent whole, and one too large for Lambda is refused with a 413 saying so (a 503 would be
retried by clients, and by OpenAI's SDKs, to no avail). A task waits, in progress, for its
invocation however late Lambda delivers it.

The handler is the process function's, its tasks sent to the Invoke API stand-in
(:mod:`tests.support.lambda_invoke`), which refuses what Lambda refuses."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http.lambda_handler import LambdaHandler, make_handler
from tests.support.http import issue_key, running
from tests.support.lambda_invoke import EVENT_PAYLOAD_LIMIT_BYTES, LambdaInvokeAPI
from tests.support.lambda_runtime import function_url_event


@pytest.fixture
def process_handler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LambdaHandler, str, LambdaInvokeAPI]]:
    """The process function of an agent with a task, sending its tasks to the stand-in."""
    (tmp_path / "archiving_agent.py").write_text(
        "from agentscope_serverless.app import AgentApp\n"
        "app = AgentApp(app_name='archiving')\n"
        "@app.query(framework='text')\n"
        "async def query(self, msgs, **kwargs):\n"
        "    yield 'ok'\n"
        "@app.task('/jobs/archive')\n"
        "async def archive(payload):\n"
        "    return len(payload['rows'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "archiving_agent", raising=False)
    keys = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys), "archive-user")
    invoke_api = LambdaInvokeAPI({}, queued=("TasksFunction",))
    with running(invoke_api.app()) as lambda_url:
        for name, value in {
            "AUTH_KEYS_BACKEND": "file",
            "AUTH_KEYS_FILE": str(keys),
            "AGENT_APP": "archiving_agent:app",
            "SESSION_HISTORY_BACKEND": "in_memory",
            "RUNS_BACKEND": "in_memory",
            "TASKS_FUNCTION_NAME": "TasksFunction",
            "LAMBDA_ENDPOINT_URL": lambda_url,
            "MAX_REQUEST_BYTES": str(4 * 1024 * 1024),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }.items():
            monkeypatch.setenv(name, value)
        yield make_handler(["process"]), key, invoke_api


def _submit(handler: LambdaHandler, key: str, body: str) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    event = function_url_event("POST", "/jobs/archive", headers=headers, body=body)
    return handler(event, None)


def test_a_task_payload_the_request_limit_admits_is_sent_whole(
    process_handler: tuple[LambdaHandler, str, LambdaInvokeAPI],
) -> None:
    handler, key, invoke_api = process_handler
    # 900 KB as sent, under 1 MB: a copy with JSON's default spaces after commas is not.
    body = json.dumps({"rows": [0] * 450_000}, separators=(",", ":"))
    assert len(body) < EVENT_PAYLOAD_LIMIT_BYTES < len(json.dumps(json.loads(body)))
    answer = _submit(handler, key, body)
    assert answer["statusCode"] == 202, answer["body"][:300]
    [event] = invoke_api.events
    assert event["agentscope_task"]["payload"] == json.loads(body)
    # The tasks function (this handler) runs it from the event, as Lambda delivers it.
    assert handler(event, None) == {"status": "done"}
    task_id = json.loads(answer["body"])["task_id"]
    headers = {"authorization": f"Bearer {key}"}
    status = handler(function_url_event("GET", f"/tasks/{task_id}", headers=headers), None)
    assert json.loads(status["body"])["result"] == 450_000, status["body"][:300]


def test_a_task_payload_larger_than_lambda_takes_is_a_413_naming_the_limit(
    process_handler: tuple[LambdaHandler, str, LambdaInvokeAPI],
) -> None:
    handler, key, invoke_api = process_handler
    body = json.dumps({"rows": ["row"] * 300_000}, separators=(",", ":"))  # 1.8 MB
    answer = _submit(handler, key, body)
    assert answer["statusCode"] == 413, answer["body"][:300]
    error = json.loads(answer["body"])["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE"
    assert str(EVENT_PAYLOAD_LIMIT_BYTES) in error["message"]
    assert answer["headers"].get("x-should-retry") != "true"
    assert invoke_api.events == []


def test_a_task_whose_invocation_comes_minutes_later_waits_for_it_and_runs(
    process_handler: tuple[LambdaHandler, str, LambdaInvokeAPI],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lambda may deliver a task's asynchronous invocation minutes after it was queued: it
    retries one that failed a minute later, then two minutes later, and holds those of a
    throttled function for up to six hours. The task was read as lost (failed, RUN_LOST)
    a minute after it was submitted, and the invocation that came then skipped it."""
    handler, key, invoke_api = process_handler
    answer = _submit(handler, key, json.dumps({"rows": [1, 2, 3]}))
    assert answer["statusCode"] == 202, answer["body"]
    task_id = json.loads(answer["body"])["task_id"]
    [event] = invoke_api.events
    submitted = time.time()
    monkeypatch.setattr(time, "time", lambda: submitted + 3 * 60)  # after Lambda's 2nd retry
    headers = {"authorization": f"Bearer {key}"}
    waiting = handler(function_url_event("GET", f"/tasks/{task_id}", headers=headers), None)
    assert json.loads(waiting["body"])["status"] == "in_progress", waiting["body"]
    assert handler(event, None) == {"status": "done"}
    status = handler(function_url_event("GET", f"/tasks/{task_id}", headers=headers), None)
    assert json.loads(status["body"])["status"] == "completed", status["body"]
    assert json.loads(status["body"])["result"] == 3
