"""The buffered process function near its time limit, and with a reply larger than it returns.

Lambda stops a function at its time limit without notice: a run still going then would
never answer (the caller gets a 502) and would stay in progress in the store. The handler
gives each invocation's work until its deadline less ``TIME_LIMIT_MARGIN_SECONDS``, so the
run ends as failed (``TIME_LIMIT``), stored, and answered. A reply larger than the 6 MB a
buffered function returns is cut after its last event that fits, and read on from the
stored run. The handlers are those ``functions/process/agentscope_handler.py`` builds, warm
across tests.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.http.lambda_handler import (
    RESPONSE_LIMIT_BYTES,
    LambdaHandler,
    make_handler,
)
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.log import logger
from tests.support.http import issue_key, parse_sse
from tests.support.lambda_runtime import function_url_event
from tests.support.tidy_agent import LOG, NEVER_ENDING, SWALLOWING

MARGIN_SECONDS = 2.0
# The slow agent takes 5 s; the invocation has this long, so its run ends at 1.5 s (the
# margin is at most half the time an invocation has).
TIME_LIMIT_SECONDS = 3.0


class LambdaContext:
    """The part of Lambda's context object the handler reads: the time left."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


def _process_handler(
    tmp_path: Path,
    agent: str,
    monkeypatch: pytest.MonkeyPatch,
    margin: float = MARGIN_SECONDS,
    routers: tuple[str, ...] = ("process", "users"),
    backend: str = "in_memory",
) -> tuple[LambdaHandler, str]:
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "lambda-user")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys_file))
    for variable in ("SESSION_HISTORY_BACKEND", "STATE_BACKEND", "RUNS_BACKEND"):
        monkeypatch.setenv(variable, backend)
    monkeypatch.setenv("MEMORY_BACKEND", "in_memory")
    monkeypatch.setenv("AGENT_APP", agent)
    monkeypatch.setenv("TIME_LIMIT_MARGIN_SECONDS", str(margin))
    handler = make_handler(routers)
    handler(function_url_event("GET", "/health"), None)  # builds the app with these settings
    return handler, key


@pytest.fixture(scope="module")
def slow_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("slow")
        routers = ("process", "users", "sessions")
        yield _process_handler(tmp, "tests.support.slow_agent:app", monkeypatch, routers=routers)


@pytest.fixture(scope="module")
def demo_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("demo")
        yield _process_handler(tmp, "agentscope_serverless.agents.demo:app", monkeypatch)


@pytest.fixture(scope="module")
def big_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    """The agent whose reply (7 MB) is larger than a buffered function returns."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("big")
        routers = ("process", "users", "sessions", "memory")
        yield _process_handler(tmp, "tests.support.big_agent:app", monkeypatch, routers=routers)


@pytest.fixture(scope="module")
def tidy_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    """The agent whose cleanup takes a while; 2 s for its run's end, cleanup included."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("tidy")
        routers = ("process", "users", "sessions")
        yield _process_handler(
            tmp, "tests.support.tidy_agent:app", monkeypatch, margin=2.0, routers=routers
        )


