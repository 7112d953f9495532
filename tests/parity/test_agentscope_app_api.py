"""AgentApp and Runner as AgentScope's: ``runner=`` with a Runner subclass, services assigned
in an init handler, custom endpoints behind auth, ``get_fastapi_app()``, ``deploy()``, and
the agent API client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agentscope_serverless import AgentApp, DeployManager, LocalDeployManager, Runner
from agentscope_serverless.deployers.adapter.protocol_adapter import ProtocolAdapter
from agentscope_serverless.deployers.adapter.responses import ResponseAPIDefaultAdapter
from agentscope_serverless.deployers.modelstudio_deployer import ModelstudioDeployManager
from agentscope_serverless.helpers.agent_api_client import (
    AgentAPIError,
    HTTPAgentAPIClient,
    create_simple_text_request,
    extract_text_from_event,
)
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Event,
    Message,
    RunStatus,
    TextContent,
)
from agentscope_serverless.services.agent_state import InMemoryStateService
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.settings import load_settings
from tests.support.http import InMemoryKeyStore, bearer, issue_key, parse_sse, running


class CountingRunner(Runner):
    """A Runner subclass, as AgentScope users write them: handlers are methods."""

    def __init__(self) -> None:
        super().__init__()
        self.framework_type = "text"
        self.events: list[str] = []

    async def init_handler(self, *args: Any, **kwargs: Any) -> None:
        self.state_service = InMemoryStateService()
        await self.state_service.start()
        self.events.append("init")

    async def shutdown_handler(self, *args: Any, **kwargs: Any) -> None:
        assert self.state_service is not None
        await self.state_service.stop()
        self.events.append("shutdown")

    async def query_handler(self, *args: Any, **kwargs: Any) -> AsyncIterator[str]:
        request = kwargs["request"]
        assert self.state_service is not None
        state = await self.state_service.export_state(request.user_id, request.session_id)
        count = (state or {}).get("count", 0) + 1
        await self.state_service.save_state(request.user_id, {"count": count}, request.session_id)
        yield f"turn {count}"


def reply_of(events: list[Event]) -> str:
    """The reply's text: what ``extract_text_from_event`` gives of its completed message."""
    [message] = [e for e in events if isinstance(e, Message) and e.status == "completed"]
    return extract_text_from_event(message) or ""


def build_app(runner: Runner) -> AgentApp:
    app = AgentApp(app_name="counter", runner=runner)

    @app.endpoint("/sync", methods=["POST"])
    def sync_handler(body: dict[str, Any]) -> dict[str, Any]:
        return {"got": body}

    @app.endpoint("/async", methods=["GET"])
    async def async_handler(name: str = "x") -> dict[str, str]:
        await asyncio.sleep(0)
        return {"hello": name}

    @app.endpoint("/stream", methods=["POST"])
    async def stream_handler(body: dict[str, Any]) -> AsyncIterator[dict[str, int]]:
        for i in range(int(body["n"])):
            yield {"i": i}

    return app


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, str, CountingRunner]]:
    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    runner = CountingRunner()
    app = build_app(runner)
    with running(app.get_fastapi_app(settings=load_settings(), key_store=store)) as url:
        yield url, key, runner
    assert runner.events == ["init", "shutdown"]


def test_a_runner_subclass_keeps_state_assigned_in_its_init(
    served: tuple[str, str, CountingRunner],
) -> None:
    url, key, runner = served
    assert runner.events == ["init"]
    client = HTTPAgentAPIClient(f"{url}/process", token=key)
    texts = []
    for _ in range(2):
        events = list(client.stream(create_simple_text_request("hi", session_id="c1")))
        assert isinstance(events[-1], AgentResponse) and events[-1].status == "completed"
        texts.append(reply_of(events))
    assert texts == ["turn 1", "turn 2"]


async def test_the_async_client_streams_and_raises_on_refusal(
    served: tuple[str, str, CountingRunner],
) -> None:
    url, key, _ = served
    client = HTTPAgentAPIClient(f"{url}/process", token=key)
    events = [e async for e in client.astream(create_simple_text_request("hi", session_id="c2"))]
    assert reply_of(events) == "turn 1"
    bad = HTTPAgentAPIClient(f"{url}/process", token="ask_wrong")
    with pytest.raises(AgentAPIError, match="401"):
        [e async for e in bad.astream(create_simple_text_request("hi"))]
    with pytest.raises(AgentAPIError, match="401"):
        list(bad.stream(create_simple_text_request("hi")))


