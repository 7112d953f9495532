"""Background tasks over HTTP: submit to a task's path, read its status by id.

| Method and path | What |
|---|---|
| ``POST <task path>`` | submit the task with the JSON body as its argument (any JSON value, |
|  | ``null`` too; no body is a 422): 202 with its id; 429 with ``Retry-After`` when |
|  | the server runs as many tasks as it may (see ``LocalTaskExecutor``) |
| ``GET /tasks/{task_id}`` | status, result or error |
| ``GET <task path>/{task_id}`` | the same as AgentScope Runtime's route answers it: |
|  | ``pending``, ``finished`` (``result``) or ``error`` (the message as ``result``) |

A task belongs to the user who submitted it: another user gets 404, as does the status route
of another task's path.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from agentscope_serverless.errors import InvalidInputError, NotFoundError
from agentscope_serverless.http.auth import CurrentUser, KeyedRoute
from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.errors import not_json_type
from agentscope_serverless.http.openapi import error_answer
from agentscope_serverless.http.params import is_json_type
from agentscope_serverless.services.runs.base import MAX_RUN_ID_LENGTH, RunRecord, RunsService
from agentscope_serverless.tasks import TaskDefinition, TaskExecutor

Context = Annotated[AppContext, Depends(get_context)]
TaskId = Annotated[str, Path(min_length=1, max_length=MAX_RUN_ID_LENGTH)]


class TaskNotFoundError(NotFoundError):
    """No such task for this user."""

    code = "TASK_NOT_FOUND"


class TaskStatus(BaseModel):
    """A background task: ``in_progress``, then ``completed`` (with ``result``) or ``failed``
    (with ``error``)."""

    task_id: str
    path: str | None
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, record: RunRecord) -> TaskStatus:
        return cls(
            task_id=record.id,
            path=record.name,
            status=record.status,
            result=record.result,
            error=record.error,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


# AgentScope Runtime's names of the statuses, on the route of the task's own path.
_AGENTSCOPE_STATUSES = {"in_progress": "pending", "completed": "finished", "failed": "error"}


class AgentScopeTaskStatus(BaseModel):
    """A background task as AgentScope Runtime's ``GET <task path>/{task_id}`` answers it:
    ``pending``, then ``finished`` with its ``result``, or ``error`` with the error's
    message as its ``result``."""

    task_id: str
    status: str
    result: Any = None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, task: TaskStatus) -> AgentScopeTaskStatus:
        failed = task.status == "failed" and task.error is not None
        return cls(
            task_id=task.task_id,
            status=_AGENTSCOPE_STATUSES.get(task.status, task.status),
            result=task.error.get("message") if failed and task.error else task.result,
            created_at=task.created_at,
            updated_at=task.updated_at,
        )


def _runs(context: AppContext) -> RunsService:
    return context.runs


async def _status(
    context: AppContext, user_id: str, task_id: str, path: str | None = None
) -> TaskStatus:
    """The status of the user's task ``task_id``; when ``path`` is given, only of a task
    submitted there (a task's own status route does not answer another task's)."""
    record = await _runs(context).get_run(user_id, task_id)
    if record is None or record.kind != "task" or (path is not None and record.name != path):
        raise TaskNotFoundError("task not found")
    return TaskStatus.of(record)


# Any task's status; each task's own routes are the app's (see build_router).
router = APIRouter(tags=["tasks"], route_class=KeyedRoute)


@router.get("/tasks/{task_id}", summary="A background task's status and result")
async def get_task(task_id: TaskId, user_id: CurrentUser, context: Context) -> TaskStatus:
    return await _status(context, user_id, task_id)


def build_router(tasks: list[TaskDefinition], executor: TaskExecutor) -> APIRouter:
    """Routes submitting each of ``tasks`` and reading its status at its own path."""
    router = APIRouter(tags=["tasks"], route_class=KeyedRoute)
    for task in tasks:
        _add_task_routes(router, task, executor)
    return router


_TASK_BODY = "The task's argument: any JSON value (`null` for none)."
_BUSY = (
    "This server runs as many background tasks at once as it may (`TASK_CAPACITY`, "
    "`TASKS_MAX_RUNNING`), or the user their share of them (`TASK_QUOTA`): nothing was "
    "stored; submit again after `Retry-After` seconds."
)


def _add_task_routes(router: APIRouter, task: TaskDefinition, executor: TaskExecutor) -> None:
    async def submit(
        request: Request, user_id: CurrentUser, payload: Annotated[Any, Body()] = None
    ) -> JSONResponse:
        # The payload may be any JSON value, so a body of another type is not refused by its
        # validation as on the other routes: the task would get its text, or its bytes.
        content_type = request.headers.get("content-type")
        if not await request.body():
            # Read as JSON null: the task ran on None, where a JSON value (null too) is sent.
            raise InvalidInputError(
                "a body is required: the task's argument as JSON (null for none)", field="body"
            )
        if not is_json_type(content_type):
            return not_json_type(content_type)
        record = await executor.submit(task, user_id, payload)
        body = {
            "task_id": record.id,
            "status": "submitted",
            "queue": task.queue,
            "message": f"Task {record.id} submitted to queue {task.queue}",
        }
        return JSONResponse(body, status_code=202)

    async def status(
        task_id: TaskId, user_id: CurrentUser, context: Context
    ) -> AgentScopeTaskStatus:
        return AgentScopeTaskStatus.of(await _status(context, user_id, task_id, task.path))

    router.add_api_route(
        task.path,
        submit,
        methods=["POST"],
        status_code=202,
        summary=f"Submit the background task {task.function.__name__}",
        responses=error_answer(429, _BUSY),
        # Required: ``submit`` refuses a request without one, saying what to send (the
        # parameter's default keeps FastAPI's own refusal, of another status, out of it).
        openapi_extra={"requestBody": {"required": True, "description": _TASK_BODY}},
    )
    router.add_api_route(
        f"{task.path.rstrip('/')}/{{task_id}}",
        status,
        methods=["GET"],
        summary=f"The status of a {task.function.__name__} task",
    )


__all__ = ["AgentScopeTaskStatus", "TaskNotFoundError", "TaskStatus", "build_router", "router"]
