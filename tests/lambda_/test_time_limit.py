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
from agentscope_serverless.log import logger
from tests.support.http import issue_key, parse_sse
from tests.support.lambda_runtime import function_url_event
from tests.support.tidy_agent import LOG, NEVER_ENDING

MARGIN_SECONDS = 1.0
# The slow agent takes 5 s; the invocation has this long, so its run ends at 2 s.
TIME_LIMIT_SECONDS = 3.0


class LambdaContext:
    """The part of Lambda's context object the handler reads: the time left."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)


def _process_handler(
    tmp_path: Path, agent: str, monkeypatch: pytest.MonkeyPatch, margin: float = MARGIN_SECONDS
) -> tuple[LambdaHandler, str]:
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "lambda-user")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys_file))
    for variable in ("SESSION_HISTORY_BACKEND", "STATE_BACKEND", "MEMORY_BACKEND"):
        monkeypatch.setenv(variable, "in_memory")
    monkeypatch.setenv("RUNS_BACKEND", "in_memory")
    monkeypatch.setenv("AGENT_APP", agent)
    monkeypatch.setenv("TIME_LIMIT_MARGIN_SECONDS", str(margin))
    handler = make_handler(["process", "users"])
    handler(function_url_event("GET", "/health"), None)  # builds the app with these settings
    return handler, key


@pytest.fixture(scope="module")
def slow_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("slow")
        yield _process_handler(tmp, "tests.support.slow_agent:app", monkeypatch)


@pytest.fixture(scope="module")
def demo_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("demo")
        yield _process_handler(tmp, "agentscope_serverless.agents.demo:app", monkeypatch)


@pytest.fixture(scope="module")
def tidy_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LambdaHandler, str]]:
    """The agent whose cleanup takes a while; 2 s for its run's end, cleanup included."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        tmp = tmp_path_factory.mktemp("tidy")
        yield _process_handler(tmp, "tests.support.tidy_agent:app", monkeypatch, margin=2.0)


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
