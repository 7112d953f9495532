"""The events of asynchronous Lambda invocations that run background tasks.

Lambda delivers an asynchronous event at least once, and invokes again after an error or a
timeout: the same task event may arrive again after the task has finished, while it runs,
or after it was cut short. The runs store says whether it has finished, and a claim made
before it runs keeps any other delivery from running it again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from agentscope_serverless.errors import StoreUnavailableError
from agentscope_serverless.local_stack import RedisServer
from agentscope_serverless.services.idempotency.base import StoredResponse
from agentscope_serverless.services.idempotency.in_memory import InMemoryIdempotencyStore
from agentscope_serverless.services.idempotency.redis import RedisIdempotencyStore
from agentscope_serverless.services.runs.base import RunRecord
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService
from agentscope_serverless.services.runs.redis import RedisRunsService
from agentscope_serverless.tasks import TASK_EVENT_KEY, TaskDefinition, run_task_event
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
