"""A2A with the real ``a2a-sdk`` client: card discovery, send, stream, get and cancel a task,
over HTTP with a bearer key; and a client of A2A 0.3 through the SDK's compatibility transport.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
import tracemalloc
import uuid
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis.asyncio
from a2a.auth.user import User
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.helpers.proto_helpers import get_artifact_text, get_message_text, new_text_message
from a2a.server.context import ServerCallContext
from a2a.types import (
    AgentCard,
    Artifact,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import InvalidParamsError
from fastapi import FastAPI, Response
from google.protobuf.json_format import MessageToDict, ParseDict

from agentscope_serverless.a2a_server import RUN_ID_KEY, TASK_SAVE_INTERVAL, RunsTaskStore
from agentscope_serverless.agents.a2a_tool import a2a_agent_tool
from agentscope_serverless.agents.demo import app as demo_app
from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth import InMemoryKeyStore
from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.http import create_app
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Message,
    MessageType,
    TextContent,
)
from agentscope_serverless.services.runs.base import LOST_AFTER_SECONDS, RunRecord
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService
from agentscope_serverless.settings import load_settings
from tests.support.http import Keys, a2a_send, bearer, running

app = AgentApp(app_name="echo-a2a", app_description="Echoes what it is told, a word at a time.")
app.a2a_skills = [{"name": "echo", "description": "Repeats the message.", "tags": ["echo"]}]
cleanups: list[str] = []


@app.query(framework="text")
async def query(self: Any, msgs: Any, session: Any = None, **kwargs: Any) -> AsyncIterator[str]:
    text = msgs[-1].get_text_content() or ""
    if text.startswith("fail"):
        raise RuntimeError("the well ran dry")
    if text.startswith("falter"):  # fails once its reply has begun
        yield "began "
        raise RuntimeError("the well ran dry")
    if text.startswith("think"):  # a thinking model: its reasoning is no part of the reply
        thinking = Message(type=MessageType.REASONING, role="assistant")
        yield thinking.in_progress()
        yield TextContent(text="(reasoning) ", delta=True)
        yield thinking.completed()
    delay = 0.5 if "slowly" in text else 0
    if text.startswith("finish"):  # too far along to stop: a cancellation comes too late
        yield "working "
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            yield "finished anyway"
        return
    try:
        for word in text.split():
            yield word + " "
            await asyncio.sleep(delay)
        if "pause" in text:  # silent for a while before it ends
            await asyncio.sleep(10)
    finally:
        cleanups.append(session.id)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Keys]]:
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=app, key_store=keys.store)
    with running(web) as url:
        yield url, keys


@contextlib.asynccontextmanager
async def _client(url: str, key: str, *, streaming: bool) -> AsyncIterator[Client]:
    """The SDK's client for the agent at ``url``, discovered from its card."""
    async with httpx.AsyncClient(headers=bearer(key), timeout=30) as http:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        yield await ClientFactory(config).create_from_url(url)


async def _first_chunk_of(stream: AsyncIterator[Any]) -> str:
    """The id of the task of a streamed reply, once its first chunk has come."""
    async for event in stream:
        if event.HasField("artifact_update"):
            task_id: str = event.artifact_update.task_id
            return task_id
    raise AssertionError("the stream ended without a chunk")


def _message(text: str, context_id: str | None = None) -> SendMessageRequest:
    message = new_text_message(text, context_id=context_id, role=Role.ROLE_USER)
    return SendMessageRequest(message=message)


def test_the_card_describes_the_agent_and_needs_a_key(served: tuple[str, Keys]) -> None:
    url, keys = served
    assert httpx.get(f"{url}/.well-known/agent-card.json").status_code == 401
    card = httpx.get(f"{url}/.well-known/agent-card.json", headers=bearer(keys.alice)).json()
    assert card["name"] == "echo-a2a"
    assert card["description"] == "Echoes what it is told, a word at a time."
    assert [skill["name"] for skill in card["skills"]] == ["echo"]
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    interfaces = {(i["protocolBinding"], i["protocolVersion"]) for i in card["supportedInterfaces"]}
    assert ("JSONRPC", "1.0") in interfaces and ("HTTP+JSON", "1.0") in interfaces
    assert all(i["url"] == f"{url}/a2a" for i in card["supportedInterfaces"])
    # Where clients of A2A before 0.3 look for it, as AgentScope Runtime serves it too.
    legacy = httpx.get(f"{url}/.well-known/agent.json", headers=bearer(keys.alice))
    assert legacy.json() == card
    assert httpx.get(f"{url}/.well-known/agent.json").status_code == 401
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
    assert httpx.post(f"{url}/a2a", json=rpc).status_code == 401
    assert httpx.post(f"{url}/a2a/message:send", json={}).status_code == 401
    other_scheme = {"Authorization": f"Token {keys.alice}"}
    for refused in (
        httpx.post(f"{url}/a2a", json=rpc, headers=other_scheme),
        httpx.get(f"{url}/.well-known/agent-card.json", headers=other_scheme),
    ):
        assert refused.status_code == 401
        assert "does not use the Bearer scheme" in refused.json()["error"]["message"]
        assert keys.alice not in refused.text


async def test_the_sdk_client_sends_and_streams_a_message_and_reads_the_task(
    served: tuple[str, Keys],
) -> None:
    url, keys = served
    async with _client(url, keys.alice, streaming=False) as client:
        [response] = [r async for r in client.send_message(_message("hello there agent"))]
        task = response.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        # One text, not a part per chunk (get_artifact_text put a line between them).
        assert get_artifact_text(task.artifacts[0]) == "hello there agent "
        stored = await client.get_task(GetTaskRequest(id=task.id))
        assert stored.status.state == TaskState.TASK_STATE_COMPLETED
        assert [part.text for part in stored.artifacts[0].parts] == ["hello there agent "]
        assert stored.context_id == task.context_id
    async with _client(url, keys.alice, streaming=True) as streaming:
        events = [r async for r in streaming.send_message(_message("one two three"))]
        chunks = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
        assert "".join(get_artifact_text(a, delimiter="") for a in chunks) == "one two three "
        assert len(chunks) == 4  # one a word, then the last (no text)
        states = [e.status_update.status.state for e in events if e.HasField("status_update")]
        assert states[-1] == TaskState.TASK_STATE_COMPLETED
    # Another user cannot read the task.
    async with _client(url, keys.bob, streaming=False) as other:
        with pytest.raises(Exception, match=r"(?i)not found"):
            await other.get_task(GetTaskRequest(id=task.id))


def _assembled(chunks: list[Any]) -> tuple[str, bool]:
    """A reply's artifact as a client assembles it from its chunks: its text, and whether
    its last chunk came (no chunk after it)."""
    text, ended = "", False
    for chunk in chunks:
        assert not ended, "a chunk came after the last"
        part_text = get_artifact_text(chunk.artifact, delimiter="")
        text = text + part_text if chunk.append else part_text
        ended = chunk.last_chunk
    return text, ended


async def test_a_streamed_reply_ends_with_its_last_chunk_completed_failed_or_canceled(
    served: tuple[str, Keys],
) -> None:
    # Every chunk said lastChunk false: a client assembling the artifact never saw it whole.
    url, keys = served
    async with _client(url, keys.alice, streaming=True) as client:
        for text, reply, state in [
            ("one two three", "one two three ", TaskState.TASK_STATE_COMPLETED),
            ("falter now", "began ", TaskState.TASK_STATE_FAILED),
        ]:
            events = [e async for e in client.send_message(_message(text))]
            chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
            assert _assembled(chunks) == (reply, True)
            assert events[-1].status_update.status.state == state
        stream = client.send_message(_message("slowly " + "word " * 20))
        task_id = await _first_chunk_of(stream)
        async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
            follow = {"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe"}
            async with http.stream(
                "POST", "/a2a", json={**follow, "params": {"id": task_id}}
            ) as sub:
                lines = sub.aiter_lines()
                assert (await anext(lines)).startswith("data: ")  # the task
                await client.cancel_task(CancelTaskRequest(id=task_id))
                followed = [json.loads(line[6:])["result"] async for line in lines if line]
        rest = [e async for e in stream]
    chunks = [e.artifact_update for e in rest if e.HasField("artifact_update")]
    assert _assembled(chunks)[1] is True
    assert rest[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
    # A2A 0.3's tasks/resubscribe: the last chunk, then the canceled status.
    assert followed[-2]["kind"] == "artifact-update" and followed[-2]["lastChunk"] is True
    assert followed[-1]["status"]["state"] == "canceled"


def test_an_a2a_stream_pings_as_often_as_the_settings_say_while_its_agent_is_silent() -> None:
    # The SDK's streams pinged every 15 s whatever SSE_PING_INTERVAL_SECONDS said.
    keys = Keys.make()
    settings = load_settings(sse_ping_interval_seconds=1)
    call = {**a2a_send("pause here"), "method": "message/stream"}
    with (
        running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as url,
        httpx.Client(base_url=url, headers=bearer(keys.alice), timeout=30) as http,
    ):
        pings, task_id = 0, None
        with http.stream("POST", "/a2a", json=call) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and task_id is None:
                    task_id = json.loads(line[6:])["result"]["id"]
                pings += line.startswith(":")
                if pings == 2:
                    break
        cancel = {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": task_id}}
        http.post("/a2a", json=cancel)
    assert pings == 2


async def test_the_sdk_client_cancels_a_running_task(served: tuple[str, Keys]) -> None:
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with _client(url, keys.alice, streaming=True) as client:
        stream = client.send_message(_message("slowly " + "word " * 20, context_id=context_id))
        task_id = await _first_chunk_of(stream)
        await stream.aclose()
        canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        for _ in range(100):
            if context_id in cleanups:
                break
            await asyncio.sleep(0.05)
        assert context_id in cleanups, "the handler's cleanup ran"
        stored = await client.get_task(GetTaskRequest(id=task_id))
        assert stored.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_cancel_that_comes_too_late_answers_the_task_as_its_run_ended(
    served: tuple[str, Keys],
) -> None:
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with _client(url, keys.alice, streaming=True) as client:
        stream = client.send_message(_message("finish it", context_id=context_id))
        task_id = await _first_chunk_of(stream)
        await stream.aclose()
        answer = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert answer.status.state == TaskState.TASK_STATE_COMPLETED
        stored = await client.get_task(GetTaskRequest(id=task_id))
        assert stored.status.state == TaskState.TASK_STATE_COMPLETED
        assert get_artifact_text(stored.artifacts[0]) == "working finished anyway"
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice)) as http:
        history = (await http.get(f"/sessions/{context_id}/messages")).json()["items"]
        assert history[-1]["content"][0]["text"] == "working finished anyway"


