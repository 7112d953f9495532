"""The agent as an A2A agent, with the official ``a2a-sdk``: its executor runs our runs and
its task store is our runs store.

- :class:`RunsAgentExecutor` turns an A2A message into a recorded run of the agent (kind
  ``a2a``; the session is the A2A ``context_id``) and its events into A2A task events: the
  reply's text pieces as chunks of one artifact, the last one (no text) marked
  ``lastChunk``, then the final status (completed, failed or canceled). Cancelling the A2A
  task, through any process, cancels the run.
- :class:`RunsTaskStore` keeps A2A tasks in the runs store (kind ``a2a_task``), per user
  (the owner is the authenticated user), so any process can answer ``GetTask``.
- :func:`agent_card` describes the app (name, description, skills) with its interfaces
  (JSON-RPC and HTTP+JSON at ``<base URL>/a2a``) and a bearer security scheme.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from a2a.helpers.proto_helpers import get_message_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    GetTaskPushNotificationConfigRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Part,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    StringList,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.types import Message as A2AMessage
from a2a.types import Role as A2ARole
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.log import logger
from agentscope_serverless.recorder import (
    FIRST_WRITE_DELAY,
    RecordedRun,
    RunRecorder,
    write_last,
)
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Message,
    Role,
    RunStatus,
    TextContent,
)
from agentscope_serverless.services._once import new_uuid
from agentscope_serverless.services._validation import (
    MAX_ID_LENGTH,
    is_blank_text,
    require_session_id,
)
from agentscope_serverless.services.runs.base import (
    RUN_ID_KEY,
    STOP_TIMEOUT_SECONDS,
    RunRecord,
    RunsService,
)
from agentscope_serverless.time_limit import seconds_left

A2A_PATH = "/a2a"
SECURITY_SCHEME = "bearer"
# How long a subscriber waits for a task's run to be named, and, once the run has ended,
# for the task's end to be stored.
FOLLOW_START_SECONDS = 5.0
FOLLOW_END_SECONDS = 5.0
# Every chunk of a streamed reply is an event the SDK saves with its whole task: while only
# the reply grows, a task is written at most this often (what came between goes with the next
# write, or this long after the last one); a change of its state, and its end, at once.
TASK_SAVE_INTERVAL = 0.5
# How many tasks in progress a process remembers the last written record of (beyond, a task's
# next write reads its record first).
WRITTEN_TASKS = 1024
TERMINAL = {
    TaskState.TASK_STATE_COMPLETED: "completed",
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "canceled",
    TaskState.TASK_STATE_REJECTED: "failed",
}


# A task in these states is running its agent: it takes no message before it ends.
_WORKING = {TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING}


# The key, in an A2A call context's state, of the function told the session a call's run
# writes in (set by the HTTP layer: the call's Idempotency-Key goes when that session does).
SESSION_WRITER = "agentscope.writes_in_session"


def owner_of(context: ServerCallContext) -> str:
    """The user an A2A call acts as (set by the HTTP layer after authentication)."""
    return context.user.user_name


def _writes_in_session(context: ServerCallContext, session_id: str) -> None:
    """Tell the HTTP layer the call writes in ``session_id`` (see :data:`SESSION_WRITER`)."""
    writer = context.state.get(SESSION_WRITER)
    if writer is not None:
        writer(session_id)


class RunsAgentExecutor(AgentExecutor):
    """Runs A2A messages through the agent's runner, as recorded runs."""

    def __init__(
        self,
        runner: Runner,
        recorder: RunRecorder,
        make_request: Callable[..., AgentRequest] = AgentRequest,
    ) -> None:
        self.runner = runner
        self.recorder = recorder
        # The run's request, as the app's request model (AgentApp.run_request).
        self.make_request = make_request
        self._runs: dict[str, RecordedRun] = {}
        # Set once a task's execution has put its end (whatever it was) on its queue.
        self._relayed: dict[str, asyncio.Event] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id, context.context_id
        # The session of the run: the message's, which the handler checked, that of the
        # task it continues, or a new uuid.
        assert task_id is not None and context_id is not None
        user_id = owner_of(context.call_context)
        request = self.request(context.get_user_input(), context_id, user_id)
        # Before the first event, which may end a call not waiting for the run (its answer,
        # and its Idempotency-Key record, are made then). The session exists by then: the
        # record of a session that does not exist is taken for one whose session expired,
        # and a retry coming before the run opened it would run the message again.
        _writes_in_session(context.call_context, context_id)
        await self.runner.session_history_service.open_session(user_id, context_id, recent=0)
        if context.current_task is None and context.message is not None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        updater = TaskUpdater(event_queue, task_id, context_id)
        run = await self.recorder.start(
            self.runner.stream_query(request), user_id=user_id, kind="a2a", session_id=context_id
        )
        self._runs[task_id] = run
        relayed = self._relayed[task_id] = asyncio.Event()
        try:
            # The task names its run, so a cancel reaching another process can find it.
            await updater.update_status(
                TaskState.TASK_STATE_WORKING, metadata={RUN_ID_KEY: run.run_id}
            )
            await self._relay(run, updater)
        except asyncio.CancelledError:
            run.cancel()
            raise
        finally:
            self._runs.pop(task_id, None)
            self._relayed.pop(task_id, None)
            relayed.set()

    def request(self, text: str, session_id: str, user_id: str) -> AgentRequest:
        """The request of the run of a message holding ``text``, as the app's request model;
        invalid params when that model needs a field A2A cannot fill."""
        try:
            return self.make_request(
                input=[Message(role=Role.USER, content=[TextContent(text=text)])],
                session_id=session_id,
                user_id=user_id,
            )
        except InvalidInputError as exc:
            raise InvalidParamsError(exc.message) from None

    async def _relay(self, run: RecordedRun, updater: TaskUpdater) -> None:
        artifact_id = run.run_id
        first = True
        final: AgentResponse | None = None
        replies = _Replies()
        async for event in run.events():
            if isinstance(event, Message):
                replies.see({"id": event.id, "type": event.type, "role": event.role})
            elif (
                isinstance(event, TextContent)
                and event.delta
                and event.text
                and replies.holds(event.msg_id)
            ):
                await updater.add_artifact(
                    [Part(text=event.text)],
                    artifact_id=artifact_id,
                    name="reply",
                    metadata={RUN_ID_KEY: run.run_id},
                    append=not first,
                    last_chunk=False,
                )
                first = False
            elif isinstance(event, AgentResponse) and event.status in (
                RunStatus.Completed,
                RunStatus.Failed,
                RunStatus.Canceled,
            ):
                final = event
        if not first:
            # Which piece of text is the last is known only once the run has ended.
            await updater.event_queue.enqueue_event(
                _reply_end(updater.task_id, updater.context_id, artifact_id)
            )
        if final is None or final.status == RunStatus.Canceled:
            await updater.cancel()
        elif final.status == RunStatus.Failed:
            message = final.error.message if final.error else "the agent failed"
            await updater.failed(
                new_text_message(
                    message,
                    context_id=updater.context_id,
                    task_id=updater.task_id,
                    role=A2ARole.ROLE_AGENT,
                )
            )
        else:
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Cancel the task's run. One running here ends as it does: canceled, or completed
        (or failed) when the cancellation came too late (its agent had finished, its turn
        was being saved), and the task's end on the queue says which (the SDK answers the
        latter as not cancelable). One running elsewhere that did not end in time (see
        :meth:`RunsRequestHandler.on_cancel_task`) is marked canceled, which stops its run
        where it runs."""
        task_id = context.task_id
        run = self._runs.get(task_id or "")
        relayed = self._relayed.get(task_id or "")
        if run is not None and relayed is not None:
            run.cancel()
            await relayed.wait()
            return
        if task_id and context.context_id:
            await TaskUpdater(event_queue, task_id, context.context_id).cancel()


@dataclass(eq=False)
class _Written:
    """A task's record as this process last wrote it, and what waits to be written."""

    record: RunRecord
    state: TaskState
    at: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: Task | None = None
    flush: asyncio.Task[None] | None = None

    def can_wait(self, task: Task) -> bool:
        """Whether ``task`` may be written later: only its reply grew since the last write,
        made less than :data:`TASK_SAVE_INTERVAL` ago."""
        state = task.status.state
        return (
            state == self.state
            and state not in TERMINAL
            and time.monotonic() - self.at < TASK_SAVE_INTERVAL
        )

    def wrote(self, record: RunRecord, task: Task) -> None:
        self.record, self.state, self.at = record, task.status.state, time.monotonic()


