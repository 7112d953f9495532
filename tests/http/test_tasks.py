"""Background tasks: submit, poll to completion, read the result; failures keep their error."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from agentscope_serverless.agents.a2a_tool import a2a_agent_tool
from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.agents.tools import AgentTool
from agentscope_serverless.app import AgentApp
from agentscope_serverless.http import create_app
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, bearer, running

app = AgentApp(app_name="worker")


@app.query(framework="text")
async def query(self: Any, msgs: Any, **kwargs: Any) -> str:
    return "ok"


@app.task("/jobs/sum", queue="numbers")
async def add_up(payload: dict[str, Any]) -> dict[str, int]:
    await asyncio.sleep(0.3)
    return {"sum": sum(payload["numbers"])}


@app.task("/jobs/count")
def count_words(payload: dict[str, Any]) -> int:
    time.sleep(0.1)
    return len(payload["text"].split())


@app.task("/jobs/scale")
def scale(payload: dict[str, Any]) -> dict[str, Any]:
    return {"scaled": [x * payload["by"] for x in payload["numbers"]]}


@app.task("/jobs/tally")
def tally(payload: dict[str, Any]) -> dict[Any, int]:
    return dict(collections.Counter(payload["items"]))


@app.task("/jobs/wait")
async def wait(payload: dict[str, Any]) -> str:
    await asyncio.sleep(payload["seconds"])
    return "waited"


# One gate per call of /jobs/gate, in order: the call returns its number once its gate opens.
GATES: list[threading.Event] = []


@app.task("/jobs/gate")
def gate(payload: Any) -> int:
    opened = threading.Event()
    GATES.append(opened)
    number = len(GATES)
    opened.wait(timeout=30)
    return number


# Set by /jobs/pages as it takes its second step, which waits for RELEASED.
STEPPING = threading.Event()
RELEASED = threading.Event()


@app.task("/jobs/pages")
def pages(payload: int) -> Iterator[dict[str, int]]:
    for page in range(payload):
        if page == 1:
            STEPPING.set()
            RELEASED.wait(timeout=30)
        yield {"page": page}


@app.task("/jobs/async-pages")
async def async_pages(payload: int) -> AsyncIterator[int]:
    for page in range(payload):
        await asyncio.sleep(0)
        yield page


JSON = {"Content-Type": "application/json"}
# The payloads /jobs/note was run on.
NOTED: list[Any] = []


@app.task("/jobs/note")
def note(payload: Any) -> None:
    NOTED.append(payload)


@app.task("/jobs/fail")
async def fail(payload: Any) -> None:
    raise ValueError("the numbers do not add up")


@app.task("/jobs/gather")
async def gather(payload: Any) -> list[None]:
    # One of the awaited steps was cancelled (by a timeout of its own, say): awaiting it
    # raises CancelledError in the task, which nobody cancelled.
    step = asyncio.ensure_future(asyncio.sleep(10))
    step.cancel()
    return await asyncio.gather(step)


# The chat API's key, as the settings hold it (made here: a traceback quotes source lines).
LLM_KEY = "sk-tasks-" + "0123456789"


@app.task("/jobs/call")
async def call(payload: Any) -> None:
    raise RuntimeError(f"the chat API refused the key {LLM_KEY}")


# The tool a task calls, made by the test that needs it (it reads the remote agent's card).
REMOTE: dict[str, AgentTool] = {}


@app.task("/jobs/ask-remote")
async def ask_remote(payload: dict[str, Any]) -> str:
    return await REMOTE["agent"].invoke(json.dumps({"message": payload["message"]}))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Keys]]:
    keys = Keys.make()
    settings = load_settings(llm_api_key=LLM_KEY)
    web = create_app(settings=settings, agent_app=app, key_store=keys.store)
    with running(web) as url:
        yield url, keys


def _wait_for(client: httpx.Client, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        status = client.get(f"/tasks/{task_id}").json()
        if status["status"] != "in_progress":
            return status
        assert time.monotonic() < deadline, "the task did not finish"
        time.sleep(0.05)


def test_a_task_is_submitted_at_once_and_its_result_read_when_done(
    server: tuple[str, Keys],
) -> None:
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        submitted = client.post("/jobs/sum", json={"numbers": [1, 2, 3]})
        assert submitted.status_code == 202
        body = submitted.json()
        assert body["status"] == "submitted" and body["queue"] == "numbers"
        task_id = body["task_id"]
        assert client.get(f"/tasks/{task_id}").json()["status"] == "in_progress"
        done = _wait_for(client, task_id)
        assert done["status"] == "completed" and done["result"] == {"sum": 6}
        assert done["error"] is None and done["path"] == "/jobs/sum"
        # Its own path answers as AgentScope Runtime's does: a client polling for
        # "finished" (it saw "completed" for ever) reads the result.
        polled = client.get(f"/jobs/sum/{task_id}").json()
        assert (polled["status"], polled["result"]) == ("finished", {"sum": 6})
        assert polled["task_id"] == task_id
        assert body["message"] == f"Task {task_id} submitted to queue numbers"
        counted = client.post("/jobs/count", json={"text": "three little words"}).json()
        assert _wait_for(client, counted["task_id"])["result"] == 3


def test_a_generator_tasks_items_are_its_result_made_while_the_server_answers(
    server: tuple[str, Keys],
) -> None:
    # A plain generator was run on the server's loop once its task had ended: nothing was
    # answered while it took its steps. An async generator's task failed (unserializable).
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/pages", json=3).json()["task_id"]
        assert STEPPING.wait(timeout=30)
        try:
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            assert client.get(f"/tasks/{task_id}").json()["status"] == "in_progress"
        finally:
            RELEASED.set()
        done = _wait_for(client, task_id)
        assert done["result"] == [{"page": 0}, {"page": 1}, {"page": 2}], done
        task_id = client.post("/jobs/async-pages", json=3).json()["task_id"]
        assert _wait_for(client, task_id)["result"] == [0, 1, 2]


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        # curl -d sends its data as a form: the task got the JSON text as a string.
        ("application/x-www-form-urlencoded", b'{"numbers": [1, 2]}'),
        ("text/plain", b"not JSON"),
        ("application/octet-stream", b"\xff\xfe"),  # the task failed decoding it
    ],
)
def test_a_body_that_is_not_json_is_refused_and_no_task_runs(
    server: tuple[str, Keys], content_type: str, body: bytes
) -> None:
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        response = client.post("/jobs/scale", content=body, headers={"Content-Type": content_type})
        assert response.status_code == 415, response.text
        assert response.json()["error"]["message"] == (
            f"the body must be JSON (Content-Type: application/json), not {content_type!r}"
        )
        # Sent as JSON, it is submitted.
        sent = client.post("/jobs/scale", json={"numbers": [1, 2], "by": 3})
        assert _wait_for(client, sent.json()["task_id"])["result"] == {"scaled": [3, 6]}


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
def test_no_body_is_refused_and_no_task_runs(server: tuple[str, Keys], content_type: str) -> None:
    # The task was submitted and ran on None, as if the body had been JSON null.
    url, keys = server
    headers = {"Content-Type": content_type} if content_type else {}
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        NOTED.clear()
        empty = client.post("/jobs/note", headers=headers)
        assert empty.status_code == 422, empty.text
        assert empty.json()["error"]["fields"][0]["loc"] == ["body"]
        assert "body is required" in empty.json()["error"]["message"]
        # Any JSON value is a task's argument, null too.
        for value in (None, [1], "text", 3, {"a": 1}):
            sent = client.post("/jobs/note", content=json.dumps(value), headers=JSON)
            assert _wait_for(client, sent.json()["task_id"])["status"] == "completed"
        assert NOTED == [None, [1], "text", 3, {"a": 1}]


@pytest.mark.parametrize(
    ("content_type", "body", "status", "says"),
    [
        ("application/json", '{"numbers": [1], "by": 2}'.encode("utf-16"), 422, "UTF-8"),
        ("application/json", '{"numbers": [1], "by": 2}'.encode("utf-32-le"), 422, "UTF-8"),
        ("application/json; charset=latin-1", b'{"numbers": [1], "by": 2}', 415, "UTF-8"),
    ],
    ids=["utf-16", "utf-32-le", "charset=latin-1"],
)
def test_a_body_that_is_not_utf8_is_refused_and_no_task_runs(
    server: tuple[str, Keys], content_type: str, body: bytes, status: int, says: str
) -> None:
    # Python's JSON parser read UTF-16 and UTF-32 too: the task was submitted and ran.
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        response = client.post("/jobs/scale", content=body, headers={"Content-Type": content_type})
        assert response.status_code == status, response.text
        assert says in response.json()["error"]["message"]
        assert "task_id" not in response.json()


def test_a_failing_task_reports_its_error(server: tuple[str, Keys]) -> None:
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/fail", json={}).json()["task_id"]
        failed = _wait_for(client, task_id)
        assert failed["status"] == "failed" and failed["result"] is None
        assert failed["error"] == {
            "code": "TASK_FAILED",
            "message": "ValueError: the numbers do not add up",
        }
        polled = client.get(f"/jobs/fail/{task_id}").json()
        assert (polled["status"], polled["result"]) == (
            "error",
            "ValueError: the numbers do not add up",
        )
        pending = client.post("/jobs/sum", json={"numbers": [1]}).json()["task_id"]
        assert client.get(f"/jobs/sum/{pending}").json()["status"] == "pending"


class OwnBaseException(BaseException):
    """An exception of a library's own that is no ``Exception``."""