async def test_the_clients_token_is_the_one_it_holds_when_it_sends(
    served: tuple[str, str, CountingRunner],
) -> None:
    # AgentScope's client keeps ``token`` as an attribute and reads it on every request, so
    # a token renewed by assigning it is the one sent.
    url, key, _ = served
    client = HTTPAgentAPIClient(f"{url}/process", token="ask_expired", headers={"X-Trace": "1"})
    assert client.token == "ask_expired" and client.headers == {"X-Trace": "1"}
    client.token = key
    events = list(client.stream(create_simple_text_request("hi", session_id="c3")))
    assert reply_of(events) == "turn 1"
    events = [e async for e in client.astream(create_simple_text_request("hi", session_id="c3"))]
    assert reply_of(events) == "turn 2"


async def test_both_clients_take_a_request_as_a_dict_as_the_runner_does(
    served: tuple[str, str, CountingRunner],
) -> None:
    # A dict, as Runner.stream_query takes one, failed with "'dict' object has no attribute
    # 'model_dump'"; one that is no request is refused before anything is sent.
    url, key, _ = served
    client = HTTPAgentAPIClient(f"{url}/process", token=key)
    request = {"input": [{"role": "user", "content": "hi"}], "session_id": "c4"}
    assert reply_of([e async for e in client.astream(request)]) == "turn 1"
    assert reply_of(await asyncio.to_thread(lambda: list(client.stream(request)))) == "turn 2"
    with pytest.raises(ValidationError, match="input"):
        [e async for e in client.astream({"session_id": "c4"})]
    with pytest.raises(TypeError, match="AgentRequest or a dict, got str"):
        list(client.stream("hi"))  # type: ignore[arg-type]


async def test_both_clients_say_why_the_api_refused_a_request(
    served: tuple[str, str, CountingRunner],
) -> None:
    url, key, _ = served
    client = HTTPAgentAPIClient(f"{url}/process", token=key)
    request = create_simple_text_request("hi", session_id="s" * 600)
    why = "422: INVALID_INPUT: session_id is longer than 512 characters"
    with pytest.raises(AgentAPIError, match=why) as refused:
        [e async for e in client.astream(request)]
    assert refused.value.status_code == 422
    with pytest.raises(AgentAPIError, match=why):
        await asyncio.to_thread(lambda: list(client.stream(request)))


def test_custom_endpoints_sync_async_and_streaming_behind_auth(
    served: tuple[str, str, CountingRunner],
) -> None:
    url, key, _ = served
    with httpx.Client(base_url=url, timeout=10) as anonymous:
        assert anonymous.post("/sync", json={"a": 1}).status_code == 401
        assert anonymous.get("/async").status_code == 401
        assert anonymous.post("/stream", json={"n": 2}).status_code == 401
    with httpx.Client(base_url=url, headers=bearer(key), timeout=10) as client:
        assert client.post("/sync", json={"a": 1}).json() == {"got": {"a": 1}}
        assert client.get("/async", params={"name": "ann"}).json() == {"hello": "ann"}
        response = client.post("/stream", json={"n": 3})
        assert response.headers["content-type"].startswith("text/event-stream")
        assert parse_sse(response.text.splitlines()).data == [{"i": 0}, {"i": 1}, {"i": 2}]


async def test_deploy_serves_the_app_with_a_local_deployer() -> None:
    store = InMemoryKeyStore()
    key = await asyncio.to_thread(issue_key, store, "dev")
    deployer = LocalDeployManager(host="127.0.0.1", port=0)
    app = build_app(CountingRunner())
    info = await app.deploy(deployer, settings=load_settings(), key_store=store)
    try:
        assert deployer.is_running and deployer.is_service_running()
        async with httpx.AsyncClient(base_url=info["url"], headers=bearer(key)) as client:
            assert (await client.get("/async")).json() == {"hello": "x"}
    finally:
        result = await deployer.stop(info["deploy_id"])
    assert result["success"] and not deployer.is_running
    deployer.is_running = True
    assert deployer.is_running


