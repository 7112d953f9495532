"""stop() with calls under way, on each backend: they finish, new ones are refused, and
those a store holds past the grace say that the service was stopped."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentscope_serverless.errors import ServiceNotStartedError
from agentscope_serverless.local_stack import LOCAL_AWS_CREDENTIALS, DynamoDBServer, RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import Message, TextContent
from agentscope_serverless.services import base
from agentscope_serverless.services.agent_state import InMemoryStateService, StateService
from agentscope_serverless.services.agent_state.dynamodb import DynamoDBStateService
from agentscope_serverless.services.agent_state.redis import RedisStateService
from agentscope_serverless.services.base import (
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)
from agentscope_serverless.services.runs import InMemoryRunsService, RunRecord
from agentscope_serverless.services.session_history import (
    InMemorySessionHistoryService,
    SessionHistoryService,
)
from agentscope_serverless.services.session_history.dynamodb import (
    DynamoDBSessionHistoryService,
)
from agentscope_serverless.services.session_history.redis import RedisSessionHistoryService

CALLS = 30


def msg(text: str) -> Message:
    return Message(role="user", content=[TextContent(text=text)])


def given(text: str, message_id: str) -> Message:
    """A message whose id its sender gave."""
    return Message(id=message_id, role="user", content=[TextContent(text=text)])


def services_on(backend: str, server: Any) -> tuple[SessionHistoryService, StateService]:
    if backend == "in_memory":
        return InMemorySessionHistoryService(), InMemoryStateService()
    if backend == "redis":
        return RedisSessionHistoryService(server.url), RedisStateService(server.url)
    aws: dict[str, Any] = {
        "endpoint_url": server.endpoint_url,
        "region_name": server.region,
        **LOCAL_AWS_CREDENTIALS,
    }
    return (
        DynamoDBSessionHistoryService(server.sessions_table, **aws),
        DynamoDBStateService(server.state_table, **aws),
    )


@pytest.fixture(params=["in_memory", "redis", "dynamodb"])
def services(
    request: pytest.FixtureRequest,
) -> tuple[SessionHistoryService, StateService]:
    backend: str = request.param
    server = None if backend == "in_memory" else request.getfixturevalue(f"{backend}_server")
    return services_on(backend, server)


@pytest.fixture(params=["redis", "dynamodb"])
def paused_store(request: pytest.FixtureRequest) -> Iterator[RedisServer | DynamoDBServer]:
    """A store of the test's own, which it pauses (and which is resumed after it)."""
    server: RedisServer | DynamoDBServer = request.getfixturevalue(f"own_{request.param}_server")
    yield server
    server.resume()