async def test_two_cancels_of_a_task_at_once_leave_no_subscriber_waiting(
    served: tuple[str, Keys],
) -> None:
    # Each cancel cancelled the task's execution: the second, while the first wound it
    # down, left a subscriber to the task with its canceled status but a stream never ended.
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with _client(url, keys.alice, streaming=True) as client:
        stream = client.send_message(_message("slowly " + "word " * 20, context_id=context_id))
        task_id = await _first_chunk_of(stream)
        await stream.aclose()
    follow = {"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": task_id}}
    cancel = {"jsonrpc": "2.0", "id": 2, "method": "tasks/cancel", "params": {"id": task_id}}
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        async with http.stream("POST", "/a2a", json=follow) as subscription:
            lines = subscription.aiter_lines()
            assert (await anext(lines)).startswith("data: ")  # the task
            answers = await asyncio.gather(*(http.post("/a2a", json=cancel) for _ in range(2)))
            async with asyncio.timeout(10):  # it ends at once, when it ends
                followed = [json.loads(line[6:]) async for line in lines if line]
        stored = await http.post("/a2a", json={**cancel, "method": "tasks/get"})
    replies = [answer.json() for answer in answers]
    states = [reply["result"]["status"]["state"] for reply in replies if "result" in reply]
    errors = [reply["error"]["code"] for reply in replies if "error" in reply]
    assert (states, errors) == (["canceled"], [-32002])  # the second finds it not cancelable
    assert followed[-1]["result"]["status"]["state"] == "canceled"
    assert stored.json()["result"]["status"]["state"] == "canceled"


@pytest.fixture(scope="module")
def two_servers(redis_server: RedisServer) -> Iterator[tuple[str, str, Keys]]:
    """Two servers of the agent sharing their stores on Redis, as two Lambda instances do."""
    keys = Keys.make()
    settings = load_settings(
        session_history_backend="redis",
        memory_backend="redis",
        state_backend="redis",
        redis_url=redis_server.url,
    )
    with (
        running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as first,
        running(create_app(settings=settings, agent_app=app, key_store=keys.store)) as second,
    ):
        yield first, second, keys


async def test_a_task_cancelled_through_another_server_stops_its_run(
    two_servers: tuple[str, str, Keys],
) -> None:
    first, second, keys = two_servers
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with (
        _client(first, keys.alice, streaming=True) as running_client,
        _client(second, keys.alice, streaming=False) as other_client,
    ):
        stream = running_client.send_message(
            _message("slowly " + "word " * 20, context_id=context_id)
        )
        task_id, states = None, []
        async for event in stream:
            if event.HasField("artifact_update") and task_id is None:
                task_id = event.artifact_update.task_id
                canceled = await other_client.cancel_task(CancelTaskRequest(id=task_id))
                assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            elif event.HasField("status_update"):
                states.append(event.status_update.status.state)
        assert task_id is not None
        assert states[-1] == TaskState.TASK_STATE_CANCELED
        assert context_id in cleanups, "the handler's cleanup ran"
        stored = await other_client.get_task(GetTaskRequest(id=task_id))
        assert stored.status.state == TaskState.TASK_STATE_CANCELED
        assert len(get_artifact_text(stored.artifacts[0]).split()) < 21
    async with httpx.AsyncClient(base_url=second, headers=bearer(keys.alice)) as http:
        runs = (await http.get("/runs", params={"session_id": context_id})).json()["items"]
        assert {(run["kind"], run["status"]) for run in runs} == {
            ("a2a", "canceled"),
            ("a2a_task", "canceled"),
        }


async def test_a_cancel_through_another_server_answers_the_task_as_its_run_ended(
    two_servers: tuple[str, str, Keys],
) -> None:
    # The other server answered canceled at once, and wrote the task so; the run, too far
    # along to stop, completed, and so did the task: the client was told what did not happen.
    first, second, keys = two_servers
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with (
        _client(first, keys.alice, streaming=True) as running_client,
        _client(second, keys.alice, streaming=False) as other_client,
    ):
        stream = running_client.send_message(_message("finish it", context_id=context_id))
        task_id = await _first_chunk_of(stream)
        answer = await other_client.cancel_task(CancelTaskRequest(id=task_id))
        rest = [e async for e in stream]
        assert answer.status.state == TaskState.TASK_STATE_COMPLETED
        assert get_artifact_text(answer.artifacts[0]) == "working finished anyway"
        assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
        stored = await other_client.get_task(GetTaskRequest(id=task_id))
        assert stored.status.state == TaskState.TASK_STATE_COMPLETED
        assert get_artifact_text(stored.artifacts[0]) == "working finished anyway"


async def _message_to_a_working_task(
    running_url: str, other_url: str, keys: Keys
) -> tuple[str, Task]:
    """Send a message to a task while it works (the task's run on ``running_url``, the
    message to ``other_url``), which must be refused; the task's context and the task as
    stored once its run ended, whose one reply it must hold."""
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    words = ["slowly", *(f"w{i}" for i in range(4))]
    async with (
        _client(running_url, keys.alice, streaming=True) as running_client,
        _client(other_url, keys.alice, streaming=False) as other_client,
    ):
        stream = running_client.send_message(_message(" ".join(words), context_id=context_id))
        task_id = await _first_chunk_of(stream)
        again = new_text_message(
            "and this too", context_id=context_id, task_id=task_id, role=Role.ROLE_USER
        )
        with pytest.raises(Exception, match="still working"):
            [e async for e in other_client.send_message(SendMessageRequest(message=again))]
        [e async for e in stream]
        stored = await other_client.get_task(GetTaskRequest(id=task_id))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert [get_artifact_text(a, delimiter="") for a in stored.artifacts] == [" ".join(words) + " "]
    async with httpx.AsyncClient(base_url=other_url, headers=bearer(keys.alice)) as http:
        runs = (await http.get("/runs", params={"session_id": context_id})).json()["items"]
    assert sorted(run["kind"] for run in runs) == ["a2a", "a2a_task"]
    return context_id, stored


async def test_a_message_to_a_task_working_on_another_server_is_refused(
    two_servers: tuple[str, str, Keys],
) -> None:
    # Two Lambda instances: the second ran the message at once, a second run in the task,
    # and the two overwrote each other's writes of the task (one reply lost from it).
    first, second, keys = two_servers
    context_id, _ = await _message_to_a_working_task(first, second, keys)
    async with httpx.AsyncClient(base_url=second, headers=bearer(keys.alice)) as http:
        messages = (await http.get(f"/sessions/{context_id}/messages")).json()["items"]
    user_texts = [m["content"][0]["text"] for m in messages if m["role"] == "user"]
    assert user_texts == ["slowly w0 w1 w2 w3"]


async def test_a_message_to_a_task_working_on_the_same_server_is_refused(
    served: tuple[str, Keys],
) -> None:
    # The SDK ran it once the task's run had ended: the sender was answered with that run's
    # reply, completed, and the task then went back to working on the message.
    url, keys = served
    _, stored = await _message_to_a_working_task(url, url, keys)
    assert [get_message_text(m) for m in stored.history] == ["slowly w0 w1 w2 w3"]


