"""``app.query`` / ``app.stream_query`` called from an ``@app.endpoint`` of a served app (the
"Streaming Responses with SSE" pattern of AgentScope Runtime's docs) run on the served
runner: ``@app.init`` and ``@app.shutdown`` run once, the turn is stored where the server's
routes read it, for the user the call acts as; in an application of this process, and in
``agentscope-serverless serve`` of an agent in a folder of the user's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless import AgentApp
from agentscope_serverless.auth import FileKeyStore
from agentscope_serverless.schemas.agent_schemas import AgentRequest
from agentscope_serverless.settings import load_settings
from tests.cli.test_cli import serving
from tests.support.http import Keys, bearer, issue_key, running, user_message


def build_app(hooks: list[str]) -> AgentApp:
    app = AgentApp(app_name="in-process")

    @app.init
    async def init(self: Any) -> None:
        hooks.append("init")

    @app.shutdown
    async def shutdown(self: Any) -> None:
        hooks.append("shutdown")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, request: Any = None, **kwargs: Any) -> AsyncIterator[str]:
        yield "You said: " + (msgs[-1].get_text_content() or "")

    @app.endpoint("/stream")
    async def stream(query: str) -> AsyncIterator[Any]:
        async for chunk in app.stream_query(query, session_id="via-stream"):
            yield chunk

    @app.endpoint("/ask")
    async def ask(request: AgentRequest) -> dict[str, Any]:
        response = await app.query(request)
        return {"text": response.output[-1].get_text_content(), "session": response.session_id}

    @app.endpoint("/ask-sync")
    def ask_sync(session: str) -> dict[str, Any]:
        # A plain endpoint (run in a worker thread) running the agent on a loop of its own.
        response = asyncio.run(app.query("from a thread", session_id=session))
        return {"session": response.session_id}

    @app.endpoint("/stream-sync")
    def stream_sync(session: str) -> list[str]:
        async def events() -> list[str]:
            return [
                str(event.object)
                async for event in app.stream_query("streamed from a thread", session_id=session)
            ]

        return asyncio.run(events())

    @app.endpoint("/ask-as")
    async def ask_as(user: str) -> dict[str, Any]:
        response = await app.query("hi", user_id=user, session_id="named")
        return {"session": response.session_id}

    return app


def session_ids(client: httpx.Client, key: str, **headers: str) -> list[str]:
    response = client.get("/sessions", headers={**bearer(key), **headers})
    response.raise_for_status()
    return sorted(item["id"] for item in response.json()["items"])


def test_an_endpoint_running_the_agent_uses_the_served_runner_for_its_caller() -> None:
    keys = Keys.make()
    hooks: list[str] = []
    app = build_app(hooks)
    with (
        running(app.get_fastapi_app(settings=load_settings(), key_store=keys.store)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        streamed = client.post("/stream", params={"query": "hello"}, headers=bearer(keys.alice))
        assert streamed.status_code == 200, streamed.text
        assert "You said: hello" in streamed.text
        asked = client.post(
            "/ask",
            json={"input": [user_message("hi")], "session_id": "via-ask"},
            headers=bearer(keys.alice),
        )
        assert asked.json() == {"text": "You said: hi", "session": "via-ask"}
        # A service key acting for bob: the turn is bob's.
        client.post(
            "/stream",
            params={"query": "hey"},
            headers={**bearer(keys.service), "X-User-Id": "bob"},
        ).raise_for_status()

        assert session_ids(client, keys.alice) == ["via-ask", "via-stream"]
        assert session_ids(client, keys.bob) == ["via-stream"]
        messages = client.get("/sessions/via-stream/messages", headers=bearer(keys.alice))
        texts = [m["content"][0]["text"] for m in messages.json()["items"]]
        assert texts == ["hello", "You said: hello"]

        # A user key cannot run the agent as another user through app.query.
        refused = client.post("/ask-as", params={"user": "bob"}, headers=bearer(keys.alice))
        assert refused.status_code == 403, refused.text
        assert "bob" not in session_ids(client, keys.alice) and session_ids(client, keys.bob) == [
            "via-stream"
        ]
        # From a plain endpoint's own event loop too: on the served runner (no second
        # @app.init), for the caller, never for a user named like the session (the runner
        # takes the session id for the user when none is given).
        sync = client.post("/ask-sync", params={"session": "bob"}, headers=bearer(keys.alice))
        assert sync.json() == {"session": "bob"}, sync.text
        streamed_sync = client.post(
            "/stream-sync", params={"session": "bob-stream"}, headers=bearer(keys.alice)
        )
        assert streamed_sync.json()[-1] == "response", streamed_sync.text
        assert session_ids(client, keys.alice) == ["bob", "bob-stream", "via-ask", "via-stream"]
        assert session_ids(client, keys.bob) == ["via-stream"]
        # Naming the caller's own user is fine.
        own = client.post("/ask-as", params={"user": "alice"}, headers=bearer(keys.alice))
        assert own.json() == {"session": "named"}
        assert hooks == ["init"]
    assert hooks == ["init", "shutdown"]


def test_app_query_in_app_init_fails_the_start_saying_why() -> None:
    """A warm-up turn in ``@app.init`` waited for the runner being started (in process, on
    a lock held by that start): the server never started, nor said why."""
    app = AgentApp(app_name="warm-up")

    @app.init
    async def init(self: Any) -> None:
        await app.query("warm up", user_id="u1", session_id="s1")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> str:
        return "ok"

    async def in_process() -> None:
        await asyncio.wait_for(app.query("hi", user_id="u1", session_id="s1"), 30)

    with pytest.raises(Exception) as raised:
        asyncio.run(in_process())
    assert "cannot run in @app.init" in str(raised.value)


# An agent as a user writes it in a folder of their own: a plain endpoint (run in a worker
# thread) running the agent on an event loop of its own.
PLAIN_ENDPOINT_AGENT = """
import asyncio