# What /jobs/raise and /jobs/raise-plain raise, by the payload naming it.
RAISED: dict[str, tuple[type[BaseException], str]] = {
    "interrupt": (KeyboardInterrupt, "stop"),
    "generator-exit": (GeneratorExit, "closed"),
    "own": (OwnBaseException, "its own"),
}
raising = AgentApp(app_name="raising")


@raising.query(framework="text")
async def answer(self: Any, msgs: Any, **kwargs: Any) -> str:
    return "ok"


@raising.task("/jobs/raise")
async def raise_it(payload: str) -> None:
    kind, text = RAISED[payload]
    raise kind(text)


@raising.task("/jobs/raise-plain")
def raise_it_plain(payload: str) -> None:
    kind, text = RAISED[payload]
    raise kind(text)


@raising.task("/jobs/first")
def first(payload: list[int]) -> int:
    return next(iter(payload))  # StopIteration for an empty list: a common slip


def test_a_plain_task_raising_stop_iteration_fails_at_once() -> None:
    # The thread's future refused StopIteration as its exception: the task stayed in
    # progress for ever (on Lambda, until the function's time limit, reported as such).
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=raising, key_store=keys.store)
    with running(web) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        failed = _wait_for(client, client.post("/jobs/first", json=[]).json()["task_id"])
        assert failed["status"] == "failed"
        message = "RuntimeError: a plain function raised StopIteration"
        assert failed["error"] == {"code": "TASK_FAILED", "message": message}
        done = _wait_for(client, client.post("/jobs/first", json=[7]).json()["task_id"])
        assert (done["status"], done["result"]) == ("completed", 7)


