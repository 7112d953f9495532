"""What a user adds to ``app.get_fastapi_app()`` (middleware, routes, mounts, exception
handlers), the way FastAPI's users customize an app: served wherever the agent is served
(``serve --agent``, the process function on Lambda, any application built later for the app),
inside the runtime's request context, each route behind the key unless left open."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.staticfiles import StaticFiles

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth.file import FileKeyStore
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http import create_app, public
from agentscope_serverless.http.lambda_handler import build_web_adapter_app, make_handler
from agentscope_serverless.settings import load_settings
from tests.cli.test_cli import serving
from tests.support.http import (
    Keys,
    bearer,
    free_port,
    issue_key,
    running,
    user_message,
    wait_until_healthy,
)
from tests.support.lambda_runtime import function_url_event

# An agent's module customizing its app as FastAPI's users do, at import.
AGENT_MODULE = textwrap.dedent(
    """
    from fastapi import APIRouter
    from agentscope_serverless.app import AgentApp
    from agentscope_serverless.http import public

    app = AgentApp(app_name="added")


    @app.query(framework="text")
    async def query(self, msgs, request=None, **kwargs):
        yield "hello"


    web = app.get_fastapi_app()


    @web.middleware("http")
    async def first(request, call_next):
        response = await call_next(request)
        response.headers["X-Layers"] = response.headers.get("X-Layers", "") + "first;"
        return response


    @web.middleware("http")
    async def second(request, call_next):
        if request.url.path == "/explode":
            raise LookupError(f"no tenant for {request.headers.get('authorization')}")
        response = await call_next(request)
        response.headers["X-Layers"] = response.headers.get("X-Layers", "") + "second;"
        return response


    router = APIRouter()


    @router.get("/reports/{name}")
    async def report(name: str):
        return {"report": name}


    web.include_router(router)


    @web.get("/hook")
    @public
    async def hook():
        return {"open": True}


    @web.get("/sessions/export")
    async def export():
        return {"export": True}
    """
)

# Module names are unique: each test imports its own copy.
_modules = itertools.count()


@pytest.fixture
def agent_module(tmp_path: Path) -> tuple[Path, str]:
    """A project folder holding the agent's module, and the module's name."""
    name = f"added_agent_{next(_modules)}"
    (tmp_path / f"{name}.py").write_text(AGENT_MODULE)
    return tmp_path, name


def test_serve_serves_what_the_agents_module_added_to_its_fastapi_app(
    agent_module: tuple[Path, str], tmp_path: Path
) -> None:
    folder, name = agent_module
    output = tmp_path / "output.txt"
    with serving(output, "--agent", f"{name}:app", "--app-dir", str(folder)) as server:
        # Only the key of the application served is printed, not one of the module's.
        printed = output.read_text()
        assert "valid while this server runs" not in printed
        assert len({line for line in printed.splitlines() if line.startswith("ask_")}) == 1
        health = httpx.get(f"{server.url}/health")
        assert health.headers["x-layers"] == "first;second;"  # the last added outermost
        assert health.headers["x-request-id"]
        refused = httpx.get(f"{server.url}/reports/q3")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "UNAUTHENTICATED"
        report = httpx.get(f"{server.url}/reports/q3", headers=bearer(server.key))
        assert report.json() == {"report": "q3"}
        assert httpx.get(f"{server.url}/hook").json() == {"open": True}
        export = httpx.get(f"{server.url}/sessions/export", headers=bearer(server.key))
        assert export.json() == {"export": True}
        assert "in place of the runtime's GET /sessions/{session_id}" in output.read_text()
        failed = httpx.get(
            f"{server.url}/explode",
            headers={**bearer(server.key), "X-Request-Id": "req-explode"},
        )
        assert failed.status_code == 500
        assert failed.json()["error"]["code"] == "INTERNAL_ERROR"
        assert failed.headers["x-request-id"] == "req-explode"

        def explode_logged() -> list[str] | None:
            logged = [line for line in output.read_text().splitlines() if line.startswith("{")]
            lines = [json.loads(line) for line in logged]
            done = any(
                line.get("path") == "/explode" and line.get("status") == 500 for line in lines
            )
            return logged if done else None

        # The request's line is written as it ends, which may be after its answer arrived.
        deadline = time.monotonic() + 10
        while (logged := explode_logged()) is None:
            assert time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
    assert any("ask_***" in line for line in logged)  # the error quoting the key, masked
    assert not any(server.key in line for line in logged)
    assert "Traceback" not in "\n".join(
        line for line in output.read_text().splitlines() if not line.startswith("{")
    )


def test_the_process_function_serves_what_the_agents_module_added(
    agent_module: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, name = agent_module
    keys_file = tmp_path / "keys.json"
    key = issue_key(FileKeyStore(keys_file), "lambda-user")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("AGENT_APP", f"{name}:app")
    monkeypatch.setenv("AUTH_KEYS_BACKEND", "file")
    monkeypatch.setenv("AUTH_KEYS_FILE", str(keys_file))
    handler = make_handler(["process"])
    health = handler(function_url_event("GET", "/health"), None)
    assert health["statusCode"] == 200
    assert health["headers"]["x-layers"] == "first;second;"
    assert handler(function_url_event("GET", "/reports/q3"), None)["statusCode"] == 401
    report = handler(
        function_url_event("GET", "/reports/q3", headers={"authorization": f"Bearer {key}"}),
        None,
    )
    assert report["statusCode"] == 200 and json.loads(report["body"]) == {"report": "q3"}
    assert handler(function_url_event("GET", "/hook"), None)["statusCode"] == 200
    # The streaming process function's application, behind the Lambda Web Adapter.
    with running(build_web_adapter_app(["process"])) as url:
        assert httpx.get(f"{url}/health").headers["x-layers"] == "first;second;"
        assert httpx.get(f"{url}/reports/q3").status_code == 401
        assert httpx.get(f"{url}/reports/q3", headers=bearer(key)).json() == {"report": "q3"}


def test_run_serves_what_the_script_added_and_prints_one_key(
    agent_module: tuple[Path, str], tmp_path: Path
) -> None:
    # python agent.py, customizing its app then calling app.run() at its end.
    folder, name = agent_module
    port = free_port()
    script = tmp_path / "script.py"
    script.write_text(f"from {name} import app\napp.run(port={port})\n")
    output = tmp_path / "output.txt"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=folder,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "POWERTOOLS_LOG_LEVEL": "CRITICAL"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process)
        (key,) = re.findall(r"server runs\): (ask_\S+)", output.read_text())
        assert httpx.get(f"{url}/health").headers["x-layers"] == "first;second;"
        assert httpx.get(f"{url}/reports/q3").status_code == 401
        assert httpx.get(f"{url}/reports/q3", headers=bearer(key)).json() == {"report": "q3"}
    finally:
        process.terminate()
        process.wait(timeout=30)


def _agent() -> AgentApp:
    agent = AgentApp(app_name="added")

    @agent.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> Any:
        yield "hello"

    return agent


def test_an_application_built_later_for_the_app_serves_its_additions() -> None:
    # A local deployment's application, uvicorn's --factory's: created for the same app.
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    class Stamp(BaseHTTPMiddleware):
        async def dispatch(self, request: Request, call_next: Any) -> Any:
            response = await call_next(request)
            response.headers["X-Stamp"] = "user"
            return response

    web.add_middleware(Stamp)

    @web.get("/mine")
    async def mine() -> dict[str, bool]:
        return {"mine": True}

    later = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    with running(later) as url:
        assert httpx.get(f"{url}/health").headers["x-stamp"] == "user"
        assert httpx.get(f"{url}/mine").status_code == 401
        assert httpx.get(f"{url}/mine", headers=bearer(keys.alice)).json() == {"mine": True}


def test_a_users_exception_handler_answers_an_unexpected_error(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    seen: list[str] = []

    async def on_any(request: Request, exc: Exception) -> JSONResponse:
        seen.append(type(exc).__name__)
        return JSONResponse({"handled": True}, status_code=503)

    web.add_exception_handler(Exception, on_any)

    @web.get("/fails")
    async def fails() -> None:
        raise RuntimeError(f"kaboom with {keys.alice}")

    with running(web) as url:
        capfd.readouterr()
        answer = httpx.get(f"{url}/fails", headers={**bearer(keys.alice), "X-Request-Id": "r-1"})
    assert answer.status_code == 503 and answer.json() == {"handled": True}
    assert answer.headers["x-request-id"] == "r-1"
    assert seen == ["RuntimeError"]
    output = capfd.readouterr().out
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(line.get("message") == "unexpected error" for line in lines)
    assert any(line.get("path") == "/fails" and line.get("status") == 503 for line in lines)
    assert keys.alice not in output


def test_a_user_middleware_that_raises_gets_the_runtimes_json_error(
    capfd: pytest.CaptureFixture[str], info_logs: None
) -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.middleware("http")
    async def tenant(request: Request, call_next: Any) -> Any:
        raise LookupError(f"no tenant for {request.headers.get('authorization')}")

    with running(web) as url:
        capfd.readouterr()
        answer = httpx.get(f"{url}/sessions", headers={**bearer(keys.alice), "X-Request-Id": "r-2"})
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "INTERNAL_ERROR"
    assert answer.headers["x-request-id"] == "r-2"
    output = capfd.readouterr()
    lines = [json.loads(line) for line in output.out.splitlines() if line.startswith("{")]
    assert any(line.get("path") == "/sessions" and line.get("status") == 500 for line in lines)
    assert keys.alice not in output.out + output.err
    assert "Traceback" not in output.err


def test_mounts_a_user_adds_need_a_key_unless_left_open(tmp_path: Path) -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    (tmp_path / "a.txt").write_text("static file")
    sub = FastAPI()

    @sub.get("/whoami")
    async def whoami() -> dict[str, bool]:
        return {"sub": True}

    web.mount("/v2", sub)
    web.mount("/static", public(StaticFiles(directory=tmp_path)))
    with running(web) as url:
        assert httpx.get(f"{url}/v2/whoami").status_code == 401
        assert httpx.get(f"{url}/v2/whoami", headers=bearer(keys.alice)).json() == {"sub": True}
        assert httpx.get(f"{url}/static/a.txt").text == "static file"


def test_a_router_left_open_needs_no_key() -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    hooks, keyed = APIRouter(), APIRouter()

    @hooks.post("/hooks/github")
    async def github() -> dict[str, bool]:
        return {"received": True}

    @keyed.get("/reports")
    async def reports() -> list[str]:
        return []

    web.include_router(public(hooks))
    web.include_router(keyed)
    with running(web) as url:
        assert httpx.post(f"{url}/hooks/github").json() == {"received": True}
        assert httpx.get(f"{url}/reports").status_code == 401


def test_a_user_route_on_health_is_refused() -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.get("/health")
    async def health() -> dict[str, bool]:
        return {"mine": True}

    with pytest.raises(ConfigurationError, match="GET /health"):
        create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)

    async def start() -> None:
        async with web.router.lifespan_context(web):
            pass

    with pytest.raises(ConfigurationError, match="GET /health"):
        asyncio.run(start())


def test_an_application_built_before_the_query_handler_serves_the_handler() -> None:
    # FastAPI's usual order: `web = app.get_fastapi_app()` right after `app = AgentApp(...)`.
    agent, keys = AgentApp(app_name="early"), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @agent.query(framework="text")
    async def query(self: Any, msgs: Any, request: Any = None, **kwargs: Any) -> Any:
        yield "registered later"

    with running(web) as url:
        reply = httpx.post(
            f"{url}/process", headers=bearer(keys.alice), json={"input": [user_message("hi")]}
        )
        assert reply.status_code == 200
        assert "registered later" in reply.text


def test_an_application_without_a_query_handler_fails_to_start_saying_so() -> None:
    agent, keys = AgentApp(app_name="none"), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    async def start() -> None:
        async with web.router.lifespan_context(web):
            pass

    with pytest.raises(ConfigurationError, match=r"no query handler: register one"):
        asyncio.run(start())


def test_a_user_key_naming_another_user_on_a_route_a_user_added_gets_403() -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.post("/owned")
    async def owned(request: Request) -> dict[str, Any]:
        return {"ran": True}

    sub = FastAPI()

    @sub.post("/owned")
    async def mounted(request: Request) -> dict[str, Any]:
        return {"body": await request.json()}

    web.mount("/v2", sub)
    alice = bearer(keys.alice)
    with running(web) as url:
        for path in ("/owned", "/v2/owned"):
            for kwargs in (
                {"headers": {**alice, "X-User-Id": "bob"}, "json": {}},
                {"headers": alice, "params": {"user_id": "bob"}, "json": {}},
                {"headers": alice, "json": {"user_id": "bob"}},
                {"headers": alice, "json": {"user": "bob"}},
            ):
                answer = httpx.post(f"{url}{path}", **kwargs)  # type: ignore[arg-type]
                assert answer.status_code == 403, (path, kwargs, answer.text)
        # Its own user, or none named, runs; the body read for the checks reaches the route.
        assert httpx.post(f"{url}/owned", headers=alice, json={"user_id": "alice"}).json() == {
            "ran": True
        }
        assert httpx.post(f"{url}/v2/owned", headers=alice, json={"a": [1, "é"]}).json() == {
            "body": {"a": [1, "é"]}
        }
        # A service key acts for the one user a request names; two users are a 422.
        service = bearer(keys.service)
        answer = httpx.post(f"{url}/owned", headers={**service, "X-User-Id": "bob"}, json={})
        assert answer.status_code == 200
        answer = httpx.post(
            f"{url}/owned", headers={**service, "X-User-Id": "bob"}, json={"user_id": "alice"}
        )
        assert answer.status_code == 422


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"note": "\\ud800"}', "body.note"),
        ('{"values": [1, NaN]}', "body.values.1"),
        ('{"limit": Infinity}', "body.limit"),
        ('{"big": 1e999}', "body.big"),
    ],
)
def test_a_body_a_route_a_user_added_cannot_carry_is_422_naming_the_field(
    body: str, field: str
) -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    @web.post("/notes")
    async def notes(request: Request) -> dict[str, Any]:
        return {"got": repr(await request.json())}

    @web.post("/open-notes")
    @public
    async def open_notes(request: Request) -> dict[str, Any]:
        return {"got": repr(await request.json())}

    with running(web) as url:
        for path in ("/notes", "/open-notes"):
            answer = httpx.post(
                f"{url}{path}",
                headers={**bearer(keys.alice), "Content-Type": "application/json"},
                content=body.encode(),
            )
            assert answer.status_code == 422, (path, answer.text)
            assert field in answer.text
        answer = httpx.post(f"{url}/open-notes", json={"note": "fine"})
        assert answer.json() == {"got": "{'note': 'fine'}"}


def test_public_leaves_open_the_route_it_marks_not_others_of_the_same_function() -> None:
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)

    async def report() -> dict[str, str]:
        return {"report": "numbers"}

    web.add_api_route("/public/summary", public(report))
    web.add_api_route("/admin/report", report)
    hooks = APIRouter()

    @hooks.post("/hooks/in")
    async def receive() -> dict[str, bool]:
        return {"received": True}

    web.include_router(public(hooks))
    web.add_api_route("/admin/replay", receive, methods=["POST"])
    with running(web) as url:
        assert httpx.get(f"{url}/public/summary").json() == {"report": "numbers"}
        assert httpx.get(f"{url}/admin/report").status_code == 401
        assert httpx.post(f"{url}/hooks/in").json() == {"received": True}
        assert httpx.post(f"{url}/admin/replay").status_code == 401
        answer = httpx.post(f"{url}/admin/replay", headers=bearer(keys.alice))
        assert answer.json() == {"received": True}


def test_a_keyed_write_to_a_users_route_is_answered_once_and_replayed() -> None:
    # "Every write route takes an Idempotency-Key": a user's route too. The retry gets the
    # first answer back, not a 409 in progress, and the route runs once.
    agent, keys = _agent(), Keys.make()
    web = agent.get_fastapi_app(settings=load_settings(), key_store=keys.store)
    calls: list[int] = []

    @web.post("/orders")
    async def order(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        return {"order": len(calls), **body}

    app = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    headers = {**bearer(keys.alice), "Idempotency-Key": "order-1"}
    with running(app) as url:
        first = httpx.post(f"{url}/orders", json={"item": "tea"}, headers=headers)
        again = httpx.post(f"{url}/orders", json={"item": "tea"}, headers=headers)
        other = httpx.post(f"{url}/orders", json={"item": "cake"}, headers=headers)
    assert first.status_code == 200, first.text
    assert first.json() == {"order": 1, "item": "tea"}
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert again.headers.get("idempotent-replayed") == "true"
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert calls == [1]
