"""Background tasks on Lambda: each submitted task is an asynchronous invocation of a function.

:class:`LambdaTaskExecutor` stores the task as submitted, then invokes ``TASKS_FUNCTION_NAME``
with ``InvocationType=Event`` and the event ``{"agentscope_task": {...}}``; Lambda queues it
and the function (the buffered process function's handler, see
:mod:`agentscope_serverless.http.lambda_handler`) runs the task to completion and stores its
result. Only IAM principals allowed to invoke the function can send such an event: a Function
URL request never has that top-level key.

No bound on the tasks running at once is kept here (``TASKS_MAX_RUNNING`` is the in-server
executor's): each task runs in an invocation of its own, and Lambda's concurrency (the
account's, or the function's reserved concurrency) bounds them, queueing what it throttles.
"""

from __future__ import annotations

import json
from typing import Any

import aioboto3
from botocore.exceptions import BotoCoreError, ClientError

from agentscope_serverless.errors import PayloadTooLargeError, StoreUnavailableError
from agentscope_serverless.log import logger
from agentscope_serverless.services.runs.base import RunRecord, RunsService
from agentscope_serverless.tasks import (
    TASK_EVENT_KEY,
    TaskDefinition,
    new_submission,
    new_task_id,
)

# The largest payload of an asynchronous invocation Lambda takes (1 MB).
EVENT_PAYLOAD_LIMIT_BYTES = 1024 * 1024


class LambdaTaskExecutor:
    """Runs submitted tasks as asynchronous invocations of ``function_name``."""

    def __init__(
        self,
        runs: RunsService,
        function_name: str,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        self.runs = runs
        self.function_name = function_name
        self._session = aioboto3.Session(region_name=region_name)
        self._endpoint_url = endpoint_url

    async def submit(self, task: TaskDefinition, user_id: str, payload: Any) -> RunRecord:
        """Store the task as submitted and queue its invocation; returns its record.

        The invocation's event is the payload in compact JSON: one larger than Lambda takes
        raises :class:`PayloadTooLargeError` (413), and nothing is stored.
        """
        # Queued: Lambda may deliver the invocation long after (see RunRecord.queued).
        record = RunRecord(
            id=new_task_id(),
            user_id=user_id,
            kind="task",
            name=task.path,
            queued=True,
            submission=new_submission(),
        )
        spec = {
            "path": task.path,
            "user_id": user_id,
            "task_id": record.id,
            "submission": record.submission,
            "payload": payload,
        }
        event = json.dumps({TASK_EVENT_KEY: spec}, ensure_ascii=False, separators=(",", ":"))
        size = len(event.encode())
        if size > EVENT_PAYLOAD_LIMIT_BYTES:
            raise PayloadTooLargeError(
                f"a background task's payload reaches its function in an asynchronous Lambda "
                f"invocation, which takes at most {EVENT_PAYLOAD_LIMIT_BYTES} bytes: this one "
                f"takes {size}; send a smaller one (a reference to the data, say)"
            )
        await self.runs.create_run(record)
        try:
            async with self._session.client("lambda", endpoint_url=self._endpoint_url) as client:
                await client.invoke(
                    FunctionName=self.function_name,
                    InvocationType="Event",
                    Payload=event.encode(),
                )
        except (ClientError, BotoCoreError, OSError) as exc:
            logger.error("could not start a background task", extra={"task_id": record.id})
            error = {"code": "TASK_NOT_STARTED", "message": "the task could not be queued"}
            await self.runs.finish_run(
                user_id, record.id, "failed", error=error, submission=record.submission
            )
            raise StoreUnavailableError("lambda", type(exc).__name__) from None
        return record

    def executing(self) -> bool:
        """Never: the tasks run in their own invocations."""
        return False

    async def aclose(self) -> None:
        """Nothing runs here: the tasks run in their own invocations."""


__all__ = ["LambdaTaskExecutor"]