def test_a_task_raising_what_is_no_exception_fails_and_the_server_goes_on() -> None:
    # A KeyboardInterrupt ended the server; the others left the task in progress, read as
    # lost a minute later.
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=raising, key_store=keys.store)
    with running(web) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as client:
        for path in ("/jobs/raise", "/jobs/raise-plain"):
            for name, (kind, text) in RAISED.items():
                task_id = client.post(path, json=name).json()["task_id"]
                failed = _wait_for(client, task_id)
                assert failed["status"] == "failed"
                message = f"{kind.__name__}: {text}"
                assert failed["error"] == {"code": "TASK_FAILED", "message": message}
        assert client.get("/health").status_code == 200


def test_a_task_failing_with_a_cancellation_of_its_own_fails_saying_so(
    server: tuple[str, Keys],
) -> None:
    # It stayed in progress, then read as lost a minute later, as if its server had stopped.
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/gather", json={}).json()["task_id"]
        status = _wait_for(client, task_id)
    assert status["status"] == "failed"
    assert status["error"] == {"code": "TASK_FAILED", "message": "CancelledError: "}


def test_a_failed_tasks_error_shows_no_secret(server: tuple[str, Keys]) -> None:
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/call", json={}).json()["task_id"]
        failed = _wait_for(client, task_id)
        polled = client.get(f"/jobs/call/{task_id}").json()
    message = "RuntimeError: the chat API refused the key ***"
    assert failed["error"] == {"code": "TASK_FAILED", "message": message}
    assert polled["result"] == message


