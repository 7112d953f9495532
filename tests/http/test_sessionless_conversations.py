"""OpenAI-compatible clients that name no session: one session per conversation, on every
backend, found again from the conversation the client resends (see
:mod:`agentscope_serverless.http.conversations`)."""

from __future__ import annotations

import base64
import concurrent.futures
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.settings import load_settings
from tests.http.conftest import scenario_app
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import Keys, bearer, running


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Keys]]:
    keys = Keys.make()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(**backend_settings(request.param, request))
        app = create_app(settings=settings, agent_app=scenario_app(), key_store=keys.store)
        with running(app) as url:
            yield url, keys


def sdk_of(served: tuple[str, Keys], key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0]}/compatible-mode/v1", api_key=key, max_retries=0)


@pytest.fixture
def sdk(served: tuple[str, Keys]) -> Iterator[openai.OpenAI]:
    with sdk_of(served, served[1].alice) as client:
        yield client


@pytest.fixture
def rest(served: tuple[str, Keys]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0], headers=bearer(served[1].alice), timeout=30) as client:
        yield client


def stored(rest: httpx.Client, session: str) -> list[tuple[str, str]]:
    items = rest.get(f"/sessions/{session}/messages", params={"limit": 1000}).json()["items"]
    return [
        (m["role"], "".join(p.get("text", "") for p in m["content"] if p["type"] == "text"))
        for m in items
    ]


def sent(conversation: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in conversation]


def say(sdk: openai.OpenAI, conversation: list[dict[str, Any]], *, stream: bool) -> str:
    """One call with the whole conversation; the reply is added to it; its session returned."""
    raw = sdk.chat.completions.with_raw_response.create(
        model="m", messages=conversation, stream=stream
    )
    if stream:
        with raw.parse() as chunks:
            answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        answer = raw.parse().choices[0].message.content or ""
    conversation.append({"role": "assistant", "content": answer})
    return raw.headers["X-Session-Id"]


def started(marker: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"first {marker}"},
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_conversation_resent_whole_is_one_session_holding_each_message_once(
    sdk: openai.OpenAI, rest: httpx.Client, stream: bool
) -> None:
    # Each call used to start a session of its own, holding the conversation so far again.
    conversation = started(uuid.uuid4().hex)
    sessions = []
    for text in ("second", "third", "fourth"):
        sessions.append(say(sdk, conversation, stream=stream))
        conversation.append({"role": "user", "content": text})
    sessions.append(say(sdk, conversation, stream=stream))
    assert len(set(sessions)) == 1
    assert stored(rest, sessions[0]) == sent(conversation)
    assert conversation[-1] == {"role": "assistant", "content": "echo: fourth"}


