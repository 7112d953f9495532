"""The events of asynchronous Lambda invocations that run background tasks.

Lambda delivers an asynchronous event at least once: the same task event may arrive again
after the task has finished. The runs store says whether it has.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentscope_serverless.services.runs.base import RunRecord
from agentscope_serverless.services.runs.in_memory import InMemoryRunsService
from agentscope_serverless.tasks import TASK_EVENT_KEY, TaskDefinition, run_task_event


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