async def test_a_runner_its_user_started_deploys_restarted_by_the_server() -> None:
    # AgentScope's way: ``async with runner: await runner.deploy(manager)``; its server
    # stops the running runner and starts it again, on the server's services.
    store = InMemoryKeyStore()
    key = await asyncio.to_thread(issue_key, store, "dev")
    runner = CountingRunner()
    async with runner:
        deployer = LocalDeployManager(host="127.0.0.1", port=0)
        info = await runner.deploy(deployer, settings=load_settings(), key_store=store)
        try:
            client = HTTPAgentAPIClient(f"{info['url']}/process", token=key)
            request = create_simple_text_request("hi", session_id="d1")
            events = [e async for e in client.astream(request)]
            assert reply_of(events) == "turn 1"
        finally:
            await deployer.stop(info["deploy_id"])
    assert runner.events == ["init", "shutdown", "init", "shutdown"]


@pytest.mark.parametrize("port", [80800, 70000, -1, True, "80a"])
def test_a_port_that_is_no_port_number_is_refused_naming_it(port: Any) -> None:
    # 80800 (8080 typed once more) served on port 15264 (80800 - 65536); -1 failed to start,
    # saying only that the server did not start.
    with pytest.raises(
        ValueError, match=f"port must be a port number from 0 to 65535, got {port!r}"
    ):
        LocalDeployManager(port=port)
    with pytest.raises(ValueError, match="port must be a port number"):
        AgentApp(app_name="counter", runner=CountingRunner()).run(port=port)
    assert LocalDeployManager(port="8090").port == 8090


@pytest.mark.parametrize("deployed", ["runner", "app"])
async def test_a_local_deployment_serves_at_the_endpoint_path_given(deployed: str) -> None:
    store = InMemoryKeyStore()
    key = await asyncio.to_thread(issue_key, store, "dev")
    deployer = LocalDeployManager(host="127.0.0.1", port=0)
    runner = CountingRunner()
    options: dict[str, Any] = {"settings": load_settings(), "key_store": store}
    if deployed == "runner":
        info = await runner.deploy(deployer, endpoint_path="/agent", **options)
    else:
        app = AgentApp(app_name="counter", endpoint_path="/agent", runner=runner)
        info = await app.deploy(deployer, **options)
    try:
        client = HTTPAgentAPIClient(f"{info['url']}/agent", token=key)
        events = [e async for e in client.astream(create_simple_text_request("hi"))]
        assert reply_of(events) == "turn 1"
    finally:
        await deployer.stop(info["deploy_id"])


async def test_a_deployer_written_for_agentscope_deploys_an_app() -> None:
    # AgentScope's DeployManager asks its subclasses for deploy and stop alone, and gives
    # each manager a deploy_id from the start.
    class RecordingDeployer(DeployManager):
        async def deploy(self, *args: Any, **kwargs: Any) -> dict[str, str]:
            self.deployed = kwargs["app"]
            return {"deploy_id": self.deploy_id, "url": "http://recorded"}

        async def stop(self, deploy_id: str, **kwargs: Any) -> dict[str, Any]:
            return {"success": deploy_id == self.deploy_id}

    deployer = RecordingDeployer()
    app = AgentApp(app_name="recorded", runner=CountingRunner())
    info = await app.deploy(deployer)
    assert deployer.deployed is app and info["deploy_id"]
    assert not deployer.is_running and deployer.service_url is None
    assert (await deployer.stop(info["deploy_id"]))["success"]


class EchoAdapter(ProtocolAdapter):
    """A protocol adapter as AgentScope users write them: routes added to the app."""

    def add_endpoint(self, app: Any, func: Any, **kwargs: Any) -> Any:
        app.add_api_route("/echo", func, methods=["POST"])


