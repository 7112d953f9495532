"""Deleting a session deletes its agent state (``runner.state_service``'s rounds, which hold
what its agent remembers of the conversation), on every backend: a session made again under
its id starts with none, and a keyed run sent again after the delete saves the latest state.
A state service written for AgentScope Runtime, which cannot delete, keeps it: the session is
deleted all the same, and that is logged."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.settings import load_settings
from tests.support.backends import BACKENDS, backend_settings
from tests.support.http import bearer, issue_key, running
from tests.support.ported_state import DictStateService


def counting_app(**services: Any) -> AgentApp:
    """An agent counting its turns in its state, as AgentScope's quickstart keeps a state."""
    app = AgentApp(app_name="counting", **services)

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, request: Any = None, **kwargs: Any) -> AsyncIterator[str]:
        user_id, session_id = request.user_id, request.session_id
        state = await self.state_service.export_state(user_id, session_id=session_id)
        count = (state or {"count": 0})["count"] + 1
        await self.state_service.save_state(user_id, {"count": count}, session_id=session_id)
        yield f"count={count}"

    return app


@contextlib.contextmanager
def served(
    app: AgentApp, user_id: str, request: pytest.FixtureRequest, backend: str = "in_memory"
) -> Iterator[httpx.Client]:
    """A client of ``app`` served with its stores on ``backend``, as ``user_id``."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(**backend_settings(backend, request))
        store = InMemoryKeyStore()
        with (
            running(create_app(settings=settings, agent_app=app, key_store=store)) as url,
            httpx.Client(
                base_url=url, headers=bearer(issue_key(store, user_id)), timeout=60
            ) as client,
        ):
            yield client


RUN = {"input": [{"role": "user", "content": "hi"}], "session_id": "s", "stream": False}


def reply(client: httpx.Client, **headers: str) -> str:
    answer = client.post("/process", json=RUN, headers=headers)
    assert answer.status_code == 200, answer.text
    assert "Idempotent-Replayed" not in answer.headers
    text: str = answer.json()["output"][0]["content"][0]["text"]
    return text


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_session_made_again_after_its_delete_starts_with_no_agent_state(
    backend: str, user_id: str, request: pytest.FixtureRequest
) -> None:
    with served(counting_app(), user_id, request, backend) as client:
        assert [reply(client), reply(client)] == ["count=1", "count=2"]
        assert client.delete("/sessions/s").status_code == 204
        assert client.get("/state/s").status_code == 404
        assert client.get("/state/s/rounds").json()["rounds"] == []
        assert reply(client) == "count=1"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_keyed_run_sent_again_after_its_session_was_deleted_saves_the_latest_state(
    backend: str, user_id: str, request: pytest.FixtureRequest
) -> None:
    # The run read the state left (count=2), saved count=3 into its first run's round 1,
    # and the state read back stayed count=2.
    with served(counting_app(), user_id, request, backend) as client:
        assert reply(client, **{"Idempotency-Key": "k"}) == "count=1"
        assert reply(client) == "count=2"
        assert client.delete("/sessions/s").status_code == 204
        assert reply(client, **{"Idempotency-Key": "k"}) == "count=1"
        latest = client.get("/state/s").json()
        assert (latest["round_id"], latest["state"]) == (1, {"count": 1})
        assert reply(client) == "count=2"


@pytest.mark.parametrize("backend", ["redis", "dynamodb"])
def test_the_sessions_function_deletes_the_agent_state_of_a_session_it_deletes(
    backend: str, user_id: str, request: pytest.FixtureRequest
) -> None:
    # As deployed, the sessions function serves the delete, and had no state service.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
        env.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
        settings = load_settings(**backend_settings(backend, request))
        store = InMemoryKeyStore()
        headers = bearer(issue_key(store, user_id))
        with (
            running(create_app(["state"], settings=settings, key_store=store)) as state_url,
            running(create_app(["sessions", "runs"], settings=settings, key_store=store)) as url,
        ):
            saved = httpx.post(
                f"{state_url}/state/s", json={"state": {"count": 1}}, headers=headers
            )
            assert saved.status_code == 201
            assert httpx.delete(f"{url}/sessions/s", headers=headers).status_code == 204
            assert httpx.get(f"{state_url}/state/s", headers=headers).status_code == 404


def test_a_state_service_that_cannot_delete_keeps_the_state_and_the_session_goes(
    user_id: str,
    request: pytest.FixtureRequest,
    capfd: pytest.CaptureFixture[str],
    info_logs: None,
) -> None:
    state = DictStateService()
    with served(counting_app(state_service=state), user_id, request) as client:
        assert reply(client) == "count=1"
        capfd.readouterr()
        assert client.delete("/sessions/s").status_code == 204
        out, err = capfd.readouterr()
        assert client.get("/sessions/s").status_code == 404
    assert state.rounds[user_id, "s"] == {1: {"count": 1}}
    lines = [json.loads(line) for line in (out + err).splitlines() if line.strip()]
    (warned,) = [line for line in lines if line.get("level") == "WARNING"]
    assert "state service cannot delete" in warned["message"]
    assert warned["session_id"] == "s" and "delete_state" in warned["error"]