async def test_a_task_streaming_on_one_server_is_followed_from_another(
    two_servers: tuple[str, str, Keys],
) -> None:
    # Two Lambda instances: the client's stream broke, its reconnection reached the other.
    first, second, keys = two_servers
    words = ["think", "slowly", *(f"w{i}" for i in range(5))]
    async with (
        _client(first, keys.alice, streaming=True) as running_client,
        _client(second, keys.alice, streaming=True) as other_client,
    ):
        stream = running_client.send_message(_message(" ".join(words)))
        task_id = await _first_chunk_of(stream)
        followed = [e async for e in other_client.subscribe(SubscribeToTaskRequest(id=task_id))]
        rest = [e async for e in stream]
        stored = await other_client.get_task(GetTaskRequest(id=task_id))
    # The reasoning is no part of the reply, followed, streamed or stored.
    streamed = [e.artifact_update.artifact for e in rest if e.HasField("artifact_update")]
    assert "reasoning" not in "".join(get_artifact_text(a, delimiter="") for a in streamed)
    assert get_artifact_text(stored.artifacts[0], delimiter="") == " ".join(words) + " "
    assert followed[0].task.id == task_id
    assert followed[0].task.status.state == TaskState.TASK_STATE_WORKING
    chunks = [e.artifact_update for e in followed if e.HasField("artifact_update")]
    # The whole reply, from its first piece: the chunks of one artifact.
    text = "".join(get_artifact_text(c.artifact, delimiter="") for c in chunks)
    assert text == " ".join(words) + " "
    assert [c.append for c in chunks] == [False] + [True] * (len(chunks) - 1)
    assert [c.last_chunk for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert len({c.artifact.artifact_id for c in chunks}) == 1
    assert followed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    # Another user cannot follow it; a finished task cannot be followed.
    async with _client(second, keys.bob, streaming=True) as bob:
        with pytest.raises(Exception, match=r"(?i)not found"):
            [e async for e in bob.subscribe(SubscribeToTaskRequest(id=task_id))]
    async with _client(second, keys.alice, streaming=True) as again:
        with pytest.raises(Exception, match=r"(?i)terminal"):
            [e async for e in again.subscribe(SubscribeToTaskRequest(id=task_id))]


async def test_a_task_whose_process_stopped_reads_as_failed_not_working(
    two_servers: tuple[str, str, Keys], redis_server: RedisServer
) -> None:
    # Its instance stopped mid-reply (killed, out of memory): its run read as lost, but the
    # task stayed working for ever, and every message to it was refused as still working;
    # its record among the runs stayed in progress, and following its events never ended.
    first, _, keys = two_servers
    stale = time.time() - LOST_AFTER_SECONDS - 5
    task_id, run_id, context_id = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in "trc")
    asked = new_text_message("take your time", context_id=context_id, role=Role.ROLE_USER)
    working = Task(
        id=task_id,
        context_id=context_id,
        status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
        history=[asked],
        metadata={RUN_ID_KEY: run_id},
    )
    # Its session, as a task's run opens it before its first event.
    async with RedisSessionHistoryService(redis_url=redis_server.url) as sessions:
        await sessions.create_session("alice", context_id)
    async with RedisRunsService(redis_url=redis_server.url) as runs:
        run = RunRecord(
            id=run_id, user_id="alice", session_id=context_id, kind="a2a", updated_at=stale
        )
        await runs.record(run, [(0, '{"sequence_number":0,"object":"response"}')], create=True)
        await runs.create_run(
            RunRecord(
                id=task_id,
                user_id="alice",
                session_id=context_id,
                kind="a2a_task",
                result=MessageToDict(working),
            )
        )
    async with _client(first, keys.alice, streaming=False) as client:
        task = await client.get_task(GetTaskRequest(id=task_id))
        assert task.status.state == TaskState.TASK_STATE_FAILED
        assert "stopped before the run ended" in get_message_text(task.status.message)
        listed = await client.list_tasks(ListTasksRequest(context_id=context_id))
        assert [t.status.state for t in listed.tasks] == [TaskState.TASK_STATE_FAILED]
        again = new_text_message(
            "are you there?", context_id=context_id, task_id=task_id, role=Role.ROLE_USER
        )
        with pytest.raises(Exception, match="terminal state"):
            [e async for e in client.send_message(SendMessageRequest(message=again))]
    # Its record among the runs read in progress too, and following it never ended.
    async with httpx.AsyncClient(base_url=first, headers=bearer(keys.alice), timeout=30) as http:
        seen = (await http.get(f"/runs/{task_id}")).json()
        assert (seen["status"], seen["error"]["code"]) == ("failed", "RUN_LOST")
        listed = (await http.get("/runs", params={"session_id": context_id})).json()["items"]
        assert {run["kind"]: run["status"] for run in listed} == {
            "a2a": "failed",
            "a2a_task": "failed",
        }
        # It is no run: following its events is refused (it was an empty stream).
        followed = await http.get(f"/runs/{task_id}/events")
        assert followed.status_code == 409, followed.text


async def _store_a_task_whose_end_was_not_stored(
    redis_url: str, status: str, error: dict[str, Any] | None = None
) -> str:
    """A task still working as stored, whose run ended (``status``) with the reply "one two
    three ": its instance stopped after the run's end was stored, before the task's. The
    task holds the reply as its last write had it ("one "); its id."""
    task_id, run_id, context_id = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in "trc")
    asked = new_text_message("count to three", context_id=context_id, role=Role.ROLE_USER)
    working = Task(
        id=task_id,
        context_id=context_id,
        status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
        history=[asked],
        artifacts=[
            Artifact(
                artifact_id=run_id,
                name="reply",
                parts=[Part(text="one ")],
                metadata={RUN_ID_KEY: run_id},
            )
        ],
        metadata={RUN_ID_KEY: run_id},
    )
    reply = Message(type=MessageType.MESSAGE, role="assistant")
    events = [
        AgentResponse(sequence_number=0),
        reply.model_copy(update={"sequence_number": 1}),
        *(
            TextContent(text=word, delta=True, msg_id=reply.id, sequence_number=2 + i)
            for i, word in enumerate(["one ", "two ", "three "])
        ),
    ]
    async with RedisRunsService(redis_url=redis_url) as runs:
        run = RunRecord(
            id=run_id,
            user_id="alice",
            session_id=context_id,
            kind="a2a",
            status=status,
            error=error,
        )
        stored = [(e.sequence_number or 0, e.model_dump_json(exclude_none=True)) for e in events]
        await runs.record(run, stored, create=True, finish=True)
        await runs.create_run(
            RunRecord(
                id=task_id,
                user_id="alice",
                session_id=context_id,
                kind="a2a_task",
                result=MessageToDict(working),
            )
        )
    return task_id


async def test_a_task_whose_end_was_not_stored_reads_as_its_run_ended(
    two_servers: tuple[str, str, Keys], redis_server: RedisServer
) -> None:
    # Its instance stopped once its run had ended, before it stored the task's end: the run
    # read completed (or failed), the task working for ever, every message to it refused.
    first, _, keys = two_servers
    completed = await _store_a_task_whose_end_was_not_stored(redis_server.url, "completed")
    failure = {"code": "AGENT_ERROR", "message": "the well ran dry"}
    failed = await _store_a_task_whose_end_was_not_stored(redis_server.url, "failed", failure)
    async with _client(first, keys.alice, streaming=False) as client:
        task = await client.get_task(GetTaskRequest(id=completed))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert [get_artifact_text(a, delimiter="") for a in task.artifacts] == ["one two three "]
        task = await client.get_task(GetTaskRequest(id=failed))
        assert task.status.state == TaskState.TASK_STATE_FAILED
        assert get_message_text(task.status.message) == "the well ran dry"
    async with httpx.AsyncClient(base_url=first, headers=bearer(keys.alice), timeout=30) as http:
        seen = (await http.get(f"/runs/{completed}")).json()
        assert (seen["status"], seen["error"]) == ("completed", None)
        seen = (await http.get(f"/runs/{failed}")).json()
        assert (seen["status"], seen["error"]) == ("failed", failure)


