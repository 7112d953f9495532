"""The official openai SDK against /compatible-mode/v1, unchanged, over real HTTP."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.http.conftest import SECRET
from tests.support.http import Keys, bearer, stream, user_message

RESPONSES_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture
def sdk(demo_url: str, keys: Keys) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"{demo_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    )
    yield client
    client.close()


def collapse(types: list[str]) -> list[str]:
    """Event types with runs of deltas folded into one."""
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]


def test_the_agent_is_listed_as_the_one_model(sdk: openai.OpenAI, demo_url: str) -> None:
    # Chat clients list models when a connection is added: the agent, named after its app.
    (model,) = sdk.models.list().data
    assert (model.id, model.object, model.owned_by) == ("demo", "model", "agentscope-serverless")
    assert isinstance(model.created, int) and model.created > 0
    assert sdk.models.retrieve("demo") == model
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-4o")
    for path in ("/models", "/models/demo"):
        assert httpx.get(f"{demo_url}/compatible-mode/v1{path}").status_code == 401


@pytest.mark.parametrize("base", ["/v1", "", "/compatible-mode"])
def test_a_base_url_without_the_compatible_prefix_is_told_where_the_routes_are(
    demo_url: str, keys: Keys, base: str
) -> None:
    wrong = openai.OpenAI(base_url=demo_url + base, api_key=keys.alice, max_retries=0)
    with wrong, pytest.raises(openai.NotFoundError) as refused:
        wrong.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
    assert "the OpenAI-compatible routes are under /compatible-mode/v1" in str(refused.value)
    assert "base_url is http://<host>:<port>/compatible-mode/v1" in str(refused.value)


def test_an_unknown_route_says_where_the_routes_are_listed(demo_url: str) -> None:
    missing = httpx.get(f"{demo_url}/api/process")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == (
        "Not Found: no route has this path (the API's routes are listed at /docs)"
    )


def test_chat_completion_not_streamed(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "My name is Alice"}]
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == (
        "Nice to meet you, Alice! I will remember your name."
    )
    assert completion.choices[0].finish_reason == "stop"


def test_chat_completion_streamed(sdk: openai.OpenAI) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hello"}], stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.startswith("Hello! I am a demo agent")
    assert sum(1 for c in chunks if c.choices[0].delta.content) > 3
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len({c.id for c in chunks}) == 1


def test_responses_not_streamed(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="demo", input="My name is Bob")
    assert response.status == "completed"
    assert response.output_text == "Nice to meet you, Bob! I will remember your name."
    assert uuid.UUID(response.metadata["session_id"])


def test_responses_streamed_in_the_reference_order(sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model="demo", input="hello", stream=True))
    assert collapse([e.type for e in events]) == RESPONSES_ORDER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    completed = events[-1].response
    assert completed.output_text == deltas
    assert deltas.startswith("Hello! I am a demo agent")


def test_responses_stream_has_event_and_data_lines(demo_url: str, keys: Keys) -> None:
    with httpx.Client(base_url=demo_url, timeout=10) as client:
        response, sse = stream(
            client,
            "/compatible-mode/v1/responses",
            json={"model": "demo", "input": "hello", "stream": True},
            headers={"Authorization": f"Bearer {keys.alice}"},
        )
    assert response.status_code == 200
    assert all(name == data["type"] for name, data in sse.events)
    item = next(d for _, d in sse.events if d["type"] == "response.output_item.done")["item"]
    assert (item["type"], item["role"], item["status"]) == ("message", "assistant", "completed")


def test_session_header_continues_a_chat_without_duplicating_history(
    sdk: openai.OpenAI, demo_url: str, keys: Keys
) -> None:
    session = f"sdk-{uuid.uuid4()}"
    headers = {"X-Session-Id": session}
    first = [{"role": "user", "content": "My name is Alice"}]
    reply = sdk.chat.completions.create(model="demo", messages=first, extra_headers=headers)
    second = [
        *first,
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "What is my name?"},
    ]
    answer = sdk.chat.completions.create(model="demo", messages=second, extra_headers=headers)
    assert answer.choices[0].message.content == "Your name is Alice."
    with httpx.Client(base_url=demo_url, timeout=10) as client:
        history = client.get(
            f"/sessions/{session}/messages", headers={"Authorization": f"Bearer {keys.alice}"}
        ).json()["items"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]


def test_a_session_named_for_the_first_time_starts_with_the_conversation_sent(
    sdk: openai.OpenAI, client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # The messages before the last reply were taken to be in the named session already:
    # in a session new to the server (named by the client, or whose history expired), the
    # agent answered without them, and they were never stored.
    chat, responses = f"sdk-{uuid.uuid4()}", f"sdk-{uuid.uuid4()}"
    conversation = [
        {"role": "user", "content": "My name is Alice"},
        {"role": "assistant", "content": "Nice to meet you, Alice."},
        {"role": "user", "content": "What is my name?"},
    ]
    answer = sdk.chat.completions.create(
        model="demo", messages=conversation, extra_headers={"X-Session-Id": chat}
    )
    given = sdk.responses.create(
        model="demo", input=conversation, metadata={"session_id": responses}
    )
    assert answer.choices[0].message.content == given.output_text == "Your name is Alice."
    conversation += [
        {"role": "assistant", "content": "Your name is Alice."},
        {"role": "user", "content": "And again?"},
    ]
    sdk.chat.completions.create(
        model="demo", messages=conversation, extra_headers={"X-Session-Id": chat}
    )
    client = client_for(keys.alice)
    stored = [
        (m["role"], m["content"][0]["text"])
        for m in client.get(f"/sessions/{chat}/messages").json()["items"]
    ]
    assert stored[:-1] == [(m["role"], m["content"]) for m in conversation]
    kept = client.get(f"/sessions/{responses}/messages").json()["items"]
    assert [m["role"] for m in kept] == ["user", "assistant", "user", "assistant"]


def test_a_conversation_ending_with_a_reply_to_continue_is_the_turn_in_a_named_session(
    sdk: openai.OpenAI, client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # Ending with an assistant message (a reply for the agent to continue), it gave the agent
    # no message at all in a named session (the whole conversation unnamed): agents that
    # read their last input message failed.
    chat, responses = f"sdk-{uuid.uuid4()}", f"sdk-{uuid.uuid4()}"
    start = [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moon"},
    ]
    answer = sdk.chat.completions.create(
        model="demo", messages=start, extra_headers={"X-Session-Id": chat}
    )
    assert answer.choices[0].message.content == (
        'You said: "Write a haiku". That is message 1 of this conversation.'
    )
    first = sdk.responses.create(
        model="demo", input="Write a haiku", metadata={"session_id": responses}
    )
    again = [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another"},
        {"role": "assistant", "content": "Spring rain"},
    ]
    given = sdk.responses.create(model="demo", input=again, metadata={"session_id": responses})
    assert given.output_text.startswith('You said: "Another". That is message 2')
    client = client_for(keys.alice)
    stored = {
        session: [
            (m["role"], m["content"][0]["text"])
            for m in client.get(f"/sessions/{session}/messages").json()["items"]
        ]
        for session in (chat, responses)
    }
    assert stored[chat][:-1] == [(m["role"], m["content"]) for m in start]
    assert stored[responses][:-1] == [(m["role"], m["content"]) for m in again]


def test_a_system_message_resent_with_each_turn_is_stored_once_until_it_changes(
    sdk: openai.OpenAI, client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    # A client that sends its system message with each new turn of a session had it stored
    # again every turn: the history filled with copies.
    session = f"sdk-{uuid.uuid4()}"
    headers = {"X-Session-Id": session}
    terse = {"role": "system", "content": "Be terse."}
    for system, ask in [
        (terse, "one"),
        (terse, "two"),
        ({**terse, "content": "Be kind."}, "three"),
    ]:
        sdk.chat.completions.create(
            model="demo", messages=[system, {"role": "user", "content": ask}], extra_headers=headers
        )
    client = client_for(keys.alice)
    again = {"input": [{**terse, "content": "Be kind."}, user_message("four")], "stream": False}
    assert client.post("/process", json={**again, "session_id": session}).status_code == 200
    history = client.get(f"/sessions/{session}/messages").json()["items"]
    said = [(m["role"], m["content"][0]["text"]) for m in history if m["role"] != "assistant"]
    assert said == [
        ("system", "Be terse."),
        ("user", "one"),
        ("user", "two"),
        ("system", "Be kind."),
        ("user", "three"),
        ("user", "four"),
    ]


def test_metadata_session_continues_a_responses_conversation(sdk: openai.OpenAI) -> None:
    session = f"sdk-{uuid.uuid4()}"
    sdk.responses.create(model="demo", input="My name is Carla", metadata={"session_id": session})
    streamed = list(
        sdk.responses.create(
            model="demo", input="What's my name?", metadata={"session_id": session}, stream=True
        )
    )
    assert streamed[-1].response.output_text == "Your name is Carla."
    assert streamed[-1].response.metadata == {"session_id": session}


@pytest.mark.parametrize("named", ["id", "object"])
def test_a_responses_conversation_is_continued_and_repeated_in_the_response(
    sdk: openai.OpenAI, named: str
) -> None:
    # The session was continued, but the response's conversation was None.
    session = f"conv_{uuid.uuid4().hex}"
    conversation: Any = session if named == "id" else {"id": session}
    sdk.responses.create(model="demo", input="My name is Quinn", conversation=conversation)
    reply = sdk.responses.create(model="demo", input="What's my name?", conversation=conversation)
    assert reply.output_text == "Your name is Quinn."
    assert reply.conversation is not None and reply.conversation.id == session
    streamed = list(
        sdk.responses.create(model="demo", input="hi", conversation=conversation, stream=True)
    )
    assert streamed[-1].response.conversation.id == session  # type: ignore[union-attr]
    assert sdk.responses.retrieve(reply.id).conversation.id == session  # type: ignore[union-attr]
    unnamed = sdk.responses.create(model="demo", input="hi")
    assert unnamed.conversation is None


@pytest.mark.parametrize("route", ["chat/completions", "responses"])
def test_a_session_header_given_twice_is_refused_not_one_of_them_taken(
    demo_url: str, keys: Keys, route: str
) -> None:
    # The first was taken, the second dropped (a proxy may keep another, or join them).
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
    sessions = [f"twice-{uuid.uuid4().hex}" for _ in range(2)]
    headers = [("Authorization", f"Bearer {keys.alice}")]
    headers += [("X-Session-Id", session) for session in sessions]
    answer = httpx.post(f"{demo_url}/compatible-mode/v1/{route}", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"] == "the X-Session-Id header is given more than once"
    alice = {"Authorization": f"Bearer {keys.alice}"}
    for session in sessions:
        assert httpx.get(f"{demo_url}/sessions/{session}", headers=alice).status_code == 404


@pytest.mark.parametrize(
    ("route", "named", "field"),
    [
        ("responses", {"metadata": {"session_id": 5}}, "metadata.session_id"),
        ("chat/completions", {"metadata": {"session_id": 5}}, "metadata.session_id"),
        ("responses", {"metadata": {"session_id": ["s"]}}, "metadata.session_id"),
        ("responses", {"conversation": {"id": 5}}, "conversation.id"),
    ],
)
def test_a_session_named_by_other_than_a_string_is_refused_not_a_new_one_started(
    demo_url: str, keys: Keys, route: str, named: dict[str, Any], field: str
) -> None:
    # It was ignored, and the turn went to a new session.
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
    with httpx.Client(base_url=demo_url, headers=bearer(keys.service)) as service:
        user = {"X-User-Id": f"user-{uuid.uuid4().hex[:8]}"}
        answer = service.post(f"/compatible-mode/v1/{route}", json={**body, **named}, headers=user)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == field
        assert answer.json()["error"]["message"] == f"{field} must be a string"
        assert service.get("/sessions", headers=user).json()["items"] == []


def test_a_session_id_field_as_process_takes_it_names_the_session(
    sdk: openai.OpenAI, demo_url: str, keys: Keys
) -> None:
    session = f"sdk-{uuid.uuid4()}"
    chat = sdk.chat.completions.with_raw_response.create(
        model="demo",
        messages=[{"role": "user", "content": "My name is Dana"}],
        extra_body={"session_id": session},
    )
    response = sdk.responses.with_raw_response.create(
        model="demo", input="What is my name?", extra_body={"session_id": session}
    )
    assert chat.headers["x-session-id"] == response.headers["x-session-id"] == session
    with httpx.Client(base_url=demo_url, headers={"Authorization": f"Bearer {keys.alice}"}) as c:
        history = c.get(f"/sessions/{session}/messages").json()["items"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]


def test_developer_messages_are_system_instructions(
    sdk: openai.OpenAI, demo_url: str, keys: Keys
) -> None:
    # OpenAI's SDKs and newer models send instructions with the "developer" role.
    session = f"sdk-{uuid.uuid4()}"
    chat = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    completion = sdk.chat.completions.create(
        model="demo", messages=chat, extra_headers={"X-Session-Id": session}
    )
    assert completion.choices[0].message.content.startswith("Hello!")
    answer = sdk.responses.create(
        model="demo",
        input=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        metadata={"session_id": session},
    )
    assert answer.output_text.startswith("Hello!")
    with httpx.Client(base_url=demo_url, headers={"Authorization": f"Bearer {keys.alice}"}) as c:
        history = c.get(f"/sessions/{session}/messages").json()["items"]
    # (the same system message again is not stored again)
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant"]


def test_a_new_session_id_is_returned_in_a_header(sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "hi"}]
    )
    assert uuid.UUID(raw.headers["x-session-id"])


def test_agent_failures_reach_the_sdk_as_errors(scenario_url: str, keys: Keys) -> None:
    client = openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    )
    session = f"failing-{uuid.uuid4().hex[:8]}"
    with (
        openai.OpenAI(  # the SDK's default: two retries of a 5xx, each a run of the agent
            base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice
        ) as retrying,
        pytest.raises(openai.InternalServerError, match="RuntimeError: boom") as failed,
    ):
        retrying.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "fail"}],
            extra_headers={"X-Session-Id": session},
        )
    assert SECRET not in str(failed.value.body)
    assert failed.value.response.headers["X-Should-Retry"] == "false"
    stored = httpx.get(
        f"{scenario_url}/sessions/{session}/messages", headers=bearer(keys.alice)
    ).json()["items"]
    assert [m["content"][0]["text"] for m in stored] == ["fail"]  # one run, not three
    with pytest.raises(openai.APIError, match="RuntimeError"):
        list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "fail"}], stream=True
            )
        )
    events = list(client.responses.create(model="m", input="fail", stream=True))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"
    client.close()


def test_a_wrong_key_is_an_authentication_error(demo_url: str) -> None:
    client = openai.OpenAI(
        base_url=f"{demo_url}/compatible-mode/v1", api_key="ask_wrong", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        client.responses.create(model="demo", input="hi")
    client.close()


def test_the_user_field_must_be_the_keys_user(sdk: openai.OpenAI) -> None:
    ok = sdk.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], user="alice"
    )
    assert ok.choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError):
        sdk.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], user="bob"
        )


def test_ping_comments_are_ignored_by_the_sdk(scenario_url: str, keys: Keys) -> None:
    client = openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    )
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "sleep 0.3"}], stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: sleep 0.3"
    client.close()


def test_malformed_messages_are_rejected_naming_the_item(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    response = client.post(
        "/compatible-mode/v1/chat/completions",
        json={"model": "m", "messages": [{"content": "no role"}]},
    )
    assert response.status_code == 400
    assert response.json()["error"]["fields"][0]["loc"] == ["messages", 0]


def test_files_reach_the_session_and_unknown_parts_are_refused(
    sdk: openai.OpenAI, client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    pdf = "data:application/pdf;base64,JVBERi0x"
    sdk.chat.completions.create(
        model="demo",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Read this"},
                    {"type": "file", "file": {"filename": "a.pdf", "file_data": pdf}},
                ],
            }
        ],
        extra_headers={"X-Session-Id": "with-a-file"},
    )
    sdk.responses.create(
        model="demo",
        input=[
            {
                "role": "user",
                "content": [{"type": "input_file", "file_id": "file-123", "filename": "b.pdf"}],
            }
        ],
        metadata={"session_id": "with-a-file"},
    )
    client = client_for(keys.alice)
    stored = client.get("/sessions/with-a-file/messages").json()["items"]
    files = [part for m in stored for part in m["content"] if part["type"] == "file"]
    assert [(f["filename"], f["file_data"], f["file_id"]) for f in files] == [
        ("a.pdf", pdf, None),
        ("b.pdf", None, "file-123"),
    ]
    video = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}
    refused = client.post(
        "/compatible-mode/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": [video]}]},
        headers={"X-Session-Id": "refused"},
    )
    assert refused.status_code == 400
    assert "'video_url' are not supported" in refused.json()["error"]["message"]
    assert client.get("/sessions/refused").status_code == 404


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "C:\\Users\\me\\secret.png", "javascript:alert(1)", "ftp://x/a.png"],
)
def test_an_image_of_a_url_no_model_fetches_is_refused_rather_than_stored(
    client_for: Callable[..., httpx.Client], keys: Keys, url: str
) -> None:
    # Stored, an image a model refuses (a local file, a drive letter taken for a scheme) was
    # resent with every later turn of the session, which the chat API refused each time.
    client = client_for(keys.alice)
    session = f"image-{uuid.uuid4()}"
    part = {"type": "image_url", "image_url": {"url": url}}
    refused = client.post(
        "/compatible-mode/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": [part]}]},
        headers={"X-Session-Id": session},
    )
    assert refused.status_code == 400, refused.text
    assert "need their image_url (an http or https URL" in refused.json()["error"]["message"]
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        ),
        (
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f-1"}]}]},
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]},
        ),
        (
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_file", "filename": "a"}]}]},
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
        ),
        (
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "cat"}]}]},
        ),
        (
            "chat/completions",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "/a.png"}}],
                    }
                ]
            },
        ),
    ],
)
def test_an_image_a_file_or_audio_without_a_source_is_refused_rather_than_stored(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, body: dict[str, object]
) -> None:
    # An image of no URL (or of a name that is no URL), a file of no URL, id or data, audio of
    # no data, show the agent nothing (an image reached a chat API as one of a null or invalid
    # URL, which it refuses, with every later turn of the session).
    client = client_for(keys.alice)
    session = f"image-{uuid.uuid4()}"
    refused = client.post(
        f"/compatible-mode/v1/{path}",
        json={"model": "m", **body},
        headers={"X-Session-Id": session},
    )
    assert refused.status_code == 400
    sources = {"image": "image_url", "file": "file_url, file_id or file_data", "audio": "data"}
    needs = next(source for kind, source in sources.items() if kind in str(body))
    assert needs in refused.json()["error"]["message"]
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    ("path", "field"), [("chat/completions", "messages"), ("responses", "input")]
)
def test_a_message_in_the_protocols_shape_has_its_parts_checked_as_openais(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str, field: str
) -> None:
    # A protocol Message's dump ("object": "message") is no OpenAI message: its parts are
    # checked as an OpenAI message's, not taken as they are (an image of a local path).
    client = client_for(keys.alice)
    session = f"shaped-{uuid.uuid4()}"
    message = {
        "type": "message",
        "object": "message",
        "role": "user",
        "content": [{"type": "image", "image_url": "/etc/passwd"}],
    }
    refused = client.post(
        f"/compatible-mode/v1/{path}",
        json={"model": "m", field: [message]},
        headers={"X-Session-Id": session},
    )
    assert refused.status_code == 400
    assert "'image' are not supported" in refused.json()["error"]["message"]
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    ("path", "part", "said"),
    [
        (
            "chat/completions",
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,not base64!"}},
            "not an image's base64",
        ),
        (
            "responses",
            {"type": "input_image", "image_url": "data:text/plain;base64,aGk="},
            "not an image's base64",
        ),
        (
            "chat/completions",
            {"type": "image_url", "image_url": {"url": "data:image/svg+xml,<svg/>"}},
            "not an image's base64",
        ),
        (
            "responses",
            {"type": "input_image", "image_url": "data:image/svg+xml;base64,PHN2Zy8+"},
            "not an image's base64 of a type models take",
        ),
        (
            "chat/completions",
            {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}},
            "need their data (base64)",
        ),
        (
            "chat/completions",
            {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf,x"}},
            "file_data of a content part of type 'file' is not base64",
        ),
        (
            "responses",
            {"type": "input_file", "filename": "a.pdf", "file_data": "not base64 at all"},
            "file_data of a content part of type 'input_file' is not base64",
        ),
    ],
)
def test_data_a_chat_api_would_refuse_is_refused_rather_than_stored(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    path: str,
    part: dict[str, object],
    said: str,
) -> None:
    # Stored, a broken data: URI or base64 reached the model with every later turn of the
    # session, which the chat API refused each time: the session could never be answered.
    client = client_for(keys.alice)
    session = f"data-{uuid.uuid4()}"
    field = "messages" if path == "chat/completions" else "input"
    refused = client.post(
        f"/compatible-mode/v1/{path}",
        json={"model": "m", field: [{"role": "user", "content": [part]}]},
        headers={"X-Session-Id": session},
    )
    assert refused.status_code == 400, refused.text
    assert said in refused.json()["error"]["message"]
    assert client.get(f"/sessions/{session}").status_code == 404


def test_images_audio_and_files_of_valid_base64_are_taken(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    client = client_for(keys.alice)
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "DATA:IMAGE/WEBP;BASE64,UklGRg=="}},
        {"type": "image_url", "image_url": {"url": "HTTP://example.com/cat.gif"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "JVBERi0x"}},
        {
            "type": "file",
            "file": {"filename": "b.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"},
        },
    ]
    answer = client.post(
        "/compatible-mode/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": parts}]},
    )
    assert answer.status_code == 200, answer.text


PICTURE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "chat/completions",
            {
                "messages": [
                    {"role": "system", "content": [PICTURE]},
                    {"role": "user", "content": "hi"},
                ]
            },
            "messages[0].content[0].type",
        ),
        (
            "responses",
            {
                "input": [
                    {"role": "developer", "content": [{"type": "input_file", "file_id": "f-1"}]},
                    {"role": "user", "content": "hi"},
                ]
            },
            "input[0].content[0].type",
        ),
        (
            "chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "draw"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Here."}, PICTURE]},
                    {"role": "user", "content": "again"},
                ]
            },
            "messages[1].content[1].type",
        ),
    ],
)
def test_a_part_other_than_text_in_a_system_or_assistant_message_is_refused(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    path: str,
    body: dict[str, object],
    param: str,
) -> None:
    # Chat APIs take text alone from a system (developer) or assistant message: stored, it
    # made the model refuse every later turn of the session, as OpenAI refuses it at once.
    client = client_for(keys.alice)
    refused = client.post(f"/compatible-mode/v1/{path}", json={"model": "m", **body})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": ""}]},
            "messages[0].content",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": " \n"}]},
            "messages[0].content",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": []}]},
            "messages[0].content",
        ),
        (
            "chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": [{"type": "text", "text": " "}]},
                ]
            },
            "messages[2].content",
        ),
        ("responses", {"input": ""}, "input"),
        ("responses", {"input": " "}, "input"),
        ("responses", {"input": []}, "input"),
        ("responses", {"input": [{"role": "user", "content": []}]}, "input[0].content"),
    ],
)
def test_a_user_message_without_content_is_refused_and_not_stored(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    path: str,
    body: dict[str, object],
    param: str,
) -> None:
    # It ran the agent on nothing and stored the empty message, which some chat APIs refuse
    # (on every later turn of the session); OpenAI refuses it at once.
    client = client_for(keys.alice)
    session = f"empty-{uuid.uuid4().hex}"
    refused = client.post(
        f"/compatible-mode/v1/{path}",
        json={"model": "m", **body},
        headers={"X-Session-Id": session},
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == param and (
        "content" in error["message"] or "no item" in error["message"]
    )
    assert client.get(f"/sessions/{session}/messages").status_code == 404
    assert client.get("/runs", params={"session_id": session}).json()["items"] == []


def _cancel_the_sessions_run(url: str, key: str, session: str) -> None:
    """Cancel the run of ``session`` as soon as it is listed (from another client)."""
    with httpx.Client(base_url=url, headers=bearer(key), timeout=10) as client:
        while not (runs := client.get("/runs", params={"session_id": session}).json()["items"]):
            time.sleep(0.02)
        assert client.post(f"/runs/{runs[0]['id']}/cancel").status_code == 202


def test_a_canceled_chat_completion_is_an_error_the_sdk_does_not_retry(
    scenario_url: str, keys: Keys
) -> None:
    session = f"cancel-{uuid.uuid4()}"
    canceller = threading.Thread(
        target=_cancel_the_sessions_run, args=(scenario_url, keys.alice, session)
    )
    canceller.start()
    # The SDK's default retries: a retried canceled run would run the agent again.
    client = openai.OpenAI(base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice)
    with pytest.raises(openai.ConflictError, match="the run was canceled") as canceled:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "sleep 30"}],
            extra_headers={"X-Session-Id": session},
        )
    canceller.join()
    client.close()
    assert canceled.value.code == "RUN_CANCELED"
    with httpx.Client(base_url=scenario_url, headers=bearer(keys.alice)) as http:
        runs = http.get("/runs", params={"session_id": session}).json()["items"]
    assert [run["status"] for run in runs] == ["canceled"]


def test_a_canceled_chat_completion_stream_ends_with_an_error(
    scenario_url: str, keys: Keys
) -> None:
    session = f"cancel-{uuid.uuid4()}"
    client = openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    )
    chunks = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "sleep 30"}],
        stream=True,
        extra_headers={"X-Session-Id": session},
    )
    first = next(iter(chunks))
    assert first.choices[0].delta.role == "assistant"
    _cancel_the_sessions_run(scenario_url, keys.alice, session)
    with pytest.raises(openai.APIError, match="the run was canceled"):
        list(chunks)
    client.close()


def test_a_canceled_response_is_cancelled_as_openai_spells_it(
    scenario_url: str, keys: Keys
) -> None:
    session = f"cancel-{uuid.uuid4()}"
    canceller = threading.Thread(
        target=_cancel_the_sessions_run, args=(scenario_url, keys.alice, session)
    )
    canceller.start()
    client = openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    )
    raw = client.responses.with_raw_response.create(
        model="m", input="sleep 30", metadata={"session_id": session}
    )
    canceller.join()
    client.close()
    # Validated as the SDK's type (``create`` builds its objects without validating them).
    response = openai.types.responses.Response.model_validate(raw.http_response.json())
    assert response.status == "cancelled"


def test_a_canceled_response_stream_ends_with_its_last_event(scenario_url: str, keys: Keys) -> None:
    session = f"cancel-{uuid.uuid4()}"
    client = openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    )
    events = iter(
        client.responses.create(
            model="m", input="sleep 30", metadata={"session_id": session}, stream=True
        )
    )
    assert next(events).type == "response.created"
    _cancel_the_sessions_run(scenario_url, keys.alice, session)
    rest = list(events)
    client.close()
    assert rest[-1].type == "response.incomplete"
    assert rest[-1].response.status == "cancelled"
    assert rest[-1].sequence_number == len(rest)


def test_previous_response_id_continues_the_session(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="demo", input="My name is Alice")
    second = sdk.responses.create(
        model="demo", input="What is my name?", previous_response_id=first.id
    )
    assert second.output_text == "Your name is Alice."  # from the session, not from memory
    assert second.metadata == first.metadata
    with sdk.responses.stream(
        model="demo", input="Who am I?", previous_response_id=second.id
    ) as events:
        third = events.get_final_response()
    assert third.output_text == "Your name is Alice."
    assert third.metadata == first.metadata and third.id != second.id


def test_previous_response_id_names_a_session_of_the_caller_only(
    demo_url: str, keys: Keys, sdk: openai.OpenAI
) -> None:
    first = sdk.responses.create(
        model="demo", input="My name is Alice", metadata={"session_id": "é"}
    )
    with (
        openai.OpenAI(
            base_url=f"{demo_url}/compatible-mode/v1", api_key=keys.bob, max_retries=0
        ) as bob,
        pytest.raises(openai.NotFoundError) as refused,
    ):
        bob.responses.create(model="demo", input="What is my name?", previous_response_id=first.id)
    assert "another user's" in refused.value.message
    again = sdk.responses.create(
        model="demo", input="What is my name?", previous_response_id=first.id
    )
    assert again.output_text == "Your name is Alice."


@pytest.mark.parametrize("session_id", ["hi??", "ab?", "é?"])
def test_previous_response_id_continues_a_session_whose_id_encodes_with_an_underscore(
    sdk: openai.OpenAI, session_id: str
) -> None:
    # The session's part of the id (base64url) may hold "_": "hi??" was read back as "?"
    # (the turn went to another session of the user) and "ab?" was refused.
    first = sdk.responses.create(
        model="demo", input="My name is Alice", metadata={"session_id": session_id}
    )
    assert "_" in first.id.removeprefix("resp_").partition("_")[2]
    second = sdk.responses.create(
        model="demo", input="What is my name?", previous_response_id=first.id
    )
    assert second.output_text == "Your name is Alice."
    assert second.metadata == {"session_id": session_id}


@pytest.mark.parametrize(
    "previous", ["resp_123", "chatcmpl-1_YQ", "resp_1_!!!", "resp_1_", "resp_1__w", "resp_1_Lw"]
)
def test_a_previous_response_id_of_no_response_here_is_refused(
    sdk: openai.OpenAI, previous: str
) -> None:
    with pytest.raises(openai.BadRequestError):
        sdk.responses.create(model="demo", input="hi", previous_response_id=previous)


def test_asking_for_more_than_one_choice_is_refused_rather_than_ignored(
    sdk: openai.OpenAI,
) -> None:
    """An agent gives one answer a turn: n=2 is a 400, not one choice where two were asked."""
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hello"}], n=2
        )
    assert refused.value.body["fields"][0]["loc"] == ["body", "n"]  # type: ignore[index]
    assert "less than or equal to 1" in refused.value.body["message"]  # type: ignore[index]
    completion = sdk.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "hello"}], n=1
    )
    assert len(completion.choices) == 1


def test_max_completion_tokens_reaches_the_agent_as_max_tokens(
    scenario_url: str, keys: Keys
) -> None:
    # Current SDKs and LangChain send max_completion_tokens (max_tokens is deprecated): it
    # was dropped, and the agent saw no limit.
    with openai.OpenAI(
        base_url=f"{scenario_url}/compatible-mode/v1", api_key=keys.alice, max_retries=0
    ) as client:
        ask = [{"role": "user", "content": "limits"}]
        newer = client.chat.completions.create(
            model="m",
            messages=ask,
            max_completion_tokens=7,  # type: ignore[arg-type]
        )
        older = client.chat.completions.create(
            model="m",
            messages=ask,
            max_tokens=9,  # type: ignore[arg-type]
        )
    assert newer.choices[0].message.content == "max_tokens=7"
    assert older.choices[0].message.content == "max_tokens=9"


def compatible_call(
    client: httpx.Client, path: str, option: dict[str, object], *, session: str | None = None
) -> httpx.Response:
    """A call of the OpenAI-compatible ``path`` (``chat/completions`` or ``responses``)
    saying "hi", with ``option`` in its body, in ``session`` when given."""
    chat = path == "chat/completions"
    ask = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"input": "hi"}
    headers = {"X-Session-Id": session} if session else {}
    return client.post(
        f"/compatible-mode/v1/{path}", json={"model": "m", **ask, **option}, headers=headers
    )


@pytest.mark.parametrize(
    ("path", "option", "param"),
    [
        ("chat/completions", {"max_tokens": 0, "max_completion_tokens": 7}, "max_tokens"),
        ("chat/completions", {"max_completion_tokens": -5}, "max_completion_tokens"),
        ("chat/completions", {"temperature": 5}, "temperature"),
        ("chat/completions", {"top_p": 1.5}, "top_p"),
        ("chat/completions", {"frequency_penalty": -3}, "frequency_penalty"),
        ("chat/completions", {"presence_penalty": 3}, "presence_penalty"),
        ("chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ("responses", {"max_output_tokens": 0}, "max_output_tokens"),
        ("responses", {"temperature": -1}, "temperature"),
        ("responses", {"top_p": 2}, "top_p"),
    ],
)
def test_a_sampling_option_out_of_openais_range_is_refused_naming_it(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    path: str,
    option: dict[str, object],
    param: str,
) -> None:
    # It reached the agent: the LLM agent's model refused the call, and the run failed (a
    # 500, with the message stored unanswered); a max_tokens of 0 gave way to another limit.
    client = client_for(keys.alice)
    session = f"sampling-{uuid.uuid4()}"
    refused = compatible_call(client, path, option, session=session)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == param
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize(
    ("path", "option", "param"),
    [
        ("chat/completions", {"stop": 5}, "stop"),
        ("chat/completions", {"stop": ["a", 1]}, "stop"),
        ("chat/completions", {"tool_choice": 5}, "tool_choice"),
        ("responses", {"input": 5}, "input"),
        ("responses", {"conversation": 5}, "conversation"),
        ("responses", {"previous_response_id": f"resp_{'a' * 32}_Lw"}, "previous_response_id"),
    ],
)
def test_a_refused_value_is_named_by_the_field_the_client_sent(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    path: str,
    option: dict[str, object],
    param: str,
) -> None:
    # A field taking a string or a list was named by pydantic's branch ("stop.str"), the
    # message listing each branch; a response id whose session part is no session id was
    # named "session_id", a field the client never sent.
    refused = compatible_call(client_for(keys.alice), path, option)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == param
    assert ".str" not in error["message"] and "session_id" not in error["message"]


CALLED = {"role": "assistant", "content": None}


@pytest.mark.parametrize(
    ("path", "option", "param"),
    [
        ("chat/completions", {"tool_choice": "bogus"}, "tool_choice"),
        ("chat/completions", {"function_call": "bogus"}, "function_call"),
        ("chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
        (
            "chat/completions",
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        ("chat/completions", {"response_format": {}}, "response_format"),
        ("chat/completions", {"reasoning_effort": "bogus"}, "reasoning_effort"),
        (
            "chat/completions",
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        **CALLED,
                        "tool_calls": [
                            {"id": "c1", "type": "bogus", "function": {"name": "f"}},
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "done"},
                    {"role": "user", "content": "and?"},
                ]
            },
            "messages[1].tool_calls[0].type",
        ),
        ("responses", {"tool_choice": "bogus"}, "tool_choice"),
        ("responses", {"truncation": "bogus"}, "truncation"),
        ("responses", {"reasoning": {"effort": "bogus"}}, "reasoning.effort"),
        ("responses", {"text": {"format": {}}}, "text.format"),
    ],
)
def test_a_value_openai_refuses_is_refused_naming_its_field(
    client_for: Callable[..., httpx.Client],
    keys: Keys,
    path: str,
    option: dict[str, object],
    param: str,
) -> None:
    # Each was taken silently (include_usage "yes" read as true, an empty response_format as
    # text), where OpenAI answers a 400: a client learnt nothing of its mistake.
    client = client_for(keys.alice)
    session = f"refused-{uuid.uuid4()}"
    refused = compatible_call(client, path, option, session=session)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == param
    assert client.get(f"/sessions/{session}").status_code == 404


@pytest.mark.parametrize("path", ["chat/completions", "responses"])
def test_a_model_name_longer_than_any_is_refused(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str
) -> None:
    # Every chunk of a stream repeats it: a name of 900 KB made an answer of a few hundred
    # chunks hundreds of megabytes long.
    client = client_for(keys.alice)
    chat = path == "chat/completions"
    ask = {"messages": [{"role": "user", "content": "hi"}]} if chat else {"input": "hi"}
    refused = client.post(
        f"/compatible-mode/v1/{path}", json={"model": "m" * 900_000, **ask, "stream": True}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "model"


def test_a_message_of_a_role_no_agent_takes_is_refused_naming_it(sdk: openai.OpenAI) -> None:
    # It said "messages[0] is not a valid message".
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(
            model="demo",
            messages=[{"role": "function", "name": "f", "content": "42"}],  # type: ignore[list-item]
        )
    error = refused.value.response.json()["error"]
    assert error["message"] == (
        "messages[0] has the role 'function'; roles are assistant, developer, system, tool, user"
    )
    assert error["fields"][0]["loc"] == ["messages", 0, "role"]


def test_a_responses_usage_is_one_the_sdk_takes_as_it_types_it() -> None:
    # Its input_tokens_details lacked cache_write_tokens, which the SDK's type requires:
    # a client validating what it read (ResponseUsage.model_validate) was refused.
    from openai.types.responses import ResponseUsage

    from agentscope_serverless.http.openai_compat import responses_usage

    shown = responses_usage({"prompt_tokens": 3, "completion_tokens": 2})
    assert shown is not None
    usage = ResponseUsage.model_validate(shown)
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (3, 2, 5)
    assert usage.input_tokens_details.cache_write_tokens == 0
