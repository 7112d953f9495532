"""AgentApp: decorators, in-process queries, services, hooks, and loading by import path."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.app import AgentApp, load_agent_app
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http import create_app
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import AgentRequest, Message, TextContent
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.settings import load_settings
from tests.support.http import (
    Keys,
    a2a_send,
    assert_late_request_heads_are_cut_off,
    free_port,
    running,
    wait_until_healthy,
)


def echo_app(**kwargs: Any) -> AgentApp:
    app = AgentApp(app_name="echo", **kwargs)

    @app.query(framework="text")
    async def query(self: Runner, msgs: list[Message], **kw: Any) -> AsyncIterator[str]:
        yield "echo: "
        yield msgs[-1].get_text_content() or ""

    return app


async def test_query_in_process_with_text_dict_or_request() -> None:
    async with echo_app() as app:
        by_text = await app.query("hello", user_id="u1", session_id="s1")
        by_dict = await app.query({"input": [{"role": "user", "content": "dict"}]}, user_id="u1")
        by_request = await app.query(
            AgentRequest(input=[Message(role="user", content="model")]), session_id="s1"
        )
        by_keyword = await app.query(request="keyword", user_id="u1", session_id="s1")
    assert [
        r.output[0].get_text_content()
        for r in (by_text, by_dict, by_request, by_keyword)
        if r.output
    ] == [
        "echo: hello",
        "echo: dict",
        "echo: model",
        "echo: keyword",
    ]
    assert by_text.session_id == "s1"


@pytest.mark.parametrize("text", ["text", "agentscope", "langgraph"])
async def test_a_query_whose_text_is_a_framework_name_is_run(text: str) -> None:
    # Taken for a decorator: awaiting it failed (TypeError, or ValueError for "langgraph").
    async with echo_app() as app:
        reply = await app.query(text)  # type: ignore[misc]
    assert reply.output is not None and reply.output[0].get_text_content() == f"echo: {text}"


async def test_stream_query_in_process_starts_the_app_on_first_use() -> None:
    app = echo_app()
    try:
        events = [e async for e in app.stream_query("streamed", user_id="u1")]
    finally:
        await app.stop()
    deltas = [e.text for e in events if isinstance(e, TextContent) and e.delta]
    assert deltas == ["echo: ", "streamed"]


async def test_services_passed_in_are_used() -> None:
    history = InMemorySessionHistoryService()
    async with echo_app(session_history_service=history) as app:
        await app.query("keep me", user_id="u1", session_id="kept")
        session = await history.get_session("u1", "kept")
    assert session is not None and len(session.messages) == 2


async def test_init_and_shutdown_handlers_get_the_runner() -> None:
    app = echo_app()
    seen: list[str] = []

    @app.init
    async def start(self: Runner) -> None:
        seen.append(f"init {type(self).__name__}")

    @app.shutdown
    def stop(self: Runner) -> None:
        seen.append("shutdown")

    async with app:
        await app.query("hi")
    assert seen == ["init Runner", "shutdown"]


def test_only_known_frameworks_register() -> None:
    app = AgentApp()

    async def query(self: Runner, msgs: list[Any], **kw: Any) -> AsyncIterator[str]:
        yield "hi"

    with pytest.raises(ValueError, match="text, agentscope"):
        app.query(framework="autogen")(query)  # as @app.query(framework="autogen") does

    # A misspelt framework= was run as a request's text: "'coroutine' object is not callable".
    for misspelt in ("Text", "txt"):
        with pytest.raises(ValueError, match=f"text, agentscope, got '{misspelt}'"):
            app.query(framework=misspelt)(query)
    with pytest.raises(TypeError):
        app.query("hello", framework="text")  # type: ignore[call-overload]


@pytest.mark.parametrize("named", [{"user_id": "u1"}, {"session_id": "s1"}])
def test_framework_with_a_runs_user_or_session_says_they_go_with_a_request(
    named: dict[str, str],
) -> None:
    with pytest.raises(TypeError, match=r"user_id and session_id name a run's, given with its "):
        AgentApp().query(framework="text", **named)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("given", "user_id"), [("txt", None), ("Text", None), ("text", "u1"), ({"input": []}, None)]
)
def test_a_positional_request_above_a_handler_says_framework_is_a_keyword(
    given: Any, user_id: str | None
) -> None:
    app = AgentApp()

    async def query(self: Runner, msgs: list[Any], **kw: Any) -> AsyncIterator[str]:
        yield "hi"

    # It was taken for a request to run: "'coroutine' object is not callable".
    with pytest.raises(TypeError, match=r"framework= is a keyword, as in @app.query\(framework="):
        app.query(given, user_id=user_id)(query)
    assert app._query_handler is None


def test_a_query_run_as_a_coroutine_outside_a_loop() -> None:
    app = echo_app()
    try:
        reply = asyncio.run(app.query("hello", user_id="u1"))
    finally:
        asyncio.run(app.stop())
    assert reply.output is not None and reply.output[0].get_text_content() == "echo: hello"


@pytest.mark.usefixtures("warnings_logged")
def test_a_second_handler_replaces_the_first_with_a_warning_naming_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = echo_app()  # its query handler is echo_app.<locals>.query

    @app.query(framework="text")
    async def query(self: Runner, msgs: list[Message], **kw: Any) -> AsyncIterator[str]:
        yield "the leftover"

    for register in (app.init, app.init, app.shutdown, app.shutdown):

        @register
        def hook(self: Runner) -> None: ...

    here = (
        f"{__name__}.{test_a_second_handler_replaces_the_first_with_a_warning_naming_both.__name__}"
    )
    warned = [json.loads(line)["message"] for line in capsys.readouterr().out.splitlines()]
    assert warned == [
        f"@app.query {here}.<locals>.query replaces {__name__}.echo_app.<locals>.query, "
        "registered before it: an app has one query handler",
        f"@app.init {here}.<locals>.hook replaces {here}.<locals>.hook, registered before it: "
        "an app has one init handler",
        f"@app.shutdown {here}.<locals>.hook replaces {here}.<locals>.hook, registered before "
        "it: an app has one shutdown handler",
    ]
    assert app._query_handler is query  # replaced, as in AgentScope Runtime


def test_query_without_its_parentheses_says_to_add_them() -> None:
    app = AgentApp()

    async def query(self: Runner, msgs: list[Message], **kw: Any) -> AsyncIterator[str]:
        yield "hi"

    with pytest.raises(TypeError, match=r"@app.query takes parentheses: @app.query\(framework="):
        app.query(query)  # type: ignore[call-overload]  # as a bare @app.query calls it


def app_of_handler(parameters: str) -> AgentApp:
    """An app whose handler is ``async def query(<parameters>)``."""
    app = AgentApp()
    namespace: dict[str, Any] = {}
    exec(f"async def query({parameters}):\n    yield 'hi'\n", namespace)
    app.query(framework="text")(namespace["query"])
    return app


@pytest.mark.parametrize(
    ("parameters", "said"),
    [
        ("msgs, **kwargs", "query() takes msgs where the runner comes"),
        ("msgs", "query() takes msgs where the runner comes"),
        ("", "query() takes no parameter for the runner"),
        ("self, messages", "query() needs 'messages', which it is not given"),
        ("self, msgs, user_id, **kwargs", "query() needs 'user_id', which it is not given"),
        ("self, msgs, /, **kwargs", "query() takes 'msgs' by position only"),
    ],
)
def test_a_handler_no_run_can_call_is_refused_as_the_app_is_built(
    parameters: str, said: str
) -> None:
    app = app_of_handler(parameters)
    with pytest.raises(ConfigurationError, match=re.escape(said)) as refused:
        create_app(settings=load_settings(), agent_app=app)
    assert "async def query(self, msgs, request=None, **kwargs)" in str(refused.value)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"response_type": "json"}, "response_type must be 'sse'"),
        # It was taken and ignored: the process endpoint streamed all the same.
        ({"stream": False}, "stream must be True"),
    ],
)
def test_an_app_answering_otherwise_than_its_endpoint_does_is_refused(
    options: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as refused:
        AgentApp(app_name="no-stream", **options)
    assert '"stream": false' in str(refused.value)


@pytest.mark.parametrize(
    ("kind", "parameters", "said"),
    [
        ("init", "", "the init handler init() takes no parameter for the runner"),
        ("init", "self, services", "the init handler init() needs 'services', which it is"),
        ("shutdown", "", "the shutdown handler shutdown() takes no parameter for the runner"),
    ],
)
def test_an_init_or_shutdown_handler_that_cannot_be_called_is_refused_as_the_app_is_built(
    kind: str, parameters: str, said: str
) -> None:
    app = app_of_handler("self, msgs, **kwargs")
    namespace: dict[str, Any] = {}
    exec(f"async def {kind}({parameters}):\n    pass\n", namespace)
    getattr(app, kind)(namespace[kind])
    with pytest.raises(ConfigurationError, match=re.escape(said)) as refused:
        create_app(settings=load_settings(), agent_app=app)
    assert f"it is called with the runner alone, e.g. async def {kind}(self)" in str(refused.value)


@pytest.mark.parametrize(
    "parameters", ["self, msgs, **kwargs", "self, msgs, request", "self, *, msgs", "*args, **kw"]
)
def test_handlers_a_run_can_call_are_served(parameters: str) -> None:
    create_app(settings=load_settings(), agent_app=app_of_handler(parameters))


async def test_an_app_without_a_handler_does_not_start() -> None:
    with pytest.raises(ConfigurationError, match="query handler"):
        await AgentApp().start()


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="endpoint_path"):
        AgentApp(endpoint_path="process")
    with pytest.raises(TypeError, match="request_model"):
        AgentApp(request_model=dict)  # type: ignore[arg-type]


def test_load_agent_app_by_import_path() -> None:
    assert load_agent_app("agentscope_serverless.agents.demo:app").app_name == "demo"
    with pytest.raises(ConfigurationError, match="cannot import"):
        load_agent_app("no_such_module_here:app")
    with pytest.raises(ConfigurationError, match="not an AgentApp"):
        load_agent_app("agentscope_serverless.agents.demo:demo_reply")


class TaggedRequest(AgentRequest):
    tag: str


def test_over_http_hooks_run_and_the_endpoint_and_model_are_the_apps(keys: Keys) -> None:
    hooks: list[str] = []
    app = echo_app(
        endpoint_path="/run",
        request_model=TaggedRequest,
        before_start=lambda web: hooks.append(f"before {web.title}"),
        after_finish=lambda web: hooks.append("after"),
    )
    keys_header = {"Authorization": f"Bearer {keys.alice}"}
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        assert hooks == ["before AgentScope Serverless: echo"]
        body = {"input": [{"role": "user", "content": "x"}], "stream": False}
        missing_tag = httpx.post(f"{url}/run", json=body, headers=keys_header)
        assert missing_tag.status_code == 422
        assert missing_tag.json()["error"]["fields"][0]["loc"] == ["body", "tag"]
        tagged = httpx.post(f"{url}/run", json={**body, "tag": "t"}, headers=keys_header)
        assert tagged.json()["output"][0]["content"][0]["text"] == "echo: x"
    assert hooks[-1] == "after"


class LangRequest(AgentRequest):
    lang: str = "en"


def test_every_route_running_the_agent_hands_it_the_apps_request_model(keys: Keys) -> None:
    # The OpenAI-compatible routes and A2A handed it an AgentRequest: a handler reading its
    # model's field failed (AttributeError), answered as a server error.
    app = AgentApp(app_name="lang", request_model=LangRequest)

    @app.query(framework="text")
    async def query(
        self: Runner, msgs: list[Message], request: Any = None, **kw: Any
    ) -> AsyncIterator[str]:
        yield f"{type(request).__name__} lang={request.lang}"

    said = "LangRequest lang=en"
    headers = {"Authorization": f"Bearer {keys.alice}"}
    user = [{"role": "user", "content": "hi"}]
    with (
        running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as client,
    ):
        chat = client.post("/compatible-mode/v1/chat/completions", json={"messages": user})
        assert chat.json()["choices"][0]["message"]["content"] == said, chat.text
        response = client.post("/compatible-mode/v1/responses", json={"input": "hi"})
        assert response.json()["output"][0]["content"][0]["text"] == said, response.text
        task = client.post("/a2a", json=a2a_send("hi")).json()["result"]
        assert task["status"]["state"] == "completed", task
        assert task["artifacts"][0]["parts"][0]["text"] == said


def test_a_request_model_a_route_cannot_fill_is_refused_there_naming_its_field(
    keys: Keys,
) -> None:
    app = echo_app(request_model=TaggedRequest)
    headers = {"Authorization": f"Bearer {keys.alice}"}
    with running(create_app(settings=load_settings(), agent_app=app, key_store=keys.store)) as url:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        chat = httpx.post(f"{url}/compatible-mode/v1/chat/completions", json=body, headers=headers)
    assert chat.status_code == 400, chat.text
    assert "TaggedRequest" in chat.json()["error"]["message"]
    assert "tag" in chat.json()["error"]["message"]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.mark.parametrize("generator", [False, True])
def test_a_plain_handler_that_blocks_holds_no_other_request(keys: Keys, generator: bool) -> None:
    # A newcomer's handler with a sync HTTP client: while it waits, the server answers on.
    started, release = threading.Event(), threading.Event()
    app = AgentApp(app_name="blocking")

    def wait() -> str:
        started.set()
        release.wait(30)
        return "done"

    if generator:

        @app.query(framework="text")
        def stream(self: Runner, msgs: list[Message], **kwargs: Any) -> Iterator[str]:
            yield "waiting, "
            yield wait()

    else:

        @app.query(framework="text")
        def answer(self: Runner, msgs: list[Message], **kwargs: Any) -> str:
            return wait()

    headers = {"Authorization": f"Bearer {keys.alice}"}
    body = {"input": [{"role": "user", "content": "x"}], "stream": False}
    web = create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    with running(web) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.post, f"{url}/process", json=body, headers=headers, timeout=60)
        assert started.wait(30)
        try:
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        finally:
            release.set()
        answered = reply.result()
    assert answered.json()["output"][0]["content"][0]["text"].endswith("done")


def test_run_listens_on_agentscope_runtimes_port_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentscope_serverless import stopping_server

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(stopping_server, "run", lambda app, **kwargs: calls.append(kwargs))
    echo_app().run(settings=load_settings())
    [call] = calls
    call.pop("http")  # the request head's time limit (see below)
    # Stopped, it waits for requests still open as serve does, 5 s (not for ever).
    assert call == {"host": "127.0.0.1", "port": 8080, "timeout_graceful_shutdown": 5}


def test_run_cuts_off_a_client_sending_half_a_request_head() -> None:
    port = free_port()
    code = f"from agentscope_serverless.agents.demo import app; app.run(port={port})"
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={
            **os.environ,
            "POWERTOOLS_LOG_LEVEL": "CRITICAL",
            "REQUEST_HEAD_TIMEOUT_SECONDS": "0.5",
        },
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        assert_late_request_heads_are_cut_off(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_run_keeps_the_http_protocol_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentscope_serverless import stopping_server

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(stopping_server, "run", lambda app, **kwargs: calls.append(kwargs))
    echo_app().run(settings=load_settings(), http="h11")
    assert calls[0]["http"] == "h11"


def test_run_prints_a_development_key_that_is_accepted(tmp_path: Path) -> None:
    # As AgentScope's scripts do: python agent.py, whose last line is app.run(). On the
    # embedded key store nothing else can make a key: without this one, every call is a 401.
    port = free_port()
    code = f"from agentscope_serverless.agents.demo import app; app.run(port={port})"
    output = tmp_path / "output.txt"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=sink,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "POWERTOOLS_LOG_LEVEL": "CRITICAL"},
        )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        printed = output.read_text()
        assert "development key (user 'dev', valid while this server runs): ask_" in printed
        key = printed.split("server runs): ", 1)[1].split()[0]
        answer = httpx.post(
            f"http://127.0.0.1:{port}/process",
            json={"input": [{"role": "user", "content": "hi"}], "stream": False},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "completed"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_run_serves_the_app_until_it_is_stopped() -> None:
    port = free_port()
    code = f"from agentscope_serverless.agents.demo import app; app.run(port={port})"
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "POWERTOOLS_LOG_LEVEL": "CRITICAL"},
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process)
        answer = httpx.post(f"http://127.0.0.1:{port}/process", json={"input": []})
        assert answer.status_code == 401
    finally:
        process.terminate()
        process.wait(timeout=30)