def test_a_regenerated_reply_forks_a_session_of_its_own(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    conversation = started(uuid.uuid4().hex)
    first = say(sdk, conversation, stream=False)
    conversation.append({"role": "user", "content": "again"})
    before = list(conversation)
    second = say(sdk, conversation, stream=False)
    # The client asks for another answer to its last message: the same call once more.
    regenerated = say(sdk, list(before), stream=False)
    assert first == second != regenerated
    assert stored(rest, second) == sent(conversation)
    assert stored(rest, regenerated) == [*sent(before), ("assistant", "echo: again")]
    # The branch goes on in its session (this agent answered the same again: the
    # conversations are one, its latest session goes on).
    conversation.append({"role": "user", "content": "on"})
    assert say(sdk, conversation, stream=True) == regenerated
    assert stored(rest, second) == sent(conversation[:-2])


def test_an_edited_earlier_message_starts_a_session_with_the_edited_conversation(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    conversation = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=False)
    conversation.append({"role": "user", "content": "second"})
    assert say(sdk, conversation, stream=False) == session
    edited = [dict(m) for m in conversation]
    edited[1]["content"] += " (edited)"
    edited.append({"role": "user", "content": "third"})
    forked = say(sdk, edited, stream=False)
    assert forked != session
    assert stored(rest, forked) == sent(edited)
    assert stored(rest, session) == sent(conversation)


def test_the_same_conversation_sent_twice_at_once_continues_one_session_only(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    conversation = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=False)
    conversation.append({"role": "user", "content": "twice"})
    # Two clients (or a double click) send the same next call: one continues the session.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(say, sdk, list(conversation), stream=False) for _ in range(2)]
        sessions = sorted((c.result() for c in calls), key=lambda s: s != session)
    assert sessions[0] == session != sessions[1]
    replied = [*sent(conversation), ("assistant", "echo: twice")]
    assert stored(rest, session) == stored(rest, sessions[1]) == replied


def test_a_conversation_is_its_users_own(served: tuple[str, Keys], rest: httpx.Client) -> None:
    conversation = started(uuid.uuid4().hex)
    with sdk_of(served, served[1].alice) as alice, sdk_of(served, served[1].bob) as bob:
        alices = say(alice, conversation, stream=False)
        before = sent(conversation)
        conversation.append({"role": "user", "content": "mine"})
        # Bob sends Alice's conversation word for word: he does not reach Alice's session.
        bobs = say(bob, list(conversation), stream=False)
        assert bobs != alices
        assert stored(rest, alices) == before
        assert say(alice, conversation, stream=False) == alices


def test_a_deleted_session_is_not_continued_its_conversation_goes_on_in_a_new_one(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    conversation = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=False)
    assert rest.delete(f"/sessions/{session}").status_code == 204
    conversation.append({"role": "user", "content": "still there?"})
    again = say(sdk, conversation, stream=False)
    assert again != session
    assert stored(rest, again) == sent(conversation)
    assert rest.get(f"/sessions/{session}/messages").status_code == 404


def remade(rest: httpx.Client, session: str) -> None:
    """The session deleted, then one of its id made again holding another conversation."""
    assert rest.delete(f"/sessions/{session}").status_code == 204
    made = rest.post(
        "/process",
        json={
            "input": [{"role": "user", "content": "new"}],
            "session_id": session,
            "stream": False,
        },
    )
    assert made.status_code == 200
    assert stored(rest, session) == turns("new")


def test_a_deleted_session_made_again_is_not_continued_by_its_old_conversation(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    # The old conversation went on in the new session, mixed into its unrelated history.
    conversation = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=False)
    remade(rest, session)
    conversation.append({"role": "user", "content": "still there?"})
    again = say(sdk, conversation, stream=False)
    assert again != session
    assert stored(rest, again) == sent(conversation)
    assert stored(rest, session) == turns("new")


def test_a_failed_turn_of_a_deleted_session_made_again_is_not_retried_in_it(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    conversation = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=False)
    conversation.append({"role": "user", "content": "on"})
    assert say(sdk, conversation, stream=False) == session
    with pytest.raises(openai.APIError):
        sdk.chat.completions.create(
            model="m",
            messages=[*conversation, {"role": "user", "content": "fail"}],  # type: ignore[list-item]
        )
    remade(rest, session)
    conversation.append({"role": "user", "content": "better"})
    again = say(sdk, conversation, stream=False)
    assert again != session
    assert stored(rest, again) == sent(conversation)


def test_a_failed_turn_is_retried_in_the_same_session(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    conversation = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=False)
    failing = [*conversation, {"role": "user", "content": "fail"}]
    with pytest.raises(openai.APIError):
        sdk.chat.completions.create(model="m", messages=failing)  # type: ignore[arg-type]
    conversation.append({"role": "user", "content": "better"})
    assert say(sdk, conversation, stream=False) == session


def test_a_responses_client_resending_its_output_items_continues_the_session(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    marker = uuid.uuid4().hex
    items: list[Any] = [{"role": "user", "content": f"draw {marker}"}]
    first = sdk.responses.create(model="m", input=items)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"role": "user", "content": "draw"})
    second = sdk.responses.create(model="m", input=items)
    items += [item.model_dump(exclude_none=True) for item in second.output]
    items.append({"role": "user", "content": "more"})
    third = sdk.responses.create(model="m", input=items, stream=False)
    sessions = {str((r.metadata or {})["session_id"]) for r in (first, second, third)}
    assert len(sessions) == 1
    assert stored(rest, sessions.pop()) == [
        ("user", f"draw {marker}"),
        ("assistant", f"echo: draw {marker}"),
        ("user", "draw"),
        ("assistant", "A cat."),
        ("user", "more"),
        ("assistant", "echo: more"),
    ]


