"""The runs store: each run's status and its events, so a run outlives its connection.

A *run* is one call of the agent (``/process``, the OpenAI-compatible endpoints, A2A) or a
background task. Its record (:class:`RunRecord`) says whose it is, its session, its status
and, for a task, its result or error; its events are the JSON of the run's events in
order, numbered by their ``sequence_number``. Everything is kept per user: a run id of
another user is simply not found.

Only the process running a run writes its record and events; anyone of the same user may
*request* its cancellation (:meth:`RunsService.request_cancel`), a mark the running
process polls. Readers follow a run with :meth:`RunsService.follow`: the stored events
after a position, then the new ones as they are stored, until the run has finished.

>>> async def demo(runs: RunsService) -> None:
...     await runs.create_run(RunRecord(id="r1", user_id="u1", session_id="s1"))
...     await runs.append_events("u1", "r1", [(0, '{"sequence_number":0}')])
...     await runs.finish_run("u1", "r1", "completed")
...     assert [seq async for seq, _ in runs.follow("u1", "r1")] == [0]
"""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, PrivateAttr

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.schemas.agent_schemas import AgentResponse, Error
from agentscope_serverless.services._validation import (
    optional_positive_int,
    require_session_id,
    require_user_id,
)
from agentscope_serverless.services.base import (
    PreparedWrite,
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)

RunKind = Literal["process", "openai", "a2a", "a2a_task", "task"]
# A run is in progress until it ends with one of these.
FINISHED = frozenset({"completed", "failed", "canceled"})
# Runs of these kinds watch their cancellation mark (a background task runs to its end).
STOPPABLE: frozenset[str] = frozenset({"process", "openai", "a2a", "a2a_task"})
# How long an erase waits for the runs it asked to stop (a run whose process died stays in
# progress in the store: it is waited for this long, once).
STOP_TIMEOUT_SECONDS = 5.0
# A run executing is written to the store this long after its first event at the latest: its
# first write waits as long for more of the run (see the recorder).
FIRST_WRITE_DELAY = 0.05
# How long a write may take to reach the store once made, for those looking for new runs.
WRITE_SECONDS = 0.1
# A run of the agent, or a background task, executing saves its record at least this often
# (its heartbeat); one in progress whose record is older than LOST_AFTER_SECONDS is lost: the
# process running it stopped before it ended (a Lambda timeout, a crash), and nothing will end
# it. Readers see it failed (RUN_LOST); a follower of its events gets a last event saying so.
HEARTBEAT_SECONDS = 10.0
LOST_AFTER_SECONDS = 60.0
# A background task queued for an asynchronous Lambda invocation has not started, and beats
# only once it has: Lambda delivers the invocation when it can (its retries a minute, then
# two, after a failure; a throttled function's hours later), keeping it at most six hours
# (its maximum event age), after which nothing will run the task.
QUEUED_LOST_AFTER_SECONDS = 6 * 3600 + LOST_AFTER_SECONDS
_BEATING: frozenset[str] = frozenset({"process", "openai", "a2a", "task"})
# The key of an A2A task's metadata holding the id of its run: the record of an A2A task
# (kind ``a2a_task``) has no heartbeat of its own, and one in progress whose run was lost
# is seen failed as its run is; so is one whose run was never stored (its process stopped
# before naming it, or before storing it: a run is stored FIRST_WRITE_DELAY after its start)
# once its record is older than LOST_AFTER_SECONDS.
RUN_ID_KEY = "run_id"
RUN_LOST = "RUN_LOST"
_LOST_ERROR = {
    "code": RUN_LOST,
    "message": "the process running the run stopped before the run ended",
}
# Runs created this long before a listing (clocks of two machines differ) are listed again.
_CLOCK_SKEW_SECONDS = 60.0
MAX_RUN_ID_LENGTH = 256
# No run numbers an event above this: a read after it finds nothing, on every store.
MAX_SEQUENCE = 2**63 - 1
DEFAULT_POLL_SECONDS = 0.25

StoredEvent = tuple[int, str]