class _CountingRuns(InMemoryRunsService):
    """Runs in memory, counting the reads of each record."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()

    async def _load(self, user_id: str, run_id: str) -> RunRecord | None:
        self.reads[run_id] += 1
        return await super()._load(user_id, run_id)


class _Alice(User):
    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return "alice"


async def test_reading_a_working_task_reads_its_run_once() -> None:
    # Its run was read to see whether it was lost, then read again to tell the same.
    working = Task(
        id="task",
        context_id="s1",
        status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
        metadata={RUN_ID_KEY: "run"},
    )
    async with _CountingRuns() as runs:
        await runs.create_run(RunRecord(id="run", user_id="alice", session_id="s1", kind="a2a"))
        task = RunRecord(
            id="task",
            user_id="alice",
            session_id="s1",
            kind="a2a_task",
            result=MessageToDict(working),
        )
        await runs.create_run(task)
        context = ServerCallContext(user=_Alice())
        seen = await RunsTaskStore(runs).get("task", context)
        assert seen is not None and seen.status.state == TaskState.TASK_STATE_WORKING
        assert runs.reads == {"task": 1, "run": 1}
        runs.reads.clear()
        listed = await RunsTaskStore(runs).list(ListTasksRequest(context_id="s1"), context)
        assert [t.status.state for t in listed.tasks] == [TaskState.TASK_STATE_WORKING]
        assert runs.reads == {"task": 1, "run": 1}  # the run listed with its task too


class _BlinkingRuns(InMemoryRunsService):
    """Runs in memory refusing the first write of an A2A task's end, as a store does for a
    moment (a connection lost, a failover)."""

    poll_seconds = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def _save(self, record: RunRecord) -> None:
        if record.kind == "a2a_task" and record.finished and not self.refused:
            self.refused += 1
            raise StoreUnavailableError("redis", "the connection failed")
        await super()._save(record)


async def test_a_tasks_end_the_store_refuses_once_is_written_again() -> None:
    # The write was not made again: the task stayed working for ever (the streaming client
    # got an internal error), though its run had completed.
    context = ServerCallContext(user=_Alice())
    for kept in (True, False):  # written working by this process first, or not
        async with _BlinkingRuns() as runs:
            tasks = RunsTaskStore(runs)
            task = Task(
                id="task",
                context_id="s1",
                status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
                metadata={RUN_ID_KEY: "run"},
            )
            await tasks.save(task, context)
            if not kept:
                tasks = RunsTaskStore(runs)
            task.status.state = TaskState.TASK_STATE_COMPLETED
            await tasks.save(task, context)
            assert runs.refused == 1
            stored = await runs.get_run("alice", "task")
            assert stored is not None and stored.status == "completed"
            assert stored.result["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_task_read_as_lost_that_ends_after_all_keeps_no_lost_error() -> None:
    # Its instance stalled past the time a run may go without a heartbeat, then ran on and
    # stored the task's end: its record said completed with the error RUN_LOST.
    context = ServerCallContext(user=_Alice())
    stale = time.time() - LOST_AFTER_SECONDS - 5
    submitted = Task(
        id="task", context_id="s1", status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
    )
    async with InMemoryRunsService() as runs:
        record = RunRecord(
            id="task",
            user_id="alice",
            session_id="s1",
            kind="a2a_task",
            result=MessageToDict(submitted),
            updated_at=stale,
        )
        await runs.create_run(record)
        lost = await runs.get_run("alice", "task")
        assert lost is not None and lost.status == "failed"
        submitted.status.state = TaskState.TASK_STATE_COMPLETED
        await RunsTaskStore(runs).save(submitted, context)
        stored = await runs.get_run("alice", "task")
        assert stored is not None and (stored.status, stored.error) == ("completed", None)


async def test_a_task_write_the_store_refuses_midway_breaks_neither_reply_nor_task(
    two_servers: tuple[str, str, Keys], redis_server: RedisServer
) -> None:
    # One write of the task refused (a store's blip) ended the client's stream with an
    # internal error, and the task stayed working for ever, though its run went on.
    first, second, keys = two_servers
    words = ["slowly", *(f"w{i}" for i in range(6))]
    store = redis.asyncio.from_url(redis_server.url)
    try:
        async with _client(first, keys.alice, streaming=True) as client:
            chunks: list[str] = []
            states = []
            async for event in client.send_message(_message(" ".join(words))):
                if event.HasField("artifact_update"):
                    task_id = event.artifact_update.task_id
                    chunks.append(get_artifact_text(event.artifact_update.artifact, delimiter=""))
                    # Out of memory from the second chunk to the fourth: writes are refused.
                    if len(chunks) in (2, 4):
                        await store.config_set("maxmemory", 1 if len(chunks) == 2 else 0)
                elif event.HasField("status_update"):
                    states.append(event.status_update.status.state)
    finally:
        await store.config_set("maxmemory", 0)
        await store.aclose()
    assert "".join(chunks) == " ".join(words) + " "
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    async with _client(second, keys.alice, streaming=False) as other:
        stored = await other.get_task(GetTaskRequest(id=task_id))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(stored.artifacts[0], delimiter="") == " ".join(words) + " "


async def test_a_long_streamed_reply_is_not_written_to_the_store_for_every_chunk(
    two_servers: tuple[str, str, Keys], redis_server: RedisServer
) -> None:
    # Every chunk read the task's record and wrote it whole: a reply of 300 chunks took 600
    # store requests, each writing all the text so far.
    first, second, keys = two_servers
    commands: list[str] = []
    store = redis.asyncio.from_url(redis_server.url)

    async def watch() -> None:
        async with store.monitor() as monitor:
            while True:
                commands.append(str((await monitor.next_command())["command"]))

    watching = asyncio.create_task(watch())
    try:
        # The monitor sees every command once it sees one sent after it started.
        while not any("monitor-ready" in c for c in commands):
            await store.echo("monitor-ready")
            await asyncio.sleep(0.01)
        async with _client(first, keys.alice, streaming=True) as client:
            words = [f"w{i}" for i in range(300)]
            started = time.monotonic()
            events = [e async for e in client.send_message(_message(" ".join(words)))]
            seconds = time.monotonic() - started
        task_id = next(e.artifact_update.task_id for e in events if e.HasField("artifact_update"))
        async with _client(second, keys.alice, streaming=False) as other:
            stored = await other.get_task(GetTaskRequest(id=task_id))
    finally:
        watching.cancel()
        await store.aclose()
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(stored.artifacts[0], delimiter="") == " ".join(words) + " "
    # The writes of the whole record, as its scripts run them (not the scripts' calls: one
    # that was not loaded yet is called twice).
    writes = [
        c for c in commands if '"a2a_task"' in c and task_id in c and not c.startswith("EVAL")
    ]
    # Created, working, completed, and the reply at most every TASK_SAVE_INTERVAL meanwhile.
    assert 2 <= len(writes) <= 4 + seconds / TASK_SAVE_INTERVAL, (len(writes), seconds)


async def test_a_reply_whose_stream_pauses_is_stored_while_it_pauses(
    two_servers: tuple[str, str, Keys],
) -> None:
    # The chunks a task's record was not written for right away are written a moment later,
    # not only at the task's next event.
    first, second, keys = two_servers
    words = [f"w{i}" for i in range(20)]
    async with (
        _client(first, keys.alice, streaming=True) as running_client,
        _client(second, keys.alice, streaming=False) as other_client,
    ):
        stream = running_client.send_message(_message(" ".join([*words, "pause"])))
        chunks = 0
        async for event in stream:
            if event.HasField("artifact_update"):
                task_id, chunks = event.artifact_update.task_id, chunks + 1
            if chunks == len(words) + 1:
                break
        deadline = asyncio.get_running_loop().time() + 8
        while True:
            stored = await other_client.get_task(GetTaskRequest(id=task_id))
            text = get_artifact_text(stored.artifacts[0], delimiter="") if stored.artifacts else ""
            if (
                text == " ".join([*words, "pause"]) + " "
                or asyncio.get_running_loop().time() > deadline
            ):
                break
            await asyncio.sleep(0.05)
        assert stored.status.state == TaskState.TASK_STATE_WORKING
        assert text == " ".join([*words, "pause"]) + " "
        await other_client.cancel_task(CancelTaskRequest(id=task_id))
        await stream.aclose()


async def test_a_contexts_tasks_are_listed_as_asked_filtered_newest_first_a_page_at_a_time(
    served: tuple[str, Keys],
) -> None:
    # The status asked for, and the page size, were ignored: every task of the context came.
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    async with _client(url, keys.alice, streaming=True) as client:
        done = []
        for text in ("one", "two"):
            sent = [e async for e in client.send_message(_message(text, context_id=context_id))]
            done.append(next(e.task.id for e in sent if e.HasField("task")))
        stream = client.send_message(_message("slowly " + "word " * 20, context_id=context_id))
        working = await _first_chunk_of(stream)
        try:
            only = ListTasksRequest(context_id=context_id, status=TaskState.TASK_STATE_WORKING)
            assert [t.id for t in (await client.list_tasks(only)).tasks] == [working]
            completed = ListTasksRequest(
                context_id=context_id, status=TaskState.TASK_STATE_COMPLETED
            )
            assert {t.id for t in (await client.list_tasks(completed)).tasks} == set(done)
            first = await client.list_tasks(ListTasksRequest(context_id=context_id, page_size=2))
            assert first.total_size == 3 and len(first.tasks) == 2 and first.next_page_token
            rest = await client.list_tasks(
                ListTasksRequest(
                    context_id=context_id, page_size=2, page_token=first.next_page_token
                )
            )
            assert len(rest.tasks) == 1 and not rest.next_page_token
            listed = [t.id for t in [*first.tasks, *rest.tasks]]
            assert listed == [working, done[1], done[0]]  # the last updated first
        finally:
            await client.cancel_task(CancelTaskRequest(id=working))
            await stream.aclose()


async def test_tasks_listed_without_a_context_are_all_the_callers(
    served: tuple[str, Keys],
) -> None:
    # ListTasks takes contextId as a filter: without one, none were listed (an empty page).
    url, keys = served
    async with _client(url, keys.alice, streaming=False) as client:
        mine = set()
        for text in ("one", "two"):
            sent = await anext(client.send_message(_message(text, f"a2a-{uuid.uuid4().hex[:8]}")))
            mine.add(sent.task.id)
        listed = await client.list_tasks(ListTasksRequest(page_size=100))
        assert mine <= {t.id for t in listed.tasks}
        completed = ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, page_size=100)
        assert mine <= {t.id for t in (await client.list_tasks(completed)).tasks}
    async with _client(url, keys.bob, streaming=False) as client:
        listed = await client.list_tasks(ListTasksRequest(page_size=100))
        assert not mine & {t.id for t in listed.tasks}


async def test_an_a2a_task_is_cancelled_and_followed_with_a2a_not_as_a_run(
    served: tuple[str, Keys],
) -> None:
    url, keys = served
    async with _client(url, keys.alice, streaming=True) as client:
        stream = client.send_message(_message("slowly " + "word " * 20))
        task_id = None
        async for event in stream:
            if event.HasField("artifact_update"):
                task_id = event.artifact_update.task_id
                break
        assert task_id is not None
        await stream.aclose()
        async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice)) as http:
            refused = await http.post(f"/runs/{task_id}/cancel")
            assert refused.status_code == 409, refused.text
            assert "CancelTask" in refused.json()["error"]["message"]
            assert (await http.get(f"/runs/{task_id}")).json()["cancel_requested"] is False
            # Its record has no events: following it was an empty stream, ended with the task.
            followed = await http.get(f"/runs/{task_id}/events")
            assert followed.status_code == 409, followed.text
            assert "SubscribeToTask" in followed.json()["error"]["message"]
        canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED


async def test_an_a2a_0_3_client_sends_and_streams_a_message(served: tuple[str, Keys]) -> None:
    url, keys = served
    async with httpx.AsyncClient(headers=bearer(keys.alice), timeout=30) as http:
        card_json = (await http.get(f"{url}/.well-known/agent-card.json")).json()
        card = ParseDict(card_json, AgentCard(), ignore_unknown_fields=True)
        transport = CompatJsonRpcTransport(http, card, f"{url}/a2a")
        sent = await transport.send_message(_message("legacy hello"))
        assert sent.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert get_artifact_text(sent.task.artifacts[0], delimiter="") == "legacy hello "
        events = [e async for e in transport.send_message_streaming(_message("legacy stream"))]
        chunks = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
        assert "".join(get_artifact_text(a, delimiter="") for a in chunks) == "legacy stream "
        legacy_call = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}
        async with httpx.AsyncClient() as anonymous:
            assert (await anonymous.post(f"{url}/a2a", json=legacy_call)).status_code == 401


@pytest.mark.parametrize("context_id", ["a/b", "..", "x" * 600])
async def test_a_context_id_no_session_can_have_is_invalid_params(
    served: tuple[str, Keys], context_id: str
) -> None:
    url, keys = served
    user = f"a2a-user-{uuid.uuid4().hex[:8]}"  # a user with nothing stored yet
    key = (await keys.store.create_key(kind="user", user_id=user)).key
    async with _client(url, key, streaming=False) as client:
        # The JSON-RPC error -32602, which the SDK raises as InvalidParamsError.
        with pytest.raises(InvalidParamsError, match="contextId cannot name a session"):
            [_ async for _ in client.send_message(_message("hello", context_id=context_id))]
    async with httpx.AsyncClient(base_url=url, headers=bearer(key)) as http:
        assert (await http.get("/sessions")).json()["items"] == []


def _sent_to(context_id: str) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """A message to the context ``context_id`` as each way of sending one has it: A2A 0.3's
    and 1.0's JSON-RPC methods, sent and streamed, and HTTP+JSON's routes (path, headers,
    body)."""
    legacy = {"role": "user", "parts": [{"kind": "text", "text": "hi"}], "messageId": "m1"}
    message = {"role": "ROLE_USER", "parts": [{"text": "hi"}], "messageId": "m1"}
    legacy["contextId"] = message["contextId"] = context_id
    version = {"A2A-Version": "1.0"}
    calls = [(method, {}, legacy) for method in ("message/send", "message/stream")]
    calls += [(method, version, message) for method in ("SendMessage", "SendStreamingMessage")]
    sent = [
        ("/a2a", headers, {"jsonrpc": "2.0", "id": 5, "method": method, "params": {"message": m}})
        for method, headers, m in calls
    ]
    return sent + [
        (path, version, {"message": message})
        for path in ("/a2a/message:send", "/a2a/message:stream")
    ]


def _error_of(answer: httpx.Response) -> dict[str, Any]:
    """The error an A2A call was answered with: JSON-RPC's (as JSON or as the first event of
    a stream) or HTTP+JSON's."""
    if answer.text.startswith("data:"):
        answer_json = json.loads(answer.text.splitlines()[0].removeprefix("data:"))
    else:
        answer_json = answer.json()
    error: dict[str, Any] = answer_json["error"]
    return error


