"""The JSON log lines stay bounded, whatever a client sends: one per request at INFO, each
value of a line cut to a bounded length, still one valid JSON object."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.log import MAX_FIELD_CHARS, MAX_PATH_CHARS
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running, user_message

app = AgentApp(app_name="strict")


@app.query(framework="text")
async def query(self: Any, msgs: Any, **kwargs: Any) -> str:
    # As agents do: an error quoting what it could not take, here the whole message.
    raise ValueError(f"cannot plan for {msgs[-1].get_text_content()}")


def logged(capfd: pytest.CaptureFixture[str]) -> list[tuple[str, dict[str, Any]]]:
    return [(line, json.loads(line)) for line in capfd.readouterr().out.splitlines() if line]


def test_a_long_path_is_cut_in_the_request_line(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    path = "/sessions/" + "a" * 50_000 + "-end"
    with running(create_app(["sessions"], settings=load_settings(), key_store=keys.store)) as url:
        capfd.readouterr()
        # Refused (no key): the caller need not even be one of the users.
        assert httpx.get(f"{url}{path}").status_code == 401
    ((text, line),) = logged(capfd)
    assert line["status"] == 401 and line["method"] == "GET"
    assert line["path"].startswith("/sessions/aaaa") and line["path"].endswith("aaa-end")
    assert "characters cut" in line["path"]
    assert len(line["path"]) < MAX_PATH_CHARS + 50 and len(text) < MAX_PATH_CHARS + 400


def test_an_exception_quoting_a_huge_message_is_logged_cut(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    text = "x" * 500_000 + "-end"
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        body = {"input": [user_message(text)], "stream": False}
        answer = httpx.post(f"{url}/process", json=body, headers=bearer(keys.alice), timeout=30)
        assert answer.json()["status"] == "failed"
    lines = logged(capfd)
    ((text_line, failed),) = [(t, line) for t, line in lines if line["level"] == "ERROR"]
    assert failed["message"] == "the agent failed" and failed["exception_name"] == "ValueError"
    # Its beginning (where it was raised) and its end (the exception's last words) are kept.
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert failed["exception"].endswith("xxx-end") and "characters cut" in failed["exception"]
    assert len(text_line) < MAX_FIELD_CHARS + 1000
    assert all(len(t) < MAX_FIELD_CHARS for t, line in lines if line is not failed)


def test_control_and_invisible_characters_reach_the_log_escaped(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    # An 8-bit terminal escape (CSI), a line separator, a right-to-left override.
    text = "plain \u009b2J\u009b31mred\u2028second line\u202edesrever"
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        body = {"input": [user_message(text)], "stream": False}
        httpx.post(f"{url}/process", json=body, headers=bearer(keys.alice), timeout=30)
    lines = logged(capfd)
    (failed,) = [line for _, line in lines if line["level"] == "ERROR"]
    # Escaped in the line as written (a terminal showing it runs no escape), whole once read.
    assert all(t.isascii() for t, _ in lines)
    assert failed["exception"].endswith(f"ValueError: cannot plan for {text}")


def test_an_agents_failure_is_logged_with_the_run_id_a_client_can_quote(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        body = {"input": [user_message("a trip")], "stream": False}
        answer = httpx.post(f"{url}/process", json=body, headers=bearer(keys.alice), timeout=30)
    # The id a client holds of a run (its events, GET /runs/{id}, the chat page) finds it.
    run_id = answer.headers["x-run-id"]
    assert answer.json()["id"] == run_id
    (failed,) = [line for _, line in logged(capfd) if line["level"] == "ERROR"]
    assert failed["message"] == "the agent failed" and failed["run_id"] == run_id


def test_a_requests_lines_carry_the_trace_ids_it_came_with(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    xray = "1-5759e988-bd862e3fe1be46a994272793"
    w3c = "0af7651916cd43dd8448eb211c80319c"
    traced = {
        "X-Amzn-Trace-Id": f"Root={xray};Parent=53995c3f42cd8ad8;Sampled=1",
        "traceparent": f"00-{w3c}-b7ad6b7169203331-01",
    }
    invalid = {"traceparent": f"00-{w3c}-0000000000000000-01"}  # no parent: not a traceparent
    body = {"input": [user_message("a trip")], "stream": False}
    sent: dict[str, tuple[str | None, str | None]] = {}
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        for headers, expected in (
            (traced, (xray, w3c)),
            (invalid, (None, None)),
            ({}, (None, None)),
        ):
            answer = httpx.post(
                f"{url}/process", json=body, headers={**bearer(keys.alice), **headers}, timeout=30
            )
            sent[answer.headers["x-request-id"]] = expected
    lines = [line for _, line in logged(capfd)]
    for request_id, expected in sent.items():
        of_request = [line for line in lines if line.get("request_id") == request_id]
        assert {line["message"] for line in of_request} == {"the agent failed", "request"}
        for line in of_request:
            assert (line.get("xray_trace_id"), line.get("trace_id")) == expected, line


def test_the_password_of_a_url_an_agents_failure_quotes_is_neither_logged_nor_answered(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    # A connection string (a database's, an index's) in an exception's text: its password
    # was logged with the traceback, and answered in the run's error.
    keys = Keys.make()
    quoted = "postgresql://app:s3cret@db.internal:5432/trips"
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        body = {"input": [user_message(quoted)], "stream": False}
        answer = httpx.post(f"{url}/process", json=body, headers=bearer(keys.alice), timeout=30)
    assert answer.json()["status"] == "failed"
    assert "s3cret" not in answer.text
    lines = logged(capfd)
    (failed,) = [line for _, line in lines if line["level"] == "ERROR"]
    assert "postgresql://****@db.internal:5432/trips" in json.dumps(failed)
    assert not [text for text, _ in lines if "s3cret" in text]


def request_lines(capfd: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [line for _, line in logged(capfd) if line["message"] == "request"]


def test_a_failed_requests_line_says_its_error_code_and_its_caller(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    """An operator reading the request lines of failed requests saw only their status:
    neither why (the code the client got) nor who asked."""
    keys = Keys.make()
    alice_key_id = keys.alice.split("_")[1]
    service_key_id = keys.service.split("_")[1]
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/sessions").status_code == 401
            as_bob = {**bearer(keys.alice), "X-User-Id": "bob"}
            assert client.get("/sessions", headers=as_bob).status_code == 403
            assert client.get("/sessions/none", headers=bearer(keys.alice)).status_code == 404
            for_carol = {**bearer(keys.service), "X-User-Id": "carol"}
            assert client.get("/sessions/none", headers=for_carol).status_code == 404
            refused = client.post("/process", json={"input": 5}, headers=bearer(keys.alice))
            assert refused.status_code == 422
            assert client.get("/sessions", headers=bearer(keys.alice)).status_code == 200
            # A chat completion whose run failed is answered with the run's error.
            chat = {"model": "m", "messages": [{"role": "user", "content": "a trip"}]}
            failed = client.post(
                "/compatible-mode/v1/chat/completions", json=chat, headers=bearer(keys.alice)
            )
            assert failed.status_code >= 400
    lines = request_lines(capfd)
    failures = [
        (line["status"], line.get("code"), line.get("user_id"), line.get("key_id"))
        for line in lines
    ]
    assert failures == [
        (401, "UNAUTHENTICATED", None, None),
        (403, "PERMISSION_DENIED", "alice", alice_key_id),
        (404, "SESSION_NOT_FOUND", "alice", alice_key_id),
        (404, "SESSION_NOT_FOUND", "carol", service_key_id),
        (422, "INVALID_INPUT", "alice", alice_key_id),
        (200, None, None, None),
        (failed.status_code, failed.json()["error"]["code"], "alice", alice_key_id),
    ]
    secrets = (keys.alice.split("_", 2)[2], keys.service.split("_", 2)[2])
    assert not [line for line in lines if any(secret in json.dumps(line) for secret in secrets)]


def test_an_agents_failure_is_logged_with_its_user(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    keys = Keys.make()
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        capfd.readouterr()
        body = {"input": [user_message("a trip")], "stream": False}
        httpx.post(f"{url}/process", json=body, headers=bearer(keys.alice), timeout=30)
    (failed,) = [line for _, line in logged(capfd) if line["level"] == "ERROR"]
    assert failed["message"] == "the agent failed" and failed["user_id"] == "alice"
