"""The run recorder's writes: one per run of a fast agent, a long run in the store early, and
the final event streamed once the run is stored."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentscope_serverless.errors import RunCanceledError, StoreUnavailableError
from agentscope_serverless.http.sse import RunEventStream
from agentscope_serverless.log import logger
from agentscope_serverless.recorder import LAST_WRITE_ATTEMPTS, RunRecorder
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    DataContent,
    Message,
    TextContent,
)
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.runs.base import RunBurst, RunRecord, StoredEvent
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService
from agentscope_serverless.services.session_history import InMemorySessionHistoryService
from agentscope_serverless.settings import load_settings


class CountingRunsService(InMemoryRunsService):
    """The in-memory runs store, counting its writes."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.writes: list[tuple[bool, int, bool]] = []

    async def _record(
        self, record: RunRecord, events: list[StoredEvent], create: bool, finish: bool
    ) -> bool | None:
        self.writes.append((create, len(events), finish))
        return await super()._record(record, events, create, finish)


class SlowWritingRunsService(InMemoryRunsService):
    """The in-memory runs store with writes that take a while, counting those in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = self.most_in_flight = 0

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            return await super()._record_many(bursts)
        finally:
            self.in_flight -= 1


async def _fast(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    for word in ("one ", "two ", "three"):
        yield word


async def _slow(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
    for word in ("one ", "two ", "three"):
        yield word
        await asyncio.sleep(0.1)


def _runner(handler: Any) -> Runner:
    services = Services(session_history=InMemorySessionHistoryService())
    return Runner(handler, services=services, settings=load_settings())


def _request() -> dict[str, Any]:
    return {"input": [{"role": "user", "content": "go"}]}


async def test_a_fast_run_is_stored_in_one_write() -> None:
    runs = CountingRunsService()
    runner = _runner(_fast)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs)
        run = await recorder.start(runner.stream_query(_request()), user_id="alice")
        final = await run.final()
        assert final.status == "completed"
        (write,) = runs.writes
        assert write == (True, final.sequence_number + 1, True)
        stored = await runs.get_run("alice", run.run_id)
        assert stored is not None and stored.status == "completed"


async def test_a_listener_slower_than_the_run_gets_every_event_to_the_last() -> None:
    # A run that ended while its listener was still taking the events it had (the listener
    # waiting elsewhere between two) ended its events() there: the last (the final
    # response) was never given.
    runner = _runner(_fast)
    async with runner.services.get("session_history"), runner:
        run = await RunRecorder(None).start(runner.stream_query(_request()), user_id="alice")
        seen = []
        async with contextlib.aclosing(run.events()) as events:
            async for event in events:
                seen.append(event)
                if len(seen) == 1:
                    await run.wait_stored()  # the run ends meanwhile
    assert isinstance(seen[-1], AgentResponse) and seen[-1].status == "completed"
    assert [event.sequence_number for event in seen] == list(range(len(seen)))


async def test_a_stored_run_is_forgotten_once_it_ends() -> None:
    runs = CountingRunsService()
    runner = _runner(_fast)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs)
        finished = []
        for _ in range(3):
            run = await recorder.start(runner.stream_query(_request()), user_id="alice")
            finished.append(await run.final())
        assert all(final.status == "completed" for final in finished)
        # Nothing keeps a finished run (its events) alive in the process.
        assert not recorder._live and not recorder._runs
        assert not recorder.cancel_local("alice", finished[0].id or "")


async def test_a_long_run_is_in_the_store_before_it_ends() -> None:
    runs = CountingRunsService()
    runner = _runner(_slow)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs, first_write_delay=0.05)
        run = await recorder.start(runner.stream_query(_request()), user_id="alice")
        await asyncio.sleep(0.15)
        early = await runs.get_run("alice", run.run_id)
        assert early is not None and early.status == "in_progress"
        assert await runs.read_events("alice", run.run_id)
        final = await run.final()
        assert final.status == "completed"
        assert runs.writes[0][0] and not any(create for create, _, _ in runs.writes[1:])
        assert runs.writes[-1][2] and len(runs.writes) >= 2
        stored = await runs.read_events("alice", run.run_id)
        assert [sequence for sequence, _ in stored] == list(range(final.sequence_number + 1))


async def _ended_runs(runs: InMemoryRunsService, user_id: str, count: int) -> None:
    for index in range(count):
        await runs.create_run(RunRecord(id=f"r{index}", user_id=user_id))
        await runs.finish_run(user_id, f"r{index}", "completed")


async def _kept(runs: InMemoryRunsService, user_id: str, count: int) -> list[int]:
    return [index for index in range(count) if await runs.get_run(user_id, f"r{index}")]


async def test_the_in_memory_store_keeps_each_users_newest_runs() -> None:
    async with InMemoryRunsService(max_runs=3) as runs:
        await _ended_runs(runs, "alice", 5)
        assert await _kept(runs, "alice", 5) == [2, 3, 4]


async def test_the_in_memory_store_drops_no_run_in_progress() -> None:
    # It dropped the oldest run whatever its status: one still going read 404, could not
    # be cancelled, and was not stored as it ended.
    async with InMemoryRunsService(max_runs=3) as runs:
        await runs.create_run(RunRecord(id="going", user_id="alice"))
        await _ended_runs(runs, "alice", 5)
        going = await runs.get_run("alice", "going")
        assert going is not None and going.status == "in_progress"
        assert await _kept(runs, "alice", 5) == [3, 4]
        await runs.finish_run("alice", "going", "completed")
        ended = await runs.get_run("alice", "going")
        assert ended is not None and ended.status == "completed"


async def test_one_users_runs_do_not_push_out_anothers_from_the_in_memory_store() -> None:
    async with InMemoryRunsService(max_runs=3) as runs:
        await _ended_runs(runs, "alice", 2)
        await _ended_runs(runs, "bob", 10)
        assert await _kept(runs, "alice", 2) == [0, 1]
        assert await _kept(runs, "bob", 10) == [7, 8, 9]


async def test_beyond_its_bound_the_in_memory_store_drops_the_oldest_runs_that_ended() -> None:
    async with InMemoryRunsService(max_runs=5, max_total_runs=6) as runs:
        await runs.create_run(RunRecord(id="going", user_id="carol"))
        await _ended_runs(runs, "alice", 2)
        await _ended_runs(runs, "bob", 5)
        assert await runs.get_run("carol", "going") is not None
        assert await _kept(runs, "alice", 2) == []
        assert await _kept(runs, "bob", 5) == [0, 1, 2, 3, 4]


async def test_the_writes_of_concurrent_runs_do_not_wait_for_each_other() -> None:
    runs = SlowWritingRunsService()
    runner = _runner(_fast)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs)

        async def one(user: str) -> str:
            run = await recorder.start(runner.stream_query(_request()), user_id=user)
            final = await run.final()
            assert final.status == "completed"
            return run.run_id

        users = [f"user-{index}" for index in range(8)]
        run_ids = await asyncio.gather(*(one(user) for user in users))
        assert runs.most_in_flight > 1
        for user, run_id in zip(users, run_ids, strict=True):
            stored = await runs.get_run(user, run_id)
            assert stored is not None and stored.status == "completed"
        assert not recorder._live and not recorder._runs


class GatedRunsService(InMemoryRunsService):
    """The in-memory runs store, whose writes wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.stored = False

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        await self.gate.wait()
        answers = await super()._record_many(bursts)
        self.stored = True
        return answers


