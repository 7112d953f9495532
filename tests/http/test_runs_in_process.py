"""Runs on the embedded (in-memory) runs store: ids on the wire, disconnects, and no storage."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import context as http_context
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS
from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services.agent_state import InMemoryStateService
from agentscope_serverless.services.memory import InMemoryMemoryService
from agentscope_serverless.settings import load_settings
from tests.http.conftest import scenario_app
from tests.support.backends import backend_settings
from tests.support.http import (
    Keys,
    bearer,
    invalid_status,
    parse_sse,
    running,
    stream,
    user_message,
)
from tests.support.slow_agent import app as slow_app


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys.make()


@pytest.fixture(scope="module")
def url(keys: Keys) -> Iterator[str]:
    web = create_app(settings=load_settings(), agent_app=slow_app, key_store=keys.store)
    with running(web) as served:
        yield served


def _status_when_finished(client: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        run = client.get(f"/runs/{run_id}").json()
        if run["status"] != "in_progress":
            return run
        assert time.monotonic() < deadline, "the run did not end"
        time.sleep(0.1)


def _leave_after_three_events(client: httpx.Client, body: dict[str, Any]) -> str:
    with client.stream("POST", "/process", json=body) as response:
        run_id = response.headers["X-Run-Id"]
        seen = 0
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
    return run_id


def test_a_client_leaving_does_not_cancel_the_run(url: str, keys: Keys) -> None:
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        body = {"input": [user_message("go")], "session_id": f"s-{uuid.uuid4().hex[:8]}"}
        run_id = _leave_after_three_events(client, body)
        assert _status_when_finished(client, run_id)["status"] == "completed"


def _leave_keyed(client: httpx.Client, body: dict[str, Any], key: str) -> str:
    with client.stream("POST", "/process", json=body, headers={"Idempotency-Key": key}) as sent:
        run_id = sent.headers["X-Run-Id"]
        next(line for line in sent.iter_lines() if line.startswith("data: "))
    return run_id


def test_a_keyed_request_whose_client_left_is_answered_once_its_run_ends(
    url: str, keys: Keys
) -> None:
    # The key was freed as the client left, while the run went on: the retry ran the agent
    # a second time under the same run id, and kept an answer the history did not hold.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    body = {"input": [user_message("go")], "session_id": session_id}
    key = f"k-{uuid.uuid4().hex}"
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        run_id = _leave_keyed(client, body, key)
        running_yet = client.post("/process", json=body, headers={"Idempotency-Key": key})
        assert running_yet.status_code == 409
        assert running_yet.json()["error"]["code"] == "REQUEST_IN_PROGRESS"
        assert _status_when_finished(client, run_id)["status"] == "completed"
        retry = client.post("/process", json=body, headers={"Idempotency-Key": key})
        assert retry.status_code == 200
        assert retry.headers["Idempotent-Replayed"] == "true"
        stored = client.get(f"/runs/{run_id}/events").text
        assert parse_sse(retry.text.split("\n")).data == parse_sse(stored.split("\n")).data
        items = client.get(f"/sessions/{session_id}/messages").json()["items"]
        assert [m["role"] for m in items] == ["user", "assistant"]
        [run] = client.get("/runs", params={"session_id": session_id}).json()["items"]
        assert run["id"] == run_id


def test_a_keyed_request_cancelled_by_its_client_leaving_frees_its_key(
    url: str, keys: Keys
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    body = {"input": [user_message("go")], "session_id": session_id, "cancel_on_disconnect": True}
    key = f"k-{uuid.uuid4().hex}"
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        run_id = _leave_keyed(client, body, key)
        assert _status_when_finished(client, run_id)["status"] == "canceled"
        body["stream"] = False
        body["cancel_on_disconnect"] = False
        retry = client.post("/process", json=body, headers={"Idempotency-Key": key})
        # Another body: the key was freed, not kept with the canceled run's answer.
        assert retry.status_code == 200, retry.text
        assert "Idempotent-Replayed" not in retry.headers


def test_cancel_on_disconnect_cancels_the_run_when_the_client_leaves(url: str, keys: Keys) -> None:
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        body = {
            "input": [user_message("go")],
            "session_id": session_id,
            "cancel_on_disconnect": True,
        }
        run_id = _leave_after_three_events(client, body)
        assert _status_when_finished(client, run_id)["status"] == "canceled"
        assert client.get(f"/state/{session_id}").json()["state"] == {"cleanup": True}


def test_cancel_on_disconnect_cancels_a_run_not_streamed_when_the_client_leaves(
    url: str, keys: Keys
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    body = {
        "input": [user_message("go")],
        "session_id": session_id,
        "stream": False,
        "cancel_on_disconnect": True,
    }
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        with pytest.raises(httpx.ReadTimeout):  # the client leaves before the answer
            client.post("/process", json=body, timeout=1)
        [run] = client.get("/runs", params={"session_id": session_id}).json()["items"]
        assert _status_when_finished(client, run["id"])["status"] == "canceled"
        assert client.get(f"/state/{session_id}").json()["state"] == {"cleanup": True}


@pytest.mark.parametrize("value", ["false", "true", 0, 1, [], {}])
def test_a_cancel_on_disconnect_other_than_true_or_false_is_refused_before_anything_runs(
    url: str, keys: Keys, value: Any
) -> None:
    # "false" (a string) was taken for true: the run stopped as its client left, its reply cut.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        sessions = client.get("/sessions", params={"limit": 1000}).json()["items"]
        for path, body in (
            ("/process", {"input": [user_message("go")], "session_id": session_id}),
            (
                "/compatible-mode/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True},
            ),
            (
                "/compatible-mode/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": "go"}]},
            ),
        ):
            response = client.post(path, json={**body, "cancel_on_disconnect": value})
            assert response.status_code == invalid_status(path), response.text
            error = response.json()["error"]
            assert error["param"] == "cancel_on_disconnect"
            assert error["message"] == "cancel_on_disconnect must be true or false"
        assert client.get("/sessions", params={"limit": 1000}).json()["items"] == sessions


# (route, body without the field, boolean fields of its body)
BOOLEAN_FIELDS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("/process", {"input": [user_message("go")]}, ("stream",)),
    (
        "/compatible-mode/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "go"}]},
        ("stream", "logprobs"),
    ),
    (
        "/compatible-mode/v1/responses",
        {"model": "m", "input": "go"},
        ("stream", "store", "background"),
    ),
]


@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, []])
@pytest.mark.parametrize(
    ("path", "body", "fields"), BOOLEAN_FIELDS, ids=[p for p, _, _ in BOOLEAN_FIELDS]
)
def test_a_boolean_field_other_than_true_or_false_is_refused_naming_it_before_anything_runs(
    url: str, keys: Keys, path: str, body: dict[str, Any], fields: tuple[str, ...], value: Any
) -> None:
    # "no" and 0 answered with JSON, "true" and 1 streamed: each was taken for what
    # pydantic made of it, where cancel_on_disconnect refused them.
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        for field in fields:
            sent = {**body, "session_id": session_id, field: value}
            response = client.post(path, json=sent)
            assert response.status_code == invalid_status(path), response.text
            error = response.json()["error"]
            assert error["param"] == field, error
            assert field in error["message"], error
        assert client.get("/runs", params={"session_id": session_id}).json()["items"] == []
        assert client.get(f"/sessions/{session_id}").status_code == 404


def test_a_run_cancelled_as_soon_as_its_id_is_known_stops(url: str, keys: Keys) -> None:
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        for _ in range(3):  # the first run of a server may be slow to send its first event
            body = {"input": [user_message("go")], "session_id": f"s-{uuid.uuid4().hex[:8]}"}
            with client.stream("POST", "/process", json=body) as response:
                run_id = response.headers["X-Run-Id"]
                with httpx.Client(base_url=url, headers=bearer(keys.alice)) as other:
                    cancel = other.post(f"/runs/{run_id}/cancel")
                events = parse_sse(list(response.iter_lines())).data
            assert cancel.status_code == 202, cancel.text
            assert cancel.json()["cancel_requested"] is True
            assert events[-1]["object"] == "response" and events[-1]["status"] == "canceled"
            assert _status_when_finished(client, run_id)["status"] == "canceled"


def test_every_streamed_event_carries_its_sequence_number_as_its_id(url: str, keys: Keys) -> None:
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        body = {"input": [user_message("go")], "session_id": f"s-{uuid.uuid4().hex[:8]}"}
        response, sse = stream(client, "/process", json=body)
        assert sse.ids == [str(event["sequence_number"]) for event in sse.data]
        assert response.headers["X-Run-Id"] == sse.data[0]["id"]
        replay = client.get(
            f"/runs/{sse.data[0]['id']}/events", headers={"Last-Event-ID": sse.ids[-2] or ""}
        )
        assert parse_sse(replay.text.split("\n")[:-1]).data == sse.data[-1:]
        bad = client.get(f"/runs/{sse.data[0]['id']}/events", headers={"Last-Event-ID": "x"})
        assert bad.status_code == 422


def test_a_position_to_resume_from_is_decimal_digits_only(url: str, keys: Keys) -> None:
    # Python's int() read "1_0" as 10 and "+3" as 3: ids no event is sent with.
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        body = {"input": [user_message("go")], "stream": False}
        events = f"/runs/{client.post('/process', json=body).headers['X-Run-Id']}/events"

        def numbers(response: httpx.Response) -> list[int]:
            assert response.status_code == 200, response.text
            return [e["sequence_number"] for e in parse_sse(response.text.split("\n")).data]

        every = numbers(client.get(events))
        for written, after in (("10", 10), ("010", 10), ("-1", -1), ("", -1)):
            assert numbers(client.get(events, headers={"Last-Event-ID": written})) == [
                n for n in every if n > after
            ]
        assert numbers(client.get(events, params={"after": "010"})) == every[11:]
        assert numbers(client.get(events, params={"after": "-1"})) == every
        for bad in ("1_0", "+3", "1.0", "0x1", "1e1", "- 1"):
            refused = client.get(events, headers={"Last-Event-ID": bad})
            assert refused.status_code == 422, bad
            assert refused.json()["error"]["code"] == "INVALID_INPUT"
        for bad in ("1_0", "+3", " 3 ", "1.0", "\u0663", "-2", ""):
            assert client.get(events, params={"after": bad}).status_code == 422, bad


def test_a_bad_last_event_id_is_refused_as_after_is_naming_the_header(url: str, keys: Keys) -> None:
    # It was refused naming nothing (param null, loc []), and "-5" replayed the run where
    # ?after=-5 was refused.
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        body = {"input": [user_message("go")], "stream": False}
        events = f"/runs/{client.post('/process', json=body).headers['X-Run-Id']}/events"
        for bad in ("xyz", "-5", "9" * 5000):
            refused = client.get(events, headers={"Last-Event-ID": bad})
            assert refused.status_code == 422, bad
            error = refused.json()["error"]
            assert error["param"] == "Last-Event-ID", bad
            assert error["fields"][0]["loc"] == ["header", "Last-Event-ID"], bad
            assert client.get(events, params={"after": bad}).status_code == 422, bad


def test_a_sessions_runs_are_listed_by_its_id_as_sessions_take_it(url: str, keys: Keys) -> None:
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        body = {"input": [user_message("go")], "session_id": f" {session_id} ", "stream": False}
        response = client.post("/process", json=body)
        assert response.status_code == 200, response.text
        run_id = response.headers["X-Run-Id"]
        for given in (session_id, f" {session_id}\t"):
            listed = client.get("/runs", params={"session_id": given})
            assert [run["id"] for run in listed.json()["items"]] == [run_id]
        for bad in ("\x00", f"{session_id}\x1c", " "):
            refused = client.get("/runs", params={"session_id": bad})
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["code"] == "INVALID_INPUT"


def test_without_a_runs_store_runs_stream_directly(keys: Keys) -> None:
    settings = load_settings(runs_backend="none")
    web = create_app(settings=settings, agent_app=slow_app, key_store=keys.store)
    with running(web) as served, httpx.Client(base_url=served, headers=bearer(keys.alice)) as c:
        body = {"input": [user_message("go")], "stream": False}
        answer = c.post("/process", json=body, timeout=30)
        assert answer.status_code == 200 and answer.json()["status"] == "completed"
        assert answer.headers["X-Run-Id"] == answer.json()["id"]
        assert c.get(f"/runs/{answer.json()['id']}").status_code == 404


def test_a_run_in_progress_outlasts_another_users_traffic(keys: Keys) -> None:
    # The store kept its 1,000 newest runs, whoever's: Bob's calls pushed Alice's run out
    # while it went on (404, its cancel a 404), and it was not stored as it ended.
    web = create_app(settings=load_settings(), agent_app=scenario_app(), key_store=keys.store)
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.alice), timeout=30) as alice,
        httpx.Client(base_url=served, headers=bearer(keys.bob), timeout=30) as bob,
    ):
        body = {"input": [user_message("sleep 30")], "stream": True}
        with alice.stream("POST", "/process", json=body) as going:
            run_id = going.headers["X-Run-Id"]
            while alice.get(f"/runs/{run_id}").status_code == 404:  # stored within 50 ms
                time.sleep(0.01)
            quick = {"input": [user_message("hi")], "stream": False}
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                calls = pool.map(lambda _: bob.post("/process", json=quick), range(1010))
                assert {answer.status_code for answer in calls} == {200}
            assert alice.get(f"/runs/{run_id}").json()["status"] == "in_progress"
            assert alice.post(f"/runs/{run_id}/cancel").status_code == 202
            assert [line for line in going.iter_lines() if line.startswith("data: ")]
        assert alice.get(f"/runs/{run_id}").json()["status"] == "canceled"


@pytest.mark.parametrize("erase", ["user", "session"])
def test_erasing_stops_a_run_of_this_process_not_stored_yet(keys: Keys, erase: str) -> None:
    # A run is stored first_write_delay after it starts: an erase in between found it in no
    # store. Here the delay outlasts the run, as a run started just before an erase.
    web = create_app(settings=load_settings(), agent_app=slow_app, key_store=keys.store)
    web.state.context.recorder.first_write_delay = 60
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.bob), timeout=30) as client,
    ):
        body = {"input": [user_message("go")], "session_id": session_id}
        with client.stream("POST", "/process", json=body) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            path = "/users/me/data" if erase == "user" else f"/sessions/{session_id}"
            assert client.delete(path).status_code == 204
            rest = parse_sse(list(lines))
        assert rest.data[-1]["status"] == "canceled"
        for _ in range(2):
            assert client.get(f"/sessions/{session_id}").status_code == 404
            assert client.get("/runs", params={"session_id": session_id}).json()["items"] == []
            time.sleep(0.5)


def recalling_app(recalling: threading.Event, gate: threading.Event) -> AgentApp:
    """An agent whose memories take until ``gate`` opens to be recalled (a slow store)."""
    app = AgentApp(app_name="recalling")

    class SlowMemory(InMemoryMemoryService):
        async def search_memory(self, *args: Any, **kwargs: Any) -> list[Message]:
            recalling.set()
            await asyncio.to_thread(gate.wait, 30)
            return await super().search_memory(*args, **kwargs)

    @app.init
    async def init(self: Any) -> None:
        memory = SlowMemory()
        await memory.start()  # whoever assigns a service starts it
        self.memory_service = memory

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "answered"

    return app


@pytest.mark.parametrize("erase", ["user", "session"])
def test_erasing_stops_a_run_of_this_process_still_loading_its_session(
    keys: Keys, erase: str
) -> None:
    # Deleting the session did not stop a run that had not begun (its session is known
    # from its first event): the run then stored its turn, making the session again. An
    # erase stopped it, but its request failed with a 500.
    recalling, gate = threading.Event(), threading.Event()
    web = create_app(
        settings=load_settings(), agent_app=recalling_app(recalling, gate), key_store=keys.store
    )
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.bob), timeout=30) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        body = {"input": [user_message("go")], "session_id": session_id, "stream": False}
        try:
            sent = pool.submit(client.post, "/process", json=body)
            assert recalling.wait(30)
            path = "/users/me/data" if erase == "user" else f"/sessions/{session_id}"
            assert client.delete(path).status_code == 204
        finally:
            gate.set()
        refused = sent.result()
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "RUN_CANCELED"
        assert refused.headers["X-Should-Retry"] == "false"
        assert client.get(f"/sessions/{session_id}").status_code == 404
        assert client.get("/runs", params={"session_id": session_id}).json()["items"] == []


def stubborn_app(stopping: threading.Event, gate: threading.Event) -> AgentApp:
    """An agent whose cleanup, once cancelled, lasts until ``gate`` opens, then ends its
    reply all the same."""
    app = AgentApp(app_name="stubborn")

    @app.query(framework="text")
    async def query(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "started. "
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopping.set()
            cleanup = asyncio.ensure_future(asyncio.to_thread(gate.wait, 30))
            while not cleanup.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(cleanup)
        yield "finished."

    return app


@pytest.mark.parametrize("where", ["here", "elsewhere"])
@pytest.mark.parametrize("erase", ["user", "session"])
def test_a_run_outlasting_an_erase_stores_nothing_after_it(
    keys: Keys,
    erase: str,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # The erase waits a few seconds for the runs it stops; one still going then stored its
    # turn (the session again, with the whole conversation) and its run once it ended.
    monkeypatch.setattr(http_context, "STOP_TIMEOUT_SECONDS", 0.5)
    stopping, gate = threading.Event(), threading.Event()
    app = stubborn_app(stopping, gate)
    settings = load_settings(
        **backend_settings("redis" if where == "elsewhere" else "in_memory", request)
    )
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        served = [
            stack.enter_context(
                running(create_app(settings=settings, agent_app=app, key_store=keys.store))
            )
            for _ in range(2 if where == "elsewhere" else 1)
        ]
        running_on, erasing_on = (
            stack.enter_context(httpx.Client(base_url=url, headers=bearer(keys.bob), timeout=30))
            for url in (served[0], served[-1])
        )
        body = {"input": [user_message("go")], "session_id": session_id}
        try:
            with running_on.stream("POST", "/process", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if "started" in line)
                path = "/users/me/data" if erase == "user" else f"/sessions/{session_id}"
                assert erasing_on.delete(path).status_code == 204
                assert stopping.is_set()
                gate.set()
                rest = parse_sse(list(lines))
        finally:
            gate.set()
        assert rest.data[-1]["object"] == "response"
        for client in (running_on, erasing_on):
            assert client.get(f"/sessions/{session_id}").status_code == 404
            assert client.get("/runs", params={"session_id": session_id}).json()["items"] == []
            assert client.get(f"/runs/{response.headers['X-Run-Id']}").status_code == 404


def slow_erase_app(
    erasing: threading.Event,
    gate: threading.Event,
    answering: threading.Event,
    released: threading.Event,
) -> AgentApp:
    """An agent answering with what the user said in its session; asked "again", it ends
    its reply only once cancelled or ``released`` (``answering`` set meanwhile). Its state
    takes until ``gate`` opens to be erased: the other stores wait behind it."""
    app = AgentApp(app_name="slow-erase")

    class SlowErase(InMemoryStateService):
        async def delete_state(self, user_id: str, session_id: str | None = None) -> None:
            erasing.set()
            await asyncio.to_thread(gate.wait, 30)
            await super().delete_state(user_id, session_id)

        async def delete_user_state(self, user_id: str) -> None:
            erasing.set()
            await asyncio.to_thread(gate.wait, 30)
            await super().delete_user_state(user_id)

    @app.init
    async def init(self: Any) -> None:
        state = SlowErase()
        await state.start()  # whoever assigns a service starts it
        self.state_service = state

    @app.query(framework="text")
    async def query(
        self: Any, msgs: list[Message], *, session: Any, **kwargs: Any
    ) -> AsyncIterator[str]:
        said = [m.get_text_content() for m in session.messages if m.role == "user"]
        yield f"you said {said}. "
        if msgs[-1].get_text_content() == "again":
            answering.set()
            await asyncio.to_thread(released.wait, 30)
        yield "bye"

    return app


@pytest.mark.parametrize("erase", ["user", "session"])
def test_a_turn_started_during_an_erase_keeps_nothing_of_what_was_erased(
    keys: Keys, erase: str
) -> None:
    # A client sending its next turn at once, while its data was erased: the turn read the
    # conversation being erased, and stored its reply quoting it after the erase's 204.
    erasing, gate, answering, released = (threading.Event() for _ in range(4))
    agent = slow_erase_app(erasing, gate, answering, released)
    web = create_app(settings=load_settings(), agent_app=agent, key_store=keys.store)
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    path = "/users/me/data" if erase == "user" else f"/sessions/{session_id}"
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.bob), timeout=30) as client,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):

        def turn(text: str) -> httpx.Response:
            body = {"input": [user_message(text)], "session_id": session_id, "stream": False}
            return client.post("/process", json=body)

        assert turn("secret-one").status_code == 200
        try:
            erased = pool.submit(client.delete, path)
            assert erasing.wait(30)  # its runs stopped and deleted: the stores go next
            sent = pool.submit(turn, "again")
            assert answering.wait(30)  # it has read the session
        finally:
            gate.set()
        try:
            assert erased.result().status_code == 204
        finally:
            released.set()
        sent.result()
        assert client.get(f"/sessions/{session_id}").status_code == 404
        assert client.get("/runs", params={"session_id": session_id}).json()["items"] == []


@pytest.mark.parametrize("backend", ["redis", "dynamodb"])
def test_a_run_whose_session_expired_is_gone(
    keys: Keys, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its session expired (SESSION_TTL_SECONDS), the run and its events were still read,
    # with the conversation: only the runs' own, longer, expiry ended them.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
    settings = load_settings(**backend_settings(backend, request), session_ttl_seconds=2)
    web = create_app(settings=settings, agent_app=demo_app, key_store=keys.store)
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.alice), timeout=30) as client,
    ):
        body = {"input": [user_message("My name is Ada")], "stream": False}
        run_id = client.post("/process", json=body).headers["X-Run-Id"]
        assert client.get(f"/runs/{run_id}").json()["status"] == "completed"
        time.sleep(3.5)  # both stores expire whole seconds
        for path in (f"/runs/{run_id}", f"/runs/{run_id}/events"):
            gone = client.get(path)
            assert gone.status_code == 404, path
            assert gone.json()["error"]["code"] == "RUN_NOT_FOUND"


@pytest.mark.parametrize("backend", ["redis", "dynamodb"])
def test_a_run_whose_session_expired_is_neither_listed_nor_canceled(
    keys: Keys, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GET /runs/{run_id} answered 404 for it, but the session's list still held it, and a
    # cancel answered 409 "the run has already ended", as for a run still there.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LOCAL_AWS_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LOCAL_AWS_CREDENTIALS["aws_secret_access_key"])
    settings = load_settings(**backend_settings(backend, request), session_ttl_seconds=2)
    web = create_app(settings=settings, agent_app=demo_app, key_store=keys.store)
    session_id = f"s-{uuid.uuid4().hex[:8]}"
    with (
        running(web) as served,
        httpx.Client(base_url=served, headers=bearer(keys.alice), timeout=30) as client,
    ):
        body = {"input": [user_message("I am Ada")], "stream": False, "session_id": session_id}
        run_id = client.post("/process", json=body).headers["X-Run-Id"]
        listed = client.get("/runs", params={"session_id": session_id}).json()["items"]
        assert [run["id"] for run in listed] == [run_id]
        time.sleep(3.5)  # both stores expire whole seconds
        after = client.get("/runs", params={"session_id": session_id})
        canceled = client.post(f"/runs/{run_id}/cancel")
    assert after.status_code == 200
    assert after.json()["items"] == []
    assert canceled.status_code == 404
    assert canceled.json()["error"]["code"] == "RUN_NOT_FOUND"


@pytest.mark.parametrize(
    "accept",
    [
        "application/json",
        "application/xml",
        "*/*;q=0",
        "text/event-stream;q=0",
        "text/*, text/event-stream;q=0",
        "application/json, text/plain",
    ],
)
def test_an_accept_not_taking_events_is_a_406_to_a_runs_events(
    client_for: Callable[..., httpx.Client], keys: Keys, accept: str
) -> None:
    # It was ignored: a 200 event stream.
    client = client_for(keys.alice)
    body = {"input": [user_message("hi")], "stream": False}
    run_id = client.post("/process", json=body).headers["X-Run-Id"]
    refused = client.get(f"/runs/{run_id}/events", headers={"Accept": accept})
    assert refused.status_code == 406, refused.text
    error = refused.json()["error"]
    assert error["code"] == "NOT_ACCEPTABLE"
    assert error["message"].startswith("Accept does not take text/event-stream")
    anonymous = client_for(None).get(f"/runs/{run_id}/events", headers={"Accept": accept})
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    "accept",
    [None, "*/*", "", "text/*", "text/event-stream", "text/event-stream;q=0.2, */*;q=0"],
)
def test_an_accept_taking_events_is_answered_a_runs_events(
    client_for: Callable[..., httpx.Client], keys: Keys, accept: str | None
) -> None:
    client = client_for(keys.alice)
    body = {"input": [user_message("hi")], "stream": False}
    run_id = client.post("/process", json=body).headers["X-Run-Id"]
    if accept is None:
        client.headers.pop("Accept")  # httpx sends */* by default
    headers = {} if accept is None else {"Accept": accept}
    answered = client.get(f"/runs/{run_id}/events", headers=headers)
    assert answered.status_code == 200, answered.text
    assert answered.headers["content-type"].startswith("text/event-stream")
    assert parse_sse(answered.text.split("\n")).data[-1]["status"] == "completed"
