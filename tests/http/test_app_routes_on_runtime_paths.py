"""An app's own routes (``@app.endpoint``, ``@app.task``) on a path the runtime serves too:
the app's route answers there, behind the key as every route, start-up naming each runtime
route it hides; a route taking ``/health`` or the process endpoint is refused at start-up."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp
from agentscope_serverless.deployers import LocalDeployManager
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http import create_app
from agentscope_serverless.log import logger
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running, user_message


def ported_app(calls: list[str]) -> AgentApp:
    """An app of AgentScope Runtime 1.0.5, where these paths were the app's."""
    app = AgentApp(app_name="ported")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, request: Any = None, **kwargs: Any) -> AsyncIterator[str]:
        yield "from the agent"

    @app.endpoint("/runs", methods=["GET"])
    def runs() -> dict[str, Any]:
        calls.append("runs")
        return {"my_runs": []}

    @app.endpoint("/memory", methods=["POST"])
    def memory(body: dict[str, Any]) -> dict[str, Any]:
        calls.append("memory")
        return {"my_memory": body}

    @app.endpoint("/sessions/recent", methods=["GET"])
    async def recent() -> dict[str, Any]:
        return {"recent": []}

    @app.endpoint("/process", methods=["GET"])
    async def process_page() -> dict[str, str]:
        return {"page": "mine"}

    @app.task("/memory/search")
    def index(payload: dict[str, Any]) -> int:
        calls.append("task")
        return len(payload["words"])

    return app


class Served:
    def __init__(self, url: str, calls: list[str], start_up: str) -> None:
        self.url, self.calls, self.start_up = url, calls, start_up

    def warnings(self) -> list[str]:
        lines = [json.loads(line) for line in self.start_up.splitlines() if line.startswith("{")]
        return [line["message"] for line in lines if line["level"] == "WARNING"]


@pytest.fixture(scope="module")
def served(keys: Keys) -> Iterator[Served]:
    calls: list[str] = []
    logged = io.StringIO()
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    try:
        with contextlib.redirect_stdout(logged):
            web_app = create_app(
                settings=load_settings(), agent_app=ported_app(calls), key_store=keys.store
            )
    finally:
        logger.setLevel(level)
    with running(web_app) as url:
        yield Served(url, calls, logged.getvalue())


def test_the_apps_endpoint_answers_on_a_path_the_runtime_serves_too(
    served: Served, keys: Keys
) -> None:
    with httpx.Client(base_url=served.url, headers=bearer(keys.alice), timeout=10) as client:
        runs = client.get("/runs")
        memory = client.post("/memory", json={"note": "mine"})
        recent = client.get("/sessions/recent")
        page = client.get("/process")
    assert (runs.status_code, runs.json()) == (200, {"my_runs": []})
    assert (memory.status_code, memory.json()) == (200, {"my_memory": {"note": "mine"}})
    assert (recent.status_code, recent.json()) == (200, {"recent": []})
    assert (page.status_code, page.json()) == (200, {"page": "mine"})


def test_start_up_names_each_runtime_route_the_app_hides(served: Served) -> None:
    hidden = [
        ("POST /memory/search", "POST /memory/search"),
        ("GET /runs", "GET /runs"),
        ("POST /memory", "POST /memory"),
        ("GET /sessions/recent", "GET /sessions/{session_id}"),
    ]
    assert served.warnings() == [
        f"the app's route {ours} is served in place of the runtime's {theirs} (pick another "
        "path to keep it)"
        for ours, theirs in hidden
    ]