async def test_a_streamed_run_sends_its_final_event_once_the_run_is_stored() -> None:
    runs = GatedRunsService()
    runner = _runner(_fast)
    async with runs, runner.services.get("session_history"), runner:
        run = await RunRecorder(runs).start(runner.stream_query(_request()), user_id="alice")
        sent: list[tuple[dict[str, Any], bool]] = []

        async def send(message: Any) -> None:
            sent.append((message, runs.stored))

        async def receive() -> Any:
            await asyncio.Event().wait()

        streaming = asyncio.create_task(RunEventStream(run, ping_interval=15)({}, receive, send))
        await asyncio.sleep(0.2)  # the run has ended; its write waits
        assert not streaming.done()
        runs.gate.set()
        await streaming
        final = await run.final()
        assert final.status == "completed"
        final_id = f"id: {final.sequence_number}\n".encode()
        *earlier, (last, stored) = sent
        assert all(final_id not in message.get("body", b"") for message, _ in earlier)
        assert stored and last["more_body"] is False and final_id in last["body"]


async def _unencodable(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[Any]:
    yield "half "
    yield DataContent(data={"arguments": "a lone surrogate: \udc00"})
    yield "never sent"


async def test_an_event_that_cannot_be_encoded_fails_the_run_with_a_final_event() -> None:
    # Before: the stream stopped after "half " with no final event, and even the input was
    # lost (the partial reply could not be stored, and it was stored with the input).
    runs = InMemoryRunsService()
    runner = _runner(_unencodable)
    history = runner.services.get("session_history")
    async with runs, history, runner:
        run = await RunRecorder(runs).start(
            runner.stream_query({**_request(), "session_id": "s1", "user_id": "alice"}),
            user_id="alice",
        )
        events = [event async for event in run.events()]
        final = events[-1]
        assert isinstance(final, AgentResponse) and final.status == "failed"
        assert final.error is not None and final.error.code == "AGENT_ERROR"
        assert "not valid Unicode" in final.error.message
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.text for e in events if isinstance(e, TextContent) and e.delta] == ["half "]
        stored = await runs.get_run("alice", run.run_id)
        assert stored is not None and stored.status == "failed"
        assert [s for s, _ in await runs.read_events("alice", run.run_id)] == list(
            range(len(events))
        )
        session = await history.get_session("alice", "s1")
        assert session is not None
        assert [m.get_text_content() for m in session.messages] == ["go"]