async def test_a_protocol_adapter_of_ones_own_is_refused_not_ignored(tmp_path: Path) -> None:
    # AgentScope's deployers called add_endpoint; here it was never called, /echo a 404.
    options: dict[str, Any] = {"settings": load_settings(), "key_store": InMemoryKeyStore()}
    deployer = LocalDeployManager(host="127.0.0.1", port=0)
    app = AgentApp(app_name="counter", runner=CountingRunner())
    with pytest.raises(TypeError, match="EchoAdapter"):
        await app.deploy(deployer, protocol_adapters=[EchoAdapter()], **options)
    with pytest.raises(TypeError, match="EchoAdapter"):
        await CountingRunner().deploy(deployer, protocol_adapters=[EchoAdapter()], **options)
    assert not deployer.is_running
    with pytest.raises(TypeError, match="EchoAdapter"):
        await ModelstudioDeployManager(build_root=tmp_path).deploy(
            app, protocol_adapters=[EchoAdapter()], skip_upload=True
        )
    # The responses API's own adapter adds what every app serves already.
    info = await app.deploy(deployer, protocol_adapters=[ResponseAPIDefaultAdapter()], **options)
    await deployer.stop(info["deploy_id"])


def test_extract_text_from_event_gives_text_as_agentscopes_client_does() -> None:
    delta = TextContent(text="Hi ", delta=True, index=0)
    whole = TextContent(text="Hi there", index=0, status=RunStatus.Completed)
    message = Message(role="assistant", content=[whole, TextContent(text="!")])
    assert extract_text_from_event(delta) == "Hi "
    assert extract_text_from_event(whole) == "Hi there"
    assert extract_text_from_event(message.in_progress()) is None
    assert extract_text_from_event(message.completed()) == "Hi there!"
    assert extract_text_from_event(AgentResponse().completed()) is None


def test_fastapi_keyword_arguments_document_the_api_and_others_are_refused() -> None:
    app = AgentApp(app_name="counter", runner=CountingRunner(), title="Counter API", version="2.1")
    store = InMemoryKeyStore()
    with running(app.get_fastapi_app(settings=load_settings(), key_store=store)) as url:
        info = httpx.get(f"{url}/openapi.json", timeout=10).json()["info"]
    assert (info["title"], info["version"]) == ("Counter API", "2.1")
    # AgentScope passed any keyword to FastAPI, which kept it unused: say so instead.
    with pytest.raises(TypeError, match="does not take: agent"):
        AgentApp(app_name="overview", agent=object())


def test_an_ag_ui_config_is_refused_not_ignored() -> None:
    # AgentScope served AG-UI at agui_config's route_path; it was kept unused, the route a 404.
    from agentscope_serverless.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="AG-UI"):
        AgentApp(app_name="overview", agui_config={"route_path": "/ag-ui"})


class TextRunner(Runner):
    """A runner given to an app whose handlers are registered with its decorators."""

    def __init__(self) -> None:
        super().__init__()
        self.framework_type = "text"
        self.events: list[str] = []