class RunRecord(BaseModel):
    """What is known of a run besides its events."""

    id: str
    user_id: str
    session_id: str | None = None
    kind: RunKind = "process"
    name: str | None = Field(None, description="The task's path, for a background task.")
    status: str = "in_progress"
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    cancel_requested: bool = False
    result: Any = None
    error: dict[str, Any] | None = None
    fingerprint: str | None = Field(
        None,
        description="What the request of the run was (a hash), for its client's retries to "
        "find the run they repeat.",
    )
    input_seed: str | None = Field(
        None,
        description="What the ids of the run's input derive from (an OpenAI-compatible run's): "
        "a retry running the request again once the run was canceled, which had stored the "
        "input, gives it the same ids, so that it is stored once.",
    )
    echo: dict[str, Any] | None = Field(
        None,
        description="What the answer repeats of the request (an OpenAI response object's "
        "model, instructions, ...), so the answer can be read again as it was given.",
    )
    queued: bool = Field(
        False,
        description="A background task waiting for the invocation that runs it, which may "
        "come hours later: not lost before then (see QUEUED_LOST_AFTER_SECONDS).",
    )
    submission: str | None = Field(
        None,
        description="A background task's submission (a token made for it alone): its id "
        "comes again when its Idempotency-Key is sent again after its record was erased, and "
        "what the task that ran then stores (its end, its heartbeat) lands only on its own "
        "record, never on the record of a later submission (see :meth:`RunsService.finish_run`).",
    )
    deleted: bool = Field(
        False,
        description="Deleted by its user (see :meth:`RunsService.delete_run`): the record is "
        "only the mark that it was, until it expires.",
    )

    # Set on an A2A task seen ended as its run did (see :func:`_as_seen`), not as stored.
    _ended_by_run: bool = PrivateAttr(default=False)

    @property
    def ended_by_run(self) -> bool:
        """Whether this is an A2A task read as its run ended, its own end not stored (its
        process stopped in between): its result's reply is as last written, and its run's
        events hold the whole of it."""
        return self._ended_by_run

    @property
    def finished(self) -> bool:
        """Whether the run has ended (completed, failed or canceled)."""
        return self.status in FINISHED

    @property
    def lost(self) -> bool:
        """Whether the run is in progress in the store but its process has stopped: its
        heartbeat is older than :data:`LOST_AFTER_SECONDS` (a task still queued:
        :data:`QUEUED_LOST_AFTER_SECONDS`)."""
        limit = QUEUED_LOST_AFTER_SECONDS if self.queued else LOST_AFTER_SECONDS
        return self.kind in _BEATING and not self.finished and time.time() - self.updated_at > limit


def _as_seen(record: RunRecord, run: RunRecord | None = None) -> RunRecord:
    """``record`` as readers see it: a lost run failed (``RUN_LOST``), and so an A2A task in
    progress whose run (``run``, as stored; None when the task names none or it is not
    stored) was lost, or was never stored while the task's record is older than
    :data:`LOST_AFTER_SECONDS`. An A2A task in progress whose run has ended is seen ended as
    its run did (its process stopped before storing the task's end, or is storing it)."""
    if _task_lost(record, run):
        at = record.updated_at if run is None else run.updated_at
        return _task_ended(record, "failed", dict(_LOST_ERROR), at, by_run=False)
    if record.lost:
        return record.model_copy(update={"status": "failed", "error": dict(_LOST_ERROR)})
    if run is not None and run.finished and record.kind == "a2a_task" and not record.finished:
        return _task_ended(record, run.status, run.error, run.updated_at, by_run=True)
    return record


# An A2A task's state (as its JSON names it) once its run has ended so.
_TASK_STATES = {
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "canceled": "TASK_STATE_CANCELED",
}