class GatedSessionHistory(InMemorySessionHistoryService):
    """The in-memory session history, whose appends wait for ``gate`` (on DynamoDB an
    append is several requests)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.appending = asyncio.Event()

    async def _append_messages(
        self, user_id: str, session_id: str, messages: list[Message]
    ) -> list[Message]:
        self.appending.set()
        await self.gate.wait()
        return await super()._append_messages(user_id, session_id, messages)


async def test_a_cancel_while_the_turn_is_saved_comes_too_late_and_the_run_completes() -> None:
    # Before: the cancellation cut the append short, and the session kept nothing of the
    # turn, not even its input; the run ended canceled.
    history = GatedSessionHistory()
    runner = Runner(_fast, services=Services(session_history=history), settings=load_settings())
    runs = InMemoryRunsService()
    async with runs, history, runner:
        run = await RunRecorder(runs).start(
            runner.stream_query({**_request(), "session_id": "s1", "user_id": "alice"}),
            user_id="alice",
        )
        await history.appending.wait()
        run.cancel()
        await asyncio.sleep(0.1)  # the cancellation lands; the run's first write is made
        history.gate.set()
        final = await run.final()
        assert final.status == "completed"
        stored = await runs.get_run("alice", run.run_id)
        assert stored is not None and stored.status == "completed"
        *_, (_, last) = await runs.read_events("alice", run.run_id)
        assert AgentResponse.model_validate_json(last) == final
        session = await history.get_session("alice", "s1")
        assert session is not None
        assert [m.get_text_content() for m in session.messages] == ["go", "one two three"]


async def test_a_run_silent_past_the_lost_bound_beats_and_stays_in_progress(
    monkeypatch: Any,
) -> None:
    # A run is taken for lost when its record is older than the bound: a run whose agent is
    # silent that long (a slow tool) keeps it fresh with its heartbeat.
    import agentscope_serverless.recorder as recorder_module
    import agentscope_serverless.services.runs.base as runs_base

    monkeypatch.setattr(recorder_module, "HEARTBEAT_SECONDS", 0.1)
    monkeypatch.setattr(runs_base, "LOST_AFTER_SECONDS", 0.4)
    release = asyncio.Event()

    async def _silent(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "thinking... "
        await release.wait()
        yield "done"

    runs = InMemoryRunsService()
    runner = _runner(_silent)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs, first_write_delay=0.05)
        run = await recorder.start(runner.stream_query(_request()), user_id="alice")
        for _ in range(8):  # 1.2 s, three times the bound
            await asyncio.sleep(0.15)
            seen = await runs.get_run("alice", run.run_id)
            assert seen is not None and seen.status == "in_progress", seen
        release.set()
        assert (await run.final()).status == "completed"
        stored = await runs.get_run("alice", run.run_id)
        assert stored is not None and stored.status == "completed"
        # Without the heartbeat (a process that died), the same silence reads as lost.
        record = stored.model_copy(update={"id": "dead", "status": "in_progress"})
        await runs.create_run(record)
        await asyncio.sleep(0.5)
        dead = await runs.get_run("alice", "dead")
        assert dead is not None and dead.status == "failed"


class PerEventRunsService(InMemoryRunsService):
    """The in-memory runs store with writes that take longer the more events they carry,
    as DynamoDB's do (a batch of items per 25 events)."""

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        await asyncio.sleep(0.0001 * sum(len(burst.events) for burst in bursts))
        return await super()._record_many(bursts)