def _post(key: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return function_url_event("POST", path, headers=headers, body=json.dumps(body))


def _get(key: str, path: str, **headers: str) -> dict[str, Any]:
    return function_url_event("GET", path, headers={"authorization": f"Bearer {key}", **headers})


def _invoke_near_the_limit(handler: LambdaHandler, event: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    answer = handler(event, LambdaContext(TIME_LIMIT_SECONDS))
    # Answered before Lambda would have stopped the function.
    assert time.monotonic() - started < TIME_LIMIT_SECONDS
    return answer


def _run_input(text: str, session_id: str, **fields: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": text}], "session_id": session_id, **fields}


def test_a_run_still_going_at_the_time_limit_ends_failed_stored_and_answered(
    slow_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = slow_process
    answer = _invoke_near_the_limit(
        handler, _post(key, "/process", _run_input("take your time", "near-limit"))
    )
    assert answer["statusCode"] == 200
    assert answer["headers"]["content-type"].startswith("text/event-stream")
    events = parse_sse(answer["body"].split("\n")[:-1]).data
    last = events[-1]
    assert last["object"] == "response" and last["status"] == "failed"
    assert last["error"]["code"] == "TIME_LIMIT"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # The run is stored as it ended, and the session keeps the input and the partial reply.
    run = json.loads(handler(_get(key, f"/runs/{last['id']}"), None)["body"])
    assert run["status"] == "failed" and run["error"]["code"] == "TIME_LIMIT"
    stored = parse_sse(
        handler(_get(key, f"/runs/{last['id']}/events"), None)["body"].split("\n")[:-1]
    ).data
    assert stored == events
    reply = last["output"][0]["content"][0]["text"]
    assert reply.startswith("piece 0. ")
    assert "piece 24." not in reply


def test_a_run_ended_at_the_time_limit_is_logged_with_where_its_agent_was(
    slow_process: tuple[LambdaHandler, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the run's metrics and the request's line (a 504) said anything of it: not which
    # run, session or user it was, nor where the agent was stuck.
    handler, key = slow_process
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    try:
        capsys.readouterr()
        body = _run_input("take your time", "logged-limit", stream=False)
        answer = _invoke_near_the_limit(handler, _post(key, "/process", body))
    finally:
        logger.setLevel(level)
    assert answer["statusCode"] == 504
    run_id = answer["headers"]["x-run-id"]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (logged,) = [line for line in lines if line["message"] == "the run reached the time limit"]
    assert logged["level"] == "WARNING" and logged["code"] == "TIME_LIMIT"
    assert (logged["run_id"], logged["session_id"]) == (run_id, "logged-limit")
    assert logged["user_id"] == "lambda-user"
    # The calls the run was in, from the runner to the agent's sleep, outermost first.
    stack = logged["stack"].split(" > ")
    assert stack[0].startswith("agentscope_serverless.runner.Runner.stream_query:")
    assert any(frame.startswith("tests.support.slow_agent.query:") for frame in stack)
    assert stack[-1].startswith("asyncio.tasks.sleep:")
    # Nothing of what the user or the agent said.
    assert "your time" not in json.dumps(logged) and "piece" not in json.dumps(logged)


def test_a_run_answered_whole_near_the_time_limit_is_a_504_not_to_retry(
    slow_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = slow_process
    answer = _invoke_near_the_limit(
        handler,
        _post(key, "/process", _run_input("take your time", "near-limit-json", stream=False)),
    )
    assert answer["statusCode"] == 504
    assert json.loads(answer["body"])["error"]["code"] == "TIME_LIMIT"
    chat = {"model": "slow", "messages": [{"role": "user", "content": "take your time"}]}
    answer = _invoke_near_the_limit(
        handler, _post(key, "/compatible-mode/v1/chat/completions", chat)
    )
    assert answer["statusCode"] == 504
    assert answer["headers"]["x-should-retry"] == "false"  # a retry would run the agent again
    assert json.loads(answer["body"])["error"]["code"] == "TIME_LIMIT"


def test_the_warm_function_serves_the_next_invocation_whole(
    slow_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = slow_process
    _invoke_near_the_limit(handler, _post(key, "/process", _run_input("first", "warm")))
    # The next invocation has the default 30 s: its run goes to its end.
    answer = handler(_post(key, "/process", _run_input("second", "warm")), LambdaContext(30))
    last = parse_sse(answer["body"].split("\n")[:-1]).data[-1]
    assert last["status"] == "completed"
    assert "piece 24." in last["output"][0]["content"][0]["text"]
    # Nothing of either invocation is left to run in the frozen environment.
    loop = handler._loop  # type: ignore[attr-defined]
    assert not [task for task in asyncio.all_tasks(loop) if not task.done()]


def test_a_streamed_reply_larger_than_lambda_returns_is_cut_and_read_on_from_the_run(
    demo_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = demo_process
    # The demo agent repeats the input: 60,000 words stream as 60,000 events, some 12 MB.
    text = " ".join(["word"] * 60_000)
    answer = handler(_post(key, "/process", _run_input(text, "big-reply")), None)
    assert answer["statusCode"] == 200
    assert len(json.dumps(answer, ensure_ascii=False).encode()) < RESPONSE_LIMIT_BYTES
    sse = parse_sse(answer["body"].split("\n")[:-1])
    name, error = sse.events[-1]
    assert name == "error" and error["error"]["code"] == "RESPONSE_TOO_LARGE"
    run_id = answer["headers"]["x-run-id"]
    assert f"/runs/{run_id}/events" in error["error"]["message"]
    events = sse.data[:-1]
    # Read on, as a client does, after the last id received, until the run's last event.
    while events[-1]["object"] != "response" or events[-1]["status"] == "in_progress":
        last_id = str(events[-1]["sequence_number"])
        page = handler(_get(key, f"/runs/{run_id}/events", **{"last-event-id": last_id}), None)
        assert len(json.dumps(page, ensure_ascii=False).encode()) < RESPONSE_LIMIT_BYTES
        more = [data for data in parse_sse(page["body"].split("\n")[:-1]).data if "object" in data]
        assert more, "no progress"
        events += more
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["status"] == "completed"
    assert (
        events[-1]["output"][0]["content"][0]["text"]
        == f'You said: "{text}". That is message 1 of this conversation.'
    )


def test_a_run_whose_cleanup_never_ends_is_still_answered_before_the_time_limit(
    tidy_process: tuple[LambdaHandler, str],
) -> None:
    # Cancelled once at its time limit, the agent's cleanup held the run until Lambda stopped
    # the function: no answer, the run left in progress.
    handler, key = tidy_process
    session_id = f"endless-{time.monotonic_ns()}"
    started = time.monotonic()
    answer = handler(
        _post(key, "/process", _run_input(NEVER_ENDING, session_id)), LambdaContext(4.0)
    )
    assert time.monotonic() - started < 4.0, "answered before Lambda would stop the function"
    last = parse_sse(answer["body"].split("\n")[:-1]).data[-1]
    assert last["status"] == "failed" and last["error"]["code"] == "TIME_LIMIT"
    assert LOG[session_id] == ["cancelled", "cleanup cut short"]
    run = json.loads(handler(_get(key, f"/runs/{last['id']}"), None)["body"])
    assert run["status"] == "failed" and run["error"]["code"] == "TIME_LIMIT"


def _payload_bytes(answer: dict[str, Any]) -> int:
    """The bytes Lambda counts of a buffered answer (its JSON, as the runtime writes it)."""
    return len(json.dumps(answer, ensure_ascii=False).encode())


def _a2a_call(method: str, request_id: int) -> dict[str, Any]:
    message = {
        "role": "user",
        "parts": [{"kind": "text", "text": "hi"}],
        "messageId": f"message-{method}-{request_id}",
        "kind": "message",
    }
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"message": message}}


def test_an_a2a_stream_larger_than_lambda_returns_keeps_its_events_and_ends_in_json_rpc(
    big_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = big_process
    answer = handler(_post(key, "/a2a", _a2a_call("message/stream", 7)), None)
    assert answer["statusCode"] == 200
    assert _payload_bytes(answer) < RESPONSE_LIMIT_BYTES
    # sse-starlette ends A2A's events with CRLF: the events that fit are kept, whole.
    events = [event for event in answer["body"].split("\r\n\r\n") if event]
    answers = [json.loads(event.removeprefix("data: ")) for event in events]
    assert len(answers) > 50
    assert all(each["jsonrpc"] == "2.0" and each["id"] == 7 for each in answers)
    task_id = answers[0]["result"]["id"]
    error = answers[-1]["error"]
    assert error["data"]["code"] == "RESPONSE_TOO_LARGE"
    assert error["data"]["taskId"] == task_id
    assert error["data"]["runId"].startswith("response_")
    assert task_id in error["message"] and "RESPONSE_STREAM" in error["message"]
    assert "<" not in error["message"] and "/sessions" not in error["message"]


def test_an_a2a_answer_larger_than_lambda_returns_is_a_json_rpc_error_naming_its_task(
    big_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = big_process
    answer = handler(_post(key, "/a2a", _a2a_call("message/send", 8)), None)
    assert answer["statusCode"] == 200  # as the SDK answers every JSON-RPC error
    assert answer["headers"]["x-should-retry"] == "false"
    reply = json.loads(answer["body"])
    assert reply["jsonrpc"] == "2.0" and reply["id"] == 8
    error = reply["error"]
    assert error["code"] == -32603 and error["data"]["code"] == "RESPONSE_TOO_LARGE"
    assert error["data"]["taskId"] and error["data"]["taskId"] in error["message"]
    assert "GetTask" in error["message"] and "/sessions" not in error["message"]


def test_an_event_larger_than_lambda_returns_is_named_and_can_be_gone_past(
    big_process: tuple[LambdaHandler, str],
) -> None:
    """Resuming before an event that no buffered answer can hold returned it never, and the
    same error, for ever: the error names it, and resuming after it goes on."""
    handler, key = big_process
    answer = handler(_post(key, "/process", _run_input("hi", "big-event")), None)
    run_id = answer["headers"]["x-run-id"]
    last_id = [i for i in parse_sse(answer["body"].split("\n")[:-1]).ids if i][-1]
    skipped: list[str] = []
    for _ in range(20):
        page = handler(_get(key, f"/runs/{run_id}/events", **{"last-event-id": last_id}), None)
        assert page["statusCode"] == 200
        assert _payload_bytes(page) < RESPONSE_LIMIT_BYTES
        sse = parse_sse(page["body"].split("\n")[:-1])
        if not sse.events or sse.events[-1][0] != "error":
            break  # the run's end
        message = sse.events[-1][1]["error"]["message"]
        assert f"/runs/{run_id}/events" in message and "<run id>" not in message
        ids = [i for i in sse.ids if i]
        if ids:
            last_id = ids[-1]
            continue
        # Nothing fits: the event is named, with the way past it.
        assert "by itself" in message and "RESPONSE_STREAM" in message
        skipped_id = message.split("Last-Event-ID ")[-1].split(" ")[0]
        assert int(skipped_id) == int(last_id) + 1
        skipped.append(skipped_id)
        last_id = skipped_id
    else:
        raise AssertionError("the resumes never reached the run's end")
    assert skipped  # the message completed, the response: each holds the whole text


def test_a_custom_endpoint_too_large_is_told_no_run_or_session(
    big_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = big_process
    answer = handler(_get(key, "/big-json"), None)
    assert answer["statusCode"] == 500
    message = json.loads(answer["body"])["error"]["message"]
    assert "RESPONSE_STREAM" in message
    assert "/sessions" not in message and "/runs" not in message
    stream = handler(_get(key, "/big-stream"), None)
    assert _payload_bytes(stream) < RESPONSE_LIMIT_BYTES
    name, error = parse_sse(stream["body"].split("\n")[:-1]).events[-1]
    assert name == "error" and error["error"]["code"] == "RESPONSE_TOO_LARGE"
    assert "/runs" not in error["error"]["message"] and "<" not in error["error"]["message"]


def test_a_stream_whose_lines_end_with_cr_alone_is_cut_after_its_events_that_fit(
    big_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = big_process
    answer = handler(_get(key, "/big-cr-stream"), None)
    assert answer["statusCode"] == 200
    assert _payload_bytes(answer) < RESPONSE_LIMIT_BYTES
    events = answer["body"].split("\r\r")
    assert events.pop() == ""
    assert len(events) > 50
    assert all(event.startswith("id: ") for event in events[:-1])
    name, data = events[-1].split("\r")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["code"] == "RESPONSE_TOO_LARGE"


def test_a_page_of_one_message_larger_than_lambda_returns_says_no_smaller_page_fits(
    big_process: tuple[LambdaHandler, str],
) -> None:
    """A page of one message too large said to ask for a smaller limit, which cannot be."""
    handler, key = big_process
    body = {**_run_input("hi", "one-big"), "stream": False}
    assert handler(_post(key, "/process", body), None)["statusCode"] == 500  # a 7 MB reply
    auth = {"authorization": f"Bearer {key}"}
    path = "/sessions/one-big/messages"
    first = handler(function_url_event("GET", path, headers=auth, query="limit=1"), None)
    cursor = json.loads(first["body"])["next_cursor"]
    assert cursor
    page = function_url_event("GET", path, headers=auth, query=f"limit=1&cursor={cursor}")
    answer = handler(page, None)
    assert answer["statusCode"] == 500
    message = json.loads(answer["body"])["error"]["message"]
    assert "smaller limit" not in message
    assert "by itself" in message and "RESPONSE_STREAM" in message
    assert "GET /runs?session_id=one-big" in message


def test_a_memory_page_too_large_is_told_its_own_page_size_not_the_sessions_route(
    big_process: tuple[LambdaHandler, str],
) -> None:
    handler, key = big_process
    memory = {"role": "user", "content": [{"type": "text", "text": "m" * 900_000}]}
    for _ in range(8):
        added = handler(_post(key, "/memory", {"messages": [memory]}), None)
        assert added["statusCode"] == 201, added["body"][:200]
    auth = {"authorization": f"Bearer {key}"}
    page = function_url_event("GET", "/memory", headers=auth, query="page_size=8")
    answer = handler(page, None)
    assert answer["statusCode"] == 500
    message = json.loads(answer["body"])["error"]["message"]
    assert "a smaller page_size (this one holds 8)" in message
    assert "/sessions" not in message


@pytest.mark.parametrize("path", ["/ask", "/ask-stream"])
def test_a_run_an_endpoint_starts_ends_at_the_time_limit_too(
    slow_process: tuple[LambdaHandler, str], path: str
) -> None:
    """``app.query`` / ``app.stream_query`` in an ``@app.endpoint`` ran past the function's
    time limit (Lambda would stop it, the turn lost): it ends as a ``/process`` run does,
    failed with ``TIME_LIMIT``, stored with the input and the reply so far."""
    handler, key = slow_process
    session = f"endpoint-limit{path.replace('/', '-')}"
    body = {"text": "take your time", "run": {"session_id": session}}
    answer = _invoke_near_the_limit(handler, _post(key, path, body))
    assert answer["statusCode"] == 200, answer
    if path == "/ask":
        final = json.loads(answer["body"])
    else:
        final = parse_sse(answer["body"].split("\n")[:-1]).data[-1]
    assert final["status"] == "failed" and final["error"]["code"] == "TIME_LIMIT", final
    stored = json.loads(handler(_get(key, f"/sessions/{session}/messages"), None)["body"])
    texts = [part["text"] for m in stored["items"] for part in m["content"] or []]
    assert texts[0] == "take your time"
    assert texts[1].startswith("piece 0. ") and "piece 24." not in texts[1]
    runs = _get(key, "/runs")
    runs["rawQueryString"] = f"session_id={session}"
    listed = json.loads(handler(runs, None)["body"])
    assert [run["status"] for run in listed["items"]] == ["failed"]


@pytest.fixture(scope="module")
def shared_runs(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[tuple[LambdaHandler, LambdaHandler, str]]:
    """Two warm process functions of one stack (their runs in one Redis)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("REDIS_URL", redis_server.url)
        tmp = tmp_path_factory.mktemp("shared")
        routers = ("process", "users", "sessions")
        first, key = _process_handler(
            tmp, "tests.support.slow_agent:app", monkeypatch, routers=routers, backend="redis"
        )
        second = make_handler(routers)
        second(function_url_event("GET", "/health"), None)
        yield first, second, key


@pytest.mark.parametrize(
    ("path", "stream"),
    [("/chat/completions", False), ("/chat/completions", True), ("/responses", True)],
)
def test_an_sdk_retry_following_a_run_elsewhere_is_answered_before_the_time_limit(
    shared_runs: tuple[LambdaHandler, LambdaHandler, str], path: str, stream: bool
) -> None:
    """An SDK's retry answered by following its first try's run, still going in another
    instance, waited for it with no bound: answered after the function's time limit (on
    Lambda, a bare 502). It ends before, saying the run goes on."""
    first, second, key = shared_runs
    session_id = f"retry-{path.strip('/').replace('/', '-')}-{stream}"
    if path == "/responses":
        body: dict[str, Any] = {"model": "slow", "input": "take your time", "stream": stream}
    else:
        messages = [{"role": "user", "content": "take your time"}]
        body = {"model": "slow", "messages": messages, "stream": stream}
    headers = {
        "authorization": f"Bearer {key}",
        "content-type": "application/json",
        "x-session-id": session_id,
    }

    def call(retry: int) -> dict[str, Any]:
        tried = {**headers, "x-stainless-retry-count": str(retry)}
        return function_url_event(
            "POST", f"/compatible-mode/v1{path}", headers=tried, body=json.dumps(body)
        )

    answers: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: answers.update(answer=first(call(0), LambdaContext(60)))
    )
    thread.start()
    try:
        runs = _get(key, "/runs")
        runs["rawQueryString"] = f"session_id={session_id}"
        while not json.loads(second(runs, None)["body"])["items"]:
            time.sleep(0.05)  # the first try's run is not stored yet
        answer = _invoke_near_the_limit(second, call(1))
    finally:
        thread.join()
    run_id = answer["headers"]["x-run-id"]
    assert run_id == answers["answer"]["headers"]["x-run-id"]  # the first try's run
    if not stream:
        assert answer["statusCode"] == 504
        assert answer["headers"]["x-should-retry"] == "true"  # it goes on: a retry gets it
        error = json.loads(answer["body"])["error"]
        assert error["code"] == "TIME_LIMIT" and f"GET /runs/{run_id}" in error["message"]
        return
    assert answer["statusCode"] == 200
    sse = parse_sse(answer["body"].split("\n")[:-1])
    if path == "/responses":
        name, error = sse.events[-1]
        assert name == "error" and error["code"] == "TIME_LIMIT"
        assert "stream=true&starting_after=" in error["message"]
        assert sse.data[0]["type"] == "response.created"
    else:
        error = sse.data[-1]["error"]
        assert error["code"] == "TIME_LIMIT" and f"GET /runs/{run_id}" in error["message"]
        assert sse.data[0]["object"] == "chat.completion.chunk"


def test_an_a2a_subscription_to_a_task_running_elsewhere_ends_before_the_time_limit(
    shared_runs: tuple[LambdaHandler, LambdaHandler, str],
) -> None:
    """``tasks/resubscribe`` of a task whose run goes on in another instance followed it with
    no bound (and waited 5 s for a run to be named): past the function's time limit. It ends
    before, the task still working, for its client to subscribe again."""
    first, second, key = shared_runs
    context_id = f"a2a-follow-{time.monotonic_ns()}"
    message = {
        "role": "user",
        "parts": [{"kind": "text", "text": "take your time"}],
        "messageId": f"m-{context_id}",
        "contextId": context_id,
        "kind": "message",
    }
    send = {"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": {"message": message}}
    answers: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: answers.update(answer=first(_post(key, "/a2a", send), LambdaContext(60)))
    )
    thread.start()
    try:
        runs = _get(key, "/runs")
        runs["rawQueryString"] = f"session_id={context_id}"
        tasks: list[dict[str, Any]] = []
        while not tasks:
            items = json.loads(second(runs, None)["body"])["items"]
            tasks = [item for item in items if item["kind"] == "a2a_task"]
            time.sleep(0.05)  # the task is not stored yet
        follow = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tasks/resubscribe",
            "params": {"id": tasks[0]["id"]},
        }
        answer = _invoke_near_the_limit(second, _post(key, "/a2a", follow))
    finally:
        thread.join()
    assert answer["statusCode"] == 200
    events = [event for event in answer["body"].split("\r\n\r\n") if event]
    followed = [json.loads(event.removeprefix("data: ")) for event in events]
    assert all("error" not in each for each in followed), followed[-1]
    assert followed[0]["result"]["id"] == tasks[0]["id"]
    assert followed[0]["result"]["status"]["state"] == "working"
    # It ended before the run, which went on to its end.
    assert not any(each["result"].get("final") for each in followed)
    streamed = answers["answer"]["body"]
    assert '"state":"completed"' in streamed.replace(" ", "")


def test_a_run_whose_agent_ignores_its_cancellation_is_ended_without_it_at_the_time_limit(
    tidy_process: tuple[LambdaHandler, str],
) -> None:
    """An agent catching its cancellation and going on held the invocation past the time
    limit (Lambda would stop it, no answer), then stored its run as completed. The run ends
    without it, failed with TIME_LIMIT, and what its agent does later is ignored."""
    handler, key = tidy_process
    session_id = f"swallowing-{time.monotonic_ns()}"
    started = time.monotonic()
    answer = handler(_post(key, "/process", _run_input(SWALLOWING, session_id)), LambdaContext(4.0))
    assert time.monotonic() - started < 4.0, "answered before Lambda would stop the function"
    events = parse_sse(answer["body"].split("\n")[:-1]).data
    last = events[-1]
    assert last["status"] == "failed" and last["error"]["code"] == "TIME_LIMIT"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert LOG[session_id][:2] == ["cancelled", "cancelled"]  # the cut of its cleanup too
    # The next invocations of the warm function run its agent, left behind, to its end.
    loop = handler._loop  # type: ignore[attr-defined]
    loop.run_until_complete(asyncio.sleep(5))
    assert LOG[session_id][-1] == "went on"
    run = json.loads(handler(_get(key, f"/runs/{last['id']}"), None)["body"])
    assert run["status"] == "failed" and run["error"]["code"] == "TIME_LIMIT"
    stored = parse_sse(
        handler(_get(key, f"/runs/{last['id']}/events"), None)["body"].split("\n")[:-1]
    ).data
    assert stored == events
    # Nothing of its turn was stored in its session as completed.
    messages = json.loads(handler(_get(key, f"/sessions/{session_id}/messages"), None)["body"])
    assert not messages.get("items")