@pytest.mark.parametrize("context_id", ["..", "a/b", "x" * 600, "a\x00b", " "])
async def test_a_context_id_no_session_can_have_is_refused_before_any_task_not_logged_as_an_error(
    served: tuple[str, Keys], caplog: pytest.LogCaptureFixture, context_id: str
) -> None:
    # The client was answered invalid params, but the task had started: its execution
    # failing was logged as two server errors with their tracebacks.
    url, keys = served
    user = f"a2a-user-{uuid.uuid4().hex[:8]}"  # a user with nothing stored yet
    key = (await keys.store.create_key(kind="user", user_id=user)).key
    async with httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=30) as http:
        for path, headers, body in _sent_to(context_id):
            with caplog.at_level(logging.WARNING):
                answer = await http.post(path, json=body, headers=headers)
            error = _error_of(answer)
            assert error["code"] == (-32602 if path == "/a2a" else 400), (path, body, answer.text)
            assert error["message"].startswith("contextId cannot name a session: session_id ")
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
            assert [r for r in caplog.records if r.exc_info] == []
            caplog.clear()
        assert (await http.get("/sessions")).json()["items"] == []
        listing = await http.get("/a2a/tasks", headers={"A2A-Version": "1.0"})
        assert listing.json().get("tasks", []) == [], listing.text


async def test_a_context_id_with_spaces_around_it_is_refused_before_any_task(
    served: tuple[str, Keys], caplog: pytest.LogCaptureFixture
) -> None:
    # Its run wrote in the session of the id stripped, its task kept the id sent: listing the
    # context's tasks (either id) found none, and deleting the session left the task.
    url, keys = served
    user = f"a2a-user-{uuid.uuid4().hex[:8]}"  # a user with nothing stored yet
    key = (await keys.store.create_key(kind="user", user_id=user)).key
    version = {"A2A-Version": "1.0"}
    async with httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=30) as http:
        for path, headers, body in _sent_to(" pad "):
            with caplog.at_level(logging.WARNING):
                answer = await http.post(path, json=body, headers=headers)
            error = _error_of(answer)
            assert error["code"] == (-32602 if path == "/a2a" else 400), (path, body, answer.text)
            assert "contextId begins or ends with whitespace" in error["message"]
            assert "'pad'" in error["message"]
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
            caplog.clear()
        assert (await http.get("/sessions")).json()["items"] == []
        listing = {"jsonrpc": "2.0", "id": 2, "method": "ListTasks", "params": {}}
        listing["params"] = {"contextId": " pad "}
        answer = (await http.post("/a2a", json=listing, headers=version)).json()
        assert answer["error"]["code"] == -32602, answer
        assert "contextId begins or ends with whitespace" in answer["error"]["message"]
        listing["params"] = {}
        assert (await http.post("/a2a", json=listing, headers=version)).json()["result"][
            "tasks"
        ] == []


def test_a_message_the_apps_request_model_cannot_take_leaves_nothing_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The client was answered invalid params, but the task had been made (left failed), its
    # session opened (left empty), and its execution's failure logged as two server errors.
    class TenantRequest(AgentRequest):
        tenant: str

    tenanted = AgentApp(app_name="tenanted", request_model=TenantRequest)
    tenanted.query(framework="text")(query)
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=tenanted, key_store=keys.store)
    version = {"A2A-Version": "1.0"}
    with running(web) as url, httpx.Client(base_url=url, headers=bearer(keys.alice)) as http:
        for context_id in ("", "tenanted"):
            for path, headers, body in _sent_to(context_id):
                with caplog.at_level(logging.WARNING):
                    answer = http.post(path, json=body, headers=headers, timeout=30)
                error = _error_of(answer)
                code = -32602 if path == "/a2a" else 400
                assert error["code"] == code, (path, body, answer.text)
                assert "TenantRequest needs tenant" in error["message"]
                errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
                assert [r.getMessage() for r in errors] == []
                assert [r for r in caplog.records if r.exc_info] == []
                caplog.clear()
        time.sleep(0.2)  # what a task started in the background would store
        assert http.get("/sessions").json()["items"] == []
        listing = http.get("/a2a/tasks", headers=version)
        assert listing.json().get("tasks", []) == [], listing.text


@pytest.mark.parametrize(
    ("parts", "code", "says"),
    [
        # Anything but text was dropped: the agent ran on an empty message, which was stored.
        ([{"data": {"city": "Paris"}}], -32005, "a data part"),
        ([{"text": "look"}, {"url": "https://example.com/cat.png"}], -32005, "a url part"),
        ([{"raw": "aGk=", "mediaType": "text/plain"}], -32005, "a raw part"),
        ([{"text": " "}], -32602, "holds no text"),
        # A part holding nothing was refused as "a None part" of a kind the agent cannot take.
        ([{"text": "look"}, {"text": None}], -32602, "message.parts[1] holds nothing"),
        ([{"metadata": {"a": 1}}], -32602, "message.parts[0] holds nothing"),
    ],
)
async def test_a_message_the_agent_cannot_take_whole_is_refused_not_run_without_it(
    served: tuple[str, Keys], parts: list[dict[str, Any]], code: int, says: str
) -> None:
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    message = {"role": "ROLE_USER", "parts": parts, "messageId": "m1", "contextId": context_id}
    call = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        answer = (await http.post("/a2a", json=call, headers={"A2A-Version": "1.0"})).json()
        assert answer["error"]["code"] == code, answer
        assert says in answer["error"]["message"]
        assert (await http.get(f"/sessions/{context_id}")).status_code == 404
        assert (await http.get("/runs", params={"session_id": context_id})).json()["items"] == []


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        # Taken as the user's words, kept in the task's history as the agent's own.
        ({"role": "ROLE_AGENT"}, "message.role must be ROLE_USER"),
        # Taken, and kept in the task's history, whatever its length (up to the body's).
        ({"messageId": "m" * 100_000}, "message.messageId is longer than 512 characters"),
    ],
)
async def test_a_message_no_client_can_send_is_invalid_params_not_run(
    served: tuple[str, Keys], fields: dict[str, Any], says: str
) -> None:
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    message = {"role": "ROLE_USER", "parts": [{"text": "hello"}], "messageId": "m1"}
    message.update(contextId=context_id, **fields)
    call = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        answer = (await http.post("/a2a", json=call, headers={"A2A-Version": "1.0"})).json()
        assert answer["error"]["code"] == -32602, answer
        assert says in answer["error"]["message"]
        assert (await http.get(f"/sessions/{context_id}")).status_code == 404
        assert (await http.get("/runs", params={"session_id": context_id})).json()["items"] == []


# A2A 0.3's HTTP+JSON form of messages the agent refuses: a file part, no content.
_REFUSED_0_3 = [
    ({"file": {"fileWithUri": "https://a.example/b.png", "mimeType": "image/png"}}, "a url part"),
    (None, "Validation failed"),
]


@pytest.mark.parametrize(("part", "says"), _REFUSED_0_3)
async def test_an_a2a_0_3_stream_of_a_refused_message_is_answered_as_its_send_not_broken_off(
    served: tuple[str, Keys], part: dict[str, Any] | None, says: str
) -> None:
    # message:stream answered 200 text/event-stream, then broke its body off unfinished.
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    message = {"role": "ROLE_USER", "messageId": "m1", "contextId": context_id}
    message["content"] = [part] if part else []
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        sent = await http.post("/a2a/v1/message:send", json={"message": message})
        streamed = await http.post("/a2a/v1/message:stream", json={"message": message})
        assert sent.status_code == streamed.status_code == 400, streamed.text
        assert streamed.json() == sent.json()
        assert says in streamed.json()["error"]["message"]
        assert (await http.get(f"/sessions/{context_id}")).status_code == 404


async def test_a_json_rpc_stream_of_a_refused_message_is_one_error_event(
    served: tuple[str, Keys],
) -> None:
    # JSON-RPC answers a call with a 200 whatever it says: the stream is the error, whole.
    url, keys = served
    file = {"kind": "file", "file": {"uri": "https://a.example/b.png", "mimeType": "image/png"}}
    message = {"role": "user", "messageId": "m1", "parts": [file]}
    call = {"jsonrpc": "2.0", "id": 4, "method": "message/stream", "params": {"message": message}}
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        answer = await http.post("/a2a", json=call)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [line for line in answer.text.splitlines() if line.startswith("data:")]
    assert len(events) == 1, answer.text
    assert _error_of(answer)["code"] == -32005


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/a2a/v1/message:send", "POST"),
        ("GET", "/a2a/message:send", "POST"),
        ("POST", "/a2a/v1/tasks/t1", "GET, HEAD"),
        ("PUT", "/a2a/tasks/t1", "GET, HEAD"),
        ("GET", "/a2a", "POST"),
    ],
)
async def test_a_method_an_a2a_route_does_not_serve_is_a_405_allowing_those_it_does(
    served: tuple[str, Keys], method: str, path: str, allowed: str
) -> None:
    # Allow named every method, the refused one included.
    url, keys = served
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        answer = await http.request(method, path, headers={"A2A-Version": "1.0"})
        assert answer.status_code == 405, answer.text
        assert answer.headers["allow"] == allowed
        assert (await http.get("/a2a/no/such/route")).status_code == 404


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/a2a", a2a_send("hello")),
        ("/a2a/v1/message:send", {"message": {"role": "ROLE_USER", "messageId": "m1"}}),
        ("/a2a/v1/message:stream", {"message": {"role": "ROLE_USER", "messageId": "m1"}}),
        ("/a2a/message:send", {"message": {"role": "ROLE_USER", "messageId": "m1"}}),
    ],
)
async def test_an_a2a_body_not_sent_as_json_is_a_415_and_not_run(
    served: tuple[str, Keys], path: str, body: dict[str, Any], content_type: str | None
) -> None:
    # The SDK read it as JSON whatever its type, and ran the agent on it.
    url, keys = served
    user = f"a2a-user-{uuid.uuid4().hex[:8]}"  # a user with nothing stored yet
    key = (await keys.store.create_key(kind="user", user_id=user)).key
    if "message" in body:
        body["message"]["content" if "/v1/" in path else "parts"] = [{"text": "hello"}]
    headers = {"A2A-Version": "1.0"} if path == "/a2a/message:send" else {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=30) as http:
        answer = await http.post(path, content=json.dumps(body), headers=headers)
        assert answer.status_code == 415, answer.text
        assert answer.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
        assert (await http.get("/sessions")).json()["items"] == []


