"""CONTRACT §7 over real HTTP: the /process stream, non-streamed runs, sessions, failures."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import load_settings
from tests.http.conftest import SECRET
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import (
    Keys,
    bearer,
    posted_at_once,
    running,
    stream,
    text_of,
    the_one_taken,
    user_message,
)

RESPONSE_FIELDS = {
    "sequence_number",
    "object",
    "status",
    "error",
    "id",
    "created_at",
    "completed_at",
    "output",
    "usage",
    "session_id",
}
MESSAGE_FIELDS = {
    "sequence_number",
    "object",
    "status",
    "error",
    "id",
    "type",
    "role",
    "content",
    "code",
    "message",
    "usage",
    "metadata",
}
TEXT_FIELDS = {
    "sequence_number",
    "object",
    "status",
    "error",
    "type",
    "index",
    "delta",
    "msg_id",
    "text",
}


def kinds(events: list[dict]) -> list[str]:
    """Each event as ``object:status`` (``content:delta`` for deltas)."""
    return [f"{e['object']}:{'delta' if e.get('delta') else e['status']}" for e in events]


def test_stream_has_the_exact_event_order_and_fields(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    body = {"input": [user_message("My name is Alice")], "session_id": "order-1"}
    response, sse = stream(client, "/process", json=body)

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-session-id"] == "order-1"
    assert all(name is None for name, _ in sse.events), "no event: lines on /process"
    events = sse.data
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    names = kinds(events)
    deltas = names.count("content:delta")
    assert deltas >= 2
    assert names == [
        "response:created",
        "response:in_progress",
        "message:in_progress",
        *["content:delta"] * deltas,
        "content:completed",
        "message:completed",
        "response:completed",
    ]

    created, in_progress, opened, *middle, done_part, done_message, done = events
    for event in (created, in_progress, done):
        assert set(event) == RESPONSE_FIELDS
        assert event["id"] == created["id"] and event["id"].startswith("response_")
        assert event["session_id"] == "order-1"
        assert event["error"] is None
    assert created["completed_at"] is None and created["output"] is None
    assert set(opened) == MESSAGE_FIELDS
    assert opened["role"] == "assistant" and opened["content"] is None
    assert opened["type"] == "message"
    for delta in middle:
        assert set(delta) == TEXT_FIELDS
        assert delta["msg_id"] == opened["id"]
        assert (delta["type"], delta["index"], delta["status"]) == ("text", 0, "in_progress")
    text = "".join(d["text"] for d in middle)
    assert text == "Nice to meet you, Alice! I will remember your name."
    assert set(done_part) == TEXT_FIELDS
    assert (done_part["text"], done_part["delta"], done_part["msg_id"]) == (
        text,
        None,
        opened["id"],
    )
    assert done_message["id"] == opened["id"]
    assert [part["text"] for part in done_message["content"]] == [text]
    assert done["completed_at"] >= done["created_at"]
    assert [m["id"] for m in done["output"]] == [opened["id"]]
    assert done["output"][0]["content"][0]["text"] == text


def test_a_second_request_in_the_session_sees_the_first_turn(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    session = f"memory-{uuid.uuid4()}"
    stream(
        client,
        "/process",
        json={"input": [user_message("My name is Alice")], "session_id": session},
    )
    _, sse = stream(
        client,
        "/process",
        json={"input": [user_message("What is my name?")], "session_id": session},
    )
    assert text_of(sse.data) == "Your name is Alice."
    history = client.get(f"/sessions/{session}/messages").json()["items"]
    assert [(m["role"], m["content"][0]["text"]) for m in history] == [
        ("user", "My name is Alice"),
        ("assistant", "Nice to meet you, Alice! I will remember your name."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Alice."),
    ]


def test_without_session_id_a_new_uuid_session_is_used_and_returned(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    response, sse = stream(client, "/process", json={"input": [user_message("hello")]})
    session_id = sse.data[-1]["session_id"]
    assert uuid.UUID(session_id)
    assert response.headers["x-session-id"] == session_id
    assert client.get(f"/sessions/{session_id}").json()["user_id"] == "alice"


@pytest.mark.parametrize("content", [[], None, "", "  ", [{"type": "text", "text": ""}]], ids=repr)
def test_a_user_message_without_content_is_refused_not_run_or_stored(
    client_for: Callable[..., httpx.Client], keys: Keys, content: object
) -> None:
    # It was run and stored: it would reach a model with every later turn of the session.
    client = client_for(keys.alice)
    session = f"blank-{uuid.uuid4().hex}"
    empty = {"role": "user", "content": content}
    body = {"input": [user_message("hi"), empty], "session_id": session, "stream": False}
    answer = client.post("/process", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == "input[1].content"
    assert "a user message needs content" in answer.json()["error"]["message"]
    appended = client.post(f"/sessions/{session}/messages", json={"messages": [empty]})
    assert appended.status_code == 422, appended.text
    assert appended.json()["error"]["param"] == "messages[0].content"
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    "url", ["/etc/passwd", "file:///etc/passwd", "data:image/svg+xml;base64,PHN2Zy8+"]
)
def test_an_image_no_model_takes_is_refused_not_run_or_stored(
    client_for: Callable[..., httpx.Client], keys: Keys, url: str
) -> None:
    # It was run and stored: resent with every later turn of the session, the chat API
    # refused each (and a path is read from the server's disk by agents taking local images).
    client = client_for(keys.alice)
    session = f"image-{uuid.uuid4().hex}"
    picture = {"role": "user", "content": [{"type": "image", "image_url": url}]}
    body = {"input": [user_message("hi"), picture], "session_id": session, "stream": False}
    answer = client.post("/process", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["param"] == "input[1].content[0].image_url"
    # Appended to the session, it would be sent with its every later turn all the same.
    appended = client.post(f"/sessions/{session}/messages", json={"messages": body["input"]})
    assert appended.status_code == 422, appended.text
    assert appended.json()["error"]["param"] == "messages[1].content[0].image_url"
    assert client.get(f"/sessions/{session}").status_code == 404


def test_stream_false_returns_the_final_agent_response(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    response = client.post(
        "/process",
        json={"input": [user_message("My name is Zoe")], "stream": False, "session_id": "json-1"},
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == RESPONSE_FIELDS
    assert (body["object"], body["status"], body["session_id"]) == (
        "response",
        "completed",
        "json-1",
    )
    assert (
        body["output"][0]["content"][0]["text"]
        == "Nice to meet you, Zoe! I will remember your name."
    )


@pytest.mark.parametrize(
    "accept",
    [
        "application/xml",
        "text/html, application/xml;q=0.9",
        "*/*;q=0",
        "text/event-stream;q=0, application/json;q=0",
        "text/*, text/event-stream;q=0",
    ],
)
@pytest.mark.parametrize("idempotent", [False, True])
def test_an_accept_taking_neither_events_nor_json_is_a_406(
    client_for: Callable[..., httpx.Client], keys: Keys, accept: str, idempotent: bool
) -> None:
    # It was ignored: a 200 event stream.
    headers = {"Accept": accept, **({"Idempotency-Key": uuid.uuid4().hex} if idempotent else {})}
    response = client_for(keys.alice).post(
        "/process", json={"input": [user_message("hi")]}, headers=headers
    )
    assert response.status_code == 406
    error = response.json()["error"]
    assert error["code"] == "NOT_ACCEPTABLE"
    assert error["message"].startswith(
        "Accept takes neither text/event-stream nor application/json"
    )


@pytest.mark.parametrize("key", [None, "not-a-key"])
@pytest.mark.parametrize("idempotent", [False, True])
def test_an_accept_taking_neither_from_a_caller_without_a_key_is_a_401(
    client_for: Callable[..., httpx.Client], key: str | None, idempotent: bool
) -> None:
    # It was a 406: the Accept was read before the key.
    headers = {"Accept": "application/xml"}
    if idempotent:
        headers["Idempotency-Key"] = uuid.uuid4().hex
    response = client_for(key).post(
        "/process", json={"input": [user_message("hi")]}, headers=headers
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    ("accept", "stream", "answered"),
    [
        (None, True, "text/event-stream"),
        ("*/*", True, "text/event-stream"),
        ("text/event-stream", True, "text/event-stream"),
        ("text/*;q=0.5, application/xml", True, "text/event-stream"),
        ("application/json", False, "application/json"),
        ("application/*, text/event-stream;q=0", False, "application/json"),
    ],
)
def test_an_accept_taking_events_or_json_is_answered(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    accept: str | None,
    stream: bool,
    answered: str,
) -> None:
    headers = {"Accept": accept} if accept else {}
    client = client_for(keys.alice)
    if accept is None:
        client.headers.pop("Accept")  # httpx sends */* by default
    response = client.post(
        "/process", json={"input": [user_message("hi")], "stream": stream}, headers=headers
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(answered)


@pytest.mark.parametrize("max_tokens", [0, -5, "many", 2.5, 5.0, "5", True])
def test_a_max_tokens_below_one_or_not_a_whole_number_is_refused_naming_it(
    client_for: Callable[..., httpx.Client], keys: Keys, max_tokens: object
) -> None:
    # A limit of 0 or below ran the agent (the LLM agent's model refused the call, and the
    # turn failed after storing its input); /chat/completions refused it.
    client = client_for(keys.alice)
    session = f"limits-{uuid.uuid4().hex[:8]}"
    body = {"input": [user_message("hi")], "session_id": session, "max_tokens": max_tokens}
    refused = client.post("/process", json=body)
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["param"] == "max_tokens"
    assert "max_tokens" in error["message"]
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    ("message_id", "why"), [("", "must not be empty"), ("m" * 10_000, "is longer than 512")]
)
def test_an_input_message_id_empty_or_longer_than_512_characters_is_refused_before_the_run(
    client_for: Callable[..., httpx.Client], keys: Keys, message_id: str, why: str
) -> None:
    client = client_for(keys.alice)
    session = f"message-id-{uuid.uuid4().hex[:8]}"
    bad = {**user_message("hi"), "id": message_id}
    for streamed in (False, True):
        body = {"input": [user_message("fine"), bad], "session_id": session, "stream": streamed}
        refused = client.post("/process", json=body)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["param"] == "input[1].id"
        assert error["message"].startswith(f"input[1].id {why}")
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    ("message_id", "why"),
    [
        ("a\x00b", "must not contain control characters"),
        ("\x1b[31mred", "must not contain control characters"),
        ("\x85", "must not contain control characters"),
        (" ", "must not be blank"),
    ],
)
def test_an_input_message_id_holding_a_control_character_or_blank_is_refused_before_the_run(
    client_for: Callable[..., httpx.Client], keys: Keys, message_id: str, why: str
) -> None:
    client = client_for(keys.alice)
    session = f"message-id-{uuid.uuid4().hex[:8]}"
    bad = {**user_message("hi"), "id": message_id}
    for streamed in (False, True):
        body = {"input": [user_message("fine"), bad], "session_id": session, "stream": streamed}
        refused = client.post("/process", json=body)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["param"] == "input[1].id"
        assert error["message"].startswith(f"input[1].id {why}")
    assert client.get(f"/sessions/{session}").status_code == 404


def test_input_messages_sharing_an_id_are_refused_before_the_run(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # The agent answered both, and the history kept the first alone (one message per id).
    client = client_for(keys.alice)
    session = f"shared-id-{uuid.uuid4().hex[:8]}"
    one, two, other = (
        {**user_message(text), "id": message_id}
        for text, message_id in (("part one", "1"), ("part two", "1"), ("other", "2"))
    )
    for streamed in (False, True):
        body = {"input": [one, other, two], "session_id": session, "stream": streamed}
        refused = client.post("/process", json=body)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["param"] == "input[2].id"
        assert error["message"] == (
            "input[2].id is the id of input[0] too: each message needs an id of its own"
        )
    assert client.get(f"/sessions/{session}").status_code == 404
    body = {"input": [one, other], "session_id": session, "stream": False}
    assert client.post("/process", json=body).status_code == 200


def test_an_input_message_whose_id_is_in_the_session_saying_else_is_refused_before_the_run(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # The agent answered each, and the history kept the first question alone, with three
    # answers.
    client = client_for(keys.alice)
    session = f"reused-id-{uuid.uuid4().hex[:8]}"

    def ask(text: str, streamed: bool = False) -> httpx.Response:
        message = {**user_message(text), "id": "1"}
        body = {"input": [message], "session_id": session, "stream": streamed}
        return client.post("/process", json=body)

    assert ask("my name is Carol").status_code == 200
    for text, streamed in (("what is my name?", False), ("tell me a joke", True)):
        refused = ask(text, streamed)
        assert refused.status_code == 409, refused.text
        assert refused.headers["x-should-retry"] == "false"
        error = refused.json()["error"]
        assert error["code"] == "MESSAGE_ID_CONFLICT"
        assert error["message"].startswith("input[0].id names a message already in the session")
    history = client.get(f"/sessions/{session}/messages").json()["items"]
    assert [m["role"] for m in history] == ["user", "assistant"]
    assert history[0]["content"][0]["text"] == "my name is Carol"


def test_an_input_message_sent_again_as_it_is_stored_runs_again_and_is_stored_once(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # A retry: say of a run that failed, whose input was kept.
    client = client_for(keys.alice)
    session = f"retried-id-{uuid.uuid4().hex[:8]}"
    body = {"input": [{**user_message("hi"), "id": "1"}], "session_id": session, "stream": False}
    assert client.post("/process", json=body).status_code == 200
    again = client.post("/process", json=body)
    assert again.status_code == 200, again.text
    history = client.get(f"/sessions/{session}/messages").json()["items"]
    assert [m["role"] for m in history] == ["user", "assistant", "assistant"]
    assert history[0]["id"] == "1"


def test_a_max_tokens_of_one_or_more_reaches_the_agent(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    for sent, seen in ((1, "max_tokens=1"), (40, "max_tokens=40"), (None, "max_tokens=None")):
        body = {"input": [user_message("limits")], "stream": False, "max_tokens": sent}
        answer = client.post("/process", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"][0]["content"][0]["text"] == seen


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        # Out of range, these ran the agent (the LLM agent's model refused the call, and the
        # turn failed after storing its input); /chat/completions refused them.
        ("temperature", 2.5, "less than or equal to 2"),
        ("temperature", -0.1, "greater than or equal to 0"),
        ("top_p", 1.5, "less than or equal to 1"),
        ("top_p", -1, "greater than or equal to 0"),
        ("frequency_penalty", 3, "less than or equal to 2"),
        ("presence_penalty", -2.5, "greater than or equal to -2"),
        ("temperature", "hot", "a valid number"),
        # Taken for a number (``true`` for 1, ``"0.5"`` for 0.5), these reached the agent,
        # which the OpenAI-compatible routes and OpenAI itself refuse.
        ("temperature", True, "a valid number"),
        ("temperature", "0.5", "a valid number"),
        ("top_p", "1", "a valid number"),
        ("frequency_penalty", False, "a valid number"),
        ("presence_penalty", "0", "a valid number"),
        ("seed", False, "a valid integer"),
        ("seed", "7", "a valid integer"),
        ("seed", 7.0, "a valid integer"),
        ("n", True, "a valid integer"),
    ],
)
def test_a_sampling_field_out_of_openais_range_or_type_is_refused_naming_it(
    client_for: Callable[..., httpx.Client], keys: Keys, field: str, value: object, said: str
) -> None:
    client = client_for(keys.alice)
    session = f"sampling-{uuid.uuid4().hex[:8]}"
    body = {"input": [user_message("hi")], "session_id": session, field: value}
    refused = client.post("/process", json=body)
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"invalid request: body.{field}: Input should be {said}")
    assert client.get(f"/sessions/{session}").status_code == 404


def test_sampling_fields_in_openais_ranges_are_taken(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    for sampling in (
        {"temperature": 0, "top_p": 0, "frequency_penalty": -2, "presence_penalty": -2},
        {"temperature": 2, "top_p": 1, "frequency_penalty": 2, "presence_penalty": 2},
        {"temperature": 0.7, "top_p": None, "frequency_penalty": 0.5, "seed": 7, "n": 5},
    ):
        body = {"input": [user_message("hi")], "stream": False, **sampling}
        answer = client.post("/process", json=body)
        assert answer.status_code == 200, answer.text


def test_an_agent_that_raises_ends_with_a_failed_event_and_keeps_the_input(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    session = f"fail-{uuid.uuid4()}"
    response, sse = stream(
        client, "/process", json={"input": [user_message("fail")], "session_id": session}
    )
    assert response.status_code == 200
    events = sse.data
    assert kinds(events) == ["response:created", "response:in_progress", "response:failed"]
    failed = events[-1]
    assert failed["error"]["code"] == "AGENT_UNKNOWN_ERROR"
    assert (
        failed["error"]["message"] == "Unknown agent error: RuntimeError: boom, and the key is ***"
    )
    assert SECRET not in sse.raw
    history = client.get(f"/sessions/{session}/messages").json()["items"]
    assert [(m["role"], m["content"][0]["text"]) for m in history] == [("user", "fail")]


def test_a_failure_after_some_output_keeps_the_input_only(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    session = f"fail-late-{uuid.uuid4()}"
    _, sse = stream(
        client,
        "/process",
        json={"input": [user_message("fail after a word")], "session_id": session},
    )
    assert kinds(sse.data)[-2:] == ["content:delta", "response:failed"]
    history = client.get(f"/sessions/{session}/messages").json()["items"]
    assert [m["role"] for m in history] == ["user"]


def test_a_project_error_keeps_its_code_and_maps_to_its_status(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    _, sse = stream(client, "/process", json={"input": [user_message("store down")]})
    assert sse.data[-1]["error"] == {
        "code": "STORE_UNAVAILABLE",
        "message": "redis is unavailable: connection refused",
    }
    response = client.post(
        "/process", json={"input": [user_message("store down")], "stream": False}
    )
    assert response.status_code == 503
    assert response.json()["status"] == "failed"


def test_a_failed_non_streamed_run_is_a_500_without_internals(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    response = client.post("/process", json={"input": [user_message("fail")], "stream": False})
    assert response.status_code == 500
    body = response.json()
    assert body["status"] == "failed"
    assert body["error"]["code"] == "AGENT_UNKNOWN_ERROR"
    assert SECRET not in response.text and "Traceback" not in response.text


def test_keepalive_pings_while_the_agent_is_silent(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    with client.stream(
        "POST", "/process", json={"input": [user_message("sleep 0.45")]}
    ) as response:
        lines = list(response.iter_lines())
    first_delta = next(i for i, line in enumerate(lines) if '"delta":true' in line)
    pings = [i for i, line in enumerate(lines) if line == ": ping"]
    assert len(pings) >= 2
    assert all(i < first_delta for i in pings)
    assert all(lines[i + 1] == "" for i in pings), "a ping is a complete SSE comment"


def test_no_ping_when_the_agent_answers_at_once(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    _, sse = stream(client, "/process", json={"input": [user_message("quick")]})
    assert sse.comments == []
    assert text_of(sse.data) == "echo: quick"


def counted_app(calls: list[int]) -> AgentApp:
    """An agent that notes each call in ``calls``, then answers."""
    app = AgentApp(app_name="counted")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        calls.append(1)
        yield "answered"

    return app


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_sent_at_once_with_one_input_id_saying_different_things_call_the_agent_once(
    backend: str, aws_env: None, keys: Keys, request: pytest.FixtureRequest
) -> None:
    # On DynamoDB all were answered 200: the agent answered each, and the history kept one
    # of their questions; then the others were 409, the rest of their input stored.
    calls: list[int] = []
    settings = load_settings(**backend_settings(backend, request))
    app = create_app(settings=settings, agent_app=counted_app(calls), key_store=keys.store)
    session = f"at-once-{uuid.uuid4().hex[:8]}"
    texts = [f"question {i}" for i in range(10)]
    bodies = [
        {
            "input": [{**user_message(text), "id": "same"}, user_message(f"more {text}")],
            "session_id": session,
            "stream": False,
        }
        for text in texts
    ]
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as alice,
    ):
        winner = the_one_taken(posted_at_once(alice, "/process", bodies), 200)
        stored = alice.get(f"/sessions/{session}/messages").json()["items"]
    assert len(calls) == 1
    assert [(m["role"], m["content"][0]["text"]) for m in stored] == [
        ("user", texts[winner]),
        ("user", f"more {texts[winner]}"),
        ("assistant", "answered"),
    ]