@pytest.fixture(scope="module")
def remote() -> Iterator[tuple[str, Keys]]:
    """The demo agent, which remembers what its users tell it, over A2A."""
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=demo_app, key_store=keys.store)
    with running(web) as url:
        yield url, keys


async def test_a_task_calling_a_remote_agent_does_it_for_the_user_who_submitted_it(
    server: tuple[str, Keys], remote: tuple[str, Keys]
) -> None:
    # The task of one user must not be another user at the remote agent (nor one user
    # shared by all who submit tasks): alice's key there acts in alice's tasks only.
    url, keys = server
    remote_url, remote_keys = remote
    REMOTE["agent"] = await a2a_agent_tool(remote_url, api_key=remote_keys.alice)

    def ask(key: str, message: str) -> str:
        with httpx.Client(base_url=url, headers=bearer(key), timeout=30) as client:
            submitted = client.post("/jobs/ask-remote", json={"message": message})
            return str(_wait_for(client, submitted.json()["task_id"])["result"])

    assert "Nice to meet you, Zed" in ask(keys.alice, "My name is Zed")
    assert "Your name is Zed" in ask(keys.alice, "What is my name?")
    assert "Zed" not in ask(keys.bob, "What is my name?")


def test_a_result_json_cannot_carry_fails_the_task_saying_where(
    server: tuple[str, Keys],
) -> None:
    # An infinite number was stored as null, the task completed.
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/scale", json={"numbers": [1, 1e308], "by": 10}).json()
        failed = _wait_for(client, task_id["task_id"])
        assert failed["status"] == "failed" and failed["result"] is None
        assert failed["error"]["code"] == "TASK_FAILED"
        assert failed["error"]["message"].startswith(
            "InvalidInputError: result.scaled.1 is not a number JSON can carry"
        )
        fine = client.post("/jobs/scale", json={"numbers": [1, 2.5], "by": 2}).json()
        assert _wait_for(client, fine["task_id"])["result"] == {"scaled": [2, 5.0]}


def test_a_result_with_two_keys_json_writes_as_one_fails_the_task_naming_them(
    server: tuple[str, Keys],
) -> None:
    # The tally of 1 and "1" was stored as {"1": 1}, one count lost, the task completed.
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/tally", json={"items": [1, "1", 2]}).json()["task_id"]
        failed = _wait_for(client, task_id)
        assert failed["status"] == "failed" and failed["result"] is None
        assert failed["error"]["message"].startswith(
            "InvalidInputError: result has the keys 1 and '1', which are one key in JSON"
        )
        fine = client.post("/jobs/tally", json={"items": ["a", 2, "a"]}).json()["task_id"]
        assert _wait_for(client, fine)["result"] == {"a": 2, "2": 1}


