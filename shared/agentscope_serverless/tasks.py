"""Background tasks: ``@app.task(path, queue)`` functions run apart from the request.

Submitting a task stores it as a run of kind ``task`` (status ``in_progress``) and returns
its id at once; an executor runs the function to completion and stores its result, or its
error (status ``failed``). Its status is read back from the runs store, so any process (or
Lambda instance) can answer ``GET /tasks/{task_id}``, and only for the user who submitted it.

The :class:`LocalTaskExecutor` runs tasks in the server's own event loop (a plain function
in a worker thread). No broker is needed.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_core import to_jsonable_python

from agentscope_serverless.log import logger
from agentscope_serverless.services._once import new_uuid
from agentscope_serverless.services._validation import require_finite
from agentscope_serverless.services.runs.base import HEARTBEAT_SECONDS, RunRecord, RunsService

TASK_FAILED = "TASK_FAILED"
# The key of the event of an asynchronous Lambda invocation that runs a task.
TASK_EVENT_KEY = "agentscope_task"
_MAX_ERROR_CHARS = 1000


@dataclass(frozen=True)
class TaskDefinition:
    """A function registered with ``@app.task(path, queue=...)``."""

    path: str
    function: Callable[..., Any]
    queue: str = "default"


def new_task_id() -> str:
    """A fresh task id (derived from the request's Idempotency-Key when it has one)."""
    return f"task_{new_uuid()}"


async def run_task(
    runs: RunsService, task: TaskDefinition, user_id: str, task_id: str, payload: Any
) -> None:
    """Run ``task`` with ``payload`` and store its result or its error; while it runs, its
    record is saved every ``HEARTBEAT_SECONDS``, so a task whose process stopped (a Lambda
    timeout) reads as lost (see :class:`~agentscope_serverless.services.runs.base.RunRecord`)."""
    try:
        result = await _beating(runs, user_id, task_id, _call(task, payload))
        # Numbers JSON cannot carry (NaN, infinities) fail the task rather than come back
        # as null.
        stored = to_jsonable_python(result, inf_nan_mode="constants")
        require_finite(stored, field="result")
    except Exception as exc:
        logger.info("a background task failed", extra={"task_id": task_id})
        message = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
        error = {"code": TASK_FAILED, "message": message}
        await runs.finish_run(user_id, task_id, "failed", error=error)
        return
    await runs.finish_run(user_id, task_id, "completed", result=stored)


async def _call(task: TaskDefinition, payload: Any) -> Any:
    if inspect.iscoroutinefunction(task.function):
        return await task.function(payload)
    result = await asyncio.to_thread(task.function, payload)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _beating(runs: RunsService, user_id: str, task_id: str, work: Awaitable[Any]) -> Any:
    """The result of ``work``, the task's record saved every ``HEARTBEAT_SECONDS`` until it
    ends. Each save is awaited before the next step, so none lands after the final one."""
    running = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait([running], timeout=HEARTBEAT_SECONDS)
            if done:
                return running.result()
            try:
                record = await runs.get_run(user_id, task_id)
                if record is not None and not record.finished:
                    await runs.beat(record)
            except Exception:
                logger.exception("could not save the task's heartbeat", extra={"task_id": task_id})
    finally:
        running.cancel()


class TaskExecutor(Protocol):
    """Where submitted tasks run: in this process, or in Lambda invocations."""

    async def submit(self, task: TaskDefinition, user_id: str, payload: Any) -> RunRecord:
        """Store the task as submitted, start it, and return its record."""
        ...

    async def aclose(self) -> None:
        """Called when the server stops."""
        ...


async def run_task_event(runs: RunsService, tasks: list[TaskDefinition], event: Any) -> None:
    """Run the task of an asynchronous invocation's event (``{TASK_EVENT_KEY: {...}}``).

    Lambda delivers such an event at least once: a task whose run has finished (a second
    delivery) or is not stored (expired, or never submitted) is not run again.
    """
    spec = event[TASK_EVENT_KEY]
    user_id, task_id = spec["user_id"], spec["task_id"]
    record = await runs.get_run(user_id, task_id)
    if record is None or record.finished:
        logger.info(
            "a task event for a finished or unknown task was skipped", extra={"task_id": task_id}
        )
        return
    task = next((t for t in tasks if t.path == spec["path"]), None)
    if task is None:
        error = {"code": TASK_FAILED, "message": f"no task is served at {spec['path']!r}"}
        await runs.finish_run(user_id, task_id, "failed", error=error)
        return
    await run_task(runs, task, user_id, task_id, spec.get("payload"))


class LocalTaskExecutor:
    """Runs submitted tasks in this process's event loop, each in a task of its own."""

    def __init__(self, runs: RunsService) -> None:
        self.runs = runs
        self._running: set[asyncio.Task[None]] = set()

    async def submit(self, task: TaskDefinition, user_id: str, payload: Any) -> RunRecord:
        """Store the task as submitted, start it, and return its record."""
        record = RunRecord(id=new_task_id(), user_id=user_id, kind="task", name=task.path)
        await self.runs.create_run(record)
        running = asyncio.create_task(run_task(self.runs, task, user_id, record.id, payload))
        self._running.add(running)
        running.add_done_callback(self._running.discard)
        return record

    async def aclose(self) -> None:
        """Wait (a little) for the tasks still running."""
        if self._running:
            await asyncio.wait(self._running, timeout=5)


__all__ = [
    "TASK_EVENT_KEY",
    "TASK_FAILED",
    "LocalTaskExecutor",
    "TaskDefinition",
    "TaskExecutor",
    "new_task_id",
    "run_task",
    "run_task_event",
]
