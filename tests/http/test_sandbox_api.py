"""The sandbox access API over real HTTP, on our sandbox server (a real process, bubblewrap)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.http import create_app
from agentscope_serverless.http.app import ROUTERS
from agentscope_serverless.local_stack import free_port
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, issue_key, running, user_message
from tests.support.sandbox_server import RunningServer, proc_scan_code


@pytest.fixture(scope="module")
def sandbox_api(sandbox_server: RunningServer, keys: Keys) -> Iterator[str]:
    """The sandbox function's app, on the session's sandbox server."""
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    with running(create_app(["sandbox"], settings=settings, key_store=keys.store)) as url:
        yield url


@pytest.fixture
def client(sandbox_api: str) -> Iterator[Callable[[str], httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(key: str) -> httpx.Client:
        clients.append(httpx.Client(base_url=sandbox_api, headers=bearer(key), timeout=30))
        return clients[-1]

    yield make
    for made in clients:
        made.close()


@pytest.fixture
def session() -> str:
    return f"s-{uuid.uuid4().hex[:10]}"


def stdout(result: dict[str, Any]) -> str:
    return "".join(p["text"] for p in result["content"] if p.get("description") == "stdout")


def run(client: httpx.Client, session: str, code: str) -> dict[str, Any]:
    response = client.post(f"/sandboxes/{session}/tools/run_ipython_cell", json={"code": code})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_a_tool_call_whose_client_leaves_is_stopped_in_the_sandbox(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    # The sandbox server stops a call whose client leaves, but the app, its client, stayed:
    # the cell ran on to its time limit (keeping what it defined), the user's next call
    # waiting behind it.
    alice = client(keys.alice)
    assert alice.post(f"/sandboxes/{session}", json={"types": ["base"]}).status_code == 200
    run(alice, session, "kept = 1")
    with pytest.raises(httpx.ReadTimeout):
        alice.post(
            f"/sandboxes/{session}/tools/run_ipython_cell",
            json={"code": "import time\ntime.sleep(30)"},
            timeout=1,
        )
    # Stopped, as the sandbox server stops a call whose client left: its variables are gone.
    after = run(alice, session, "print(kept)")
    assert "NameError" in "".join(p["text"] for p in after["content"])
    assert alice.delete(f"/sandboxes/{session}").json()["released"] is True


def test_connect_run_python_twice_keeping_state_then_release(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    alice = client(keys.alice)
    connected = alice.post(f"/sandboxes/{session}", json={"types": ["base"]})
    assert connected.status_code == 200
    [box] = connected.json()["sandboxes"]
    assert box["sandbox_type"] == "base"
    assert alice.post(f"/sandboxes/{session}").json()["sandboxes"] == [box]
    assert alice.get(f"/sandboxes/{session}").json()["sandboxes"] == [box]

    first = run(alice, session, "x = 6 * 7")
    assert first["isError"] is False
    assert stdout(run(alice, session, "print(x)")) == "42\n"

    tools = alice.get(f"/sandboxes/{session}/tools").json()["sandboxes"]
    assert tools[0]["sandbox_id"] == box["sandbox_id"]
    assert "run_ipython_cell" in tools[0]["tools"]["generic"]

    shell = alice.post(f"/sandboxes/{session}/tools/run_shell_command", json={"command": "echo hi"})
    assert stdout(shell.json()) == "hi\n"

    assert alice.delete(f"/sandboxes/{session}").json() == {"session_id": session, "released": True}
    assert alice.delete(f"/sandboxes/{session}").json()["released"] is False
    after = alice.post(f"/sandboxes/{session}/tools/run_ipython_cell", json={"code": "x"})
    assert after.status_code == 404


def test_another_user_never_reaches_the_sandbox_of_a_session(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    alice, bob = client(keys.alice), client(keys.bob)
    [alices] = alice.post(f"/sandboxes/{session}").json()["sandboxes"]
    run(alice, session, "secret = 'alice only'")

    assert bob.get(f"/sandboxes/{session}").json()["sandboxes"] == []
    assert (
        bob.post(f"/sandboxes/{session}/tools/run_ipython_cell", json={"code": "1"}).status_code
        == 404
    )
    [bobs] = bob.post(f"/sandboxes/{session}").json()["sandboxes"]
    assert bobs["sandbox_id"] != alices["sandbox_id"]
    assert stdout(run(bob, session, "print(globals().get('secret'))")) == "None\n"
    assert bob.delete(f"/sandboxes/{session}").json()["released"] is True
    assert stdout(run(alice, session, "print(secret)")) == "alice only\n"

    naming_bob = alice.get(f"/sandboxes/{session}", headers={"X-User-Id": "bob"})
    assert naming_bob.status_code == 403
    alice.delete(f"/sandboxes/{session}")


def test_ids_with_underscores_reach_separate_sandboxes(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    # Joined with "_" unescaped, (session "<s>_b", user "c<u>") and (session "<s>", user
    # "b_c<u>") would be one key.
    suffix = uuid.uuid4().hex[:6]
    first = client(issue_key(keys.store, f"c{suffix}"))
    second = client(issue_key(keys.store, f"b_c{suffix}"))
    [one] = first.post(f"/sandboxes/{session}_b").json()["sandboxes"]
    [two] = second.post(f"/sandboxes/{session}").json()["sandboxes"]
    assert one["sandbox_id"] != two["sandbox_id"]
    run(first, f"{session}_b", "mine = 1")
    assert stdout(run(second, session, "print('mine' in globals())")) == "False\n"
    first.delete(f"/sandboxes/{session}_b")
    second.delete(f"/sandboxes/{session}")


def test_erasing_a_users_data_releases_their_sandboxes_and_no_one_elses(
    sandbox_server: RunningServer, session: str
) -> None:
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    store = InMemoryKeyStore()
    app = create_app(["sessions", "sandbox", "users"], settings=settings, key_store=store)
    suffix = uuid.uuid4().hex[:6]
    # Ids joined past the length of a server's key are hashed in it, which names no user.
    sessions = [session, f"{session}_b", "_" * 400 + session]
    with running(app) as url:
        erased, other = (
            httpx.Client(base_url=url, headers=bearer(issue_key(store, name)), timeout=30)
            for name in (f"c{suffix}", f"b_c{suffix}")
        )
        with erased, other:
            for name in sessions:
                assert erased.post(f"/sandboxes/{name}").status_code == 200
            [kept] = other.post(f"/sandboxes/{session}").json()["sandboxes"]
            assert erased.delete("/users/me/data").status_code == 204
            for name in sessions:
                assert erased.get(f"/sandboxes/{name}").json()["sandboxes"] == []
            assert other.get(f"/sandboxes/{session}").json()["sandboxes"] == [kept]
            other.delete(f"/sandboxes/{session}")


def test_deleting_a_session_releases_its_sandboxes_and_no_other_sessions(
    sandbox_server: RunningServer, session: str
) -> None:
    # They stayed, with what the session's agent wrote in their workspaces, until the sandbox
    # server's idle timeout.
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    store = InMemoryKeyStore()
    app = create_app(["sessions", "sandbox"], settings=settings, key_store=store)
    with (
        running(app) as url,
        httpx.Client(base_url=url, headers=bearer(issue_key(store, "d")), timeout=30) as http,
    ):
        for name in (session, f"{session}-kept"):
            assert http.post(f"/sandboxes/{name}").status_code == 200
            run(http, name, "open('notes.txt', 'w').write('private')")
        [kept] = http.get(f"/sandboxes/{session}-kept").json()["sandboxes"]
        assert http.delete(f"/sessions/{session}").status_code == 204
        assert http.get(f"/sandboxes/{session}").json()["sandboxes"] == []
        assert http.get(f"/sandboxes/{session}-kept").json()["sandboxes"] == [kept]
        http.delete(f"/sandboxes/{session}-kept")


def test_the_functions_deleting_a_session_or_a_users_data_release_their_sandboxes(
    sandbox_server: RunningServer, session: str
) -> None:
    # As the stack deploys them: the sandboxes made through the sandbox function stayed, with
    # what was written in their workspaces, when the sessions function deleted their session
    # or the process function (its agent using no sandbox) erased their user's data.
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    store = InMemoryKeyStore()
    key = issue_key(store, "e")
    functions = [
        create_app(["sandbox"], settings=settings, key_store=store),
        create_app(["sessions", "runs"], settings=settings, key_store=store),
        create_app(["process", "users"], settings=settings, agent_app=demo_app, key_store=store),
    ]
    with (
        running(functions[0]) as sandbox_url,
        running(functions[1]) as sessions_url,
        running(functions[2]) as process_url,
        httpx.Client(base_url=sandbox_url, headers=bearer(key), timeout=30) as http,
    ):
        for name in (session, f"{session}-2"):
            assert http.post(f"/sandboxes/{name}").status_code == 200
            run(http, name, "open('notes.txt', 'w').write('private')")
        assert http.delete(f"{sessions_url}/sessions/{session}").status_code == 204
        assert http.get(f"/sandboxes/{session}").json()["sandboxes"] == []
        assert http.get(f"/sandboxes/{session}-2").json()["sandboxes"] != []
        assert http.delete(f"{process_url}/users/me/data").status_code == 204
        assert http.get(f"/sandboxes/{session}-2").json()["sandboxes"] == []


def test_connecting_with_an_async_type_name_again_keeps_the_sandbox_and_its_state(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    alice = client(keys.alice)
    [box] = alice.post(f"/sandboxes/{session}", json={"types": ["base_async"]}).json()["sandboxes"]
    run(alice, session, "x = 42")
    for types in (["base_async"], ["base"]):
        again = alice.post(f"/sandboxes/{session}", json={"types": types})
        assert again.json()["sandboxes"] == [box]
    assert alice.get(f"/sandboxes/{session}").json()["sandboxes"] == [box]
    query = {"sandbox_type": "base_async"}
    response = alice.post(
        f"/sandboxes/{session}/tools/run_ipython_cell", params=query, json={"code": "print(x)"}
    )
    assert stdout(response.json()) == "42\n"
    assert alice.delete(f"/sandboxes/{session}").json()["released"] is True


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/tools/no_such_tool", {}, 422),
        ("/tools/" + "t" * 129, {}, 422),
        ("/tools/run_ipython_cell", {"code": 3}, 422),
        ("/tools/run_ipython_cell?sandbox_type=browser", {"code": "1"}, 404),
    ],
)
def test_bad_tool_calls_get_4xx(
    client: Callable[[str], httpx.Client],
    keys: Keys,
    session: str,
    path: str,
    body: dict[str, Any],
    status: int,
) -> None:
    alice = client(keys.alice)
    alice.post(f"/sandboxes/{session}")
    response = alice.post(f"/sandboxes/{session}{path}", json=body)
    assert response.status_code == status, response.text
    assert set(response.json()["error"]) >= {"code", "message"}
    alice.delete(f"/sandboxes/{session}")


def test_a_misspelt_tool_on_a_session_of_several_sandboxes_is_named(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    # The answer asked which sandbox to run it on, as if the tool existed.
    alice = client(keys.alice)
    assert alice.post(f"/sandboxes/{session}", json={"types": ["base", "filesystem"]}).is_success
    response = alice.post(f"/sandboxes/{session}/tools/run_ipyton_cell", json={"code": "1"})
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "'run_ipyton_cell' is none of the built-in tools" in message
    assert "run_ipython_cell" in message.split("built-in tools", 1)[1]
    alice.delete(f"/sandboxes/{session}")


def test_an_unknown_sandbox_type_gets_422(
    client: Callable[[str], httpx.Client], keys: Keys, session: str
) -> None:
    response = client(keys.alice).post(f"/sandboxes/{session}", json={"types": ["no-such"]})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "SANDBOX_BAD_REQUEST"


@pytest.mark.parametrize("field", ["env_types", "sandbox_types"])
def test_the_types_under_the_python_apis_name_are_refused_naming_it_and_nothing_is_made(
    client: Callable[[str], httpx.Client], keys: Keys, session: str, field: str
) -> None:
    # connect_async's name for them was ignored, and a base sandbox made.
    alice = client(keys.alice)
    response = alice.post(f"/sandboxes/{session}", json={field: ["filesystem"]})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == field
    assert f"body.{field}: Extra inputs are not permitted" in response.json()["error"]["message"]
    assert alice.get(f"/sandboxes/{session}").json()["sandboxes"] == []


def test_the_sandbox_routes_need_a_key(sandbox_api: str) -> None:
    for method, path in (("POST", "/sandboxes/s"), ("GET", "/sandboxes/s/tools")):
        assert httpx.request(method, f"{sandbox_api}{path}").status_code == 401


def test_a_sandbox_server_that_is_down_gets_503(keys: Keys) -> None:
    settings = load_settings(
        sandbox_base_url=f"http://127.0.0.1:{free_port()}", sandbox_bearer_token="t" * 32
    )
    with running(create_app(["sandbox"], settings=settings, key_store=keys.store)) as url:
        response = httpx.post(f"{url}/sandboxes/s", headers=bearer(keys.alice), timeout=30)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "SANDBOX_UNAVAILABLE"


def test_a_token_the_sandbox_server_refuses_gets_503_and_health_says_so(
    sandbox_server: RunningServer, keys: Keys
) -> None:
    wrong = "wrongtoken0123456789"
    settings = load_settings(sandbox_base_url=sandbox_server.url, sandbox_bearer_token=wrong)
    with running(create_app(["sandbox"], settings=settings, key_store=keys.store)) as url:
        response = httpx.post(f"{url}/sandboxes/s", headers=bearer(keys.alice), timeout=30)
        health = httpx.get(f"{url}/health", timeout=30)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "SANDBOX_UNAVAILABLE"
    assert "refuses the configured credentials (SANDBOX_BEARER_TOKEN)" in error["message"]
    assert wrong not in response.text
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert health.json()["services"]["sandbox"] is False


def test_every_router_includes_sandbox_only_with_a_sandbox_server() -> None:
    assert "sandbox" in ROUTERS
    without = create_app(settings=load_settings())
    assert not any(p.startswith("/sandboxes") for p in without.openapi()["paths"])
    configured = load_settings(sandbox_base_url="http://127.0.0.1:9", sandbox_bearer_token="t" * 16)
    with_server = create_app(settings=configured)
    assert "/sandboxes/{session_id}/tools/{tool_name}" in with_server.openapi()["paths"]


def test_a_user_past_their_share_gets_429_and_the_next_user_still_gets_a_sandbox(
    sandbox_server: RunningServer, keys: Keys
) -> None:
    settings = load_settings(
        sandbox_base_url=sandbox_server.url,
        sandbox_bearer_token=sandbox_server.token,
        sandbox_max_per_user=2,
    )
    app = create_app(["sandbox"], settings=settings, key_store=keys.store)
    sessions = [f"share-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    with running(app) as url:
        alice = httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30)
        bob = httpx.Client(base_url=url, headers=bearer(keys.bob), timeout=30)
        with alice, bob:
            assert alice.post(f"/sandboxes/{sessions[0]}").status_code == 200
            assert alice.post(f"/sandboxes/{sessions[1]}").status_code == 200
            refused = alice.post(f"/sandboxes/{sessions[2]}")
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) > 0
            assert refused.json()["error"]["code"] == "SANDBOX_QUOTA"
            assert bob.post(f"/sandboxes/{sessions[2]}").status_code == 200
            assert alice.delete(f"/sandboxes/{sessions[0]}").json()["released"] is True
            assert alice.post(f"/sandboxes/{sessions[2]}").status_code == 200
            for user, session in ((alice, sessions[1]), (alice, sessions[2]), (bob, sessions[2])):
                assert user.delete(f"/sandboxes/{session}").json()["released"] is True


def embedded_servers_of(parent: int) -> list[bytes]:
    """The environments of the embedded sandbox servers ``parent`` started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if b"agentscope_serverless.sandbox_server\0--uds" in command and (
            f"PPid:\t{parent}\n" in status
        ):
            found.append((entry / "environ").read_bytes())
    return found