def test_a_task_running_past_the_lost_bound_beats_and_stays_in_progress(
    server: tuple[str, Keys], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task whose process stopped (a Lambda timeout) stayed in progress for a day; one that
    # runs long keeps its record fresh, so only the first reads as lost.
    import agentscope_serverless.services.runs.base as runs_base
    import agentscope_serverless.tasks as tasks_module

    monkeypatch.setattr(tasks_module, "HEARTBEAT_SECONDS", 0.1)
    monkeypatch.setattr(runs_base, "LOST_AFTER_SECONDS", 0.5)
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/wait", json={"seconds": 1.5}).json()["task_id"]
        for _ in range(5):  # past twice the bound
            time.sleep(0.25)
            assert client.get(f"/tasks/{task_id}").json()["status"] == "in_progress"
        assert _wait_for(client, task_id)["result"] == "waited"


def test_another_user_cannot_read_a_task(server: tuple[str, Keys]) -> None:
    url, keys = server
    with httpx.Client(base_url=url, timeout=30) as client:
        done = client.post("/jobs/sum", json={"numbers": [4]}, headers=bearer(keys.alice))
        failed = client.post("/jobs/fail", json={}, headers=bearer(keys.alice))
        for task_id in (done.json()["task_id"], failed.json()["task_id"]):
            _wait_for(httpx.Client(base_url=url, headers=bearer(keys.alice)), task_id)
            assert client.get(f"/tasks/{task_id}", headers=bearer(keys.bob)).status_code == 404
            assert client.get(f"/jobs/sum/{task_id}", headers=bearer(keys.bob)).status_code == 404
            assert client.get(f"/tasks/{task_id}").status_code == 401
        assert client.post("/jobs/sum", json={"numbers": [1]}).status_code == 401
        assert client.get("/tasks/nope", headers=bearer(keys.alice)).status_code == 404
        too_long = client.get(f"/tasks/{'t' * 257}", headers=bearer(keys.alice))
        assert too_long.status_code == 422
        assert too_long.json()["error"]["fields"][0]["loc"] == ["path", "task_id"]


def test_a_tasks_status_is_not_read_on_another_tasks_path(server: tuple[str, Keys]) -> None:
    # GET /jobs/count/<a /jobs/sum task's id> answered 200 with that task's result.
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/sum", json={"numbers": [5]}).json()["task_id"]
        assert _wait_for(client, task_id)["result"] == {"sum": 5}
        assert client.get(f"/jobs/sum/{task_id}").json()["result"] == {"sum": 5}
        elsewhere = client.get(f"/jobs/count/{task_id}")
        assert elsewhere.status_code == 404, elsewhere.text
        assert elsewhere.json()["error"]["code"] == "TASK_NOT_FOUND"


def test_a_task_is_not_taken_for_a_run_that_can_be_cancelled_or_followed(
    server: tuple[str, Keys],
) -> None:
    url, keys = server
    with httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as client:
        task_id = client.post("/jobs/sum", json={"numbers": [1, 2]}).json()["task_id"]
        refused = client.post(f"/runs/{task_id}/cancel")
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["message"] == "a background task cannot be cancelled"
        assert client.get(f"/runs/{task_id}").json()["cancel_requested"] is False
        # Nor for a run to follow: its events were an empty stream, ended with the task.
        followed = client.get(f"/runs/{task_id}/events")
        assert followed.status_code == 409, followed.text
        assert followed.json()["error"]["message"] == (
            f"a background task has no events: read its status at GET /tasks/{task_id}"
        )
        assert _wait_for(client, task_id)["status"] == "completed"


def _gates(count: int) -> list[threading.Event]:
    deadline = time.monotonic() + 30
    while len(GATES) < count:
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.02)
    return GATES[:count]