def test_a_conversation_new_here_whose_first_turn_failed_is_retried_in_its_session(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    # A conversation begun elsewhere (it holds a reply already) starts a session holding it.
    conversation = [*started(uuid.uuid4().hex), {"role": "assistant", "content": "from before"}]
    with pytest.raises(openai.APIError):
        sdk.chat.completions.create(  # type: ignore[call-overload]
            model="m", messages=[*conversation, {"role": "user", "content": "fail"}]
        )
    conversation.append({"role": "user", "content": "better"})
    session = say(sdk, conversation, stream=False)
    assert stored(rest, session) == [
        *sent(conversation[:3]),
        ("user", "fail"),
        *sent(conversation[3:]),
    ]


def respond(sdk: openai.OpenAI, text: str, previous: str | None = None, **extra: Any) -> Any:
    """A responses call (continuing ``previous``); the response and its session."""
    raw = sdk.responses.with_raw_response.create(
        model="m", input=text, previous_response_id=previous or openai.NOT_GIVEN, **extra
    )
    return raw.parse(), raw.headers["X-Session-Id"]


def turns(*texts: str) -> list[tuple[str, str]]:
    return [pair for text in texts for pair in (("user", text), ("assistant", f"echo: {text}"))]


def test_previous_response_id_of_an_earlier_response_branches_from_it(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    # OpenAI's previous_response_id continues the conversation up to that response: a
    # call continuing an earlier one again (a regenerate, an edit) saw the later turns.
    first, session = respond(sdk, "one")
    second, same = respond(sdk, "two", first.id)
    branch, branched = respond(sdk, "three", first.id)
    assert same == session != branched
    assert stored(rest, branched) == turns("one", "three")
    assert stored(rest, session) == turns("one", "two")
    # Each goes on in its own session.
    assert respond(sdk, "four", second.id)[1] == session
    assert respond(sdk, "five", branch.id)[1] == branched
    assert stored(rest, session) == turns("one", "two", "four")
    assert stored(rest, branched) == turns("one", "three", "five")
    assert branch.metadata == {"session_id": branched}


def test_a_response_of_a_deleted_session_made_again_is_continued_by_no_call(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    # The call continuing it ran in the new session of the same id, an unrelated one.
    first, session = respond(sdk, "one")
    second, _ = respond(sdk, "two", first.id)
    remade(rest, session)
    for previous in (second.id, first.id):  # its note, and a branch from an earlier one
        with pytest.raises(openai.NotFoundError):
            respond(sdk, "and now?", previous)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(previous)
    assert stored(rest, session) == turns("new")


def test_a_response_id_naming_another_session_than_its_runs_is_no_response(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    first, session = respond(sdk, "one")
    _, other = respond(sdk, "other")
    run = first.id.removeprefix("resp_").partition("_")[0]
    forged = f"resp_{run}_{base64.urlsafe_b64encode(other.encode()).decode().rstrip('=')}"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(forged)
    with pytest.raises(openai.NotFoundError):
        respond(sdk, "and now?", forged)
    assert stored(rest, other) == turns("other")
    assert respond(sdk, "two", first.id)[1] == session


def test_the_same_response_continued_twice_at_once_goes_on_in_two_conversations(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    first, session = respond(sdk, "one")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(respond, sdk, text, first.id) for text in ("a", "b")]
        sessions = {call.result()[1] for call in calls}
    assert session in sessions and len(sessions) == 2
    held = sorted(stored(rest, s) for s in sessions)
    assert held == [turns("one", "a"), turns("one", "b")]


def test_an_sdk_retry_of_a_continuing_call_starts_no_branch(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    def sessions() -> set[str]:
        listed = rest.get("/sessions", params={"limit": 1000}).json()["items"]
        return {s["id"] for s in listed}

    first, session = respond(sdk, "one")
    retried = {"X-Stainless-Retry-Count": "1"}
    second, same = respond(sdk, "two", first.id, extra_headers=retried)
    before = sessions()
    again, still = respond(sdk, "two", first.id, extra_headers=retried)
    assert session == same == still and again.id == second.id
    assert sessions() == before
    assert stored(rest, session) == turns("one", "two")
    assert respond(sdk, "three", second.id)[1] == session


def test_a_response_still_in_progress_is_continued_by_no_call_until_it_ends(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    # Its turn is stored in its session as it ends: a call continuing it meanwhile ran in
    # its session, and the session held that call's turn before the one it continued.
    with sdk.responses.create(model="m", input="sleep 2", stream=True) as going:
        created = next(iter(going)).response  # type: ignore[union-attr]
        session = str((created.metadata or {})["session_id"])
        for named in ({}, {"metadata": {"session_id": session}}):
            with pytest.raises(openai.BadRequestError) as refused:
                respond(sdk, "next", created.id, **named)
            assert (refused.value.code, refused.value.param) == (
                "RESPONSE_IN_PROGRESS",
                "previous_response_id",
            )
            assert "in progress" in refused.value.message
        assert [event.type for event in going][-1] == "response.completed"
    assert respond(sdk, "next", created.id)[1] == session
    assert stored(rest, session) == turns("sleep 2", "next")


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_with_a_message_of_no_text_is_read_and_continued_alike_streamed_or_not(
    sdk: openai.OpenAI, rest: httpx.Client, stream: bool
) -> None:
    # The picture's message has no text: a completion not streamed began with the blank
    # line joining it to the next, which a stream does not send, and a client resending the
    # streamed reply was not found to continue its session.
    conversation = [*started(uuid.uuid4().hex), {"role": "user", "content": "show"}]
    first = say(sdk, conversation, stream=stream)
    assert conversation[-1] == {"role": "assistant", "content": "Here it is."}
    conversation.append({"role": "user", "content": "thanks"})
    assert say(sdk, conversation, stream=stream) == first


def test_a_responses_client_resending_a_reply_with_a_message_of_no_text_continues_it(
    sdk: openai.OpenAI,
) -> None:
    # Its output items: the picture's message, without content, then the text's.
    items: list[Any] = [*started(uuid.uuid4().hex), {"role": "user", "content": "show"}]
    first = sdk.responses.create(model="m", input=items)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"role": "user", "content": "thanks"})
    second = sdk.responses.create(model="m", input=items)
    assert (first.metadata or {})["session_id"] == (second.metadata or {})["session_id"]


@pytest.mark.parametrize("asked", ["refuse", "half refuse"])
def test_a_responses_client_resending_a_reply_with_a_refusal_continues_it(
    sdk: openai.OpenAI, rest: httpx.Client, asked: str
) -> None:
    # The conversation was noted with the reply's text alone, while the digest of the
    # resent output read its refusal part: the next call started a new session.
    items: list[Any] = [*started(uuid.uuid4().hex), {"role": "user", "content": asked}]
    first = sdk.responses.create(model="m", input=items)
    assert "refusal" in [part.type for item in first.output for part in item.content]  # type: ignore[union-attr]
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"role": "user", "content": "thanks"})
    second = sdk.responses.create(model="m", input=items)
    session = str((first.metadata or {})["session_id"])
    assert str((second.metadata or {})["session_id"]) == session
    assert [role for role, _ in stored(rest, session)] == [
        "system",
        "user",
        "user",
        "assistant",
        "user",
        "assistant",
    ]


@pytest.mark.parametrize("resent_as", ["message", "refusal part"])
@pytest.mark.parametrize("asked", ["refuse", "half refuse"])
def test_a_chat_client_resending_a_reply_with_a_refusal_continues_it(
    sdk: openai.OpenAI, asked: str, resent_as: str
) -> None:
    conversation: list[Any] = [*started(uuid.uuid4().hex), {"role": "user", "content": asked}]
    raw = sdk.chat.completions.with_raw_response.create(model="m", messages=conversation)
    reply = raw.parse().choices[0].message
    assert reply.refusal
    if resent_as == "message":  # the SDK's message as it came (its refusal field)
        conversation.append(reply.model_dump(exclude_none=True))
    else:
        parts = [{"type": "text", "text": reply.content}] if reply.content else []
        parts.append({"type": "refusal", "refusal": reply.refusal})
        conversation.append({"role": "assistant", "content": parts})
    conversation.append({"role": "user", "content": "thanks"})
    assert say(sdk, conversation, stream=False) == raw.headers["X-Session-Id"]


@pytest.mark.parametrize("resent_as", ["", None])
@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_reply_resent_as_the_client_got_it_continues_its_session(
    sdk: openai.OpenAI, rest: httpx.Client, stream: bool, resent_as: str | None
) -> None:
    # A turn whose agent said nothing left no message to note the conversation with: each
    # later call started a new session holding a copy of the conversation.
    conversation: list[Any] = [
        *started(uuid.uuid4().hex),
        {"role": "user", "content": "say nothing"},
    ]
    first = say(sdk, conversation, stream=stream)
    assert conversation[-1] == {"role": "assistant", "content": ""}
    conversation[-1]["content"] = resent_as
    conversation.append({"role": "user", "content": "thanks"})
    assert say(sdk, conversation, stream=stream) == first
    roles = [role for role, _ in stored(rest, first)]
    assert roles == ["system", "user", "user", "user", "assistant"]


def test_a_chat_reply_stopped_by_its_client_is_continued_with_what_it_got(
    sdk: openai.OpenAI, rest: httpx.Client
) -> None:
    # The stopped run noted only the conversation before its turn: the next call, resending
    # the partial reply the client got, started a new session.
    conversation: list[Any] = [*started(uuid.uuid4().hex), {"role": "user", "content": "ticks"}]
    raw = sdk.chat.completions.with_raw_response.create(
        model="m", messages=conversation, stream=True
    )
    session, run = raw.headers["X-Session-Id"], raw.headers["X-Run-Id"]
    got = ""
    with raw.parse() as chunks:  # the user presses "stop" after two ticks
        for chunk in chunks:
            got += (chunk.choices[0].delta.content or "") if chunk.choices else ""
            if got.count("tick") == 2:
                break
    assert got == "tick 0\n\ntick 1"
    deadline = time.monotonic() + 10  # the run ends (its partial reply kept), then is noted
    while rest.get(f"/runs/{run}").json()["status"] != "canceled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    conversation += [{"role": "assistant", "content": got}, {"role": "user", "content": "on"}]
    assert say(sdk, conversation, stream=True) == session
    assert stored(rest, session)[:4] == [*sent(conversation[:3]), ("assistant", "tick 0")]
    assert stored(rest, session)[-2:] == [("user", "on"), ("assistant", "echo: on")]


@pytest.mark.parametrize("stopped_by", ["client", "cancel"])
def test_a_chat_reply_stopped_before_it_said_anything_is_continued_in_its_session(
    sdk: openai.OpenAI, rest: httpx.Client, stopped_by: str
) -> None:
    # The stopped run noted no conversation with its (empty) reply: the next call, resending
    # the turn as the client showed it, started a new session holding a copy of it all.
    conversation: list[Any] = started(uuid.uuid4().hex)
    session = say(sdk, conversation, stream=True)
    conversation.append({"role": "user", "content": "sleep 3"})
    raw = sdk.chat.completions.with_raw_response.create(
        model="m", messages=conversation, stream=True
    )
    run = raw.headers["X-Run-Id"]
    with raw.parse() as chunks:  # the user presses "stop" before the agent says anything
        if stopped_by == "cancel":
            assert rest.post(f"/runs/{run}/cancel").status_code == 202
        next(iter(chunks))
    deadline = time.monotonic() + 10
    while rest.get(f"/runs/{run}").json()["status"] != "canceled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    conversation += [{"role": "assistant", "content": ""}, {"role": "user", "content": "on"}]
    assert say(sdk, conversation, stream=True) == session
    assert stored(rest, session)[-3:] == [
        ("user", "sleep 3"),
        ("user", "on"),
        ("assistant", "echo: on"),
    ]


@pytest.mark.parametrize("named", [True, False], ids=["session named", "conversation"])
def test_an_sdk_retry_of_a_stopped_run_goes_on_in_its_session_and_remembers_its_input_once(
    sdk: openai.OpenAI, rest: httpx.Client, named: bool
) -> None:
    # The stopped run stored its input, and memory got it; the retry, running again with
    # the same input, added it to memory a second time, and a conversation's retry went on
    # in a new session (the first try's left holding the input alone).
    marker = uuid.uuid4().hex
    # A conversation's first turn: no earlier part of it finds its session again.
    conversation: list[Any] = [
        {"role": "user", "content": f"a note {marker}"},
        {"role": "user", "content": "sleep 1"},
    ]
    tried = {"X-Session-Id": marker} if named else {}
    first = sdk.chat.completions.with_raw_response.create(
        model="m",
        messages=conversation,
        stream=True,
        extra_headers={**tried, "X-Stainless-Retry-Count": "0"},
    )
    run, session = first.headers["X-Run-Id"], first.headers["X-Session-Id"]
    assert rest.post(f"/runs/{run}/cancel").status_code == 202
    first.parse().close()
    deadline = time.monotonic() + 10
    while rest.get(f"/runs/{run}").json()["status"] != "canceled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    retried = sdk.chat.completions.with_raw_response.create(
        model="m",
        messages=conversation,
        stream=True,
        extra_headers={**tried, "X-Stainless-Retry-Count": "1"},
    )
    assert retried.headers["X-Run-Id"] != run  # run again
    assert retried.headers["X-Session-Id"] == session
    with retried.parse() as chunks:
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert said == "echo: sleep 1"
    assert stored(rest, session) == [
        ("user", f"a note {marker}"),
        ("user", "sleep 1"),
        ("assistant", "echo: sleep 1"),
    ]
    found = rest.post("/memory/search", json={"query": marker, "top_k": 10}).json()["items"]
    assert [m["content"][0]["text"] for m in found] == [f"a note {marker}"]
