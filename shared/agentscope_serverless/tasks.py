"""Background tasks: ``@app.task(path, queue)`` functions run apart from the request.

Submitting a task stores it as a run of kind ``task`` (status ``in_progress``) and returns
its id at once; an executor runs the function to completion and stores its result, or its
error (status ``failed``). Its status is read back from the runs store, so any process (or
Lambda instance) can answer ``GET /tasks/{task_id}``, and only for the user who submitted it.

The :class:`LocalTaskExecutor` runs tasks in the server's own event loop (a plain function
in a daemon thread of its own, a plain generator's steps too), a bounded number at once
(``TASKS_MAX_RUNNING``, and ``TASKS_MAX_RUNNING_PER_USER`` for each user). No broker is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_core import to_jsonable_python

from agentscope_serverless.cancellation import TIME_LIMIT_CLEANUP_SECONDS, cancelled_from_outside
from agentscope_serverless.errors import (
    InvalidInputError,
    TaskCapacityError,
    TaskQuotaError,
    TimeLimitError,
)
from agentscope_serverless.log import logger, redacted
from agentscope_serverless.recorder import write_last
from agentscope_serverless.services._once import new_uuid
from agentscope_serverless.services._turn import acting_for
from agentscope_serverless.services._validation import json_copy, require_distinct_keys
from agentscope_serverless.services.idempotency.base import (
    Claim,
    ClaimOutcome,
    IdempotencyStore,
    StoredResponse,
)
from agentscope_serverless.services.runs.base import HEARTBEAT_SECONDS, RunRecord, RunsService
from agentscope_serverless.settings import TASKS_MAX_RUNNING
from agentscope_serverless.threads import ThreadWorker, stepped
from agentscope_serverless.time_limit import seconds_left

TASK_FAILED = "TASK_FAILED"
# A task cancelled by what runs it (its server stopping): its end stored at once, rather than
# read as lost (RUN_LOST) only once its heartbeats stop.
TASK_STOPPED = "TASK_STOPPED"
_STOPPED_ERROR = {
    "code": TASK_STOPPED,
    "message": "the process running the task stopped before the task ended",
}
# How long a stopping server waits for the tasks still running to end, then for those it
# cancels (their cleanup, their end stored).
STOP_WAIT_SECONDS = 5.0
# How long a submission refused for want of a free slot is told to wait (Retry-After); how
# many tasks a server runs at once is the TASKS_MAX_RUNNING setting.
BUSY_RETRY_SECONDS = 5
# The key of the event of an asynchronous Lambda invocation that runs a task.
TASK_EVENT_KEY = "agentscope_task"
_MAX_ERROR_CHARS = 1000
# The fingerprint of the claim an invocation makes before running a task (one per task id).
_TASK_CLAIM = "background-task"
# The ends of tasks run in this process that could not be stored, by (user id, task id,
# submission), for Lambda's retry of their invocation to store (see run_task_event); the
# oldest go first beyond _UNSTORED_KEPT.
_unstored: dict[tuple[str, str, str | None], tuple[str, dict[str, Any]]] = {}
_UNSTORED_KEPT = 100


@dataclass(frozen=True)
class TaskDefinition:
    """A function registered with ``@app.task(path, queue=...)``."""

    path: str
    function: Callable[..., Any]
    queue: str = "default"


def new_task_id() -> str:
    """A fresh task id (derived from the request's Idempotency-Key when it has one)."""
    return f"task_{new_uuid()}"


def new_submission() -> str:
    """A token of its own for a task's submission (:attr:`RunRecord.submission`), random
    even when the task's id derives from an ``Idempotency-Key``."""
    return uuid.uuid4().hex


async def run_task(
    runs: RunsService,
    task: TaskDefinition,
    user_id: str,
    task_id: str,
    payload: Any,
    submission: str | None = None,
) -> None:
    """Run ``task`` with ``payload`` and store its result or its error; while it runs, its
    record is saved every ``HEARTBEAT_SECONDS``, so a task whose process stopped (a Lambda
    timeout) reads as lost (see :class:`~agentscope_serverless.services.runs.base.RunRecord`).
    A task still running at the time limit of the invocation serving it
    (:mod:`~agentscope_serverless.time_limit`) is stopped and stored as failed
    (``TIME_LIMIT``). With ``submission`` (its record's), its end and its heartbeats land
    only on the record of that submission: the task erased and submitted again under the
    same id meanwhile, the new record keeps its own. Its end is stored as :func:`_store_end`
    does: the store's error is raised once it is given up."""
    status, outcome = await _ended(runs, task, user_id, task_id, payload, submission)
    await _store_end(runs, user_id, task_id, submission, status, outcome)


async def _ended(
    runs: RunsService,
    task: TaskDefinition,
    user_id: str,
    task_id: str,
    payload: Any,
    submission: str | None,
) -> tuple[str, dict[str, Any]]:
    """Run the task (see :func:`run_task`); its end: its final status and the result or
    error to store with it. Only a task stopped from outside has its end stored here."""
    try:
        # What the task does (a remote agent called, a sandbox connected) is for its user.
        with acting_for(user_id):
            work = _call(task, payload)
            result = await _beating(runs, user_id, task_id, submission, work)
        # A result that every store could not keep and give back as it was fails the task,
        # saying why: numbers JSON cannot carry (NaN, infinities: null once stored), text
        # that is not Unicode (a lone UTF-16 surrogate), nesting too deep to be read back,
        # two keys that are one in JSON (1 and "1": converting keeps one value alone).
        require_distinct_keys(result, field="result")
        stored = json_copy(to_jsonable_python(result, inf_nan_mode="constants"), field="result")
    except TimeLimitError as exc:
        logger.warning("a background task reached the time limit", extra={"task_id": task_id})
        return "failed", {"error": {"code": exc.code, "message": exc.message}}
    except (Exception, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and cancelled_from_outside():
            # Not the task's failure: what runs it stops (its server shuts down).
            try:
                await runs.finish_run(
                    user_id, task_id, "failed", error=_STOPPED_ERROR, submission=submission
                )
            except Exception:
                logger.exception(
                    "could not store the end of a stopped task", extra={"task_id": task_id}
                )
            raise
        logger.info("a background task failed", extra={"task_id": task_id})
        failure = exc.__cause__ if isinstance(exc, _Raised) else exc
        # Without the secrets of the process, as a failed run's error.
        message = redacted(_described(failure))[:_MAX_ERROR_CHARS]
        return "failed", {"error": {"code": TASK_FAILED, "message": message}}
    return "completed", {"result": stored}


async def _store_end(
    runs: RunsService,
    user_id: str,
    task_id: str,
    submission: str | None,
    status: str,
    outcome: dict[str, Any],
) -> None:
    """Store the end of a task (``status``, with ``outcome``), made again after a failure
    as a run's last write is (:func:`~agentscope_serverless.recorder.write_last`): a store
    failing for a moment as the task ended (a failover) lost its result, and the task read
    as lost. Once given up, an error naming the task is logged and the store's is raised."""
    try:
        await write_last(
            lambda: runs.finish_run(user_id, task_id, status, submission=submission, **outcome),
            pause=runs.poll_seconds,
            failure="could not store the end of a background task",
            extra={"task_id": task_id},
        )
    except Exception:
        logger.error("the end of a background task was not stored", extra={"task_id": task_id})
        raise


def _described(failure: object) -> str:
    """``"<type name>: <text>"`` of a task's error; its type name alone when its text
    cannot be had (its ``__str__`` raises, or returns no ``str``)."""
    name = type(failure).__name__
    try:
        text = str(failure)
    except Exception:
        return name
    return f"{name}: {text}"


class _Raised(Exception):
    """An exception of a task that is no ``Exception`` (``sys.exit()``'s ``SystemExit``,
    ``KeyboardInterrupt``, ``GeneratorExit``, a ``BaseException`` subclass of its own),
    carried out of the asyncio task running it as an error: the first two leaving an
    asyncio task end the event loop, and the process serving it; the others would leave
    the task in progress until it read as lost."""


async def _call(task: TaskDefinition, payload: Any) -> Any:
    """What ``task`` gives for ``payload``: a generator's items as a list, made here, while
    the task beats and within its time limit (not once it has ended)."""
    try:
        if inspect.iscoroutinefunction(task.function):
            return await task.function(payload)
        if inspect.isasyncgenfunction(task.function):
            return await _listed(task.function(payload))
        result = await _in_a_thread(task.function, payload)
        if inspect.isawaitable(result):
            result = await result
        if inspect.isasyncgen(result):
            result = await _listed(result)
        return result
    except (Exception, asyncio.CancelledError):
        raise
    except BaseException as exc:
        raise _Raised() from exc


async def _listed(items: AsyncGenerator[Any, Any]) -> list[Any]:
    """The items of an async generator, which is closed (its ``finally`` blocks run) when
    the task is cancelled."""
    async with contextlib.aclosing(items):
        return [item async for item in items]


async def _in_a_thread(function: Callable[..., Any], payload: Any) -> Any:
    """``function(payload)`` called in a daemon thread of its own: a function that never
    returns does not keep the server from exiting once stopped (its result is dropped then).
    A generator it gives is run in that thread too, step by step, so the task is stopped
    (at its time limit, its server stopping) between two items: it is closed then, in its
    thread, once the step it may be taking is over (a step still going after
    ``TIME_LIMIT_CLEANUP_SECONDS`` is left to end, and the generator to close, on its own)."""
    worker = ThreadWorker(getattr(function, "__name__", "task"))
    try:
        result = await worker.run(function, payload)
        if not inspect.isgenerator(result):
            return result
        steps = stepped(worker, result, TIME_LIMIT_CLEANUP_SECONDS)
        async with contextlib.aclosing(steps) as items:
            return [item async for item in items]
    finally:
        worker.close()


async def _beating(
    runs: RunsService,
    user_id: str,
    task_id: str,
    submission: str | None,
    work: Awaitable[Any],
) -> Any:
    """The result of ``work``, the task's record (of ``submission``, when given) saved every
    ``HEARTBEAT_SECONDS`` until it ends. Each save is awaited before the next step, so none
    lands after the final one. Raises :class:`TimeLimitError` (``work`` cancelled) at the
    invocation's time limit."""
    running = asyncio.ensure_future(work)
    try:
        while True:
            left = seconds_left()
            if left is not None and left <= 0:
                raise TimeLimitError(
                    "the task was stopped at the function's time limit, before it finished"
                )
            wait = HEARTBEAT_SECONDS if left is None else min(HEARTBEAT_SECONDS, left)
            done, _ = await asyncio.wait([running], timeout=wait)
            if done:
                return running.result()
            if wait < HEARTBEAT_SECONDS:
                continue  # the time limit comes before the heartbeat
            try:
                record = await runs.get_run(user_id, task_id)
                mine = record is not None and submission in (None, record.submission)
                if record is not None and mine and not record.finished:
                    await runs.beat(record)
            except Exception:
                logger.exception("could not save the task's heartbeat", extra={"task_id": task_id})
    finally:
        if not running.done():
            running.cancel()
            # Its cleanup (``finally`` blocks) runs before the task is stored as ended.
            await asyncio.wait([running], timeout=TIME_LIMIT_CLEANUP_SECONDS)


class TaskExecutor(Protocol):
    """Where submitted tasks run: in this process, or in Lambda invocations."""

    async def submit(self, task: TaskDefinition, user_id: str, payload: Any) -> RunRecord:
        """Store the task as submitted, start it, and return its record."""
        ...

    def executing(self) -> bool:
        """Whether tasks run in this process now."""
        ...

    async def aclose(self) -> None:
        """Called when the server stops."""
        ...


async def run_task_event(
    runs: RunsService,
    tasks: list[TaskDefinition],
    event: Any,
    claims: IdempotencyStore | None = None,
) -> str:
    """Run the task of an asynchronous invocation's event (``{TASK_EVENT_KEY: {...}}``);
    returns what became of it: ``"done"`` or ``"skipped"``.

    Lambda delivers such an event at least once, and invokes again after an error or a
    timeout: a task runs at most once all the same. It is skipped when its run has finished
    or is not stored (expired, or never submitted), or is another submission's (the
    task erased and submitted again under its id), and, with ``claims``, unless this
    invocation is the first to claim it (a claim held once the task is stored as started
    never lapses: a task that started and was cut short is not run again). An event that
    is not a task's (a poison message) is skipped: running it again could not help. Errors
    reading, claiming or marking the task started are raised, before it runs, for Lambda
    to try again: the claim is given up, so the retry runs it. A task's end the store did
    not take (:func:`_store_end`) is raised too, and kept in this process: Lambda's retry
    reaching it stores that end, without running the task again.
    """
    spec = event.get(TASK_EVENT_KEY) if isinstance(event, dict) else None
    fields = ("user_id", "task_id", "path")
    if not isinstance(spec, dict) or not all(isinstance(spec.get(f), str) for f in fields):
        logger.warning("an event that is not a background task's was skipped")
        return "skipped"
    user_id, task_id = spec["user_id"], spec["task_id"]
    submission = spec.get("submission")
    key = (user_id, task_id, submission)
    if (submission is None or isinstance(submission, str)) and key in _unstored:
        # Ran here, by the invocation Lambda retries: its end is stored, or raised again for
        # Lambda's next retry.
        status, outcome = _unstored[key]
        await _store_end(runs, user_id, task_id, submission, status, outcome)
        _unstored.pop(key, None)
        logger.info(
            "the end of a background task was stored on a retry", extra={"task_id": task_id}
        )
        return "done"
    try:
        record = await runs.get_run(user_id, task_id)
    except InvalidInputError:
        logger.warning("a task event naming no valid task was skipped")
        return "skipped"
    if record is None or record.finished or record.kind != "task":
        logger.info(
            "a task event for a finished or unknown task was skipped", extra={"task_id": task_id}
        )
        return "skipped"
    if record.submission != submission:
        # The task was erased, and submitted again under its id: the new submission has
        # an event of its own.
        logger.info(
            "a task event for an earlier submission was skipped", extra={"task_id": task_id}
        )
        return "skipped"
    claim = None
    if claims is not None:
        # Its key holds a space, which no ``Idempotency-Key`` header may.
        claim = await claims.begin(user_id, f"task {task_id}", _TASK_CLAIM)
        if claim.outcome is not ClaimOutcome.CLAIMED:
            logger.warning(
                "a task event for a task already started was skipped", extra={"task_id": task_id}
            )
            return "skipped"
    task = next((t for t in tasks if t.path == spec["path"]), None)
    try:
        if task is None:
            error = {"code": TASK_FAILED, "message": f"no task is served at {spec['path']!r}"}
            await runs.finish_run(user_id, task_id, "failed", error=error, submission=submission)
        elif record.queued:
            # Started: from now on it beats, and is lost soon after it stops beating.
            await runs.beat(record.model_copy(update={"queued": False}))
        if claims is not None and claim is not None:
            # Completed only now, the task about to run: it holds until it expires
            # (``IDEMPOTENCY_EXPIRY_SECONDS``, longer than Lambda keeps an event) instead
            # of lapsing with its lease, so a task cut short is not run again.
            await claims.complete(claim, StoredResponse(202, {}, b""))
    except BaseException:
        if claims is not None and claim is not None:
            await _release(claims, claim, task_id)
        raise
    if task is not None:
        status, outcome = await _ended(
            runs, task, user_id, task_id, spec.get("payload"), submission
        )
        try:
            await _store_end(runs, user_id, task_id, submission, status, outcome)
        except Exception:
            while len(_unstored) >= _UNSTORED_KEPT:
                del _unstored[next(iter(_unstored))]
            _unstored[key] = (status, outcome)
            raise
    return "done"


async def _release(claims: IdempotencyStore, claim: Claim, task_id: str) -> None:
    """Give up the claim of an invocation that failed before the task ran, so Lambda's
    retry runs it. When the store cannot forget it either, the claim lapses with its
    lease (``lease_seconds``), and a later retry runs the task."""
    try:
        await claims.abandon(claim)
    except Exception:
        logger.exception("could not give up the claim of a task", extra={"task_id": task_id})


class LocalTaskExecutor:
    """Runs submitted tasks in this process's event loop, each in a task of its own: at most
    ``max_running`` at once, and ``max_per_user`` of one user's (``max_running`` when None).

    A plain function holds a thread of its own while it runs: without a bound, one user's
    submissions took as many threads (and their memory) as they sent. A submission past
    either bound is refused before anything is stored (:class:`TaskCapacityError`, or
    :class:`TaskQuotaError` for the user's share: a 429 with ``Retry-After``), so its
    ``Idempotency-Key`` is free for the retry it asks for.
    """

    def __init__(
        self,
        runs: RunsService,
        *,
        max_running: int = TASKS_MAX_RUNNING,
        max_per_user: int | None = None,
    ) -> None:
        self.runs = runs
        self.max_running = max_running
        self.max_per_user = max_per_user or max_running
        self._running: set[asyncio.Task[None]] = set()
        # The slots taken, by user: a task's from its submission (before it is stored, so
        # concurrent submissions cannot all pass the bound) until it ends.
        self._taken: dict[str, int] = {}

    async def submit(self, task: TaskDefinition, user_id: str, payload: Any) -> RunRecord:
        """Store the task as submitted, start it, and return its record; raises
        :class:`TaskCapacityError` (nothing stored) when no slot is free for it."""
        self._take(user_id)
        try:
            record = RunRecord(
                id=new_task_id(),
                user_id=user_id,
                kind="task",
                name=task.path,
                submission=new_submission(),
            )
            await self.runs.create_run(record)
            running = asyncio.create_task(
                self._run(task, user_id, record.id, payload, record.submission)
            )
        except BaseException:
            self._give_back(user_id)
            raise
        self._running.add(running)
        running.add_done_callback(self._running.discard)
        running.add_done_callback(lambda _: self._give_back(user_id))
        return record

    def _take(self, user_id: str) -> None:
        mine, total = self._taken.get(user_id, 0), sum(self._taken.values())
        # The server's bound first: without a share of their own (TASKS_MAX_RUNNING_PER_USER
        # unset), a user is told the server is full, not that they hold too many.
        if total >= self.max_running:
            raise TaskCapacityError(
                f"this server runs {total} background tasks at once, its most "
                "(TASKS_MAX_RUNNING): the task was not submitted; submit it again once some "
                "have ended",
                retry_after=BUSY_RETRY_SECONDS,
            )
        if mine >= self.max_per_user:
            raise TaskQuotaError(
                f"you run {mine} background tasks at once in this server, your most "
                "(TASKS_MAX_RUNNING_PER_USER): the task was not submitted; submit it again "
                "once one of them has ended",
                retry_after=BUSY_RETRY_SECONDS,
            )
        self._taken[user_id] = mine + 1

    def _give_back(self, user_id: str) -> None:
        left = self._taken[user_id] - 1
        if left:
            self._taken[user_id] = left
        else:
            del self._taken[user_id]

    async def _run(
        self,
        task: TaskDefinition,
        user_id: str,
        task_id: str,
        payload: Any,
        submission: str | None,
    ) -> None:
        """:func:`run_task`, its end not stored logged there: nothing here tries again."""
        with contextlib.suppress(Exception):
            await run_task(self.runs, task, user_id, task_id, payload, submission)

    def executing(self) -> bool:
        """Whether tasks run in this process now."""
        return bool(self._running)

    async def aclose(self) -> None:
        """Wait (a little) for the tasks still running, then cancel those still going: each
        is stored failed (``TASK_STOPPED``) before the stores close."""
        if self._running:
            await asyncio.wait(self._running, timeout=STOP_WAIT_SECONDS)
        going = set(self._running)
        if going:
            logger.warning("%d background task(s) still running were stopped", len(going))
            for task in going:
                task.cancel()
            await asyncio.wait(going, timeout=STOP_WAIT_SECONDS)


__all__ = [
    "TASK_EVENT_KEY",
    "TASK_FAILED",
    "TASK_STOPPED",
    "LocalTaskExecutor",
    "TaskDefinition",
    "TaskExecutor",
    "new_submission",
    "new_task_id",
    "run_task",
    "run_task_event",
]
