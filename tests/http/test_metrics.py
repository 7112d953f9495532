"""Run metrics: one CloudWatch Embedded Metric Format line on stdout per run that ends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http import create_app
from agentscope_serverless.schemas.agent_schemas import AgentResponse
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, issue_key, running, stream, user_message

app = AgentApp(app_name="metered")


@app.query(framework="text")
async def query(
    self: Any, msgs: Any, *, response: AgentResponse, **kwargs: Any
) -> AsyncIterator[str]:
    text = msgs[-1].get_text_content() or ""
    if text == "fail":
        yield "half"
        raise RuntimeError("the model went away")
    if text == "answer, then think":
        yield "At once"
        await asyncio.sleep(1.0)  # the reply ends long after its first text
        yield ", then more."
        return
    await asyncio.sleep(0.05)  # the time to the first token
    yield "Hel"
    yield "lo"
    if text == "count as responses do":
        response.usage = {"input_tokens": 12, "output_tokens": 2, "total_tokens": 14}
        return
    response.usage = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}


def emf_lines(output: str) -> list[dict[str, Any]]:
    records = []
    for line in output.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            records.append(json.loads(line))
    return records


def run_three(url: str, key: str) -> None:
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        _, done = stream(client, "/process", json={"input": [user_message("hi")]})
        assert done.data[-1]["status"] == "completed"
        _, failed = stream(client, "/process", json={"input": [user_message("fail")]})
        assert failed.data[-1]["status"] == "failed"
        refused = client.post("/process", json={"input": "not a list"})
        assert refused.status_code == 422
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        answered = client.post("/compatible-mode/v1/chat/completions", json=body)
        assert answered.status_code == 200


def test_each_run_that_ends_writes_its_metrics(capfd: pytest.CaptureFixture[str]) -> None:
    keys = Keys.make()
    settings = load_settings(metrics_namespace="AgentScopeServerless")
    with running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        run_three(url, keys.alice)
    records = emf_lines(capfd.readouterr().out)
    # A refused request is not a run.
    assert [(r["Kind"], r["Status"]) for r in records] == [
        ("process", "completed"),
        ("process", "failed"),
        ("openai", "completed"),
    ]
    done, failed, _ = records
    (directive,) = done["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "AgentScopeServerless"
    assert directive["Dimensions"] == [["Service"], ["Service", "Kind", "Status"]]
    units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
    assert units == {
        "Runs": "Count",
        "RunDuration": "Milliseconds",
        "TimeToFirstToken": "Milliseconds",
        "PromptTokens": "Count",
        "CompletionTokens": "Count",
    }
    assert (done["Runs"], done["PromptTokens"], done["CompletionTokens"]) == (1, 12, 2)
    # About the agent's 50 ms before its first token, at least (49.965 ms was measured once).
    assert 45 <= done["TimeToFirstToken"] <= done["RunDuration"]
    assert isinstance(done["_aws"]["Timestamp"], int)
    assert done["Service"] == "agentscope-serverless"
    # A failed run counts too; without usage, no token counts.
    assert failed["Runs"] == 1 and "PromptTokens" not in failed
    # Metrics are per service: no user, session or run is named.
    text = json.dumps(records)
    assert "alice" not in text and "session" not in text and "response_" not in text


def test_the_time_to_first_token_of_a_reply_not_streamed_is_when_its_first_text_came(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A reply not streamed gathers its text: the time was stamped as the gathered text was
    # sent, at the run's end, so such runs skewed the metric by their whole duration.
    keys = Keys.make()
    settings = load_settings(metrics_namespace="AgentScopeServerless")
    text = "answer, then think"
    with (
        running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        capfd.readouterr()
        body = {"input": [user_message(text)], "stream": False}
        assert client.post("/process", json=body).json()["status"] == "completed"
        chat = {"model": "m", "messages": [{"role": "user", "content": text}]}
        assert client.post("/compatible-mode/v1/chat/completions", json=chat).status_code == 200
    records = emf_lines(capfd.readouterr().out)
    assert [r["Kind"] for r in records] == ["process", "openai"]
    for record in records:
        assert record["TimeToFirstToken"] < record["RunDuration"] / 2


def test_usage_reported_as_the_responses_api_counts_it_writes_its_token_counts(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # The OpenAI-compatible routes answered its usage; the run's metrics had no token counts.
    keys = Keys.make()
    settings = load_settings(metrics_namespace="AgentScopeServerless")
    with (
        running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client,
    ):
        capfd.readouterr()
        chat = {"model": "m", "messages": [{"role": "user", "content": "count as responses do"}]}
        answered = client.post("/compatible-mode/v1/chat/completions", json=chat)
        assert answered.json()["usage"]["prompt_tokens"] == 12
    (record,) = emf_lines(capfd.readouterr().out)
    assert (record["PromptTokens"], record["CompletionTokens"]) == (12, 2)


def test_a_request_answered_with_a_server_error_writes_one_errors_line(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A store down before the run began was answered 503 without any metric: no alarm could
    see the outage. The Code dimension takes only the runtime's own codes, else OTHER."""
    key_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(key_file), "alice")
    settings = load_settings(
        metrics_namespace="AgentScopeServerless",
        auth_keys_backend="file",
        auth_keys_file=str(key_file),
    )
    with running(create_app(settings=settings, agent_app=app)) as url:
        capfd.readouterr()
        body = {"input": [user_message("fail")], "stream": False}
        failed = httpx.post(f"{url}/process", json=body, headers=bearer(key), timeout=30)
        assert failed.status_code == 500
        assert httpx.get(f"{url}/sessions/nowhere", headers=bearer(key)).status_code == 404
        key_file.write_text("{ not json")
        time.sleep(1.1)  # the key file is read again at most once a second
        down = httpx.get(f"{url}/sessions", headers=bearer(key))
        assert down.json()["error"]["code"] == "STORE_UNAVAILABLE"
    records = emf_lines(capfd.readouterr().out)
    errors = [record for record in records if "Errors" in record]
    assert [(r["Errors"], r["Code"]) for r in errors] == [
        (1, "AGENT_UNKNOWN_ERROR"),  # it was OTHER: the runtime's own code for a failed run
        (1, "STORE_UNAVAILABLE"),
    ]
    (directive,) = errors[1]["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "AgentScopeServerless"
    assert directive["Dimensions"] == [["Service"], ["Service", "Code"]]
    assert directive["Metrics"] == [{"Name": "Errors", "Unit": "Count"}]
    assert errors[1]["Service"] == "agentscope-serverless"
    assert "went away" not in json.dumps(errors)


def test_without_a_namespace_no_metrics_are_written(capfd: pytest.CaptureFixture[str]) -> None:
    keys = Keys.make()
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        run_three(url, keys.alice)
    assert emf_lines(capfd.readouterr().out) == []


@pytest.mark.parametrize(
    "namespace", ["AWS/Lambda", "Agent Scope!", "Agents\u00e9", "   ", "Tab\tbed", "x" * 256]
)
def test_a_namespace_cloudwatch_would_refuse_fails_at_start(namespace: str) -> None:
    # CloudWatch drops the metrics of such a line without a word: none would ever show.
    with pytest.raises(ConfigurationError, match="METRICS_NAMESPACE"):
        load_settings(metrics_namespace=namespace)


def test_a_namespace_of_every_character_cloudwatch_takes_is_taken() -> None:
    namespace = "Agents/prod-1_eu.west #2:a b"
    assert load_settings(metrics_namespace=namespace).metrics_namespace == namespace


@pytest.mark.parametrize("service", ["agents-caf\u00e9", "   ", "x" * 1025])
def test_a_service_name_cloudwatch_would_refuse_as_a_dimension_fails_at_start(
    service: str,
) -> None:
    # The service name is read as the process starts: a process of its own.
    check = "from agentscope_serverless.settings import load_settings\nload_settings()"
    env = {**os.environ, "POWERTOOLS_SERVICE_NAME": service, "METRICS_NAMESPACE": "Agents"}
    done = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "POWERTOOLS_SERVICE_NAME" in done.stderr and "METRICS_NAMESPACE" in done.stderr
    # Without metrics, the name is only the logs' own: taken.
    env.pop("METRICS_NAMESPACE")
    assert subprocess.run([sys.executable, "-c", check], env=env, timeout=60).returncode == 0


def test_a_run_failed_in_a_reply_not_streamed_logs_its_code_and_caller(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """/process answered a failed run not streamed with a request line without its error
    code or its caller (user_id, key_id), which chat completions' has."""
    from agentscope_serverless.log import logger

    key_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(key_file), "alice")
    settings = load_settings(auth_keys_backend="file", auth_keys_file=str(key_file))
    level = logger.level
    logger.setLevel("INFO")  # the request lines (the tests log nothing below CRITICAL)
    try:
        with running(create_app(settings=settings, agent_app=app)) as url:
            capfd.readouterr()
            body = {"input": [user_message("fail")], "stream": False}
            failed = httpx.post(f"{url}/process", json=body, headers=bearer(key), timeout=30)
            assert failed.status_code == 500
            chat = {"model": "m", "messages": [{"role": "user", "content": "fail"}]}
            path = "/compatible-mode/v1/chat/completions"
            answered = httpx.post(f"{url}{path}", json=chat, headers=bearer(key), timeout=30)
            assert answered.status_code == 500
    finally:
        logger.setLevel(level)
    lines = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line[:1] == "{"]
    requests = [line for line in lines if line.get("message") == "request"]
    said = [(r["path"], r.get("code"), r.get("user_id"), "key_id" in r) for r in requests]
    code = failed.json()["error"]["code"]
    assert said == [("/process", code, "alice", True), (path, code, "alice", True)]


def test_the_runtimes_own_codes_are_their_own_code_dimension() -> None:
    from agentscope_serverless.http.errors import INTERNAL_ERROR
    from agentscope_serverless.metrics import error_code_dimension
    from agentscope_serverless.runner import AGENT_UNKNOWN_ERROR

    for code in (AGENT_UNKNOWN_ERROR, INTERNAL_ERROR, "LLM_ERROR", "UNAVAILABLE"):
        assert error_code_dimension(code) == code
    assert error_code_dimension("MY_AGENTS_OWN") == "OTHER"
    assert error_code_dimension(None) == "OTHER"