async def test_a_task_id_or_context_id_no_task_can_have_is_a_client_error(
    served: tuple[str, Keys],
) -> None:
    url, keys = served
    long_id = "t" * 300
    version = {"A2A-Version": "1.0"}
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        for method in ("tasks/get", "tasks/cancel"):
            call = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"id": long_id}}
            answer = (await http.post("/a2a", json=call)).json()
            assert answer["error"]["code"] == -32001, answer  # task not found
        listing = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "ListTasks",
            "params": {"contextId": "a\x01b"},
        }
        answer = (await http.post("/a2a", json=listing, headers=version)).json()
        assert answer["error"]["code"] == -32602, answer  # invalid params
        assert "contextId cannot name a session" in answer["error"]["message"]
        for method, path in (
            ("GET", f"/a2a/tasks/{long_id}"),
            ("POST", f"/a2a/tasks/{long_id}:cancel"),
        ):
            response = await http.request(method, path, headers=version)
            assert response.status_code == 404, response.text
        response = await http.get("/a2a/tasks", params={"contextId": "a\x01b"}, headers=version)
        assert response.status_code == 400, response.text


async def test_an_a2a_0_3_history_length_no_task_can_have_is_invalid_params(
    served: tuple[str, Keys],
) -> None:
    # The SDK's 0.3 route answered one past 32 bits with an internal error (-32603), and
    # logged it with its traceback as a server error.
    url, keys = served
    message = a2a_send("hi")["params"]["message"]
    too_long = 2**31
    calls = [
        ("message/send", {"message": message, "configuration": {"historyLength": too_long}}),
        ("message/stream", {"message": message, "configuration": {"historyLength": too_long}}),
        ("tasks/get", {"id": "t1", "historyLength": too_long}),
    ]
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        for method, params in calls:
            call = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
            answer = (await http.post("/a2a", json=call)).json()
            assert answer["id"] == 7, answer
            assert answer["error"]["code"] == -32602, answer
            assert answer["error"]["message"] == (
                f"historyLength must be at most {too_long - 1}, got {too_long}"
            )
        fits = {"jsonrpc": "2.0", "id": 8, "method": "tasks/get", "params": {"id": "t1"}}
        fits["params"]["historyLength"] = too_long - 1
        answer = (await http.post("/a2a", json=fits)).json()
        assert answer["error"]["code"] == -32001, answer  # task not found


@pytest.mark.parametrize(
    ("method", "params", "says"),
    [
        ("tasks/get", {}, "id: Field required"),
        ("tasks/get", {"id": 5}, "id: Input should be a valid string"),
        ("tasks/cancel", None, "params: Field required"),
        ("tasks/resubscribe", {"id": ["t1"]}, "id: Input should be a valid string"),
        ("message/send", {"message": {"parts": []}}, "message.messageId: Field required"),
        ("message/stream", {}, "message: Field required"),
    ],
)
async def test_an_a2a_0_3_call_whose_params_its_method_cannot_take_is_invalid_params(
    served: tuple[str, Keys], method: str, params: dict[str, Any] | None, says: str
) -> None:
    # The SDK's 0.3 routes answered it as an invalid request (-32600), which JSON-RPC keeps
    # for a body that is no request at all, and logged it as a server error; its 1.0 methods
    # answer invalid params, as this does.
    url, keys = served
    call: dict[str, Any] = {"jsonrpc": "2.0", "id": 9, "method": method}
    if params is not None:
        call["params"] = params
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        answer = (await http.post("/a2a", json=call)).json()
    assert answer["id"] == 9, answer
    assert answer["error"]["code"] == -32602, answer
    assert says in answer["error"]["message"]


@pytest.mark.parametrize("version", ["1.0", "9.9", "later"])
@pytest.mark.parametrize(
    "method", ["message/send", "message/stream", "tasks/get", "tasks/resubscribe"]
)
async def test_an_a2a_0_3_call_saying_another_version_is_refused_as_not_supported(
    served: tuple[str, Keys], caplog: pytest.LogCaptureFixture, method: str, version: str
) -> None:
    # The SDK's 0.3 methods answered it with an internal error (-32603), where its 1.0
    # methods answer a version they do not speak as not supported (-32009).
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    call = a2a_send("hello", contextId=context_id)
    if method.startswith("tasks/"):
        call["params"] = {"id": "t1"}
    call = {**call, "id": 3, "method": method}
    headers = {**bearer(keys.alice), "A2A-Version": version}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        with caplog.at_level(logging.WARNING):
            answer = await http.post("/a2a", json=call)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["id"], answer.json()["error"]["code"]) == (3, -32009), answer.text
        assert answer.json()["error"]["message"] == (
            f"A2A version '{version}' is not supported by this handler. Expected version '0.3'."
        )
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert [r for r in caplog.records if r.exc_info] == []
        assert (await http.get(f"/sessions/{context_id}")).status_code == 404
        # The version A2A 0.3 speaks, as the SDK reads it: its major version.
        answer = await http.post("/a2a", json=call, headers={"A2A-Version": "0.3.1"})
        assert answer.status_code == 200, answer.text
        assert "-32009" not in answer.text


@pytest.mark.parametrize("method", ["message/send", "message/stream", "tasks/get"])
@pytest.mark.parametrize("without_id", [{}, {"id": None}])
async def test_an_a2a_0_3_call_without_an_id_is_refused_saying_so_and_not_run(
    served: tuple[str, Keys], method: str, without_id: dict[str, Any]
) -> None:
    # A2A 0.3 takes no notifications (its methods' requests need an id), and its SDK's own
    # server answers one with an error, running nothing; this one's error was a dump of the
    # SDK's validation, quoting the message, which it also logged as a server error.
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    call = a2a_send("secret words", contextId=context_id)
    del call["id"]
    if method == "tasks/get":
        call["params"] = {"id": "t1"}
    call = {**call, **without_id, "method": method}
    await refused_without_id_and_not_run(url, keys, call, context_id, "A2A 0.3", {})


@pytest.mark.parametrize("method", ["SendMessage", "SendStreamingMessage", "GetTask"])
@pytest.mark.parametrize("without_id", [{}, {"id": None}])
async def test_an_a2a_1_0_call_without_an_id_is_refused_saying_so_and_not_run(
    served: tuple[str, Keys], method: str, without_id: dict[str, Any]
) -> None:
    # A JSON-RPC notification gets no answer, but the agent ran on it and its reply was sent
    # back (with a null id); A2A 0.3 calls without an id were already refused, nothing run.
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    message = new_text_message("secret words", context_id=context_id, role=Role.ROLE_USER)
    params = {"message": MessageToDict(message)} if "Message" in method else {"id": "t1"}
    call = {"jsonrpc": "2.0", "method": method, "params": params, **without_id}
    await refused_without_id_and_not_run(url, keys, call, context_id, "A2A", {"A2A-Version": "1.0"})


async def refused_without_id_and_not_run(
    url: str,
    keys: Keys,
    call: dict[str, Any],
    context_id: str,
    protocol: str,
    headers: dict[str, str],
) -> None:
    """``call`` (without an id, in the session ``context_id``) needs a key, and is refused
    saying it needs an id, quoting none of it; no session or run of it is left."""
    method = call["method"]
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        assert (await http.post("/a2a", json=call)).status_code == 401
        answer = await http.post("/a2a", json=call, headers=bearer(keys.alice))
        assert answer.status_code == 200, answer.text
        error = answer.json()["error"]
        assert (answer.json()["id"], error["code"]) == (None, -32600)
        assert error["message"] == (
            f"{method} needs an id (a string or a number): {protocol} takes no notifications"
        )
        assert "secret" not in answer.text
        http.headers.update(bearer(keys.alice))
        assert (await http.get(f"/sessions/{context_id}")).status_code == 404
        assert (await http.get("/runs", params={"session_id": context_id})).json()["items"] == []


