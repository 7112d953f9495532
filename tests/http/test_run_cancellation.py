"""A canceled run's agent is cancelled once, however the run is canceled and however many
cancels come: its cleanup (``finally`` blocks, and what they await) runs to its end, one
that never ends is cut short all the same, and the run ends canceled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types import CancelTaskRequest, Role, SendMessageRequest, TaskState

from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.settings import load_settings
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import Keys, bearer, parse_sse, running, user_message
from tests.support.tidy_agent import LOG, NEVER_ENDING, app

CLEANED_UP = ["cancelled", "cleaned up"]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module", params=BACKENDS)
def url(request: pytest.FixtureRequest, keys: Keys) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(**backend_settings(request.param, request))
        web = create_app(settings=settings, agent_app=app, key_store=keys.store)
        with running(web) as served:
            yield served


@pytest.fixture
def client(url: str, keys: Keys) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as made:
        yield made


def _wait_until(holds: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not holds():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _run_ended(client: httpx.Client, run_id: str) -> dict[str, Any]:
    ended: list[dict[str, Any]] = []

    def ends() -> bool:
        run = client.get(f"/runs/{run_id}").json()
        ended.append(run)
        return bool(run["status"] != "in_progress")

    _wait_until(ends, "the run did not end")
    return ended[-1]


def _cleanup_ended(session_id: str) -> list[str]:
    _wait_until(lambda: len(LOG[session_id]) >= 2, "the agent's cleanup did not end")
    return LOG[session_id]


def _body(session_id: str, text: str = "go", **more: Any) -> dict[str, Any]:
    return {"input": [user_message(text)], "session_id": session_id, **more}


def _canceled_after_three_events(
    client: httpx.Client, session_id: str, cancels: int, text: str = "go"
) -> tuple[str, list[dict[str, Any]]]:
    """Start a run, send ``cancels`` cancels of it at once after its third event; its id
    and its events."""
    with (
        client.stream("POST", "/process", json=_body(session_id, text)) as response,
        concurrent.futures.ThreadPoolExecutor(cancels) as pool,
    ):
        run_id = response.headers["X-Run-Id"]
        lines = response.iter_lines()
        head = [next(line for line in lines if line.startswith("data: ")) for _ in range(3)]
        answers = list(pool.map(lambda _: client.post(f"/runs/{run_id}/cancel"), range(cancels)))
        rest = list(lines)
    assert [answer.status_code for answer in answers] == [202] * cancels
    return run_id, parse_sse([*(line for data in head for line in (data, "")), *rest]).data


@pytest.mark.parametrize("cancels", [1, 10])
def test_a_canceled_runs_cleanup_runs_to_its_end(client: httpx.Client, cancels: int) -> None:
    # The run's cancellation reached the agent again while its finally block ran (at the
    # next poll of the cancel mark, or with the next cancel request): its cleanup was lost.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    run_id, events = _canceled_after_three_events(client, session_id, cancels)
    assert events[-1]["object"] == "response" and events[-1]["status"] == "canceled"
    assert _cleanup_ended(session_id) == CLEANED_UP
    assert client.get(f"/state/{session_id}").json()["state"] == {"cleanup": True}
    assert _run_ended(client, run_id)["status"] == "canceled"
    history = client.get(f"/sessions/{session_id}/messages").json()["items"]
    assert [message["role"] for message in history] == ["user", "assistant"]


def test_a_canceled_runs_message_is_kept_incomplete_with_its_text(client: httpx.Client) -> None:
    # It was stored in_progress, as if still being written, for good.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    _, events = _canceled_after_three_events(client, session_id, 1)
    [cut] = events[-1]["output"]
    assert (cut["status"], cut["content"][0]["status"]) == ("incomplete", "incomplete")
    history = client.get(f"/sessions/{session_id}/messages").json()["items"]
    assert history[-1]["role"] == "assistant" and history[-1]["status"] == "incomplete"
    assert history[-1]["content"][0]["text"] == cut["content"][0]["text"] != ""


def test_a_cleanup_that_never_ends_is_cut_short_and_the_run_ends_canceled(
    client: httpx.Client,
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    run_id, events = _canceled_after_three_events(client, session_id, 1, NEVER_ENDING)
    assert events[-1]["object"] == "response" and events[-1]["status"] == "canceled"
    assert _cleanup_ended(session_id) == ["cancelled", "cleanup cut short"]
    assert _run_ended(client, run_id)["status"] == "canceled"
    assert client.get(f"/state/{session_id}").status_code == 404


def test_a_run_canceled_by_its_client_leaving_cleans_up_to_its_end(client: httpx.Client) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    body = _body(session_id, cancel_on_disconnect=True)
    with client.stream("POST", "/process", json=body) as response:
        run_id = response.headers["X-Run-Id"]
        lines = response.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
    assert _run_ended(client, run_id)["status"] == "canceled"
    assert _cleanup_ended(session_id) == CLEANED_UP
    assert client.get(f"/state/{session_id}").json()["state"] == {"cleanup": True}


def test_a_run_stopped_by_deleting_its_session_cleans_up_to_its_end(
    client: httpx.Client,
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with client.stream("POST", "/process", json=_body(session_id)) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        assert client.delete(f"/sessions/{session_id}").status_code == 204
        events = parse_sse(list(lines)).data
    assert events[-1]["object"] == "response" and events[-1]["status"] == "canceled"
    assert _cleanup_ended(session_id) == CLEANED_UP


async def test_an_a2a_task_canceled_cleans_up_to_its_end(url: str, keys: Keys) -> None:
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(headers=bearer(keys.alice), timeout=30) as http:
        a2a = await ClientFactory(ClientConfig(httpx_client=http)).create_from_url(url)
        message = new_text_message("go", context_id=context_id, role=Role.ROLE_USER)
        stream = a2a.send_message(SendMessageRequest(message=message))
        async for event in stream:
            if event.HasField("artifact_update"):
                task_id = event.artifact_update.task_id
                break
        await stream.aclose()
        canceled = await a2a.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    await asyncio.to_thread(_cleanup_ended, context_id)
    assert LOG[context_id] == CLEANED_UP
