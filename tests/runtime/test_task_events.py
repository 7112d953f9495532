"""The events of asynchronous Lambda invocations that run background tasks.

Lambda delivers an asynchronous event at least once, and invokes again after an error or a
timeout: the same task event may arrive again after the task has finished, while it runs,
or after it was cut short. The runs store says whether it has finished, and a claim made
before it runs keeps any other delivery from running it again.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from redis import Redis

from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.log import logger
from agentscope_serverless.services.idempotency.base import StoredResponse
from agentscope_serverless.services.idempotency.in_memory import InMemoryIdempotencyStore
from agentscope_serverless.services.idempotency.redis import RedisIdempotencyStore
from agentscope_serverless.services.runs.base import RunRecord
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.tasks import (
    TASK_EVENT_KEY,
    LocalTaskExecutor,
    TaskDefinition,
    run_task_event,
)
from agentscope_serverless.time_limit import ending_by


def test_a_task_event_delivered_twice_runs_the_task_once() -> None:
    calls: list[Any] = []

    def send_invoice(payload: dict[str, Any]) -> dict[str, int]:
        calls.append(payload)
        return {"invoice": len(calls)}

    tasks = [TaskDefinition("/jobs/invoice", send_invoice)]
    event = {
        TASK_EVENT_KEY: {
            "path": "/jobs/invoice",
            "user_id": "alice",
            "task_id": "task_1",
            "payload": {"amount": 3},
        }
    }

    async def deliver_twice() -> RunRecord | None:
        runs = InMemoryRunsService()
        async with runs:
            await runs.create_run(
                RunRecord(id="task_1", user_id="alice", kind="task", name="/jobs/invoice")
            )
            await run_task_event(runs, tasks, event)
            await run_task_event(runs, tasks, event)
            return await runs.get_run("alice", "task_1")

    record = asyncio.run(deliver_twice())
    assert calls == [{"amount": 3}]
    assert record is not None
    assert record.status == "completed" and record.result == {"invoice": 1}


def test_a_task_event_without_its_run_runs_nothing() -> None:
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]
    event = {TASK_EVENT_KEY: {"path": "/jobs/invoice", "user_id": "alice", "task_id": "task_gone"}}

    async def deliver() -> None:
        runs = InMemoryRunsService()
        async with runs:
            await run_task_event(runs, tasks, event)

    asyncio.run(deliver())
    assert calls == []


def test_a_task_event_of_an_earlier_submission_runs_nothing() -> None:
    # The task erased, then submitted again under its id (the same Idempotency-Key): a
    # delivery of the first submission's event ran the task into the second's record.
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]
    event = _invoice_event()
    event[TASK_EVENT_KEY]["submission"] = "first"

    async def deliver() -> tuple[str, RunRecord | None]:
        runs = InMemoryRunsService()
        async with runs:
            again = RunRecord(
                id="task_1", user_id="alice", kind="task", name="/jobs/invoice", submission="second"
            )
            await runs.create_run(again)
            outcome = await run_task_event(runs, tasks, event)
            return outcome, await runs.get_run("alice", "task_1")

    outcome, record = asyncio.run(deliver())
    assert outcome == "skipped" and calls == []
    assert record is not None and record.status == "in_progress"


def _invoice_event(task_id: str = "task_1") -> dict[str, Any]:
    spec = {"path": "/jobs/invoice", "user_id": "alice", "task_id": task_id, "payload": {}}
    return {TASK_EVENT_KEY: spec}


async def _submitted(runs: InMemoryRunsService, task_id: str = "task_1") -> None:
    await runs.create_run(RunRecord(id=task_id, user_id="alice", kind="task", name="/jobs/invoice"))


def test_two_deliveries_of_a_task_event_at_once_run_the_task_once() -> None:
    calls: list[Any] = []

    async def send_invoice(payload: Any) -> int:
        calls.append(payload)
        await asyncio.sleep(0.05)
        return len(calls)

    tasks = [TaskDefinition("/jobs/invoice", send_invoice)]

    async def deliver_twice() -> list[str]:
        runs, claims = InMemoryRunsService(), InMemoryIdempotencyStore()
        async with runs, claims:
            await _submitted(runs)
            return list(
                await asyncio.gather(
                    run_task_event(runs, tasks, _invoice_event(), claims),
                    run_task_event(runs, tasks, _invoice_event(), claims),
                )
            )

    outcomes = asyncio.run(deliver_twice())
    assert calls == [{}]
    assert sorted(outcomes) == ["done", "skipped"]


def test_a_task_cut_short_is_not_run_again_by_lambdas_retry() -> None:
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]

    async def retry_after_a_timeout() -> RunRecord | None:
        runs, claims = InMemoryRunsService(), InMemoryIdempotencyStore()
        async with runs, claims:
            await _submitted(runs)
            # The first invocation claimed the task, then Lambda stopped it mid-run: the
            # record is still in progress, and Lambda invokes again with the same event.
            first = await claims.begin("alice", "task task_1", "background-task")
            await claims.complete(first, StoredResponse(202, {}, b""))
            outcome = await run_task_event(runs, tasks, _invoice_event(), claims)
            assert outcome == "skipped"
            return await runs.get_run("alice", "task_1")

    record = asyncio.run(retry_after_a_timeout())
    assert calls == []
    assert record is not None and record.status == "in_progress"


def test_an_error_before_the_claim_is_raised_and_the_retry_runs_the_task() -> None:
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]

    class FlakyRuns(InMemoryRunsService):
        failures = 1

        async def get_run(self, user_id: str, run_id: str) -> RunRecord | None:
            if self.failures:
                self.failures -= 1
                raise StoreUnavailableError("dynamodb", "throttled")
            return await super().get_run(user_id, run_id)

    async def deliver_with_a_retry() -> None:
        runs, claims = FlakyRuns(), InMemoryIdempotencyStore()
        async with runs, claims:
            await _submitted(runs)
            with pytest.raises(StoreUnavailableError):
                await run_task_event(runs, tasks, _invoice_event(), claims)
            assert await run_task_event(runs, tasks, _invoice_event(), claims) == "done"

    asyncio.run(deliver_with_a_retry())
    assert calls == [{}]


@pytest.mark.parametrize(
    "event",
    [
        {TASK_EVENT_KEY: "task_1"},
        {TASK_EVENT_KEY: None},
        {TASK_EVENT_KEY: {}},
        {TASK_EVENT_KEY: {"path": "/jobs/invoice", "user_id": 7, "task_id": "task_1"}},
        {TASK_EVENT_KEY: {"path": "/jobs/invoice", "user_id": "", "task_id": "task_1"}},
        {TASK_EVENT_KEY: {"path": "/jobs/invoice", "user_id": "alice", "task_id": ""}},
    ],
)
def test_a_poison_task_event_is_skipped_without_an_error(event: dict[str, Any]) -> None:
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]

    async def deliver() -> str:
        runs, claims = InMemoryRunsService(), InMemoryIdempotencyStore()
        async with runs, claims:
            await _submitted(runs)
            return await run_task_event(runs, tasks, event, claims)

    assert asyncio.run(deliver()) == "skipped"
    assert calls == []


def test_a_task_event_naming_a_run_of_the_agent_runs_nothing() -> None:
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]

    async def deliver() -> RunRecord | None:
        runs = InMemoryRunsService()
        async with runs:
            await runs.create_run(RunRecord(id="task_1", user_id="alice", kind="process"))
            assert await run_task_event(runs, tasks, _invoice_event()) == "skipped"
            return await runs.get_run("alice", "task_1")

    record = asyncio.run(deliver())
    assert calls == [] and record is not None and record.status == "in_progress"


def test_a_task_still_running_at_the_time_limit_is_stored_as_failed() -> None:
    stopped = asyncio.Event()

    async def slow_report(payload: Any) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    tasks = [TaskDefinition("/jobs/invoice", slow_report)]

    async def deliver_near_the_limit() -> RunRecord | None:
        runs = InMemoryRunsService()
        async with runs:
            await _submitted(runs)
            started = time.monotonic()
            with ending_by(time.time() + 0.3):
                assert await run_task_event(runs, tasks, _invoice_event()) == "done"
            assert time.monotonic() - started < 5
            assert stopped.is_set()  # the task's own cleanup ran
            return await runs.get_run("alice", "task_1")

    record = asyncio.run(deliver_near_the_limit())
    assert record is not None and record.status == "failed"
    assert record.error is not None and record.error["code"] == "TIME_LIMIT"


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_a_generator_task_still_running_at_the_time_limit_is_closed_and_stored_as_failed(
    kind: str,
) -> None:
    # A plain generator was run only once the task had ended, past the time limit, and its
    # items stored (an async generator's task failed: its result could not be stored).
    closed = threading.Event()

    def pages(payload: Any) -> Iterator[int]:
        try:
            for page in range(100):
                time.sleep(0.05)
                yield page
        finally:
            closed.set()

    async def async_pages(payload: Any) -> AsyncIterator[int]:
        try:
            for page in range(100):
                await asyncio.sleep(0.05)
                yield page
        finally:
            closed.set()

    tasks = [TaskDefinition("/jobs/invoice", pages if kind == "plain" else async_pages)]

    async def deliver_near_the_limit() -> RunRecord | None:
        runs = InMemoryRunsService()
        async with runs:
            await _submitted(runs)
            with ending_by(time.time() + 0.3):
                assert await run_task_event(runs, tasks, _invoice_event()) == "done"
            return await runs.get_run("alice", "task_1")

    record = asyncio.run(deliver_near_the_limit())
    assert closed.wait(timeout=10)  # its ``finally`` ran
    assert record is not None and record.status == "failed", record
    assert record.error is not None and record.error["code"] == "TIME_LIMIT"


class _RunsFailingOnce(RedisRunsService):
    """The runs of a Redis that drops the connection once, at the first write that marks a
    run started (``beat``) or ends it (``finish_run``), as a failover would."""

    failing = "beat"

    async def beat(self, record: RunRecord) -> None:
        if self.failing == "beat":
            self.failing = ""
            raise StoreUnavailableError("redis", "ConnectionError: connection reset")
        await super().beat(record)

    async def finish_run(
        self,
        user_id: str,
        run_id: str,
        status: str,
        *,
        result: Any = None,
        error: dict[str, Any] | None = None,
        submission: str | None = None,
    ) -> None:
        if self.failing == "finish_run":
            self.failing = ""
            raise StoreUnavailableError("redis", "ConnectionError: connection reset")
        await super().finish_run(
            user_id, run_id, status, result=result, error=error, submission=submission
        )


@pytest.mark.parametrize(("failing", "path"), [("beat", "/jobs/invoice"), ("finish_run", "/gone")])
def test_an_error_marking_a_claimed_task_started_is_raised_and_the_retry_runs_it(
    redis_server: RedisServer, user_id: str, failing: str, path: str
) -> None:
    calls: list[Any] = []
    tasks = [TaskDefinition("/jobs/invoice", calls.append)]
    task_id = f"task_{uuid.uuid4().hex}"
    spec = {"path": path, "user_id": user_id, "task_id": task_id, "payload": {}}

    async def deliver_with_a_retry() -> RunRecord | None:
        runs = _RunsFailingOnce(redis_url=redis_server.url)
        runs.failing = failing
        claims = RedisIdempotencyStore(redis_url=redis_server.url)
        async with runs, claims:
            record = RunRecord(id=task_id, user_id=user_id, kind="task", name=path, queued=True)
            await runs.create_run(record)
            with pytest.raises(StoreUnavailableError):
                await run_task_event(runs, tasks, {TASK_EVENT_KEY: spec}, claims)
            assert await run_task_event(runs, tasks, {TASK_EVENT_KEY: spec}, claims) == "done"
            # A third delivery finds it finished.
            assert await run_task_event(runs, tasks, {TASK_EVENT_KEY: spec}, claims) == "skipped"
            return await runs.get_run(user_id, task_id)

    record = asyncio.run(deliver_with_a_retry())
    assert record is not None
    if path == "/jobs/invoice":
        assert calls == [{}] and record.status == "completed"
    else:
        assert calls == [] and record.status == "failed"
        assert record.error is not None and record.error["code"] == "TASK_FAILED"


def test_two_deliveries_at_once_on_redis_run_the_task_once(
    redis_server: RedisServer, user_id: str
) -> None:
    calls: list[Any] = []

    async def send_invoice(payload: Any) -> int:
        calls.append(payload)
        await asyncio.sleep(0.05)
        return len(calls)

    tasks = [TaskDefinition("/jobs/invoice", send_invoice)]
    task_id = f"task_{uuid.uuid4().hex}"
    spec = {"path": "/jobs/invoice", "user_id": user_id, "task_id": task_id, "payload": {}}

    async def deliver_twice() -> list[str]:
        runs = RedisRunsService(redis_url=redis_server.url)
        claims = RedisIdempotencyStore(redis_url=redis_server.url)
        async with runs, claims:
            record = RunRecord(
                id=task_id, user_id=user_id, kind="task", name="/jobs/invoice", queued=True
            )
            await runs.create_run(record)
            event = {TASK_EVENT_KEY: spec}
            return list(
                await asyncio.gather(
                    run_task_event(runs, tasks, event, claims),
                    run_task_event(runs, tasks, event, claims),
                )
            )

    assert sorted(asyncio.run(deliver_twice())) == ["done", "skipped"]
    assert calls == [{}]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text")


def test_a_task_raising_an_error_without_text_is_stored_as_failed_with_its_type(
    redis_server: RedisServer, user_id: str
) -> None:
    def send_invoice(payload: Any) -> None:
        raise _Unprintable()

    tasks = [TaskDefinition("/jobs/invoice", send_invoice)]
    task_id = f"task_{uuid.uuid4().hex}"
    spec = {"path": "/jobs/invoice", "user_id": user_id, "task_id": task_id, "payload": {}}

    async def deliver() -> RunRecord | None:
        async with RedisRunsService(redis_url=redis_server.url) as runs:
            await runs.create_run(
                RunRecord(id=task_id, user_id=user_id, kind="task", name="/jobs/invoice")
            )
            assert await run_task_event(runs, tasks, {TASK_EVENT_KEY: spec}) == "done"
            return await runs.get_run(user_id, task_id)

    record = asyncio.run(deliver())
    assert record is not None and record.status == "failed"
    assert record.error == {"code": "TASK_FAILED", "message": "_Unprintable"}


def _refuse_writes(redis: RedisServer, refuse: bool) -> None:
    """Redis refusing every write (out of memory), as while it fails over; reads go on."""
    with Redis.from_url(redis.url) as client:
        client.config_set("maxmemory", 1 if refuse else 0)


@pytest.fixture
def failing_over() -> Iterator[tuple[RedisServer, Callable[[float], None]]]:
    """A Redis of the test's own, and what has it take writes again so many seconds from
    now (done before it stops, however soon)."""
    timers: list[threading.Timer] = []

    def taking_writes_again(after: float) -> None:
        timers.append(threading.Timer(after, _refuse_writes, (redis, False)))
        timers[-1].start()

    with RedisServer() as redis:
        try:
            yield redis, taking_writes_again
        finally:
            for timer in timers:
                timer.join()


def test_a_task_whose_end_is_refused_for_a_moment_is_stored_completed(
    failing_over: tuple[RedisServer, Callable[[float], None]], user_id: str
) -> None:
    redis, taking_writes_again = failing_over
    calls: list[Any] = []

    def report(payload: Any) -> dict[str, int]:
        calls.append(payload)
        # The store refuses writes as the task ends, and takes them again a moment later.
        _refuse_writes(redis, True)
        taking_writes_again(0.3)
        return {"pages": 42}

    tasks = [TaskDefinition("/jobs/report", report)]
    task_id = f"task_{uuid.uuid4().hex}"
    spec = {"path": "/jobs/report", "user_id": user_id, "task_id": task_id, "payload": {}}

    async def deliver() -> tuple[str, RunRecord | None]:
        runs = RedisRunsService(redis_url=redis.url)
        runs.poll_seconds = 1.0  # the pause between attempts: well after writes are back
        claims = RedisIdempotencyStore(redis_url=redis.url)
        async with runs, claims:
            record = RunRecord(
                id=task_id, user_id=user_id, kind="task", name="/jobs/report", queued=True
            )
            await runs.create_run(record)
            outcome = await run_task_event(runs, tasks, {TASK_EVENT_KEY: spec}, claims)
            return outcome, await runs.get_run(user_id, task_id)

    outcome, record = asyncio.run(deliver())
    assert outcome == "done" and calls == [{}]
    assert record is not None and record.status == "completed"
    assert record.result == {"pages": 42} and record.error is None


def test_a_task_whose_end_the_store_never_took_has_it_stored_by_lambdas_retry(
    failing_over: tuple[RedisServer, Callable[[float], None]],
    user_id: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    redis, _ = failing_over
    calls: list[Any] = []

    def report(payload: Any) -> dict[str, int]:
        calls.append(payload)
        _refuse_writes(redis, True)  # until after the invocation has given up
        return {"pages": 42}

    tasks = [TaskDefinition("/jobs/report", report)]
    task_id = f"task_{uuid.uuid4().hex}"
    spec = {"path": "/jobs/report", "user_id": user_id, "task_id": task_id, "payload": {}}
    event = {TASK_EVENT_KEY: spec}

    async def deliver_with_retries() -> RunRecord | None:
        runs = RedisRunsService(redis_url=redis.url)
        runs.poll_seconds = 0.05
        claims = RedisIdempotencyStore(redis_url=redis.url)
        async with runs, claims:
            record = RunRecord(
                id=task_id, user_id=user_id, kind="task", name="/jobs/report", queued=True
            )
            await runs.create_run(record)
            with pytest.raises(StoreUnavailableError):
                await run_task_event(runs, tasks, event, claims)
            # Lambda's retry, the store still refusing: raised again, for the next one.
            with pytest.raises(StoreUnavailableError):
                await run_task_event(runs, tasks, event, claims)
            stored = await runs.get_run(user_id, task_id)
            assert stored is not None and stored.status == "in_progress"
            _refuse_writes(redis, False)
            assert await run_task_event(runs, tasks, event, claims) == "done"
            # A later delivery finds it finished.
            assert await run_task_event(runs, tasks, event, claims) == "skipped"
            return await runs.get_run(user_id, task_id)

    level = logger.level
    logger.setLevel("ERROR")  # the tests log nothing below CRITICAL
    try:
        record = asyncio.run(deliver_with_retries())
    finally:
        logger.setLevel(level)
    assert calls == [{}]
    assert record is not None and record.status == "completed"
    assert record.result == {"pages": 42}
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    given_up = [r for r in logged if r["message"] == "the end of a background task was not stored"]
    assert len(given_up) == 2  # the invocation's, and its first retry's
    assert all(r["level"] == "ERROR" and r["task_id"] == task_id for r in given_up)


def test_a_task_run_in_the_server_whose_end_is_refused_for_a_moment_is_stored_completed(
    failing_over: tuple[RedisServer, Callable[[float], None]],
) -> None:
    redis, taking_writes_again = failing_over

    async def report(payload: Any) -> dict[str, int]:
        _refuse_writes(redis, True)
        taking_writes_again(0.3)
        return {"pages": 42}

    async def submit() -> RunRecord | None:
        runs = RedisRunsService(redis_url=redis.url)
        runs.poll_seconds = 1.0
        async with runs:
            executor = LocalTaskExecutor(runs)
            record = await executor.submit(TaskDefinition("/jobs/report", report), "alice", {})
            await executor.aclose()  # waits for the task
            return await runs.get_run("alice", record.id)

    record = asyncio.run(submit())
    assert record is not None and record.status == "completed"
    assert record.result == {"pages": 42}