async def test_a_run_with_many_events_to_store_at_once_is_never_seen_lost(
    monkeypatch: Any,
) -> None:
    # A burst of thousands of events (a fast agent, a slow store) once went in one write,
    # which took longer than the lost bound: the run's heartbeat waited for it, and readers
    # saw the run failed (RUN_LOST) meanwhile, then completed.
    import agentscope_serverless.recorder as recorder_module
    import agentscope_serverless.services.runs.base as runs_base

    monkeypatch.setattr(recorder_module, "HEARTBEAT_SECONDS", 0.1)
    monkeypatch.setattr(runs_base, "LOST_AFTER_SECONDS", 0.6)

    async def _burst(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        yield "start "
        await asyncio.sleep(0.2)  # the run is stored, then its words come all at once
        for index in range(8000):
            yield f"w{index} "

    runs = PerEventRunsService()
    runner = _runner(_burst)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs, first_write_delay=0.05)
        run = await recorder.start(runner.stream_query(_request()), user_id="alice")
        ending = asyncio.ensure_future(run.final())
        seen: list[str] = []
        while not ending.done():
            record = await runs.get_run("alice", run.run_id)
            if record is not None:
                seen.append(record.status)
            await asyncio.sleep(0.05)
        assert (await ending).status == "completed"
        assert set(seen) <= {"in_progress", "completed"}, seen
        stored = await runs.get_run("alice", run.run_id)
        assert stored is not None and stored.status == "completed"
        events = await runs.read_events("alice", run.run_id)
        assert [sequence for sequence, _ in events] == list(range(len(events)))


class FailingRunsService(InMemoryRunsService):
    """A runs store that is down: each write fails after ``delay`` seconds (a store that
    refuses at once, or one that does not answer until its timeout), and so does each read
    of a run's cancellation mark."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.writes = 0
        self.polls = 0

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        self.writes += 1
        await asyncio.sleep(self.delay)
        raise StoreUnavailableError("redis", "the request timed out")

    async def get_run(self, user_id: str, run_id: str) -> RunRecord | None:
        self.polls += 1
        raise StoreUnavailableError("redis", "the connection failed")


async def test_the_last_write_is_tried_again_after_a_quick_failure_only(
    monkeypatch: Any,
) -> None:
    # The client gets the run's last events once its last write is done or given up: a store
    # that takes its whole timeout to fail is not asked twice more.
    import agentscope_serverless.recorder as recorder_module

    monkeypatch.setattr(recorder_module, "LAST_WRITE_PATIENCE_SECONDS", 0.2)
    for delay, attempts in ((0.0, recorder_module.LAST_WRITE_ATTEMPTS), (0.3, 1)):
        runs = FailingRunsService(delay)
        runs.poll_seconds = 0.01
        runner = _runner(_fast)
        async with runs, runner.services.get("session_history"), runner:
            run = await RunRecorder(runs).start(runner.stream_query(_request()), user_id="alice")
            assert (await run.final()).status == "completed"
            assert runs.writes == attempts


async def test_a_store_outage_is_logged_once_per_run_not_at_every_write_or_poll(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def chatty(self: Any, msgs: Any, **kwargs: Any) -> AsyncIterator[str]:
        for _ in range(20):
            yield "word "
            await asyncio.sleep(0.02)

    runs = FailingRunsService(0.0)
    runs.poll_seconds = 0.01
    runner = _runner(chatty)
    level = logger.level
    logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
    try:
        async with runs, runner.services.get("session_history"), runner:
            recorder = RunRecorder(runs, first_write_delay=0.01)
            run = await recorder.start(runner.stream_query(_request()), user_id="alice")
            assert (await run.final()).status == "completed"
    finally:
        logger.setLevel(level)
    assert runs.polls > 5 and runs.writes > 5
    logged = capsys.readouterr().out
    assert logged.count("could not read the run's cancellation mark") == 1
    # Once while the run went on, then at each try of its last write.
    assert logged.count("could not store the run") == 1 + LAST_WRITE_ATTEMPTS


async def test_a_run_stopped_before_its_first_step_is_canceled_not_left_hanging() -> None:
    # A delete of its session stopping it before its task had run a line: the task, cancelled
    # before it began, never ran the code that ends the run, and its request waited for ever.
    runs = InMemoryRunsService()
    runner = _runner(_fast)
    async with runs, runner.services.get("session_history"), runner:
        recorder = RunRecorder(runs)
        request = {**_request(), "session_id": "s1"}
        starting = asyncio.ensure_future(
            recorder.start(runner.stream_query(request), user_id="alice", session_id="s1")
        )
        await asyncio.sleep(0)  # start() runs up to its first wait: the run's task is made
        assert recorder._runs, "the run has not started yet"
        await recorder.stop_local("alice", "s1", wait=5)
        with pytest.raises(RunCanceledError, match="canceled before it began"):
            await asyncio.wait_for(starting, 5)
        assert not recorder._runs