async def under_way(calls: list[Any]) -> list[asyncio.Task[Any]]:
    """The ``calls`` started as tasks, each past its first step (its request sent)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    await asyncio.sleep(0)
    return tasks


async def test_stop_lets_the_calls_under_way_finish_and_refuses_new_ones(
    services: tuple[SessionHistoryService, StateService],
    user_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The grace is not what is tested (a loaded machine's local DynamoDB takes seconds for
    # the 63 calls): that the stop waits for them, however long they take within it.
    monkeypatch.setattr(base, "STOP_GRACE_SECONDS", 120)
    history, state = services
    await history.start()
    await state.start()
    session = await history.create_session(user_id, "s1")
    appends = await under_way(
        [history.append_message(session, msg(f"m{i}")) for i in range(CALLS)]
        # Two steps each (the ids looked up, then the append): the second comes after
        # stop() began, as part of a call under way.
        + [
            history.append_new_messages(session, [given(f"n{i}", f"id-{i}")], field="message")
            for i in range(3)
        ]
    )
    saves = await under_way([state.save_state(user_id, {"i": i}) for i in range(CALLS)])
    stopping = asyncio.ensure_future(asyncio.gather(history.stop(), state.stop()))
    await asyncio.sleep(0)
    with pytest.raises(ServiceNotStartedError, match="is not started"):
        await history.get_session(user_id, "s1")
    with pytest.raises(ServiceNotStartedError, match="is not started"):
        await state.save_state(user_id, {"late": True})

    await stopping
    results = await asyncio.gather(*appends, *saves, return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert not any(task.cancelled() for task in appends + saves)
    assert history._under_way == state._under_way == 0

    await history.start()
    await state.start()
    stored = await history.get_session(user_id, "s1")
    assert stored is not None
    assert len(stored.messages) == CALLS + 3
    assert await state.list_rounds(user_id, "default") == list(range(1, CALLS + 1))
    await history.stop()
    await state.stop()


async def test_calls_a_store_holds_past_the_grace_say_the_service_was_stopped(
    paused_store: RedisServer | DynamoDBServer,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    user_id: str,
) -> None:
    monkeypatch.setattr(base, "STOP_GRACE_SECONDS", 0)
    backend = "redis" if isinstance(paused_store, RedisServer) else "dynamodb"
    history, state = services_on(backend, paused_store)
    level = logger.level
    logger.setLevel("WARNING")  # the tests log nothing below CRITICAL
    try:
        async with history, state:
            session = await history.create_session(user_id, "s1")
            await state.save_state(user_id, {"first": True})
            paused_store.pause()
            calls = await under_way(
                [history.append_message(session, msg(f"m{i}")) for i in range(CALLS)]
                + [state.save_state(user_id, {"i": i}) for i in range(CALLS)]
            )
    finally:
        logger.setLevel(level)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert not any(task.cancelled() for task in calls)
    assert {type(r) for r in results} == {ServiceNotStartedError}
    assert {str(r) for r in results} == {
        f"{type(service).__name__} was stopped while this call was under way"
        for service in (history, state)
    }
    # The store did not fail: the service closed it, so nothing says it did.
    out, err = capfd.readouterr()
    assert "failed" not in out + err


class Gated(StartedGuard, ServiceWithLifecycleManager):
    """A service of one's own whose call waits for the test to open a gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()

    @service_call
    async def pass_gate(self) -> str:
        self.entered.set()
        await asyncio.to_thread(self.gate.wait)
        return "passed"


async def test_a_call_ending_in_another_threads_event_loop_ends_the_wait_of_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A stop that missed the end of the call would wait out its grace: here, for ever.
    monkeypatch.setattr(base, "STOP_GRACE_SECONDS", 3600)
    loop = asyncio.get_running_loop()
    loop.set_debug(True)  # a call of this loop's methods from another thread raises
    service = Gated()
    await service.start()
    with ThreadPoolExecutor(1) as thread:
        call = asyncio.wrap_future(thread.submit(asyncio.run, service.pass_gate()))
        await asyncio.to_thread(service.entered.wait)
        stopping = asyncio.ensure_future(service.stop())
        try:
            await asyncio.sleep(0)
            assert not stopping.done()  # waiting for the call
            with pytest.raises(ServiceNotStartedError, match="is not started"):
                await service.pass_gate()
            service.gate.set()
            assert await call == "passed"
            await stopping
        finally:
            stopping.cancel()
            loop.set_debug(False)
    assert service._under_way == service._cut_short == 0


async def test_stop_of_an_in_memory_service_waits_for_a_call_under_way_across_awaits(
    user_id: str,
) -> None:
    runs = InMemoryRunsService()
    runs.poll_seconds = 0.02
    await runs.start()
    await runs.create_run(RunRecord(id="never-ends", user_id=user_id, session_id="s1"))
    # Polls the run until it ends, or until the wait is over.
    stopping_runs = asyncio.ensure_future(runs.stop_runs(user_id, "s1", wait=0.3))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(runs.stop())
    await asyncio.sleep(0)
    try:
        assert not stopping.done()  # waiting for the call under way
        with pytest.raises(ServiceNotStartedError, match="is not started"):
            await runs.get_run(user_id, "never-ends")
        assert await stopping_runs == ["never-ends"]
        await stopping
    finally:
        stopping.cancel()
    assert runs._under_way == runs._cut_short == 0