def test_the_runtime_routes_the_app_does_not_hide_still_answer(served: Served, keys: Keys) -> None:
    with httpx.Client(base_url=served.url, headers=bearer(keys.alice), timeout=10) as client:
        memories = client.get("/memory")
        session = client.get("/sessions/not-recent")
        run = client.get("/runs/run_unknown")
        body = {"input": [user_message("hi")], "stream": False}
        reply = client.post("/process", json=body)
        health = client.get("/health")
    assert memories.status_code == 200 and memories.json()["items"] == []
    assert session.status_code == 404 and session.json()["error"]["code"] == "SESSION_NOT_FOUND"
    assert run.status_code == 404 and run.json()["error"]["code"] == "RUN_NOT_FOUND"
    assert reply.json()["output"][0]["content"][0]["text"] == "from the agent"
    assert health.json()["status"] == "healthy"


def test_the_apps_routes_on_runtime_paths_need_a_key(served: Served) -> None:
    before = list(served.calls)
    with httpx.Client(base_url=served.url, timeout=10) as client:
        answers = [
            client.get("/runs"),
            client.post("/memory", json={}),
            client.post("/memory/search", json={"words": []}),
        ]
    assert [answer.status_code for answer in answers] == [401, 401, 401]
    assert served.calls == before


def test_the_apps_task_on_a_runtime_path_is_submitted_there(served: Served, keys: Keys) -> None:
    with httpx.Client(base_url=served.url, headers=bearer(keys.alice), timeout=10) as client:
        submitted = client.post("/memory/search", json={"words": ["a", "b", "c"]})
        assert submitted.status_code == 202
        task_id = submitted.json()["task_id"]
        deadline = time.monotonic() + 10
        while (status := client.get(f"/tasks/{task_id}").json())["status"] == "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert (status["status"], status["result"]) == ("completed", 3)


def on_health(app: AgentApp) -> None:
    app.endpoint("/health", methods=["GET"])(lambda: {"mine": True})


def on_the_process_endpoint(app: AgentApp) -> None:
    app.endpoint(app.endpoint_path)(lambda: {"mine": True})


def a_task_on_the_process_endpoint(app: AgentApp) -> None:
    app.task(app.endpoint_path)(lambda payload: payload)


def on_every_top_level_path(app: AgentApp) -> None:
    app.endpoint("/{page}", methods=["GET"])(lambda page: {"page": page})


@pytest.mark.parametrize(
    ("endpoint_path", "add_route", "clash"),
    [
        ("/process", on_health, "GET /health clashes with the runtime's GET /health"),
        ("/process", on_every_top_level_path, "GET /{page} clashes with the runtime's GET /health"),
        (
            "/process",
            on_the_process_endpoint,
            "POST /process clashes with the runtime's POST /process",
        ),
        ("/agent", on_the_process_endpoint, "POST /agent clashes with the runtime's POST /agent"),
        ("/process", a_task_on_the_process_endpoint, "POST /process clashes with the runtime's"),
    ],
)
def test_a_route_taking_health_or_the_process_endpoint_is_refused_at_start_up(
    keys: Keys, endpoint_path: str, add_route: Callable[[AgentApp], None], clash: str
) -> None:
    app = AgentApp(app_name="clashing", endpoint_path=endpoint_path)

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    add_route(app)
    with pytest.raises(ConfigurationError) as refused:
        create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    assert f"the app's route {clash}" in str(refused.value)
    assert str(refused.value).endswith("which cannot be replaced: pick another path for it")


def test_a_local_deployment_serves_the_apps_endpoint_on_a_runtime_path(keys: Keys) -> None:
    app = AgentApp(app_name="deployed")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "unused"

    def runs() -> dict[str, Any]:
        return {"my_runs": []}

    manager = LocalDeployManager(host="127.0.0.1", port=0)
    info = manager.deploy_sync(
        app,
        custom_endpoints=[{"path": "/runs", "handler": runs, "methods": ["GET"]}],
        settings=load_settings(),
        key_store=keys.store,
    )
    try:
        answer = httpx.get(f"{info['url']}/runs", headers=bearer(keys.alice), timeout=10)
    finally:
        manager.stop_sync()
    assert (answer.status_code, answer.json()) == (200, {"my_runs": []})