def test_the_apps_embedded_sandbox_server_sees_none_of_the_apps_secrets(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "canary-" + uuid.uuid4().hex
    monkeypatch.setenv("LLM_API_KEY", canary)
    monkeypatch.setenv("REDIS_URL", f"redis://:{canary}@127.0.0.1:1/0")
    monkeypatch.delenv("SANDBOX_BASE_URL", raising=False)
    app = create_app(["sandbox"], settings=load_settings(), key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as alice:
        session = f"s-{uuid.uuid4().hex[:10]}"
        assert alice.post(f"/sandboxes/{session}", timeout=60).status_code == 200
        scan = alice.post(
            f"/sandboxes/{session}/tools/run_ipython_cell",
            json={"code": proc_scan_code([canary])},
            timeout=60,
        )
        assert scan.status_code == 200, scan.text
        assert json.loads(stdout(scan.json()))["hits"] == []
        servers = embedded_servers_of(os.getpid())
        assert servers
        for environ in servers:
            assert canary.encode() not in environ
        assert alice.delete(f"/sandboxes/{session}").json()["released"] is True


def sandbox_agent() -> AgentApp:
    """An agent keeping a word in its session's sandbox, connected as ported code may do it:
    by session id alone."""
    app = AgentApp(app_name="sandboxed", with_sandbox=True)

    @app.query(framework="text")
    async def query(
        self: Any, msgs: list[Message], session: Any = None, **kwargs: Any
    ) -> AsyncIterator[str]:
        [box] = await self.sandbox_service.connect_async(session.id)
        text = msgs[-1].get_text_content() or ""
        code = f"word = {text[5:]!r}" if text.startswith("keep ") else "print(word)"
        result = await box.call_tool_async("run_ipython_cell", {"code": code})
        yield stdout(result) or "kept"

    return app


def test_a_sandbox_connected_in_a_run_without_a_user_is_the_runs_users(
    sandbox_server: RunningServer, keys: Keys, session: str
) -> None:
    settings = load_settings(
        sandbox_base_url=sandbox_server.url, sandbox_bearer_token=sandbox_server.token
    )
    app = create_app(settings=settings, agent_app=sandbox_agent(), key_store=keys.store)
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as client:

        def say(key: str, text: str) -> str:
            run = {"input": [user_message(text)], "session_id": session, "stream": False}
            answer = client.post("/process", json=run, headers=bearer(key))
            assert answer.status_code == 200, answer.text
            return str(answer.json()["output"][-1]["content"][0]["text"])

        assert say(keys.alice, "keep pineapple") == "kept"
        assert say(keys.alice, "tell") == "pineapple\n"
        assert "pineapple" not in say(keys.bob, "tell")
        for key in (keys.alice, keys.bob):
            client.delete(f"/sandboxes/{session}", headers=bearer(key))