def _task_ended(
    record: RunRecord, ended: str, error: dict[str, Any] | None, at: float, *, by_run: bool
) -> RunRecord:
    """``record``, an A2A task in progress, ended (``ended``, with ``error``, at ``at``): its
    status, its error and the status of the task it holds, which agree (a failure's message
    is the error's); ``by_run`` when its run ended so (see :attr:`RunRecord.ended_by_run`)."""
    task = dict(record.result) if isinstance(record.result, dict) else {}
    status: dict[str, Any] = {
        "state": _TASK_STATES[ended],
        "timestamp": datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z"),
    }
    if ended == "failed":
        message = (error or {}).get("message") or "the agent failed"
        status["message"] = {
            "messageId": f"{record.id}-end",
            "taskId": record.id,
            "role": "ROLE_AGENT",
            "parts": [{"text": str(message)}],
        }
        if task.get("contextId"):
            status["message"]["contextId"] = task["contextId"]
    task["status"] = status
    seen = record.model_copy(update={"status": ended, "error": error, "result": task})
    seen._ended_by_run = by_run
    return seen


def _task_lost(record: RunRecord, run: RunRecord | None) -> bool:
    """Whether ``record`` is an A2A task in progress that nothing will end: its run ``run``
    was lost, or none was stored and the task was last written too long ago for it to be."""
    if record.kind != "a2a_task" or record.finished:
        return False
    if run is None:
        return time.time() - record.updated_at > LOST_AFTER_SECONDS
    return run.lost