def test_a_task_erased_then_submitted_again_with_its_key_keeps_its_own_result(
    server: tuple[str, Keys],
) -> None:
    # The same Idempotency-Key after an erase gives the same task id: the erased task's
    # result was stored as the new task's.
    url, keys = server
    GATES.clear()
    headers = {**bearer(keys.service), "X-User-Id": "erased-then-again"}
    key = {"Idempotency-Key": f"again-{uuid.uuid4().hex}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        first = client.post("/jobs/gate", json={}, headers=key).json()["task_id"]
        _gates(1)
        assert client.delete("/users/me/data").status_code == 204
        second = client.post("/jobs/gate", json={}, headers=key).json()["task_id"]
        assert second == first
        erased, submitted = _gates(2)
        erased.set()
        # The erased task ends within milliseconds: its result never shows.
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            assert client.get(f"/tasks/{second}").json()["status"] == "in_progress"
            time.sleep(0.05)
        submitted.set()
        done = _wait_for(client, second)
    assert (done["status"], done["result"]) == ("completed", 2)


def _submitted_tasks(web: Any, user_id: str) -> int:
    """How many tasks of ``user_id`` the server's runs store holds."""
    runs = web.state.context.runs
    return sum(r.kind == "task" for r in asyncio.run(runs.recent_runs(user_id, 0)))


def _assert_refused(answer: httpx.Response, code: str) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == code
    assert answer.headers["Retry-After"] == "5"
    assert "X-Should-Retry" not in answer.headers


def test_submissions_past_the_servers_bound_are_refused_until_a_task_ends() -> None:
    # Each plain task took a thread of its own, with no bound: 3000 submissions of one user
    # were all accepted, and ran 3000 threads at once.
    GATES.clear()
    keys = Keys.make()
    settings = load_settings(tasks_max_running=3)
    web = create_app(settings=settings, agent_app=app, key_store=keys.store)
    key = {"Idempotency-Key": f"busy-{uuid.uuid4().hex}"}
    with (
        running(web) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as alice,
        httpx.Client(base_url=url, headers=bearer(keys.bob), timeout=30) as bob,
    ):
        first = [alice.post("/jobs/gate", json={}) for _ in range(3)]
        assert [a.status_code for a in first] == [202] * 3
        gates = _gates(3)
        _assert_refused(alice.post("/jobs/gate", json={}, headers=key), "TASK_CAPACITY")
        _assert_refused(bob.post("/jobs/gate", json={}), "TASK_CAPACITY")
        # Nothing stored for a refused task, and no thread started for it.
        assert (_submitted_tasks(web, "alice"), _submitted_tasks(web, "bob")) == (3, 0)
        time.sleep(0.2)
        assert len(GATES) == 3
        for opened in gates:
            opened.set()
        for answer in first:
            assert _wait_for(alice, answer.json()["task_id"])["status"] == "completed"
        # The refusal left its key free: the same request, sent again, runs.
        again = alice.post("/jobs/gate", json={}, headers=key)
        assert again.status_code == 202, again.text
        assert "Idempotent-Replayed" not in again.headers
        _gates(4)[3].set()
        done = _wait_for(alice, again.json()["task_id"])
    assert (done["status"], done["result"]) == ("completed", 4)


def test_a_user_past_their_share_of_tasks_is_refused_while_others_still_submit() -> None:
    GATES.clear()
    keys = Keys.make()
    settings = load_settings(tasks_max_running=5, tasks_max_running_per_user=2)
    web = create_app(settings=settings, agent_app=app, key_store=keys.store)
    with (
        running(web) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as alice,
        httpx.Client(base_url=url, headers=bearer(keys.bob), timeout=30) as bob,
    ):
        # Sent at once: each takes its slot before it is stored, so no more than the share pass.
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: alice.post("/jobs/gate", json={}), range(6)))
        taken = [a for a in answers if a.status_code == 202]
        assert len(taken) == 2, [a.text for a in answers]
        for answer in answers:
            if answer.status_code != 202:
                _assert_refused(answer, "TASK_QUOTA")
        assert _submitted_tasks(web, "alice") == 2
        others = [bob.post("/jobs/gate", json={}) for _ in range(2)]
        assert [a.status_code for a in others] == [202] * 2
        _assert_refused(bob.post("/jobs/gate", json={}), "TASK_QUOTA")
        for opened in _gates(4):
            opened.set()
        for answer in taken:
            assert _wait_for(alice, answer.json()["task_id"])["status"] == "completed"
        assert alice.post("/jobs/sum", json={"numbers": [1]}).status_code == 202
