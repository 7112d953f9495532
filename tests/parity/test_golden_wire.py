"""``/process`` and ``/compatible-mode/v1/responses`` answer event for event, field for field,
like AgentScope Runtime 1.0.5 serving the same agent (transcripts in ``golden/``, captured
from ``golden/peer_friday_app.py.txt``); only ids and timestamps differ.

Where AgentScope's Responses API differs from OpenAI's (key order, id prefixes, the type of
``created_at``, a non-streamed body that is the last event instead of the Response, a failed
response that drops the reply it had streamed), we follow OpenAI's, whose SDK is the client
that matters there (``golden/README.md``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import load_settings
from tests.support.http import InMemoryKeyStore, bearer, issue_key, parse_sse, running

GOLDEN = Path(__file__).with_name("golden")
PIECES = ["Hi! ", "My name is ", "Friday."]
PROCESS_BODY = {
    "input": [
        {"role": "user", "type": "message", "content": [{"type": "text", "text": "Who are you?"}]}
    ],
    "session_id": "wire-s1",
    "user_id": "dev",
}
IDS = ("id", "msg_id", "item_id")
# Where a Response object follows OpenAI's rather than AgentScope's: the requested model is
# echoed, a new response is ``in_progress`` (AgentScope: ``queued``), and OpenAI's other
# Response fields are present (null, or the session in ``metadata``).
OPENAI_RESPONSE_FIELDS = {"model", "status"}
OPENAI_EXTRA_FIELDS = {
    "error",
    "incomplete_details",
    "instructions",
    "max_output_tokens",
    "metadata",
    "previous_response_id",
    "temperature",
    "top_p",
    "usage",
}
# A failed response keeps the reply it had streamed, as OpenAI's output items do (AgentScope's
# output was empty): the message, ``incomplete``, with its text so far.
PARTIAL_REPLY = {
    "type": "message",
    "id": "<id 1>",
    "status": "incomplete",
    "role": "assistant",
    "content": [{"type": "output_text", "text": PIECES[0], "annotations": []}],
}
TIMES = ("created_at", "completed_at")


def friday_app(fail: bool) -> AgentApp:
    """The text agent of the transcripts: three pieces, or one and then an exception."""
    app = AgentApp(app_name="Friday", app_description="compat probe")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, request: Any = None, **kwargs: Any) -> AsyncIterator[str]:
        for piece in PIECES:
            yield piece
            if fail:
                raise RuntimeError("boom after one delta")

    return app


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[str, str]]]:
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    settings = load_settings()
    with (
        running(create_app(settings=settings, agent_app=friday_app(False), key_store=store)) as ok,
        running(create_app(settings=settings, agent_app=friday_app(True), key_store=store)) as err,
    ):
        yield {"ok": (ok, key), "err": (err, key)}


def golden_body(name: str) -> str:
    """The body of a transcript (after the status line, the headers and a blank line)."""
    return (GOLDEN / name).read_text().split("\n\n", 1)[1]


def golden_sse(name: str) -> list[tuple[str | None, Any]]:
    return parse_sse(golden_body(name).splitlines()).events


def normalized(value: Any, ids: dict[str, str] | None = None) -> Any:
    """``value`` with ids numbered by first appearance and timestamps reduced to set/unset."""
    ids = {} if ids is None else ids
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in IDS and isinstance(item, str):
                out[key] = ids.setdefault(item, f"<id {len(ids)}>")
            elif key in TIMES:
                out[key] = None if item is None else "<time>"
            else:
                out[key] = normalized(item, ids)
        return out
    if isinstance(value, list):
        return [normalized(item, ids) for item in value]
    return value


def post_sse(url: str, key: str, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    with (
        httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())
    return [e for e in parse_sse(lines).events if e[0] != "ping"]


@pytest.mark.parametrize(
    ("mode", "transcript"), [("ok", "peer_as_process.txt"), ("err", "peer_as_err_process.txt")]
)
def test_process_stream_matches_agentscope(
    servers: dict[str, tuple[str, str]], mode: str, transcript: str
) -> None:
    url, key = servers[mode]
    ours = [data for _, data in post_sse(url, key, "/process", PROCESS_BODY)]
    theirs = [data for _, data in golden_sse(transcript)]
    # Same events, same keys in the same order, same values.
    assert json.dumps(normalized(ours), indent=1) == json.dumps(normalized(theirs), indent=1)


@pytest.mark.parametrize(
    ("mode", "transcript"),
    [("ok", "peer_responses_stream.txt"), ("err", "peer_err_responses_stream.txt")],
)
def test_responses_stream_matches_agentscope(
    servers: dict[str, tuple[str, str]], mode: str, transcript: str
) -> None:
    url, key = servers[mode]
    body = {"model": "any", "input": "Who are you?", "stream": True}
    ours = post_sse(url, key, "/compatible-mode/v1/responses", body)
    theirs = golden_sse(transcript)
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    for (name, our_event), (_, their_event) in zip(ours, theirs, strict=True):
        our_event, their_event = normalized(our_event), normalized(their_event)
        if "response" in their_event:
            assert_same_response(our_event.pop("response"), their_event.pop("response"), name)
        assert our_event == their_event, name


@pytest.mark.parametrize(
    ("mode", "transcript"),
    [("ok", "peer_responses_non-stream.txt"), ("err", "peer_err_responses_non-stream.txt")],
)
def test_responses_body_is_agentscopes_final_response(
    servers: dict[str, tuple[str, str]], mode: str, transcript: str
) -> None:
    url, key = servers[mode]
    body = {"model": "any", "input": "Who are you?", "stream": False}
    with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
        response = client.post("/compatible-mode/v1/responses", json=body)
    assert response.status_code == 200
    theirs = json.loads(golden_body(transcript))["response"]
    assert_same_response(normalized(response.json()), normalized(theirs), "body")
    assert response.json()["model"] == "any"


def assert_same_response(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    """AgentScope's Response fields, equal, but for the OpenAI ones (see the top)."""
    assert set(ours) - set(theirs) <= OPENAI_EXTRA_FIELDS, where
    assert set(theirs) <= set(ours), where
    if theirs["status"] == "failed":
        assert ours["output"] == [PARTIAL_REPLY], where
        theirs = {**theirs, "output": ours["output"]}
    for field in set(theirs) - OPENAI_RESPONSE_FIELDS:
        assert ours[field] == theirs[field], (where, field)
    if theirs["status"] != "queued":
        assert ours["status"] == theirs["status"], where
    for field in OPENAI_EXTRA_FIELDS - {"metadata", "error"}:
        assert ours.get(field) is None, (where, field)
