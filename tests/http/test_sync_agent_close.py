"""A sync generator agent ended early (its run canceled, an item of its reply refused) is
closed in its worker thread, for the run's user and request: its ``finally`` blocks no
other request, and runs while the run ends, not later with no user."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.services._turn import turn_user_id
from agentscope_serverless.settings import load_settings
from agentscope_serverless.tracing import TracingUtil
from tests.support.http import Keys, bearer, running, user_message

# By session: the thread, user and request id the agent's ``finally`` ran with.
CLOSED: dict[str, list[tuple[str, str | None, str | None]]] = collections.defaultdict(list)

app = AgentApp(app_name="sync-closing")


@app.query(framework="text")
def query(self: Any, msgs: Any, session: Any = None, **kwargs: Any) -> Iterator[Any]:
    text = msgs[-1].get_text_content()
    try:
        if text == "refused":
            yield "ok "
            yield object()  # no item of a reply
        for _ in range(100):
            time.sleep(0.2)
            yield "piece "
    finally:
        time.sleep(0.3)  # a blocking cleanup
        CLOSED[session.id].append(
            (threading.current_thread().name, turn_user_id(), TracingUtil.get_request_id())
        )


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def client(keys: Keys) -> Iterator[httpx.Client]:
    web = create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    with (
        running(web) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as made,
    ):
        yield made


def _closed(session_id: str) -> tuple[str, str | None, str | None]:
    deadline = time.monotonic() + 20
    while not CLOSED[session_id]:
        assert time.monotonic() < deadline, "the agent's finally did not run"
        time.sleep(0.05)
    return CLOSED[session_id][0]


def test_a_canceled_sync_agent_is_closed_in_its_thread_for_its_user(
    client: httpx.Client,
) -> None:
    # Its close raised "generator already executing" (dropped): the finally ran later, as
    # the generator was collected, with no user and no request.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    body = {"input": [user_message("go")], "session_id": session_id}
    with client.stream("POST", "/process", json=body) as response:
        run_id = response.headers["X-Run-Id"]
        request_id = response.headers["X-Request-Id"]
        lines = response.iter_lines()
        for _ in range(4):
            next(line for line in lines if line.startswith("data: "))
        assert client.post(f"/runs/{run_id}/cancel").status_code == 202
        rest = list(lines)
    assert any('"status":"canceled"' in line for line in rest)
    thread, user, request = _closed(session_id)
    assert thread.startswith("agentscope-handler")
    assert (user, request) == ("alice", request_id)


def test_a_sync_agent_whose_item_is_refused_is_closed_in_its_thread(
    client: httpx.Client,
) -> None:
    # Its blocking finally ran on the event loop's thread, holding every other request.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    body = {"input": [user_message("refused")], "session_id": session_id, "stream": False}
    answer = client.post("/process", json=body)
    assert answer.json()["status"] == "failed"
    thread, user, request = _closed(session_id)
    assert thread.startswith("agentscope-handler")
    assert (user, request) == ("alice", answer.headers["X-Request-Id"])