from agentscope_serverless import AgentApp

app = AgentApp(app_name="asks-from-a-thread")


@app.query(framework="text")
async def query(self, msgs, request=None, **kwargs):
    yield "You said: " + (msgs[-1].get_text_content() or "")


@app.endpoint("/ask-sync")
def ask_sync(text: str, session: str) -> dict:
    response = asyncio.run(app.query(text, session_id=session))
    return {"text": response.output[-1].get_text_content(), "session": response.session_id}
"""


def test_a_plain_endpoint_of_a_served_users_agent_runs_it_for_the_caller(tmp_path: Path) -> None:
    (tmp_path / "asker.py").write_text(PLAIN_ENDPOINT_AGENT)
    keys_file = tmp_path / "keys.json"
    alice, bob = (issue_key(FileKeyStore(keys_file), user) for user in ("alice", "bob"))
    env = {"AUTH_KEYS_BACKEND": "file", "AUTH_KEYS_FILE": str(keys_file)}
    output = tmp_path / "output.txt"
    with (
        serving(output, "--agent", "asker:app", "--no-web", env=env, cwd=tmp_path) as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        # A session named as another user: the runner takes the session id for the user
        # when none is given, so the turn is bob's unless it runs for its caller.
        asked = client.post(
            "/ask-sync", params={"text": "hi", "session": "bob"}, headers=bearer(alice)
        )
        assert asked.json() == {"text": "You said: hi", "session": "bob"}, asked.text
        messages = client.get("/sessions/bob/messages", headers=bearer(alice))
        assert messages.status_code == 200, messages.text
        texts = [m["content"][0]["text"] for m in messages.json()["items"]]
        assert texts == ["hi", "You said: hi"]
        runs = client.get("/runs", params={"session_id": "bob"}, headers=bearer(alice))
        [run] = runs.json()["items"]
        assert (run["kind"], run["status"]) == ("process", "completed")
        assert session_ids(client, bob) == []
        listed = client.get("/runs", params={"session_id": "bob"}, headers=bearer(bob))
        assert listed.json()["items"] == []