def _copy(task: Task) -> Task:
    copy = Task()
    copy.CopyFrom(task)
    return copy


class RunsTaskStore(TaskStore):
    """A2A tasks in the runs store, one record per task, scoped to the calling user."""

    def __init__(self, runs: RunsService, *, first_write_delay: float = FIRST_WRITE_DELAY) -> None:
        self.runs = runs
        self.first_write_delay = first_write_delay
        # The tasks in progress this process wrote last, by user and task id.
        self._written: dict[tuple[str, str], _Written] = {}

    async def save(self, task: Task, context: ServerCallContext) -> None:
        """Store ``task``: at once when it is new, its state changed or it ended; while only
        its reply grows, with the next write or :data:`TASK_SAVE_INTERVAL` after the last."""
        user_id = owner_of(context)
        _join_reply(task)
        key = (user_id, task.id)
        written = self._written.get(key)
        if written is not None and written.can_wait(task):
            written.pending = _copy(task)
            if written.flush is None:
                written.flush = asyncio.create_task(self._flush_later(user_id, written))
            return
        if written is None:
            if task.status.state in TERMINAL:
                await self._store_end(user_id, task, None)
            else:
                record = await self._store(user_id, task, None)
                self._keep(key, _Written(record, task.status.state))
        else:
            async with written.lock:
                if written.flush is not None:
                    written.flush.cancel()
                    written.flush = None
                written.pending = None
                if task.status.state in TERMINAL:
                    await self._store_end(user_id, task, written.record)
                else:
                    written.at = time.monotonic()  # as in _flush_later
                    try:
                        written.wrote(await self._store(user_id, task, written.record), task)
                    except Exception:
                        # As a write made later: the next one (its end at the latest) holds
                        # the whole task, and a failed one ended the reply's stream for
                        # nothing.
                        logger.exception("could not save an A2A task", extra={"task_id": task.id})
            if task.status.state in TERMINAL:
                self._written.pop(key, None)
        if task.status.state == TaskState.TASK_STATE_CANCELED:
            await self._cancel_run(user_id, task)

    async def _store_end(self, user_id: str, task: Task, record: RunRecord | None) -> None:
        """Write the end of ``task`` (see :meth:`_store`), made again after a failure as a
        run's last write is (:func:`~agentscope_serverless.recorder.write_last`): a store
        failing for a moment left the task working for ever."""
        await write_last(
            lambda: self._store(user_id, task, record),
            pause=self.runs.poll_seconds,
            failure="could not save an A2A task",
            extra={"task_id": task.id},
        )

    async def _store(self, user_id: str, task: Task, record: RunRecord | None) -> RunRecord:
        """Write ``task`` over ``record`` (the one this process last wrote), or over the one
        stored (a new one if none is); the record written."""
        stored = MessageToDict(task)
        status = TERMINAL.get(task.status.state, "in_progress")
        if record is None:
            record = await self.runs.get_run(user_id, task.id)
        if record is None:
            record = RunRecord(
                id=task.id,
                user_id=user_id,
                session_id=task.context_id or None,
                kind="a2a_task",
                status=status,
                result=stored,
            )
            await self.runs.create_run(record)
            return record
        # The record read may be the task as readers see it (lost, or ended as its run did,
        # with the run's error): the task as it is now has none of that.
        record = record.model_copy(update={"status": status, "result": stored, "error": None})
        await self.runs.save_run(record)
        return record

    async def _flush_later(self, user_id: str, written: _Written) -> None:
        """Write what waits, :data:`TASK_SAVE_INTERVAL` after the last write."""
        await asyncio.sleep(max(0.0, written.at + TASK_SAVE_INTERVAL - time.monotonic()))
        async with written.lock:
            written.flush = None
            task, written.pending = written.pending, None
            if task is None:
                return
            # From now: a save while this write is under way waits for the next interval,
            # rather than writing the same reply again as soon as this one is done.
            written.at = time.monotonic()
            try:
                written.wrote(await self._store(user_id, task, written.record), task)
            except Exception:
                # Each write holds the whole task: the next one (its end at the latest) has it.
                logger.exception("could not save an A2A task", extra={"task_id": task.id})

    def _keep(self, key: tuple[str, str], written: _Written) -> None:
        if len(self._written) >= WRITTEN_TASKS:
            self._written.pop(next(iter(self._written)), None)
        self._written[key] = written

    async def _cancel_run(self, user_id: str, task: Task) -> None:
        """Mark the run of a canceled task: canceled by another process than the one running
        it, the run stops when that process reads the mark."""
        run_id = task.metadata.fields.get(RUN_ID_KEY)
        if run_id is None or not run_id.string_value:
            return
        if await self.runs.request_cancel(user_id, run_id.string_value) is None:
            # A run just started is stored within its first write delay.
            await asyncio.sleep(self.first_write_delay)
            await self.runs.request_cancel(user_id, run_id.string_value)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        try:
            record = await self.runs.get_run(owner_of(context), task_id)
        except InvalidInputError:
            return None  # an id no run can have (too long): no such task
        if record is None or record.kind != "a2a_task":
            return None
        return await self._as_seen(record)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The caller's tasks, of a context when ``params`` name one (``context_id``), as
        ``params`` ask for them (their status, updated since, a page of them, the last
        updated first: the SDK's listing picks them)."""
        if not params.context_id:
            records = await self.runs.recent_runs(owner_of(context), 0.0)
        else:
            _require_context_id(params.context_id)
            records = await self.runs.list_runs(owner_of(context), params.context_id)
        listing = InMemoryTaskStore()
        for record in records:
            if record.kind == "a2a_task":
                await listing.save(await self._as_seen(record), context)
        return await listing.list(params, context)

    async def _as_seen(self, record: RunRecord) -> Task:
        """The task stored in ``record`` (as the runs store reads it, its run read once),
        as readers see it: one working whose run was lost (the process running it stopped
        before it ended, see :class:`RunRecord`) failed, with the run's error, since nothing
        will end it; one whose run ended before its own end was stored, as its run ended
        (see :attr:`RunRecord.ended_by_run`), with the whole reply from the run's events."""
        task: Task = ParseDict(record.result, Task(), ignore_unknown_fields=True)
        run_id = _run_of(task)
        if record.ended_by_run and run_id:
            await self._whole_reply(record.user_id, run_id, task)
        return task

    async def _whole_reply(self, user_id: str, run_id: str, task: Task) -> None:
        """Put the whole reply of the run ``run_id`` (its stored events) in ``task``'s reply
        artifact, in place."""
        replies, text = _Replies(), []
        for _, data in await self.runs.read_events(user_id, run_id):
            text.append(replies.text_of(json.loads(data)))
        if not any(text):
            return
        kept = [artifact for artifact in task.artifacts if artifact.name != "reply"]
        del task.artifacts[:]
        task.artifacts.extend(kept)
        task.artifacts.append(
            Artifact(
                artifact_id=run_id,
                name="reply",
                parts=[Part(text="".join(text))],
                metadata={RUN_ID_KEY: run_id},
            )
        )

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        """Tasks are not deleted one by one: they expire with the runs (``RUNS_TTL_SECONDS``)."""


class RunsRequestHandler(DefaultRequestHandler):
    """The SDK's request handler, whose ``SubscribeToTask`` also follows a task running in
    another process (another Lambda instance): from the runs store, as ``/runs/{id}/events``
    follows a run; and whose ``CancelTask`` answers such a task as its run ended there.

    The SDK's own handler follows only a task of its process (its event queue). Elsewhere,
    the stream is the task (without its artifacts), then the reply's text from its first
    piece, as the chunks of one artifact (the last one marked ``lastChunk``), then the
    task's final status.
    """

    def __init__(
        self,
        *,
        agent_executor: RunsAgentExecutor,
        task_store: RunsTaskStore,
        agent_card: AgentCard,
    ) -> None:
        super().__init__(
            agent_executor=agent_executor, task_store=task_store, agent_card=agent_card
        )
        self._executor = agent_executor
        self._tasks = task_store
        self._runs = task_store.runs
        self._push_notifications = agent_card.capabilities.push_notifications
        # The cancels of a task under way here, and how many are waiting for them.
        self._cancels: dict[str, tuple[asyncio.Lock, int]] = {}

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> A2AMessage | Task:
        await self._refuse_what_cannot_run(params, context)
        answer: A2AMessage | Task = await super().on_message_send(params, context)
        return answer

    async def on_message_send_stream(  # type: ignore[override]
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncIterator[Any]:
        await self._refuse_what_cannot_run(params, context)
        async for event in super().on_message_send_stream(params, context):
            yield event

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        """Push notifications not supported (-32003) when the card says so, as for the other
        push notification methods: before the params are read, so the A2A 0.3 form naming
        only the task (which A2A 1.0 has no form for: its config id is required) is not
        invalid params."""
        if not self._push_notifications:
            raise PushNotificationNotSupportedError(
                message="Push notifications are not supported by the agent"
            )
        config: TaskPushNotificationConfig = await super().on_get_task_push_notification_config(
            params, context
        )
        return config

    async def _refuse_what_cannot_run(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> None:
        """Refuse, before a task is made for it, a message the agent cannot run: see
        :func:`_refuse_what_is_not_text`, :func:`_refuse_a_context_no_session_can_be` and
        :meth:`_refuse_a_working_task`; and one whose run's request the app's request model
        refuses (a field A2A cannot fill). Refused once its task had started, the task was
        left failed, its session made empty, and its execution's failure logged as a server
        error."""
        message = params.message
        _refuse_what_is_not_text(message)
        _refuse_a_context_no_session_can_be(message)
        await self._refuse_a_working_task(params, context)
        session_id = message.context_id or new_uuid()  # the SDK names a new context later
        self._executor.request(get_message_text(message), session_id, owner_of(context))

    async def _refuse_a_working_task(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> None:
        """Refuse a message to a task still working, in this process or another (another
        Lambda instance). The SDK runs a message to a task of its own process once the
        task's current run has ended, answering the sender with that run's reply, and the
        task then works again on the message; a process that does not run the task would
        run the message at once, a second run whose writes of the task would overwrite the
        first's (the stored task would lose one of the replies)."""
        task_id = params.message.task_id
        if not task_id:
            return
        task = await self._tasks.get(task_id, context)
        if task is not None and task.status.state in _WORKING:
            raise UnsupportedOperationError(
                message=f"Task {task.id} is still working: send the message in a new task"
            )

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        """Cancel a task. One running in another process (another Lambda instance) is
        answered as its run ended there, as one running here is: its run is asked to stop,
        and once it has ended and that process has stored the task's end, the task is
        answered as stored: canceled, or completed when the cancel came too late. Should it
        not end in time, the task is marked canceled (its run stops when it reads the mark).

        The cancels of a task are made one after another: one coming while another is under
        way is answered once that one has ended, as a cancel of the task it left (canceled:
        not cancelable). The SDK cancels the task's execution for each, and a second one,
        while the first wound it down, left the task's subscribers waiting for ever."""
        lock, waiting = self._cancels.get(params.id, (asyncio.Lock(), 0))
        self._cancels[params.id] = (lock, waiting + 1)
        try:
            async with lock:
                if await self._active_task_registry.get(params.id) is None:
                    ended = await self._stop_elsewhere(params.id, context)
                    if ended is not None:
                        return ended
                answer: Task | None = await super().on_cancel_task(params, context)
                return answer
        finally:
            lock, waiting = self._cancels[params.id]
            if waiting == 1:
                del self._cancels[params.id]
            else:
                self._cancels[params.id] = (lock, waiting - 1)

    async def _stop_elsewhere(self, task_id: str, context: ServerCallContext) -> Task | None:
        """The task ``task_id`` as stored once its run, asked to stop, has ended and its end
        is stored; None for a task with no run in progress, or one not ended in time."""
        task = await self._tasks.get(task_id, context)
        if task is None or task.status.state in TERMINAL or not _run_of(task):
            return None
        user_id, loop = owner_of(context), asyncio.get_running_loop()
        await self._tasks._cancel_run(user_id, task)
        deadline = loop.time() + STOP_TIMEOUT_SECONDS
        while (run := await self._runs.get_run(user_id, _run_of(task))) and not run.finished:
            if loop.time() > deadline:
                return None
            await asyncio.sleep(self._runs.poll_seconds)
        task = await self._stored_end(task, context)
        return task if task.status.state in TERMINAL else None

    async def _stored_end(
        self, task: Task, context: ServerCallContext, ends_at: float | None = None
    ) -> Task:
        """``task`` once the process running it has stored its end (its run has ended: that
        process stores it right after), or as stored :data:`FOLLOW_END_SECONDS` later (or at
        ``ends_at``, a time of the loop, when sooner)."""
        deadline = asyncio.get_running_loop().time() + FOLLOW_END_SECONDS
        if ends_at is not None:
            deadline = min(deadline, ends_at - self._runs.poll_seconds)
        while task.status.state not in TERMINAL:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(self._runs.poll_seconds)
            task = await self._tasks.get(task.id, context) or task
        return task

    async def on_subscribe_to_task(  # type: ignore[override]
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncIterator[Any]:
        if await self._active_task_registry.get(params.id) is not None:
            async for event in super().on_subscribe_to_task(params, context):
                yield event
            return
        task = await self._tasks.get(params.id, context)
        if task is None:
            raise TaskNotFoundError
        if task.status.state in TERMINAL:
            raise UnsupportedOperationError(
                message=f"Task {task.id} is in terminal state: {TaskState.Name(task.status.state)}"
            )
        # A task just submitted names its run with its first update, and a run just started
        # is stored within its first write delay. On Lambda, the stream ends before the
        # invocation's time limit, the task as it is then (its client subscribes again).
        user_id, loop = owner_of(context), asyncio.get_running_loop()
        left = seconds_left()
        ends_at = None if left is None else loop.time() + left
        deadline = loop.time() + FOLLOW_START_SECONDS
        while not _run_of(task) or await self._runs.get_run(user_id, _run_of(task)) is None:
            if ends_at is not None and loop.time() + self._tasks.first_write_delay >= ends_at:
                yield _snapshot(task)
                return
            if loop.time() > deadline:
                raise TaskNotFoundError
            await asyncio.sleep(self._tasks.first_write_delay)
            task = await self._tasks.get(params.id, context) or task
        yield _snapshot(task)
        run_id, first = _run_of(task), True
        replies = _Replies()
        followed = self._runs.follow(user_id, run_id)
        while True:
            try:
                async with asyncio.timeout_at(ends_at):
                    _, data = await anext(followed)
            except StopAsyncIteration:
                break
            except TimeoutError:
                return  # out of time: the run goes on, followed again by a new subscription
            text = replies.text_of(json.loads(data))
            if text:
                yield TaskArtifactUpdateEvent(
                    task_id=task.id,
                    context_id=task.context_id,
                    artifact=Artifact(
                        artifact_id=run_id,
                        name="reply",
                        parts=[Part(text=text)],
                        metadata={RUN_ID_KEY: run_id},
                    ),
                    append=not first,
                    last_chunk=False,
                )
                first = False
        if not first:
            yield _reply_end(task.id, task.context_id, run_id)
        task = await self._stored_end(task, context, ends_at)
        if task.status.state in TERMINAL:
            yield TaskStatusUpdateEvent(
                task_id=task.id, context_id=task.context_id, status=task.status
            )


def _snapshot(task: Task) -> Task:
    """``task`` without its artifacts: what a subscription to it starts with."""
    snapshot = Task()
    snapshot.CopyFrom(task)
    del snapshot.artifacts[:]
    return snapshot


def _reply_end(task_id: str, context_id: str, run_id: str) -> TaskArtifactUpdateEvent:
    """The last chunk of a reply's artifact, sent once its run has ended (completed, failed
    or canceled): no text, ``lastChunk`` true, so a client assembling the artifact from its
    chunks knows it whole."""
    return TaskArtifactUpdateEvent(
        task_id=task_id,
        context_id=context_id,
        artifact=Artifact(
            artifact_id=run_id, name="reply", parts=[Part(text="")], metadata={RUN_ID_KEY: run_id}
        ),
        append=True,
        last_chunk=True,
    )


def _refuse_what_is_not_text(message: A2AMessage) -> None:
    """Refuse a message the agent cannot be given whole, before a task is made for it: one
    holding a part of another kind than text (a file, data; its card takes ``text/plain``),
    a part holding nothing, or no text. The agent ran without what was dropped, on an empty
    message if nothing was left, which its session kept. Refuse too a message no client
    sends: the agent's own (its words would be kept in the task's history as the agent's),
    or one whose id is longer than any id we keep."""
    if message.role == A2ARole.ROLE_AGENT:
        raise InvalidParamsError("message.role must be ROLE_USER: a client sends the user's words")
    if len(message.message_id) > MAX_ID_LENGTH:
        raise InvalidParamsError(f"message.messageId is longer than {MAX_ID_LENGTH} characters")
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind is None:
            raise InvalidParamsError(
                f"message.parts[{index}] holds nothing: a part holds a text, a url, raw or data"
            )
        if kind != "text":
            raise ContentTypeNotSupportedError(
                message=f"the message holds a {kind} part: this agent takes text parts only"
            )
    # A message without parts is the SDK's to refuse (a required field).
    if message.parts and all(is_blank_text(part.text) for part in message.parts):
        raise InvalidParamsError("the message holds no text")


def _refuse_a_context_no_session_can_be(message: A2AMessage) -> None:
    """Refuse a message whose contextId, the session of its run, no session can have (one
    naming no session: a '/', '..', a control character, too long...; see
    :func:`~agentscope_serverless.services._validation.clean_session_id`), or one that is
    not already clean (:func:`_require_context_id`). Refused once its task had started, the
    task's execution failing was logged as a server error."""
    if message.context_id:  # else the task's, or a new one
        _require_context_id(message.context_id)


def _require_context_id(context_id: str) -> None:
    """Refuse a contextId no session can have, or one with whitespace around it: its session
    would be the id stripped, and its tasks would keep the id sent (what a client expects
    back), which neither listing the context's tasks nor deleting its session would reach."""
    try:
        session_id = require_session_id(context_id)
    except InvalidInputError as exc:
        raise InvalidParamsError(f"contextId cannot name a session: {exc.message}") from None
    if session_id != context_id:
        raise InvalidParamsError(
            "contextId begins or ends with whitespace, which a session's id does not: send "
            f"{session_id!r}"
        )


def _join_reply(task: Task) -> None:
    """The text parts of the task's reply artifact as one part, in place: each chunk streamed
    appends a part, and the task (what ``GetTask`` and a send not streamed answer) keeps the
    reply as one text, not a part per chunk (which clients show a line each)."""
    for artifact in task.artifacts:
        parts = artifact.parts
        if artifact.name != "reply" or len(parts) < 2:
            continue
        if all(part.WhichOneof("content") == "text" and not part.metadata for part in parts):
            whole = "".join(part.text for part in parts)
            del parts[:]
            parts.append(Part(text=whole))


class _Replies:
    """The ids of a run's reply messages (the agent's words: not its reasoning, not tool
    calls), from the message events seen: only their text goes in the task's artifact."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def see(self, message: dict[str, Any]) -> None:
        if message.get("type") == "message" and message.get("role") == "assistant":
            self._ids.add(str(message.get("id")))

    def holds(self, msg_id: Any) -> bool:
        return msg_id in self._ids

    def text_of(self, event: Any) -> str:
        """The reply's text in ``event`` (a run's event as stored JSON reads), seeing the
        messages it starts; "" for an event holding none."""
        if not isinstance(event, dict):
            return ""
        if event.get("object") == "message":
            self.see(event)
        elif (
            event.get("object") == "content"
            and event.get("delta")
            and self.holds(event.get("msg_id"))
        ):
            text = event.get("text")
            return text if isinstance(text, str) else ""
        return ""


def _run_of(task: Task) -> str:
    """The id of the run of ``task`` ("" before its first update names it)."""
    run_id = task.metadata.fields.get(RUN_ID_KEY)
    return run_id.string_value if run_id is not None else ""


def agent_card(
    name: str,
    description: str,
    base_url: str,
    *,
    skills: Sequence[dict[str, Any]] = (),
    version: str = "1.0.0",
) -> AgentCard:
    """The agent card of an app served at ``base_url``."""
    url = base_url.rstrip("/") + A2A_PATH
    cards_skills = [
        AgentSkill(
            id=skill.get("id", skill["name"]),
            name=skill["name"],
            description=skill.get("description", ""),
            tags=list(skill.get("tags", [])),
            examples=list(skill.get("examples", [])),
        )
        for skill in skills
    ] or [
        AgentSkill(
            id="chat",
            name=name or "chat",
            description=description or "Answers messages.",
            tags=["chat"],
        )
    ]
    return AgentCard(
        name=name or "agent",
        description=description or "An agent served by AgentScope Serverless.",
        version=version,
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=url, protocol_binding="HTTP+JSON", protocol_version="1.0"),
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=cards_skills,
        security_schemes={
            SECURITY_SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer",
                    bearer_format="API key",
                    description="An API key: Authorization: Bearer <key>.",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SECURITY_SCHEME: StringList()})],
    )


__all__ = [
    "A2A_PATH",
    "SESSION_WRITER",
    "RunsAgentExecutor",
    "RunsRequestHandler",
    "RunsTaskStore",
    "agent_card",
    "owner_of",
]