def _run_of_task(record: RunRecord) -> str | None:
    """The id of the run of an A2A task in progress (its stored task names it), or None."""
    if record.kind != "a2a_task" or record.finished or not isinstance(record.result, dict):
        return None
    metadata = record.result.get("metadata")
    run_id = metadata.get(RUN_ID_KEY) if isinstance(metadata, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def seen_in_progress(record: RunRecord, run_of: Callable[[str], RunRecord | None]) -> bool:
    """Whether ``record`` is in progress as readers see it (not lost; an A2A task's run,
    which ``run_of`` gives by its id as stored, neither lost nor ended): a run still going,
    which a store keeping a bounded number of runs does not drop."""
    task_run = _run_of_task(record)
    return not _as_seen(record, run_of(task_run) if task_run else None).finished


@dataclass(frozen=True, slots=True)
class RunBurst:
    """What :meth:`RunsService.record` stores in one write: ``events`` of the run ``record``,
    creating it first (``create``) and saving ``record`` as final (``finish``)."""

    record: RunRecord
    events: Sequence[StoredEvent]
    create: bool = False
    finish: bool = False


def _check(burst: RunBurst) -> RunBurst:
    require_user_id(burst.record.user_id)
    require_run_id(burst.record.id)
    if burst.finish and burst.record.status not in FINISHED:
        raise InvalidInputError(f"a run finishes as one of {sorted(FINISHED)}", field="status")
    return burst


def require_run_id(run_id: Any) -> str:
    """``run_id`` if it is a usable id (a non-empty string of at most 256 characters)."""
    if not isinstance(run_id, str) or not run_id or len(run_id) > MAX_RUN_ID_LENGTH:
        raise InvalidInputError(
            f"run_id must be a non-empty string of at most {MAX_RUN_ID_LENGTH} characters",
            field="run_id",
        )
    return run_id


class RunsService(StartedGuard, ServiceWithLifecycleManager):
    """Runs and their events, per user. Backends implement the ``_`` hooks."""

    poll_seconds: float = DEFAULT_POLL_SECONDS
    # How long :meth:`stop_runs` counts on for a run's first write to reach the store.
    write_seconds: float = WRITE_SECONDS
    # Whether the backend prepares writes (see :meth:`prepare_record`).
    prepares_writes: ClassVar[bool] = False

    @service_call
    async def create_run(self, record: RunRecord) -> None:
        """Store a new run (its record; events come with :meth:`append_events`)."""
        require_user_id(record.user_id)
        require_run_id(record.id)
        await self._create(record)

    @service_call
    async def append_events(self, user_id: str, run_id: str, events: Sequence[StoredEvent]) -> None:
        """Append ``(sequence_number, event JSON)`` pairs, in order, to the run's events."""
        if events:
            await self._append(require_user_id(user_id), require_run_id(run_id), list(events))

    async def record(
        self,
        record: RunRecord,
        events: Sequence[StoredEvent],
        *,
        create: bool = False,
        finish: bool = False,
    ) -> bool | None:
        """Store a burst of a run executing in this process, in as few writes as the store
        allows: the run is created first (``create``), ``events`` are appended, and with
        ``finish`` its record is saved as given (its final status; a cancellation mark is
        kept).

        Returns whether the run's cancellation was requested, or None when the store cannot
        tell without another read (the caller polls :meth:`cancel_requested` then).
        """
        (requested,) = await self.record_many([RunBurst(record, events, create, finish)])
        return requested

    @service_call
    async def record_many(self, bursts: Sequence[RunBurst]) -> list[bool | None]:
        """:meth:`record` for several bursts (of different runs), in as few round trips as
        the store allows; the answers in order. Fails as a whole when one fails."""
        for burst in bursts:
            _check(burst)
        return await self._record_many(list(bursts))

    def prepare_record(self, burst: RunBurst) -> PreparedWrite | None:
        """:meth:`record` of ``burst``, prepared to be applied with a write of another
        service in one request (see :class:`PreparedWrite`), with the same result. None
        when the backend cannot (then call :meth:`record`)."""
        self._ensure_started()
        if not self.prepares_writes:
            return None
        return self._prepare_record(_check(burst))

    def _prepare_record(self, burst: RunBurst) -> PreparedWrite | None:
        """``_record_many`` of one burst as a prepared write (backends that set
        ``prepares_writes``)."""
        return None

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        return [await self._record(b.record, list(b.events), b.create, b.finish) for b in bursts]

    async def _record(
        self, record: RunRecord, events: list[StoredEvent], create: bool, finish: bool
    ) -> bool | None:
        """Create, append and finish with the other hooks; backends may do it in one write."""
        if create:
            await self._create(record)
        if events:
            await self._append(record.user_id, record.id, events)
        if finish:
            await self._save(record)
        return None

    @service_call
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
        """Record the end of the run: its final ``status`` (and a task's result or error).

        With ``submission`` (a task's :attr:`RunRecord.submission`), only the record of that
        very submission is ended: one stored since under the same id (the task erased, then
        submitted again with the same ``Idempotency-Key``) keeps its own status, checked by
        the store in the same step as the write.
        """
        if status not in FINISHED:
            raise InvalidInputError(f"a run finishes as one of {sorted(FINISHED)}", field="status")
        record = await self.get_run(user_id, run_id)
        if record is None or (submission is not None and record.submission != submission):
            return
        record = record.model_copy(
            update={"status": status, "result": result, "error": error, "updated_at": time.time()}
        )
        await self._save(record)

    @service_call
    async def save_run(self, record: RunRecord) -> None:
        """Replace the record of an existing run (its cancellation mark is kept)."""
        require_user_id(record.user_id)
        require_run_id(record.id)
        await self._save(record.model_copy(update={"updated_at": time.time()}))

    @service_call
    async def request_cancel(self, user_id: str, run_id: str) -> RunRecord | None:
        """Mark the run for cancellation; the run as it is now, or None when not found."""
        user_id, run_id = require_user_id(user_id), require_run_id(run_id)
        record = await self._load(user_id, run_id)
        if record is None:
            return None
        record = await self._seen(record)
        if not record.finished:
            await self._mark_cancel(user_id, run_id)
            record.cancel_requested = True
        return record

    @service_call
    async def beat(self, record: RunRecord) -> None:
        """Save the record of a run executing in this process as it is now, still in
        progress: its heartbeat (:data:`HEARTBEAT_SECONDS`). A run deleted meanwhile is not
        made again, nor is a task's record replaced by a later submission's (the store
        checks that the one it holds is of ``record.submission``)."""
        record.updated_at = time.time()
        await self._save(record)

    async def cancel_requested(self, user_id: str, run_id: str) -> bool:
        """Whether cancellation of the run was requested."""
        record = await self.get_run(user_id, run_id)
        return record is not None and record.cancel_requested

    @service_call
    async def get_run(self, user_id: str, run_id: str) -> RunRecord | None:
        """The run's record, or None (also for another user's run, or a deleted one)."""
        record = await self._load(require_user_id(user_id), require_run_id(run_id))
        return None if record is None or record.deleted else await self._seen(record)

    @service_call
    async def list_runs(self, user_id: str, session_id: str) -> list[RunRecord]:
        """The runs of a session, oldest first. ``session_id`` is taken as sessions take it
        (stripped; refused when blank or holding control characters)."""
        runs = await self._list(require_user_id(user_id), require_session_id(session_id))
        return await self._listed(runs)

    @service_call
    async def recent_runs(self, user_id: str, since: float) -> list[RunRecord]:
        """The user's runs created at ``since`` (a Unix time) or later, oldest first."""
        return await self._listed(await self._list_user(require_user_id(user_id), since))

    async def _seen(self, record: RunRecord) -> RunRecord:
        """``record`` as readers see it (see :func:`_as_seen`)."""
        (seen,) = await self._all_seen([record])
        return seen

    async def _all_seen(self, records: list[RunRecord]) -> list[RunRecord]:
        """``records`` as readers see them: a lost run failed, and so an A2A task in
        progress whose run was lost or never stored (its run read from the store)."""
        # A task's run listed with it is not read again.
        found = {(record.user_id, record.id): record for record in records}
        named = {(record.user_id, _run_of_task(record)) for record in records}
        wanted = [
            (user, run_id) for user, run_id in named if run_id and (user, run_id) not in found
        ]
        runs = await asyncio.gather(*(self._load(user_id, run_id) for user_id, run_id in wanted))
        found.update({(run.user_id, run.id): run for run in runs if run is not None})
        return [
            _as_seen(record, found.get((record.user_id, _run_of_task(record) or "")))
            for record in records
        ]

    async def _listed(self, records: list[RunRecord]) -> list[RunRecord]:
        """``records`` as a listing gives them: oldest first, as readers see them, without
        the marks of deleted runs."""
        kept = await self._all_seen([record for record in records if not record.deleted])
        return sorted(kept, key=lambda record: record.created_at)

    @service_call
    async def delete_run(self, user_id: str, run_id: str) -> RunRecord | None:
        """Delete a run that has ended (a response its client deletes): its events and its
        record go, and a record marking it deleted (:meth:`was_deleted`) is kept until it
        expires, which no read or listing finds. Returns the run as it was, or None when not
        found; a run in progress is not deleted (returned as it is)."""
        user_id, run_id = require_user_id(user_id), require_run_id(run_id)
        record = await self._load(user_id, run_id)
        if record is None or record.deleted:
            return None
        record = await self._seen(record)
        if record.finished:
            await self._delete_run_of(record)
            mark = {"status": record.status, "created_at": record.created_at, "deleted": True}
            fields = {"id": run_id, "user_id": user_id, "session_id": record.session_id}
            await self._create(RunRecord(**fields, kind=record.kind, **mark))
        return record

    @service_call
    async def discard_run(self, user_id: str, run_id: str) -> None:
        """Delete the run whatever its status, its events and its entries in indexes, and
        keep no mark that it was (unlike :meth:`delete_run`): its id is taken again, by a
        new run of the request that started it (a retry with its ``Idempotency-Key`` after
        the run was lost, say), whose events and listing would otherwise mix with its own.
        Nothing happens when the run is not stored."""
        user_id, run_id = require_user_id(user_id), require_run_id(run_id)
        record = await self._load(user_id, run_id)
        if record is not None:
            await self._delete_run_of(record)

    @service_call
    async def was_deleted(self, user_id: str, run_id: str) -> bool:
        """Whether the run was deleted with :meth:`delete_run` (and its mark has not expired)."""
        record = await self._load(require_user_id(user_id), require_run_id(run_id))
        return record is not None and record.deleted

    @service_call
    async def stop_runs(
        self,
        user_id: str,
        session_id: str | None = None,
        *,
        wait: float = STOP_TIMEOUT_SECONDS,
    ) -> list[str]:
        """Ask the runs of ``user_id`` in progress (those of ``session_id``, when given) to
        stop, and wait for them to end, at most ``wait`` seconds: call it before erasing,
        or a run would store its turn, and its events, after its session and runs are gone.
        Returns the ids of the runs still in progress at the end.

        Background tasks are not stopped (they do not watch their mark, and store nothing in
        a session). A run started just before the call may not be stored yet (its first
        write comes :data:`FIRST_WRITE_DELAY` after its start): the runs are listed again
        once that delay, and a write's time, have passed since the call began and the runs
        asked have ended, and those found then are asked too.
        """
        user_id = require_user_id(user_id)
        if session_id is not None:
            session_id = require_session_id(session_id)
        began = time.monotonic()
        deadline = began + wait
        # Every run started before the call is in the store by then.
        all_stored = began + FIRST_WRITE_DELAY + self.write_seconds
        asked: set[str] = set()
        since = 0.0
        live: list[str] = []
        for listing in range(2):
            if listing:
                await asyncio.sleep(max(all_stored - time.monotonic(), 0.0))
            listed_at = time.time()
            if session_id is None:
                records = await self._list_user(user_id, since)
            else:
                records = await self._list(user_id, session_id)
            since = listed_at - _CLOCK_SKEW_SECONDS
            fresh = [
                r.id
                for r in records
                if not r.finished and r.kind in STOPPABLE and r.id not in asked
            ]
            await asyncio.gather(*(self._mark_cancel(user_id, run_id) for run_id in fresh))
            asked.update(fresh)
            live = await self._in_progress(user_id, [*live, *fresh], deadline)
        return live

    async def _in_progress(self, user_id: str, run_ids: list[str], deadline: float) -> list[str]:
        """Wait for the runs ``run_ids`` to end, until ``deadline`` (a ``time.monotonic()``)
        at most; those still in progress then."""
        while run_ids and time.monotonic() < deadline:
            await asyncio.sleep(min(self.poll_seconds, deadline - time.monotonic()))
            loaded = await asyncio.gather(*(self._load(user_id, run_id) for run_id in run_ids))
            found = await self._all_seen([record for record in loaded if record is not None])
            run_ids = [record.id for record in found if not record.finished]
        return run_ids

    @service_call
    async def delete_user_runs(self, user_id: str) -> None:
        """Delete every run of ``user_id``: records and events, tasks and A2A tasks too
        (erasing a user's data: a run's events hold its conversation). Other users' runs
        stay. A run still executing is not stopped (see :meth:`stop_runs`); what it stores
        afterwards is not kept (its events, its end), except its first write when it had
        stored nothing yet, which stores the run anew. Retrying is safe."""
        await self._delete_user(require_user_id(user_id))

    @service_call
    async def delete_session_runs(self, user_id: str, session_id: str) -> None:
        """Delete the runs of a session (deleting the session: their events hold its
        conversation), as :meth:`delete_user_runs` does a user's."""
        await self._delete_session(require_user_id(user_id), require_session_id(session_id))

    @service_call
    async def read_events(
        self, user_id: str, run_id: str, after: int = -1, limit: int | None = None
    ) -> list[StoredEvent]:
        """The stored events with a sequence number above ``after``, in order (``after``
        below -1 reads them all, above :data:`MAX_SEQUENCE` none), at most ``limit`` of them
        (at least 1) when given."""
        user_id, run_id = require_user_id(user_id), require_run_id(run_id)
        if isinstance(after, bool) or not isinstance(after, int):
            raise InvalidInputError("after must be an integer", field="after")
        limit = optional_positive_int(limit, field="limit")
        return await self._read(user_id, run_id, min(max(after, -1), MAX_SEQUENCE), limit)

    async def follow(
        self, user_id: str, run_id: str, after: int = -1
    ) -> AsyncIterator[StoredEvent]:
        """The events after ``after``, then the new ones as they are stored, until the run ends.

        Stops when the run does not exist, after the events still readable: a run deleted
        between two polls (its session deleted) may have stored its last ones meanwhile.
        """
        while True:
            record = await self.get_run(user_id, run_id)
            if record is None:
                for event in await self.read_events(user_id, run_id, after):
                    yield event
                return
            # The status is read before the events: a finished run has stored all of them.
            events = await self.read_events(user_id, run_id, after)
            for sequence, data in events:
                yield sequence, data
                after = sequence
            if record.finished:
                if record.error == _LOST_ERROR:
                    ending = await self._lost_ending(user_id, run_id, after)
                    if ending is not None:
                        yield ending
                return
            if not events:
                await self._wait(user_id, run_id, after)

    async def _lost_ending(self, user_id: str, run_id: str, after: int) -> StoredEvent | None:
        """The last event of a lost run, as a run failing there would have sent it: its
        response (its first event), failed with ``RUN_LOST``, numbered after its last stored
        event. None for a follower past that (``after``: it had the ending already)."""
        last = await self.read_events(user_id, run_id, after - 1, limit=1)
        if not last or last[0][0] != after:
            return None
        first = await self.read_events(user_id, run_id, -1, limit=1)
        sequence = after + 1
        try:
            response = AgentResponse.model_validate_json(first[0][1])
        except ValueError:
            return None
        ending = response.model_copy(update={"sequence_number": sequence, "output": None})
        return sequence, ending.failed(Error(**_LOST_ERROR)).model_dump_json()

    async def _wait(self, user_id: str, run_id: str, after: int) -> None:
        """Wait (at most about ``poll_seconds``) for events after ``after``."""
        await asyncio.sleep(self.poll_seconds)

    @abstractmethod
    async def _create(self, record: RunRecord) -> None:
        """Store a new run record and index it under its session."""

    @abstractmethod
    async def _save(self, record: RunRecord) -> None:
        """Replace the run's record (keeping a cancellation mark) when it is stored, and,
        for a record with a ``submission``, only when the stored one is of the same
        submission (checked in the same step as the write)."""

    @abstractmethod
    async def _append(self, user_id: str, run_id: str, events: list[StoredEvent]) -> None:
        """Append events; one already stored (same sequence number) is skipped."""

    @abstractmethod
    async def _mark_cancel(self, user_id: str, run_id: str) -> None:
        """Set the run's cancellation mark."""

    @abstractmethod
    async def _load(self, user_id: str, run_id: str) -> RunRecord | None:
        """The record, with ``cancel_requested`` from the mark, or None."""

    @abstractmethod
    async def _list(self, user_id: str, session_id: str) -> list[RunRecord]:
        """The records of the session's runs, in any order."""

    @abstractmethod
    async def _list_user(self, user_id: str, since: float) -> list[RunRecord]:
        """The records of the user's runs created at ``since`` (a Unix time) or later, in
        any order."""

    @abstractmethod
    async def _delete_user(self, user_id: str) -> None:
        """Delete every run of the user, with its events and its entries in indexes."""

    @abstractmethod
    async def _delete_session(self, user_id: str, session_id: str) -> None:
        """Delete the session's runs, with their events and their entries in indexes."""

    @abstractmethod
    async def _delete_run_of(self, record: RunRecord) -> None:
        """Delete the run of ``record``, with its events and its entries in indexes."""

    @abstractmethod
    async def _read(
        self, user_id: str, run_id: str, after: int, limit: int | None
    ) -> list[StoredEvent]:
        """Stored events above ``after``, ascending, at most ``limit``."""


__all__ = [
    "DEFAULT_POLL_SECONDS",
    "FINISHED",
    "FIRST_WRITE_DELAY",
    "HEARTBEAT_SECONDS",
    "LOST_AFTER_SECONDS",
    "MAX_SEQUENCE",
    "RUN_ID_KEY",
    "RUN_LOST",
    "STOPPABLE",
    "STOP_TIMEOUT_SECONDS",
    "RunBurst",
    "RunKind",
    "RunRecord",
    "RunsService",
    "StoredEvent",
    "require_run_id",
    "seen_in_progress",
]
