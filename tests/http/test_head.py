"""HEAD requests: answered as GET, without the body, on every GET route."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.support.http import Keys, user_message

# Headers that differ between two answers to the same request.
_PER_ANSWER = {"date", "x-request-id"}


def _headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in _PER_ANSWER}


@pytest.mark.parametrize(
    "path", ["/health", "/sessions", "/sessions/{session}", "/sessions/{session}/messages"]
)
def test_head_answers_as_get_without_the_body(
    client_for: Callable[..., httpx.Client], keys: Keys, path: str
) -> None:
    # Every GET route but /health answered HEAD with 405.
    client = client_for(keys.alice)
    session = f"head-{uuid.uuid4().hex[:8]}"
    client.post("/sessions/" + session + "/messages", json={"messages": [user_message("hi")]})
    url = path.format(session=session)
    got = client.get(url)
    head = client.head(url)
    assert got.status_code == 200
    assert head.status_code == got.status_code
    assert head.content == b""
    assert _headers(head) == _headers(got)


def test_head_of_a_missing_item_is_404_and_without_a_key_401(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    assert client_for(keys.alice).head("/sessions/nobody-here").status_code == 404
    anonymous = client_for(None).head("/sessions")
    assert anonymous.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert anonymous.content == b""


def test_head_of_a_post_route_is_still_refused(
    client_for: Callable[..., httpx.Client], keys: Keys
) -> None:
    refused = client_for(keys.alice).head("/process")
    assert refused.status_code == 405
    assert refused.headers["allow"] == "POST"


def test_head_of_the_events_of_a_run_in_progress_does_not_wait_for_the_run(
    client_for: Callable[..., httpx.Client], keys: Keys, scenario_url: str
) -> None:
    client = client_for(keys.alice, url=scenario_url)
    body = {"input": [user_message("sleep 60")], "session_id": f"head-{uuid.uuid4().hex[:8]}"}
    with client.stream("POST", "/process", json=body) as running_run:
        run_id = running_run.headers["X-Run-Id"]
        try:
            head = client.head(f"/runs/{run_id}/events")
            assert head.status_code == 200
            assert head.headers["content-type"].startswith("text/event-stream")
            assert head.content == b""
            assert client.get(f"/runs/{run_id}").json()["status"] == "in_progress"
        finally:
            client.post(f"/runs/{run_id}/cancel")