@pytest.mark.parametrize(
    ("body", "answer_id", "says"),
    [
        ('"hello"', None, "a JSON-RPC request is an object"),
        ("5", None, "a JSON-RPC request is an object"),
        ("[]", None, "batches of requests (an array) are not supported"),
        (" null\n", None, "a JSON-RPC request is an object"),
        ('{"id": 3, "method": "GetTask", "params": {"id": "t1"}}', 3, 'jsonrpc must be "2.0"'),
        ('{"jsonrpc": "2.0", "id": 3}', 3, "method must be a string"),
        ('{"jsonrpc": "2.0", "id": 3, "method": 7}', 3, "method must be a string"),
        ('{"jsonrpc": "2.0", "id": {"a": 1}, "method": "GetTask"}', None, "id must be a string"),
        ('{"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": "t1"}', 3, "params must be"),
        ('{"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": null}', 3, "params must be"),
    ],
)
async def test_a_body_that_is_no_json_rpc_request_is_refused_saying_why_not_logged_as_an_error(
    served: tuple[str, Keys],
    caplog: pytest.LogCaptureFixture,
    body: str,
    answer_id: Any,
    says: str,
) -> None:
    # The SDK refused it, as an invalid request (or invalid params, for params null) whose
    # message was "Invalid Request" or "Invalid params" only, and logged it as a server error
    # with its traceback.
    url, keys = served
    headers = {**bearer(keys.alice), "A2A-Version": "1.0", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        with caplog.at_level(logging.ERROR, logger="a2a"):
            answer = await http.post("/a2a", content=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == answer_id
    assert answer.json()["error"]["code"] == -32600, answer.text
    assert says in answer.json()["error"]["message"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def _message_call(method: str, call_id: float) -> dict[str, Any]:
    if "/" in method:  # A2A 0.3
        message = {"role": "user", "kind": "message", "parts": [{"kind": "text", "text": "hi"}]}
    else:
        message = {"role": "ROLE_USER", "parts": [{"text": "hi"}]}
    message["messageId"] = uuid.uuid4().hex
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": {"message": message}}


@pytest.mark.parametrize(
    ("call", "answered_with"),
    [
        (_message_call("SendMessage", 1.5), "result"),
        (_message_call("SendStreamingMessage", 2.5), "result"),
        (_message_call("message/send", 1.0), "result"),
        (_message_call("message/stream", 0.25), "result"),
        ({"jsonrpc": "2.0", "id": 3.5, "method": "GetTask", "params": {"id": "none"}}, "error"),
    ],
)
async def test_a_call_whose_id_is_a_number_with_a_fraction_is_answered_with_that_id(
    served: tuple[str, Keys], call: dict[str, Any], answered_with: str
) -> None:
    # JSON-RPC allows a number with a fraction as id: it was refused as an invalid request
    # whose id was null.
    url, keys = served
    headers = {**bearer(keys.alice), "Content-Type": "application/json"}
    if "/" not in call["method"]:
        headers["A2A-Version"] = "1.0"
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        answer = await http.post("/a2a", content=json.dumps(call))
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        lines = answer.text.splitlines()
        answers = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
    else:
        answers = [answer.json()]
    assert answers and all(a["id"] == call["id"] for a in answers), answer.text
    assert all(answered_with in a for a in answers), answer.text
    assert json.dumps(call["id"]) in answer.text  # as sent: 1.0, not 1


_GET = b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t1"'


@pytest.mark.parametrize(
    ("body", "content_type", "code", "answer_id", "says"),
    [
        (b"\xff\xfe", "application/json", -32700, None, "the body is not valid UTF-8 text"),
        (_GET + b', "x": "\xff"}}', "application/json", -32700, None, "not valid UTF-8 text"),
        (_GET + b', "n": ' + b"1" * 5000 + b"}}", "application/json", -32700, None, "4300 digits"),
        (b"[" * 200 + b"]" * 200, "application/json", -32700, None, "nests deeper than 100"),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": '
            b'"\\ud800"}}',
            "application/json",
            -32602,
            1,
            "body.params.contextId is not valid Unicode text",
        ),
        (_GET + b', "n": NaN}}', "application/json", -32602, 1, "body.params.n is not a number"),
        (_GET + b'}, "x": "\\udc00"}', "application/json", -32600, 1, "body.x is not valid"),
        (
            b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "tasks/get", "params": {"id": "t1"}}',
            "application/json",
            -32600,
            None,
            "body.id is not valid Unicode text",
        ),
    ],
)
async def test_a_json_rpc_body_that_cannot_be_read_is_a_json_rpc_error_saying_why(
    served: tuple[str, Keys],
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    content_type: str,
    code: int,
    answer_id: int | None,
    says: str,
) -> None:
    # A body that is not UTF-8 was a parse error saying "Expecting value: line 1 column 1
    # (char 0)", or an HTTP 422 in the API's error shape, as was text that is not Unicode or
    # a number JSON cannot carry: no JSON-RPC error at all.
    url, keys = served
    headers = {**bearer(keys.alice), "A2A-Version": "1.0", "Content-Type": content_type}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        with caplog.at_level(logging.WARNING):
            answer = await http.post("/a2a", content=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["jsonrpc"] == "2.0", answer.text
        assert (answer.json()["id"], answer.json()["error"]["code"]) == (answer_id, code)
        assert says in answer.json()["error"]["message"]
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        # The HTTP+JSON routes answer it as the API's other routes do.
        rest = await http.post("/a2a/message:send", content=body)
        assert rest.status_code == 422, rest.text
        assert says in rest.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("GetTask", {"id": 5}),
        ("GetTask", {"id": "t1", "historyLength": 2**40}),
        ("ListTasks", {"statusTimestampAfter": "yesterday"}),
        ("SendMessage", {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": 5}}),
    ],
)
async def test_params_an_a2a_1_0_method_cannot_read_are_not_logged_as_a_server_error(
    served: tuple[str, Keys], caplog: pytest.LogCaptureFixture, method: str, params: Any
) -> None:
    # The client's mistake was logged as a server error, with the SDK's traceback.
    url, keys = served
    call = {"jsonrpc": "2.0", "id": 4, "method": method, "params": params}
    headers = {**bearer(keys.alice), "A2A-Version": "1.0"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        with caplog.at_level(logging.WARNING, logger="a2a"):
            answer = (await http.post("/a2a", json=call)).json()
    assert (answer["id"], answer["error"]["code"]) == (4, -32602), answer
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    warned = [r for r in caplog.records if r.getMessage() == "Failed to parse request params"]
    assert [(r.levelno, r.exc_info) for r in warned] == [(logging.WARNING, None)]


@pytest.mark.parametrize(
    ("method", "params", "version", "code"),
    [
        (
            "tasks/pushNotificationConfig/set",
            {"taskId": "t1", "pushNotificationConfig": {"url": "https://example.com/h"}},
            "0.3",
            -32003,
        ),
        (
            "CreateTaskPushNotificationConfig",
            {"taskId": "t1", "url": "https://example.com/h"},
            "1.0",
            -32003,
        ),
        ("GetExtendedAgentCard", {}, "1.0", -32004),
    ],
)
async def test_a_call_for_what_the_card_says_is_not_supported_is_not_logged_as_an_error(
    served: tuple[str, Keys],
    caplog: pytest.LogCaptureFixture,
    method: str,
    params: Any,
    version: str,
    code: int,
) -> None:
    # The SDK logged each as a server error ("Validation failure: ..."), by any client.
    url, keys = served
    call = {"jsonrpc": "2.0", "id": 4, "method": method, "params": params}
    headers = {**bearer(keys.alice), "A2A-Version": version}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        with caplog.at_level(logging.WARNING, logger="a2a"):
            answer = (await http.post("/a2a", json=call)).json()
    assert (answer["id"], answer["error"]["code"]) == (4, code), answer
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    warned = [r for r in caplog.records if r.getMessage().startswith("Validation failure")]
    assert [r.levelno for r in warned] == [logging.WARNING]


async def test_an_a2a_0_3_push_config_get_naming_only_its_task_is_not_supported(
    served: tuple[str, Keys],
) -> None:
    # A2A 0.3 takes {"id": taskId}; it was answered invalid params, "id Field is required".
    url, keys = served
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        sent = (await http.post("/a2a", json=a2a_send("hi", messageId=str(uuid.uuid4())))).json()
        for task_id in (sent["result"]["id"], "no-such-task"):
            call = {"jsonrpc": "2.0", "id": 2, "method": "tasks/pushNotificationConfig/get"}
            call["params"] = {"id": task_id}
            answer = (await http.post("/a2a", json=call)).json()
            assert answer["error"]["code"] == -32003, answer
            assert answer["error"]["message"] == "Push notifications are not supported by the agent"


async def test_an_agent_calls_another_a2a_agent_as_a_tool(served: tuple[str, Keys]) -> None:
    url, keys = served
    tool = await a2a_agent_tool(url, api_key=keys.alice)
    assert tool.name == "echo-a2a"
    assert tool.description == "Echoes what it is told, a word at a time."
    assert await tool.invoke('{"message": "ask the other agent"}') == "ask the other agent "
    # The model was told the other agent "did not complete the task", and nothing of why.
    assert await tool.invoke('{"message": "fail to answer"}') == (
        "error: the agent 'echo-a2a' did not complete the task (failed: Unknown agent error: "
        "RuntimeError: the well ran dry)"
    )
    with pytest.raises(Exception, match="401"):
        await a2a_agent_tool(url, api_key="ask_wrong_key")


async def test_an_agent_card_compressed_twice_is_refused_without_being_unpacked_whole() -> None:
    # 256 MiB of a card in a few KiB (gzip of gzip): another agent's server is not ours.
    inner = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    spaces = b" " * 1024**2
    packed = inner.compress(b'{"name": "') + b"".join(inner.compress(spaces) for _ in range(256))
    outer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = outer.compress(packed + inner.flush()) + outer.flush()
    assert len(bomb) < 64 * 1024
    web = FastAPI()

    @web.get("/.well-known/agent-card.json")
    async def card() -> Response:
        headers = {"Content-Encoding": "gzip, gzip"}
        return Response(bomb, media_type="application/json", headers=headers)

    tracemalloc.start()
    try:
        with running(web) as url, pytest.raises(Exception, match="larger than 67108864 bytes"):
            await a2a_agent_tool(url, api_key="ask_any")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 128 * 1024**2


@pytest.fixture(scope="module")
def remembering() -> Iterator[tuple[str, Keys]]:
    """The demo agent, which remembers what its users tell it, over A2A."""
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=demo_app, key_store=keys.store)
    with running(web) as url:
        yield url, keys


@pytest.mark.parametrize(
    ("kind", "first", "second"),
    # Users whose ids are not ASCII too (the header carries them as UTF-8).
    [("service", "sam", "tom"), ("service", "josé", "王伟"), ("alice", "alice", "bob")],
)
async def test_an_a2a_agent_called_as_a_tool_keeps_the_callers_users_apart(
    remembering: tuple[str, Keys], kind: str, first: str, second: str
) -> None:
    # Each user of the calling agent must be a user of its own there (a service key acts
    # for them; a user key only in its user's runs), never one user shared by all of them.
    url, keys = remembering
    tool = await a2a_agent_tool(url, api_key=getattr(keys, kind))
    caller = AgentApp(app_name="caller")

    @caller.query(framework="text")
    async def ask(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield await tool.invoke(json.dumps({"message": msgs[-1].get_text_content()}))

    async def reply(text: str, user_id: str) -> str:
        answer = await caller.query(text, user_id=user_id, session_id=uuid.uuid4().hex)
        return answer.output[-1].get_text_content() or ""

    assert "Nice to meet you, Zed" in await reply("My name is Zed", first)
    assert "Your name is Zed" in await reply("What is my name?", first)
    asked = await reply("What is my name?", second)
    assert "Zed" not in asked
    if kind != "service":
        assert "refused to act for this user" in asked


async def test_a_custom_endpoint_calling_an_a2a_agent_does_it_for_its_caller() -> None:
    remote_keys, local_keys = InMemoryKeyStore(), InMemoryKeyStore()
    for store in (remote_keys, local_keys):
        await store.start()
    remote_key = (await remote_keys.create_key(user_id="alice")).key
    alice, bob = [(await local_keys.create_key(user_id=u)).key for u in ("alice", "bob")]
    remote = create_app(settings=load_settings(), agent_app=demo_app, key_store=remote_keys)
    with running(remote) as remote_url:
        tool = await a2a_agent_tool(remote_url, api_key=remote_key)
        caller = AgentApp(app_name="caller")
        caller.query(framework="text")(query)

        @caller.endpoint("/ask", methods=["POST"])
        async def ask(body: dict[str, Any]) -> dict[str, str]:
            return {"reply": await tool.invoke(json.dumps({"message": body["message"]}))}

        served = caller.get_fastapi_app(settings=load_settings(), key_store=local_keys)
        with running(served) as url, httpx.Client(base_url=url, timeout=30) as client:

            def reply(key: str, message: str) -> str:
                answer = client.post("/ask", json={"message": message}, headers=bearer(key))
                return str(answer.json()["reply"])

            assert "Nice to meet you, Zed" in reply(alice, "My name is Zed")
            assert "Your name is Zed" in reply(alice, "What is my name?")
            assert "Zed" not in reply(bob, "What is my name?")


def test_a_message_sent_again_with_its_idempotency_key_gets_the_first_answer(
    served: tuple[str, Keys],
) -> None:
    # A2A went past the Idempotency-Key: each retry ran the agent, the turn stored twice.
    url, keys = served
    context_id = f"ctx-{uuid.uuid4().hex[:8]}"
    body = a2a_send("say it once", messageId=str(uuid.uuid4()), contextId=context_id)
    headers = {**bearer(keys.alice), "Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        first = client.post("/a2a", json=body, headers={"A2A-Version": "0.3"})
        again = client.post("/a2a", json=body, headers={"A2A-Version": "0.3"})
        assert first.status_code == again.status_code == 200
        assert "error" not in first.json(), first.text
        assert again.content == first.content
        assert again.headers["Idempotent-Replayed"] == "true"
        retried = client.post("/a2a", json={**body, "id": 2}, headers={"A2A-Version": "0.3"})
        assert retried.headers["Idempotent-Replayed"] == "true"
        assert retried.json() == {**first.json(), "id": 2}
        other = client.post(
            "/a2a",
            json=a2a_send("say it twice", contextId=context_id),
            headers={"A2A-Version": "0.3"},
        )
        assert other.status_code == 200
        assert other.json()["error"]["data"]["code"] == "IDEMPOTENCY_KEY_REUSED"
        bad = client.post("/a2a", json=body, headers={"Idempotency-Key": "no spaces"})
        assert bad.status_code == 422
        items = client.get(f"/sessions/{context_id}/messages").json()["items"]
    assert [m["role"] for m in items] == ["user", "assistant"]


def test_a2a_config_names_the_card_and_where_it_is_served() -> None:
    # AgentScope's a2a_config did not import (deployers.adapter.a2a), and a dict was ignored.
    from a2a.types import AgentSkill

    from agentscope_serverless.app.agent_app import AgentCardWithRuntimeConfig

    config = AgentCardWithRuntimeConfig(
        agent_card={
            "name": "Friday",
            "description": "Plans your day.",
            "version": "2.1.0",
            "skills": [AgentSkill(id="plan", name="Plan", description="Makes plans.")],
        },
        wellknown_path="/friday/card.json",
    )
    configured = AgentApp(app_name="echo-a2a", a2a_config=config)
    configured.query(framework="text")(query)
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=configured, key_store=keys.store)
    with running(web) as url:
        cards = [
            httpx.get(f"{url}{path}", headers=bearer(keys.alice)).json()
            for path in ("/.well-known/agent-card.json", "/friday/card.json")
        ]
    assert cards[0] == cards[1]
    assert (cards[0]["name"], cards[0]["description"], cards[0]["version"]) == (
        "Friday",
        "Plans your day.",
        "2.1.0",
    )
    assert [(s["id"], s["name"]) for s in cards[0]["skills"]] == [("plan", "Plan")]
    as_dict = AgentApp(a2a_config={"agent_card": {"name": "Jarvis"}}).a2a_card("http://h")
    assert as_dict.name == "Jarvis"


def test_an_a2a_registry_is_refused_not_ignored() -> None:
    from agentscope_serverless.deployers.adapter.a2a import A2ARegistry
    from agentscope_serverless.errors import ConfigurationError

    class Registry(A2ARegistry):
        def registry_name(self) -> str:
            return "mine"

        def register(self, agent_card: Any, a2a_transports_properties: Any = None) -> None:
            raise AssertionError("never called")

    with pytest.raises(ConfigurationError, match="registries"):
        AgentApp(a2a_config={"registry": Registry()})
    with pytest.raises(ValueError, match="wellknown_path"):
        AgentApp(a2a_config={"wellknown_path": "card.json"})


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/health", "/health"),
        ("/sessions", "/sessions"),
        ("/sessions/mine", "/sessions/{session_id}"),
        ("/docs", "/docs"),
        ("/a2a/tasks", "/a2a/tasks"),
        ("/a2a/v1/card", "/a2a/v1/card"),
        ("/a2a/tasks/mine", "/a2a/tasks/{id}"),
    ],
)
def test_a_wellknown_path_of_another_route_is_refused_at_start(path: str, route: str) -> None:
    # The route there answered, the card was not served, and nothing said so.
    from agentscope_serverless.errors import ConfigurationError

    configured = AgentApp(app_name="echo-a2a", a2a_config={"wellknown_path": path})
    configured.query(framework="text")(query)
    with pytest.raises(ConfigurationError) as refused:
        create_app(settings=load_settings(), agent_app=configured, key_store=Keys.make().store)
    assert f"wellknown_path {path!r}" in str(refused.value)
    assert f"GET {route}," in str(refused.value)


@pytest.mark.parametrize("path", ["/a2a", "/a2a/card", "/a2a/agent/card.json"])
def test_a_wellknown_path_the_a2a_routes_do_not_serve_serves_the_card(path: str) -> None:
    # Every path under /a2a/ was refused, though A2A serves GET on a few of them only.
    configured = AgentApp(app_name="echo-a2a", a2a_config={"wellknown_path": path})
    configured.query(framework="text")(query)
    keys = Keys.make()
    web = create_app(settings=load_settings(), agent_app=configured, key_store=keys.store)
    with running(web) as url:
        card = httpx.get(f"{url}{path}", headers=bearer(keys.alice))
        task = httpx.get(f"{url}/a2a/tasks/nowhere", headers=bearer(keys.alice))
    assert card.status_code == 200, card.text
    assert card.json()["name"] == "echo-a2a"
    assert task.status_code != 200 and "echo-a2a" not in task.text  # the binding still answers


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream;q=0, */*"])
async def test_an_accept_not_taking_events_is_a_406_to_an_http_json_stream(
    served: tuple[str, Keys], accept: str
) -> None:
    # It was ignored: the message ran, answered with a 200 event stream.
    url, keys = served
    context_id = f"a2a-{uuid.uuid4().hex[:8]}"
    message = {"role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": context_id}
    legacy = {"role": "user", "parts": [{"kind": "text", "text": "hi"}], "contextId": context_id}
    headers = {"Accept": accept, "A2A-Version": "1.0"}
    async with httpx.AsyncClient(base_url=url, headers=bearer(keys.alice), timeout=30) as http:
        sent = await http.post(
            "/a2a/message:send",
            json={"message": {**message, "messageId": uuid.uuid4().hex}},
            headers=headers,
        )
        assert sent.status_code == 200, sent.text
        task_id = sent.json()["task"]["id"]
        refused = [
            await http.post(
                "/a2a/message:stream",
                json={"message": {**message, "messageId": uuid.uuid4().hex}},
                headers=headers,
            ),
            await http.post(
                "/a2a/v1/message:stream",
                json={"message": {**legacy, "messageId": uuid.uuid4().hex}},
                headers={"Accept": accept},
            ),
            await http.get(f"/a2a/tasks/{task_id}:subscribe", headers=headers),
            await http.post(f"/a2a/tasks/{task_id}:subscribe", headers=headers),
            await http.get(f"/a2a/v1/tasks/{task_id}:subscribe", headers={"Accept": accept}),
        ]
        for answer in refused:
            assert answer.status_code == 406, answer.text
            error = answer.json()["error"]
            assert error["code"] == "NOT_ACCEPTABLE"
            assert error["message"].startswith("Accept does not take text/event-stream")
        runs = (await http.get("/runs", params={"session_id": context_id})).json()["items"]
        assert [run["kind"] for run in runs].count("a2a") == 1  # the message sent, none streamed
