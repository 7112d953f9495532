"""The SAM-built functions under the real runtime interface client, fed Function URL events."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lambda_.conftest import Artifact, RunningFunction, start_built_function
from tests.support.http import free_port, user_message
from tests.support.lambda_runtime import function_url_event
from tests.support.sandbox_server import RunningServer

# The first test builds the stack with SAM (once per session).
pytestmark = pytest.mark.timeout(300)

FUNCTIONS = [
    "ProcessFunction",
    "ProcessStreamFunction",
    "SessionsFunction",
    "MemoryFunction",
    "StateFunction",
]
PROCESS_FUNCTIONS = ["ProcessFunction", "ProcessStreamFunction"]

StartFunction = Callable[..., RunningFunction]
ROOT = Path(__file__).resolve().parents[2]


def sse_events(body: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("data: ") :])
        for line in body.decode().splitlines()
        if line.startswith("data: ")
    ]


def run(function: RunningFunction, key: str, session_id: str, text: str) -> list[dict[str, Any]]:
    status, headers, body, _ = function.request(
        "POST",
        "/process",
        key=key,
        body={"input": [{"role": "user", "content": text}], "session_id": session_id},
    )
    assert status == 200, body
    assert headers["content-type"].startswith("text/event-stream")
    return sse_events(body)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_answers_health(start_function: StartFunction, name: str) -> None:
    status, _, body, _ = start_function(name).request("GET", "/health")
    assert status == 200
    assert json.loads(body)["status"] == "healthy"


@pytest.mark.parametrize("name", [*PROCESS_FUNCTIONS, "SessionsFunction"])
def test_a_requests_id_is_its_invocations(start_function: StartFunction, name: str) -> None:
    # The id Lambda's own lines of the invocation carry (START, END, REPORT: a time-out, the
    # memory used), so a request's lines and Lambda's are found with the one id.
    status, headers, _, invocation = start_function(name).request("GET", "/health")
    assert status == 200
    assert headers["x-request-id"] == invocation.request_id


def test_a_request_refused_before_the_application_has_its_invocations_id(
    start_function: StartFunction,
) -> None:
    event = function_url_event("POST", "/sessions", body="not base64!")
    event["isBase64Encoded"] = True
    invocation = start_function("SessionsFunction").runtime.invoke(event)
    status, headers, _ = invocation.http_response()
    assert status == 400
    assert headers["x-request-id"] == invocation.request_id


def test_the_sandbox_function_serves_a_users_sandbox(
    start_function: StartFunction, api_key: str, sandbox_server: RunningServer
) -> None:
    sandbox = start_function(
        "SandboxFunction",
        SANDBOX_BASE_URL=sandbox_server.url,
        SANDBOX_BEARER_TOKEN=sandbox_server.token,
    )
    status, _, body, _ = sandbox.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "healthy"
    session_id = f"box-{uuid.uuid4().hex[:8]}"
    status, _, body, _ = sandbox.request("POST", f"/sandboxes/{session_id}", key=api_key, body={})
    assert status == 200, body
    status, _, body, _ = sandbox.request(
        "POST",
        f"/sandboxes/{session_id}/tools/run_ipython_cell",
        key=api_key,
        body={"code": "print(6 * 7)"},
    )
    assert status == 200, body
    assert "42" in json.dumps(json.loads(body)["content"])
    status, _, body, _ = sandbox.request("DELETE", f"/sandboxes/{session_id}", key=api_key)
    assert status == 200 and json.loads(body)["released"] is True


PROTECTED_ROUTE = {
    "ProcessFunction": ("POST", "/process"),
    "ProcessStreamFunction": ("POST", "/process"),
    "SessionsFunction": ("GET", "/sessions"),
    "MemoryFunction": ("GET", "/memory"),
    "StateFunction": ("GET", "/state/s1/rounds"),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_refuses_requests_without_a_key(
    start_function: StartFunction, name: str
) -> None:
    method, path = PROTECTED_ROUTE[name]
    body = {} if method == "POST" else None
    status, headers, content, _ = start_function(name).request(method, path, body=body)
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert json.loads(content)["error"]["code"]


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_a_body_nesting_too_deeply_is_refused_by_the_built_function(
    start_function: StartFunction, api_key: str, name: str
) -> None:
    nested: Any = "x"
    for _ in range(150):
        nested = [nested]
    function = start_function(name)
    status, _, content, _ = function.request("POST", "/process", key=api_key, body=nested)
    assert status == 422, content
    assert json.loads(content)["error"] == {
        "code": "INVALID_INPUT",
        "message": "the request body nests deeper than 100 levels of arrays and objects",
        "type": "invalid_request_error",
        "param": None,
    }


def test_an_event_whose_body_does_not_decode_is_a_400_of_the_built_function(
    start_function: StartFunction, api_key: str
) -> None:
    sessions = start_function("SessionsFunction")
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
    event = function_url_event("POST", "/sessions", headers=headers, body="!!not base64")
    event["isBase64Encoded"] = True
    status, _, content = sessions.runtime.invoke(event).http_response()
    assert status == 400, content
    assert json.loads(content)["error"] == {
        "code": "BAD_REQUEST",
        "message": "the request body is not valid base64 (isBase64Encoded is true)",
        "type": "invalid_request_error",
        "param": None,
    }
    status, _, content, _ = sessions.request("POST", "/sessions", key=api_key, body={})
    assert status == 201, content  # the next event is served


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_process_streams_the_full_event_sequence(
    start_function: StartFunction, api_key: str, name: str
) -> None:
    events = run(start_function(name), api_key, f"s-{uuid.uuid4().hex[:8]}", "My name is Ada")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [(e["object"], e["status"]) for e in events]
    assert kinds[:3] == [
        ("response", "created"),
        ("response", "in_progress"),
        ("message", "in_progress"),
    ]
    deltas = [e for e in events if e["object"] == "content" and e["delta"]]
    assert deltas and all(e["msg_id"] == events[2]["id"] for e in deltas)
    assert kinds[-3:] == [
        ("content", "completed"),
        ("message", "completed"),
        ("response", "completed"),
    ]
    final = events[-1]
    assert final["output"][0]["content"][0]["text"] == "".join(e["text"] for e in deltas)


def test_the_streaming_function_streams_and_the_buffered_one_buffers(
    start_function: StartFunction, api_key: str
) -> None:
    body = {"input": [{"role": "user", "content": "hello"}], "session_id": "stream-check"}
    *_, streamed = start_function("ProcessStreamFunction").request(
        "POST", "/process", key=api_key, body=body
    )
    *_, buffered = start_function("ProcessFunction").request(
        "POST", "/process", key=api_key, body=body
    )
    assert streamed.streamed and len(streamed.chunk_times) > 1
    assert not buffered.streamed


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_a_process_function_started_while_the_memory_store_is_down_answers(
    start_function: StartFunction, api_key: str, name: str
) -> None:
    # Memory is best effort: a run goes on without it, from a cold start too.
    function = start_function(name, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    status, _, body, _ = function.request(
        "POST", "/process", key=api_key, body={"input": [{"role": "user", "content": "Hi"}]}
    )
    assert status == 200, body
    assert sse_events(body)[-1]["status"] == "completed"


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_a_process_function_that_cannot_start_answers_503(
    start_function: StartFunction, api_key: str, name: str
) -> None:
    # The streaming one's server (run.sh) keeps serving rather than exiting.
    function = start_function(name, AGENT_APP="agentscope_serverless.agents.nowhere:app")
    for _ in range(2):
        status, headers, body, _ = function.request(
            "POST", "/process", key=api_key, body={"input": [{"role": "user", "content": "Hi"}]}
        )
        assert status == 503, body
        assert json.loads(body)["error"]["code"] == "UNAVAILABLE"
        assert headers["x-request-id"] and b"nowhere" not in body


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_a_second_turn_remembers_the_first(
    start_function: StartFunction, api_key: str, name: str
) -> None:
    function = start_function(name)
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    run(function, api_key, session_id, "My name is Grace")
    events = run(function, api_key, session_id, "What is my name?")
    assert "Grace" in events[-1]["output"][0]["content"][0]["text"]


def test_sessions_written_by_process_are_read_by_the_sessions_function(
    start_function: StartFunction, api_key: str
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    run(start_function("ProcessFunction"), api_key, session_id, "My name is Linus")
    sessions = start_function("SessionsFunction")
    status, _, body, _ = sessions.request("GET", f"/sessions/{session_id}/messages", key=api_key)
    assert status == 200, body
    messages = json.loads(body)["items"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"][0]["text"] == "My name is Linus"
    status, _, body, _ = sessions.request("GET", "/sessions", key=api_key)
    assert session_id in [s["id"] for s in json.loads(body)["items"]]


def test_state_and_memory_functions_share_the_stores(
    start_function: StartFunction, api_key: str
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    state = start_function("StateFunction")
    status, _, body, _ = state.request(
        "POST", f"/state/{session_id}", key=api_key, body={"state": {"step": 7}}
    )
    assert status in (200, 201), body
    status, _, body, _ = state.request("GET", f"/state/{session_id}", key=api_key)
    assert status == 200 and json.loads(body)["state"] == {"step": 7}

    run(start_function("ProcessStreamFunction"), api_key, session_id, "I adore pistachio ice cream")
    memory = start_function("MemoryFunction")
    status, _, body, _ = memory.request(
        "POST", "/memory/search", key=api_key, body={"query": "pistachio", "top_k": 3}
    )
    assert status == 200, body
    assert "pistachio" in json.dumps(json.loads(body)).lower()


def iam_caller(name: str) -> dict[str, str]:
    arn = f"arn:aws:iam::123456789012:user/{name}"
    return {"accessKey": "AKIAEXAMPLE", "accountId": "123456789012", "userArn": arn}


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_with_iam_auth_the_callers_identity_is_the_user(
    start_function: StartFunction, name: str
) -> None:
    process = start_function(name, AUTH_MODE="iam")
    sessions = start_function("SessionsFunction", AUTH_MODE="iam")
    session_id = f"iam-{uuid.uuid4().hex[:8]}"
    alice, bob = iam_caller(f"alice-{session_id}"), iam_caller(f"bob-{session_id}")
    request = {"input": [{"role": "user", "content": "hello"}], "session_id": session_id}
    status, _, body, _ = process.request("POST", "/process", body=request, iam=alice)
    assert status == 200 and sse_events(body)[-1]["status"] == "completed"

    status, _, body, _ = sessions.request("GET", f"/sessions/{session_id}", iam=alice)
    assert status == 200 and json.loads(body)["user_id"] == alice["userArn"]
    status, _, _, _ = sessions.request("GET", f"/sessions/{session_id}", iam=bob)
    assert status == 404
    status, _, _, _ = sessions.request("GET", f"/sessions/{session_id}")
    assert status == 401


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_a_run_at_the_functions_time_limit_ends_failed_before_lambda_stops_it(
    start_function: StartFunction,
    lambda_artifacts: Callable[[str], Artifact],
    api_key: str,
    name: str,
) -> None:
    # The slow agent takes 5 s; the invocation has 5 s (its deadline, as Lambda sets it) and
    # the run is ended 2 s before: the buffered function reads the deadline from its
    # context, the streaming one from the header the Web Adapter sends.
    artifact = lambda_artifacts(name)
    function = start_function(
        name,
        AGENT_APP="tests.support.slow_agent:app",
        PYTHONPATH=f"{artifact.code_dir}:{artifact.layer_dir}:{ROOT}",
        TIME_LIMIT_MARGIN_SECONDS="2",
    )
    assert function.request("GET", "/health")[0] == 200  # started, as a warm function is
    body = {"input": [{"role": "user", "content": "take your time"}], "session_id": name}
    # An answer after the deadline would fail here (the runtime waits no longer).
    status, _, content, _ = function.request(
        "POST", "/process", key=api_key, body=body, time_limit=5.0
    )
    assert status == 200, content
    final = sse_events(content)[-1]
    assert final["status"] == "failed" and final["error"]["code"] == "TIME_LIMIT"
    status, _, content, _ = function.request("GET", f"/runs/{final['id']}", key=api_key)
    assert json.loads(content)["status"] == "failed"


@pytest.mark.parametrize("name", ["SessionsFunction", "TasksFunction"])
def test_an_event_that_is_no_request_gets_an_answer_not_an_invocation_error(
    start_function: StartFunction, name: str
) -> None:
    function = start_function(name)
    for event in ({}, {"Records": [{"eventSource": "aws:sqs", "body": "{}"}]}):
        invocation = function.runtime.invoke(event)
        # An invocation error would be retried by Lambda, its stack trace sent to the caller.
        assert invocation.kind == "response", invocation.body
        assert json.loads(invocation.body)["error"]["code"] == "UNSUPPORTED_EVENT"
    poison = function.runtime.invoke({"agentscope_task": {"task_id": "task_x"}})
    assert poison.kind == "response", poison.body
    assert json.loads(poison.body) == {"status": "skipped"}


def logged_turn(
    artifact: Artifact, settings: dict[str, str], api_key: str, log: Path
) -> tuple[str, str]:
    """The log of a built function (the logging agent's, told an LLM key) answering one
    turn, and that key."""
    secret = f"sk-{uuid.uuid4().hex}"
    settings = {
        **settings,
        "AGENT_APP": "tests.support.logging_agent:app",
        "PYTHONPATH": f"{artifact.code_dir}:{artifact.layer_dir}:{ROOT}",
        "LLM_API_KEY": secret,
    }
    with log.open("wb") as output:
        function = start_built_function(artifact, settings, output=output)
        try:
            status, _, body, _ = function.request(
                "POST", "/process", key=api_key, body={"input": [user_message("hi")]}
            )
        finally:
            function.stop()
    assert status == 200 and sse_events(body)[-1]["status"] == "completed", body
    return log.read_text(), secret


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_a_librarys_log_records_are_json_lines_with_secrets_masked(
    lambda_artifacts: Callable[[str], Artifact],
    function_environment: dict[str, str],
    api_key: str,
    tmp_path: Path,
    name: str,
) -> None:
    """Lambda's runtime writes the root logger's records (a library's, the agent's own) as
    plain text lines, among the function's JSON ones in CloudWatch, and quoted a secret
    as it was."""
    artifact = lambda_artifacts(name)
    text, secret = logged_turn(artifact, function_environment, api_key, tmp_path / "log")
    assert secret not in text
    # Every line is JSON: the server's own (uvicorn's, behind the Web Adapter) too.
    assert all(isinstance(json.loads(line), dict) for line in text.splitlines()), text
    [line] = [line for line in text.splitlines() if "retrying with the key" in line]
    record = json.loads(line)
    assert record["message"] == "retrying with the key ***"
    assert record["level"] == "WARNING" and record["service"] == "agentscope-serverless"


@pytest.mark.parametrize("name", PROCESS_FUNCTIONS)
def test_with_the_functions_log_format_json_secrets_are_masked_in_lambdas_lines_too(
    lambda_artifacts: Callable[[str], Artifact],
    function_environment: dict[str, str],
    api_key: str,
    tmp_path: Path,
    name: str,
) -> None:
    """With the JSON log format, Lambda's runtime writes the root logger's records as JSON
    of its own (kept: CloudWatch reads its fields), and quoted a secret as it was."""
    artifact = lambda_artifacts(name)
    settings = {**function_environment, "AWS_LAMBDA_LOG_FORMAT": "JSON"}
    text, secret = logged_turn(artifact, settings, api_key, tmp_path / "log")
    assert secret not in text
    [line] = [line for line in text.splitlines() if "retrying with the key" in line]
    assert json.loads(line)["message"] == "retrying with the key ***"


@pytest.mark.parametrize("name", ["SessionsFunction", "ProcessStreamFunction"])
def test_a_variable_misspelling_a_setting_is_named_in_one_warning_as_the_function_starts(
    lambda_artifacts: Callable[[str], Artifact],
    function_environment: dict[str, str],
    api_key: str,
    tmp_path: Path,
    name: str,
) -> None:
    # Ignored without a word: the function ran with its stores in memory, losing them.
    settings = {
        **function_environment,
        "SESSION_HISTORY_BACKND": "dynamodb",
        "OPENAI_API_KEY": "sk-own-1234",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
    }
    log = tmp_path / "log"
    with log.open("wb") as output:
        function = start_built_function(lambda_artifacts(name), settings, output=output)
        try:
            status, _, body, _ = function.request("GET", "/health", key=api_key)
        finally:
            function.stop()
    assert status == 200, body
    text = log.read_text()
    said = [json.loads(line) for line in text.splitlines() if "no setting" in line]
    assert [line["message"] for line in said] == [
        "environment variables that are no setting, ignored: SESSION_HISTORY_BACKND (did you "
        "mean SESSION_HISTORY_BACKEND?)"
    ], text
    assert said[0]["level"] == "WARNING" and "OPENAI" not in text