def test_decorated_handlers_run_on_the_runner_given_to_the_app() -> None:
    # AgentScope's AgentApp binds what @app.init, @app.query and @app.shutdown register
    # onto the runner passed as ``runner=``.
    runner = TextRunner()
    app = AgentApp(app_name="decorated", runner=runner)

    @app.init
    async def init(self: TextRunner) -> None:
        self.events.append("init")

    @app.shutdown
    def shutdown(self: TextRunner) -> None:
        self.events.append("shutdown")

    @app.query(framework="text")
    async def query(self: TextRunner, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield f"{type(self).__name__} heard {msgs[-1].get_text_content()}"

    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    with running(app.get_fastapi_app(settings=load_settings(), key_store=store)) as url:
        assert runner.events == ["init"]
        client = HTTPAgentAPIClient(f"{url}/process", token=key)
        events = list(client.stream(create_simple_text_request("hi", session_id="g1")))
    assert reply_of(events) == "TextRunner heard hi"
    assert runner.events == ["init", "shutdown"]


def test_a_session_service_assigned_in_init_is_the_apps_session_history() -> None:
    # AgentScope Runtime's quickstart names it self.session_service and keeps its agent's
    # history there: the sessions routes read that history.
    app = AgentApp(app_name="Friday")

    @app.init
    async def init_func(self: Any) -> None:
        self.session_service = InMemorySessionHistoryService()
        await self.session_service.start()

    @app.shutdown
    async def shutdown_func(self: Any) -> None:
        await self.session_service.stop()

    @app.query(framework="text")
    async def query_func(
        self: Any, msgs: list[Message], request: Any = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        session = await self.session_service.create_session(request.user_id, request.session_id)
        await self.session_service.append_message(session, msgs)
        yield "noted"
        await self.session_service.append_message(
            session, Message(role="assistant", content=[TextContent(text="noted")])
        )

    store = InMemoryKeyStore()
    key = issue_key(store, "dev")
    with running(app.get_fastapi_app(settings=load_settings(), key_store=store)) as url:
        turn = {"input": [{"role": "user", "content": "hi"}], "session_id": "chat-1"}
        answer = httpx.post(f"{url}/process", json={**turn, "stream": False}, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        stored = httpx.get(f"{url}/sessions/chat-1/messages", headers=bearer(key)).json()
    assert [(m["role"], m["content"][0]["text"]) for m in stored["items"]] == [
        ("user", "hi"),
        ("assistant", "noted"),
    ]


def test_the_hooks_find_the_started_runner_in_the_apps_state() -> None:
    # AgentScope Runtime calls before_start(app) once the runner has started (its init
    # handler has run) and after_finish(app) before it stops, app.state.runner holding it.
    seen: list[Any] = []

    async def before_start(web: Any) -> None:
        await web.state.runner.state_service.save_state("ops", {"warm": True})

    async def after_finish(web: Any) -> None:
        seen.append(await web.state.runner.state_service.export_state("ops"))

    app = AgentApp(app_name="hooked", before_start=before_start, after_finish=after_finish)

    @app.init
    async def init_func(self: Any) -> None:
        self.state_service = InMemoryStateService()
        await self.state_service.start()

    @app.shutdown
    async def shutdown_func(self: Any) -> None:
        seen.append("shutdown")
        await self.state_service.stop()

    @app.query(framework="text")
    async def query_func(self: Any, msgs: list[Message], **kwargs: Any) -> AsyncIterator[str]:
        yield "hi"

    store = InMemoryKeyStore()
    issue_key(store, "dev")
    with running(app.get_fastapi_app(settings=load_settings(), key_store=store)):
        pass
    assert seen == [{"warm": True}, "shutdown"]


async def test_a_local_deployment_on_the_embedded_key_store_prints_a_key_to_call_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # AgentScope's local deployment: ``await app.deploy(LocalDeployManager(...))``, then calls
    # to the URL it returns. Every route but /health needs a key, and no command can add one
    # to the embedded store: as app.run(), the deployment prints one.
    deployer = LocalDeployManager(host="127.0.0.1", port=0)
    info = await build_app(CountingRunner()).deploy(deployer, settings=load_settings())
    try:
        printed = capsys.readouterr().out
        assert "development key (user 'dev', valid while this server runs): ask_" in printed
        key = printed.rsplit(": ", 1)[1].strip()
        # A script reads it where AgentScope's deployment record keeps it: its token.
        assert info["token"] == key
        client = HTTPAgentAPIClient(f"{info['url']}/process", token=info["token"])
        events = [e async for e in client.astream(create_simple_text_request("hi"))]
        assert reply_of(events) == "turn 1"
    finally:
        await deployer.stop(info["deploy_id"])


async def test_a_local_deployment_made_synchronously_in_a_running_loop_prints_its_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # deploy_sync, AgentScope's synchronous twin, called from a notebook cell's loop.
    deployer = LocalDeployManager(host="127.0.0.1", port=0)
    info = deployer.deploy_sync(build_app(CountingRunner()), settings=load_settings())
    try:
        key = capsys.readouterr().out.rsplit(": ", 1)[1].strip()
        async with httpx.AsyncClient(base_url=info["url"], headers=bearer(key)) as client:
            assert (await client.get("/async")).json() == {"hello": "x"}
    finally:
        deployer.stop_sync()


def test_the_fastapi_app_on_the_embedded_key_store_prints_a_key_to_call_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # ``uvicorn.run(app.get_fastapi_app())``, as AgentScope's users serve an app themselves.
    # The key is printed as that application starts: one never served prints none.
    web_app = build_app(CountingRunner()).get_fastapi_app(settings=load_settings())
    assert "development key" not in capsys.readouterr().out
    with running(web_app) as url:
        printed = capsys.readouterr().out
        assert "development key (user 'dev', valid while this server runs): ask_" in printed
        key = printed.rsplit(": ", 1)[1].strip()
        assert httpx.get(f"{url}/async", headers=bearer(key)).json() == {"hello": "x"}
