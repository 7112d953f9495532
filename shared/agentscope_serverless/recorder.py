"""Executing runs: a run's events go to its listener and to the runs store as they are
produced, and the run goes on when its client leaves.

:meth:`RunRecorder.start` takes the event stream of a run (``Runner.stream_query``) and
drives it in a task of its own, so the run is independent of the request that started it:

- every event is kept in the run's log, which the listener (the HTTP response) takes from
  in batches (:meth:`RecordedRun.take`, woken by :meth:`RecordedRun.changed`);
- a writer task stores the events not yet written, one write in flight at a time, so the
  stream never waits for the store. Each write is one call of
  :meth:`~agentscope_serverless.services.runs.base.RunsService.record`: the first also
  creates the run and the last also saves its final status. The first write waits until
  the run ends or ``first_write_delay`` seconds have passed, so a run of a fast agent
  costs one write (one Redis round trip), and any run is in the store that soon. A write
  that fails is made again with the next one (the last, saving the status, is tried
  ``LAST_WRITE_ATTEMPTS`` times, none begun after ``LAST_WRITE_PATIENCE_SECONDS``: a store
  that slow to fail is not answering: :func:`write_last`), so a store failing for a moment
  loses none of the run;
- a run that completes within its first write delay is stored with its turn's history: the
  runner hands its turn's end to the recorder (:func:`~agentscope_serverless.runner.
  end_turns_with`), which appends the messages to the session and stores the whole run,
  its final event included, in one request when both stores allow it (the same Redis: one
  ``MULTI``/``EXEC``), and otherwise appends them as the runner would;
- the store's answer says whether the run's cancellation was requested; a run still going
  after its first write delay also polls for it, every ``poll_seconds``. Cancelling cancels
  the run's task with :data:`~agentscope_serverless.runner.RUN_CANCELED`, once however many
  cancels come: the handler's task is cancelled (its ``finally`` blocks run to their end, cut
  short only past :data:`~agentscope_serverless.cancellation.CLEANUP_SECONDS`), the runner
  keeps the partial reply in the session history and ends the stream with a ``canceled``
  response; nothing is stored after it;
- a run still going when its session or its user's data is erased (its agent did not stop
  in the time the erase waits) stores nothing more, neither events nor its turn: at once
  in this process (:meth:`RunRecorder.erase_local`); elsewhere once it finds its record
  deleted after its cancellation was asked, which it checks before storing its turn;
- when the listener goes away (the client disconnected) the run goes on, stored and
  resumable, unless it was started with ``cancel_on_disconnect``;
- a run started with a time limit (a Lambda invocation's, see
  :mod:`~agentscope_serverless.time_limit`) still going when it runs out is cancelled the
  same way, but ends ``failed`` with the error ``TIME_LIMIT``: its end is stored and sent
  before the function is stopped, and a line logged says which run it was and where it was
  waiting (:func:`~agentscope_serverless.stacks.awaited_stack`).

Without a runs store (``RUNS_BACKEND=none``) the same machinery streams without storing,
and a run whose client leaves is cancelled (nobody could resume it).

The run's id is the ``id`` of its first event (the ``response`` event).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from pydantic_core import PydanticSerializationError

from agentscope_serverless.cancellation import CLEANUP_SECONDS, TIME_LIMIT_CLEANUP_SECONDS
from agentscope_serverless.errors import AgentError, RunCanceledError, TimeLimitError
from agentscope_serverless.log import logger
from agentscope_serverless.metrics import RunMetrics
from agentscope_serverless.runner import (
    AGENT_UNKNOWN_ERROR,
    RUN_CANCELED,
    end_turns_with,
    tell_first_text_held,
)
from agentscope_serverless.schemas._build import json_of, set_field
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Error,
    Event,
    Message,
    RunStatus,
    TextContent,
)
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services.runs.base import (
    FINISHED,
    FIRST_WRITE_DELAY,
    HEARTBEAT_SECONDS,
    RunBurst,
    RunKind,
    RunRecord,
    RunsService,
)
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.stacks import awaited_stack
from agentscope_serverless.time_limit import TIME_LIMIT, seconds_left

EventItem = tuple[Event, str]
"""An event and its JSON, as sent and stored."""
# How long after the cut of its cleanup at the time limit a run whose agent goes on all the
# same is ended without it (see RecordedRun._abandon).
ABANDON_SECONDS = 0.2
# How many times the write saving a run's final status is tried.
LAST_WRITE_ATTEMPTS = 3
# No further attempt once the last write's attempts have taken this long: a store that is
# this slow to fail does not answer (each call waited out its timeout), and the client gets
# the run's last events only once the write is given up.
LAST_WRITE_PATIENCE_SECONDS = 5.0
# The most events one write of a run stores (see RecordedRun._write_burst).
MAX_BURST_EVENTS = 1000
STOP_SECONDS = CLEANUP_SECONDS + 2
"""How long a stopping server waits, in all, for its cancelled runs to end and be stored."""
_OUT_OF_TIME = Error(
    code=TIME_LIMIT,
    message="the run was ended at the function's time limit, before the agent finished",
)


class RecordedRun:
    """One run executing in this process, recorded in the runs store (when there is one)."""

    def __init__(
        self,
        recorder: RunRecorder,
        events: AsyncGenerator[Event, None],
        *,
        user_id: str,
        kind: RunKind,
        cancel_on_disconnect: bool,
        session_id: str | None = None,
        fingerprint: str | None = None,
        input_seed: str | None = None,
        echo: dict[str, Any] | None = None,
        time_left: float | None = None,
    ) -> None:
        self._recorder = recorder
        self._fingerprint = fingerprint
        self._input_seed = input_seed
        self._echo = echo
        self._runs = recorder.runs
        self._source = events
        self.user_id = user_id
        self.kind: RunKind = kind
        # Nobody can resume a run that is not stored: it ends with its listener.
        self.cancel_on_disconnect = cancel_on_disconnect or self._runs is None
        self.run_id = ""
        # Known before the run's first event names it, so that deleting the session stops
        # a run still loading it.
        self.session_id = session_id
        self.status: str = RunStatus.InProgress
        self._log: list[EventItem] = []
        self._taken = 0
        self._written = 0
        self._changed: asyncio.Future[None] | None = None
        self._to_write = asyncio.Event()
        self._created = False
        self._produced = False
        self._failure: BaseException | None = None
        self._first: AgentResponse | None = None
        self._record: RunRecord | None = None
        self._producer: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None
        # The final event, with its JSON, once stored with the turn's history.
        self._ending: EventItem | None = None
        # For the run's metrics: when it began, when its first text came (as the runner got
        # it, whether it was sent at once or held back), its usage.
        self._began = time.monotonic()
        # When its record was last saved as in progress (its heartbeat, see _beat_when_due).
        self._beaten = self._began
        self._first_text: float | None = None
        self._usage: dict[str, object] | None = None
        # The error the run ended with, for its record.
        self._error: Error | None = None
        # Seconds the run may take (None: no limit), whether they ran out, and where the
        # run was waiting then (for the line saying so).
        self._time_left = time_left
        self._time_limit: asyncio.TimerHandle | None = None
        self._out_of_time = False
        self._stopped_in = ""
        # Whether its task was cancelled (it is, once), and when its agent's cleanup is cut
        # short if still going.
        self._cancelled = False
        self._cleanup_limit: asyncio.TimerHandle | None = None
        # Its cancellation was requested in the store (as an erase does, before deleting).
        self._cancel_requested = False
        # Its session or its user's data was erased while it ran: it stores nothing more.
        self._erased = False
        # Its agent went on past the cut of its cleanup at the time limit: the run was ended
        # without it (its task left behind), and nothing its task does later counts; the
        # task storing that end.
        self._abandoned = False
        self._abandoning: asyncio.Task[None] | None = None

    # --- the run's task -----------------------------------------------------------------

    async def _produce(self) -> None:
        # (Without a runs store too: a turn its run was ended without is not stored.)
        end_turns_with(self._end_turn, self._keeps_turn)
        if self._recorder.metrics is not None:
            tell_first_text_held(self._first_text_came)
        try:
            async with contextlib.aclosing(self._source) as events:
                async for event in events:
                    if event.status == RunStatus.Canceled and isinstance(event, AgentResponse):
                        # The runner turned our cancellation into the run's last event.
                        task = asyncio.current_task()
                        if task is not None and task.cancelling():
                            task.uncancel()
                    self._emit(event)
        except asyncio.CancelledError as exc:
            # Cancelled outside the agent (while loading the session, or again while its
            # partial reply is saved): end the stream here. Any other cancellation (the
            # server stopping) also ends it.
            if self._ending is not None and not self._ended():
                self._emit(self._ending[0])  # stored already: the run completed
            elif self._first is not None and not self._ended():
                self._emit(self._next_end().canceled())
            elif self._first is None:
                # Canceled before it began (an erase of its session): a conflict, answered
                # as such, not a server's failure.
                canceled = exc.args == (RUN_CANCELED,)
                self._failure = _canceled_before_it_began() if canceled else exc
            if exc.args != (RUN_CANCELED,):
                raise
        except Exception as exc:
            if self._first is None:
                self._failure = exc
            else:
                logger.exception("the run failed", extra={"run_id": self.run_id})
                self._end_failed(exc)
        finally:
            if not self._abandoned:  # else its end was stored without it
                self._mark_produced()
                if self._record is not None:
                    await self._store_end()

    def _mark_produced(self) -> None:
        """The run's stream has ended: its timers go, its readers and its recorder learn it."""
        self._produced = True
        self._end_timers()
        self._notify()
        self._recorder._ended(self)

    def _next_end(self) -> AgentResponse:
        """The run's first event, as the last one to come next (its status to set)."""
        assert self._first is not None
        ending = {"output": None, "sequence_number": self._last_sequence() + 1}
        return self._first.model_copy(update=ending)

    def _end_failed(self, exc: Exception) -> None:
        """End the stream of a run that failed past its first event outside the agent (an
        event that cannot be encoded...) with a ``failed`` response, as an agent's error
        would; the runner then keeps the input in the session."""
        assert self._first is not None
        if not self._ended():
            with contextlib.suppress(Exception):
                self._emit(self._next_end().failed(_failure_of(exc)))
        self.status = RunStatus.Failed

    def _ended(self) -> bool:
        return self.status in FINISHED

    def _last_sequence(self) -> int:
        if not self._log:
            return -1
        return self._log[-1][0].sequence_number or 0

    def _emit(self, event: Event) -> None:
        if self._abandoned:
            return  # its agent, left behind at the time limit, goes on: nothing counts
        if self._first is None and isinstance(event, AgentResponse):
            self._first = event.model_copy()
            self.run_id = event.id or ""
            self.session_id = event.session_id
            if self._runs is not None:
                self._record = RunRecord(
                    id=self.run_id,
                    user_id=self.user_id,
                    session_id=self.session_id,
                    kind=self.kind,
                    fingerprint=self._fingerprint,
                    input_seed=self._input_seed,
                    echo=self._echo,
                )
                loop = asyncio.get_running_loop()
                delay = self._recorder.first_write_delay
                self._write_timer = loop.call_later(delay, self._start_writer)
                self._recorder._live[(self.user_id, self.run_id)] = self
            if self._out_of_time:
                asyncio.get_running_loop().call_soon(self.cancel)
        if event.sequence_number is None:
            set_field(event, "sequence_number", self._last_sequence() + 1)
        if isinstance(event, AgentResponse) and event.status in FINISHED:
            if self._out_of_time and event.status == RunStatus.Canceled:
                event.failed(_OUT_OF_TIME)  # cancelled for its time limit, not by a client
                self._log_out_of_time()
            self.status = event.status
            self._usage = event.usage
            self._error = event.error
        elif self._first_text is None and isinstance(event, TextContent) and event.text:
            self._first_text = time.monotonic()  # streamed: it came just now
        if self._ending is not None and event is self._ending[0]:
            self._log.append(self._ending)
            self._written = len(self._log)
        else:
            self._log.append((event, json_of(event)))
            if self._writer is not None:  # else the writer, once started, writes it
                self._to_write.set()
        self._notify()

    def _first_text_came(self, at: float) -> None:
        """The agent's first text came ``at`` (a ``time.monotonic()``), held back by the
        runner until later: a run not streamed gathers its text."""
        if self._first_text is None:
            self._first_text = at

    def _log_out_of_time(self) -> None:
        """Say which run its time limit ended, and where it was waiting then (its agent's
        frames: the call it was stuck in), nothing of what it said."""
        logged = {"code": TIME_LIMIT, "run_id": self.run_id, "session_id": self.session_id}
        logged |= {"user_id": self.user_id, "stack": self._stopped_in}
        logger.warning("the run reached the time limit", extra=logged)

    async def _keeps_turn(self) -> bool:
        """Whether the run stores its turn: not once erased, nor once its record is gone
        after its cancellation was asked (an erase elsewhere, which did not wait for it)."""
        if self._abandoned:
            return False  # ended without it at the time limit: its turn comes too late
        if self._cancel_requested and self._created and not self._erased:
            assert self._runs is not None
            with contextlib.suppress(Exception):  # unknown: the turn is kept
                if await self._runs.get_run(self.user_id, self.run_id) is None:
                    self.erase()
        return not self._erased

    async def _end_turn(
        self,
        history: SessionHistoryService,
        session: Session,
        messages: list[Message],
        final: AgentResponse,
    ) -> None:
        """The runner's turn end (see :data:`~agentscope_serverless.runner.TurnEnd`): a run
        not written yet is stored whole, ``final`` included, with the turn's messages."""
        runs, record = self._runs, self._record
        unwritten = runs is not None and record is not None and self._writer is None
        together = unwritten and runs is not None and runs.prepares_writes
        appending = history.prepare_append(session, messages) if together else None
        if appending is None:
            await history.append_message(session, messages)
            return
        assert runs is not None and record is not None
        ending = (final, json_of(final))
        events = [(e.sequence_number or 0, data) for e, data in (*self._log, ending)]
        # Saved as final by this write (a copy: when it is not made, the run's writes
        # store the record in progress, then as final with the status it has then).
        final_record = record.model_copy(update={"status": final.status, "updated_at": time.time()})
        burst = RunBurst(final_record, events, create=True, finish=True)
        recording = runs.prepare_record(burst)
        if recording is None or not appending.joins(recording):
            await appending.apply()
            return
        # From here the run is stored by this write or, when it fails, as it ends.
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        await appending.apply(recording)  # a cancellation asked for now comes too late
        self._ending = ending
        self._created = True

    def _notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def _store_end(self) -> None:
        """The run has ended: store the rest of it (all of it, when it ended within its first
        write delay), or hand the rest to the writer already storing it."""
        if self._writer is not None:
            self._to_write.set()
            return
        if self._ending is not None and self._written == len(self._log):
            self._stored()  # stored with the turn's history
            return
        if self._write_timer is not None:
            self._write_timer.cancel()
        try:
            await self._write_last()
        finally:
            self._stored()

    def _start_writer(self) -> None:
        """The run goes on past its first write delay: store it as it is produced, and
        watch for its cancellation."""
        self._write_timer = None
        if self._writer is None and not self._produced:
            self._writer = asyncio.create_task(self._write())
            self._watcher = asyncio.create_task(self._watch())

    async def _write(self) -> None:
        """Store the events not yet written, in bursts; the last burst saves the status. A
        burst that fails is written again with the next one."""
        assert self._runs is not None and self._record is not None
        try:
            failing = False
            while not self._produced:
                self._to_write.clear()
                try:
                    await self._write_burst(finish=False)
                    await self._beat_when_due()
                    failing = False
                except Exception:
                    # Once per outage: a run streaming on tries again with each burst.
                    if not failing:
                        logger.exception("could not store the run", extra={"run_id": self.run_id})
                    failing = True
                if not self._produced:
                    # Woken by new events, or to beat: a run silent for long (a slow tool)
                    # is not taken for lost.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(HEARTBEAT_SECONDS):
                            await self._to_write.wait()
            await self._write_last()
        finally:
            self._stored()

    async def _write_last(self) -> None:
        """The run's last write (its final status), tried again after a failure."""
        assert self._runs is not None
        with contextlib.suppress(Exception):  # each failure is logged
            await write_last(
                lambda: self._write_burst(finish=True),
                pause=self._runs.poll_seconds,
                failure="could not store the run",
                extra={"run_id": self.run_id},
            )

    async def _beat_when_due(self) -> None:
        """Save the run's record as it is now (its heartbeat), when the last was
        :data:`HEARTBEAT_SECONDS` ago or more."""
        assert self._runs is not None and self._record is not None
        if (
            self._created
            and not self._erased
            and time.monotonic() - self._beaten >= HEARTBEAT_SECONDS
        ):
            await self._runs.beat(self._record)
            self._beaten = time.monotonic()

    async def _write_burst(self, *, finish: bool) -> None:
        """Store the events not written yet (and, until a write succeeded, the run's
        creation; with ``finish``, its final status), :data:`MAX_BURST_EVENTS` a write at
        most, the run's heartbeat saved between two when due: a write of thousands of
        events (a fast agent, a slow store) takes long, and a run whose record is not saved
        meanwhile reads as lost. A failed write changes nothing here: writing the same
        events again stores them once."""
        while not self._erased and len(self._log) - self._written > MAX_BURST_EVENTS:
            await self._write_once(self._written + MAX_BURST_EVENTS, finish=False)
            await self._beat_when_due()
        await self._write_once(len(self._log), finish=finish)

    async def _write_once(self, end: int, *, finish: bool) -> None:
        """One write: the events not written yet up to ``end`` (see :meth:`_write_burst`)."""
        assert self._runs is not None and self._record is not None
        if self._erased:
            return
        burst = [(e.sequence_number or 0, data) for e, data in self._log[self._written : end]]
        record = self._record
        if finish:  # the last write: the record is saved as final
            record.status = self.status if self._ended() else RunStatus.Failed
            record.error = None if self._error is None else self._error.model_dump()
            record.updated_at = time.time()
        requested = await self._runs.record(record, burst, create=not self._created, finish=finish)
        self._written, self._created = end, True
        if requested:
            self._cancel_requested = True
            self.cancel()

    def _stored(self) -> None:
        # Let go of the watcher: cancelled, its task holds a traceback through its frame
        # back to this run, a reference cycle that would keep the run's events (a large
        # reply) until the next garbage collection.
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        self._recorder._forget(self)

    async def _watch(self) -> None:
        """Cancel the run when its cancellation is requested in the store; then, until it
        ends, erase it when its record is deleted: an erase (in another process) asks a run
        to stop, waits a few seconds, and deletes it, stopped or not."""
        assert self._runs is not None
        failing = False
        while not self._produced:
            try:
                record = await self._runs.get_run(self.user_id, self.run_id)
                failing = False
            except Exception:
                # Once per outage, not at every poll.
                if not failing:
                    logger.exception("could not read the run's cancellation mark")
                failing = True
            else:
                if record is None and self._cancel_requested:
                    self.erase()
                    return
                if record is not None and record.cancel_requested and not self._cancel_requested:
                    self._cancel_requested = True
                    self.cancel()
            await asyncio.sleep(self._runs.poll_seconds)

    # --- for the request ----------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the run (a no-op once it has ended, its end is stored, or it was cancelled):
        its task is cancelled once, and its agent's cleanup (``finally`` blocks) runs to its
        end, cut short (the task cancelled again) only past :data:`CLEANUP_SECONDS`
        (:data:`TIME_LIMIT_CLEANUP_SECONDS` at the run's time limit)."""
        if self._cancelled or not self._going():
            return
        assert self._producer is not None
        self._cancelled = True
        self._producer.cancel(RUN_CANCELED)
        self._cut_cleanup_within(
            TIME_LIMIT_CLEANUP_SECONDS if self._out_of_time else CLEANUP_SECONDS
        )

    def _going(self) -> bool:
        """Whether the run's task runs, its end not stored yet."""
        return self._producer is not None and not self._produced and self._ending is None

    def _cut_cleanup_within(self, seconds: float) -> None:
        """Cut the agent's cleanup short if still going ``seconds`` from now (or sooner, as
        set already)."""
        loop = asyncio.get_running_loop()
        limit = self._cleanup_limit
        if limit is not None:
            if limit.when() <= loop.time() + seconds:
                return
            limit.cancel()
        self._cleanup_limit = loop.call_later(seconds, self._cut_cleanup)

    def _cut_cleanup(self) -> None:
        self._cleanup_limit = None
        if self._going():
            assert self._producer is not None
            self._producer.cancel(RUN_CANCELED)
            if self._out_of_time:
                loop = asyncio.get_running_loop()
                self._cleanup_limit = loop.call_later(ABANDON_SECONDS, self._abandon)

    def _abandon(self) -> None:
        """The run's agent goes on at its time limit, its cleanup cut short (it catches the
        cancellation, or awaits what ignores it): end the run without it, failed with
        ``TIME_LIMIT`` after what it produced, and store that end. Its task is left behind
        (in a Lambda environment, frozen until the next invocation); whatever it does later
        is ignored (see :meth:`_emit`, :meth:`_keeps_turn`)."""
        self._cleanup_limit = None
        if not self._going():
            return
        logged = {"code": TIME_LIMIT, "run_id": self.run_id, "session_id": self.session_id}
        logged |= {"user_id": self.user_id, "stack": awaited_stack(self._source)}
        logger.warning("the run's agent ignores its cancellation: it is left behind", extra=logged)
        if self._first is None:
            self._failure = TimeLimitError("the run reached the time limit before it began")
        elif not self._ended():
            self._emit(self._next_end().canceled())  # its last event, then nothing counts
        self._abandoned = True
        self._mark_produced()
        if self._record is not None:
            self._abandoning = asyncio.get_running_loop().create_task(self._store_end())

    def _end_timers(self) -> None:
        """The run has ended: neither its time limit nor its cleanup's comes."""
        for timer in (self._time_limit, self._cleanup_limit):
            if timer is not None:
                timer.cancel()

    def erase(self) -> None:
        """Cancel the run, and store nothing more of it (its turn included): its session or
        its user's data is being erased."""
        self._erased = True
        self.cancel()

    def _time_is_up(self) -> None:
        """The run's time limit has come: end it (as soon as it has begun), as failed; the
        cleanup of one cancelled already is cut short within :data:`TIME_LIMIT_CLEANUP_SECONDS`."""
        self._time_limit = None
        self._out_of_time = True
        self._stopped_in = awaited_stack(self._source)
        if self._cancelled:
            self._cut_cleanup_within(TIME_LIMIT_CLEANUP_SECONDS)
        elif self._first is not None:
            self.cancel()

    async def _begin(self) -> None:
        self._producer = asyncio.create_task(self._produce())
        self._producer.add_done_callback(self._never_ran)
        if self._time_left is not None:
            loop = asyncio.get_running_loop()
            self._time_limit = loop.call_later(max(self._time_left, 0), self._time_is_up)
        while not self._log and not self._produced:
            await self.changed()
        if self._failure is not None:
            raise self._failure
        assert self._log, "the run ended before its first event"

    def _never_ran(self, producer: asyncio.Task[None]) -> None:
        """End a run whose task was cancelled before its first step (a delete of its
        session came first): the task's code, which ends the run, never ran."""
        if self._produced:
            return
        self._produced = True
        self._failure = _canceled_before_it_began()
        self._end_timers()
        self._notify()

    def take(self) -> list[EventItem]:
        """The events produced since the last call (none when nothing new came)."""
        items = self._log[self._taken :]
        self._taken = len(self._log)
        return items

    @property
    def error(self) -> Error | None:
        """The error the run ended with (None while it runs, and when it did not fail)."""
        return self._error

    @property
    def done(self) -> bool:
        """Whether the run has produced its last event and all were taken."""
        return self._produced and self._taken == len(self._log)

    def changed(self) -> asyncio.Future[None]:
        """A future resolved when the run produces an event or ends (at once when there
        are events not taken yet, or the run has ended)."""
        if self._changed is None or self._changed.cancelled():
            # (A waiter cancelled, its client gone, cancelled the future it awaited.)
            self._changed = asyncio.get_running_loop().create_future()
        changed = self._changed
        if self._produced or self._taken < len(self._log):
            self._notify()
        return changed

    def detach(self) -> None:
        """The listener has gone: the run goes on, unless it cancels on disconnect."""
        if self.cancel_on_disconnect and not self._produced:
            self.cancel()

    async def items(self) -> AsyncGenerator[EventItem, None]:
        """``(event, its JSON)`` as produced; leaving early detaches (or cancels) the run."""
        try:
            while True:
                for item in self.take():
                    yield item
                # Events produced while the last were yielded (the run may have ended
                # meanwhile, its last event among them) are taken first.
                if self._produced and self._taken == len(self._log):
                    break
                await self.changed()
            await self.wait_stored()
        finally:
            self.detach()

    async def events(self) -> AsyncGenerator[Event, None]:
        """The run's events as produced."""
        async with contextlib.aclosing(self.items()) as items:
            async for event, _ in items:
                yield event

    async def final(self) -> AgentResponse:
        """Wait for the end of the run and return its last response event."""
        try:
            while not self._produced:
                self._taken = len(self._log)
                await self.changed()
            self._taken = len(self._log)
            await self.wait_stored()
        finally:
            self.detach()
        last = self._log[-1][0]
        assert isinstance(last, AgentResponse)
        return last

    async def wait_stored(self) -> None:
        """Wait until the run's events and status are stored (or the run has ended, when
        it is not stored)."""
        producer = self._abandoning if self._abandoned else self._producer
        pending = [t for t in (producer, self._writer) if t is not None and not t.done()]
        if pending:
            await asyncio.wait(pending)


async def write_last(
    write: Callable[[], Awaitable[object]],
    *,
    pause: float,
    failure: str,
    extra: dict[str, Any],
) -> None:
    """``write()``, the last write of something executing (what it stores once it has
    ended), which stores the same when made twice: tried again ``pause`` seconds after a
    failure, :data:`LAST_WRITE_ATTEMPTS` times at most, none begun after
    :data:`LAST_WRITE_PATIENCE_SECONDS`. Each failure is logged (``failure``, with
    ``extra``); the last one is raised."""
    began = time.monotonic()
    for attempt in range(1, LAST_WRITE_ATTEMPTS + 1):
        try:
            await write()
            return
        except Exception:
            logger.exception(failure, extra=extra)
            if attempt == LAST_WRITE_ATTEMPTS or (
                time.monotonic() - began >= LAST_WRITE_PATIENCE_SECONDS
            ):
                raise
        await asyncio.sleep(pause)


def _canceled_before_it_began() -> RunCanceledError:
    return RunCanceledError(
        "the run was canceled before it began: its session was deleted, or your data erased"
    )


def _failure_of(exc: Exception) -> Error:
    """The error of a run that failed outside its agent: nothing of the exception's text,
    which the runner has not cleaned of secrets."""
    if isinstance(exc, PydanticSerializationError):
        message = "the agent produced output that cannot be encoded as JSON, such as text "
        return Error(code=AgentError.code, message=message + "that is not valid Unicode")
    return Error(code=AGENT_UNKNOWN_ERROR, message="the run failed unexpectedly")


class RunRecorder:
    """Starts runs, recorded in ``runs`` (None: streamed without storing), and keeps track
    of those executing in this process.

    A run is in the store at most ``first_write_delay`` seconds after its first event (an
    erase in another process counts on :data:`FIRST_WRITE_DELAY`, see
    :meth:`~agentscope_serverless.services.runs.base.RunsService.stop_runs`). The writes of
    concurrent runs do not wait for each other (on Redis, the store's shared
    connection pipelines them).
    """

    def __init__(
        self,
        runs: RunsService | None,
        *,
        first_write_delay: float = FIRST_WRITE_DELAY,
        metrics: RunMetrics | None = None,
    ) -> None:
        self.runs = runs
        self.first_write_delay = first_write_delay
        self.metrics = metrics
        self._live: dict[tuple[str, str], RecordedRun] = {}
        self._runs: set[RecordedRun] = set()
        _recorders.add(self)

    async def start(
        self,
        events: AsyncGenerator[Event, None],
        *,
        user_id: str,
        kind: RunKind = "process",
        cancel_on_disconnect: bool = False,
        session_id: str | None = None,
        fingerprint: str | None = None,
        input_seed: str | None = None,
        echo: dict[str, Any] | None = None,
    ) -> RecordedRun:
        """Start driving ``events`` as a recorded run; returns once its first event is out.

        ``session_id`` is the session the run is of, when known before it begins (a delete
        of that session then stops it while it still loads); ``fingerprint`` (what the
        request was), ``input_seed`` (what the ids of its input derive from) and ``echo``
        (what its answer repeats of it) are kept with the run's record. An error before the
        first event (the session could not be loaded...) is raised here,
        :class:`RunCanceledError` when the run was stopped meanwhile. The run ends at the
        time limit of the invocation serving it, if any
        (:func:`~agentscope_serverless.time_limit.seconds_left`).
        """
        run = RecordedRun(
            self,
            events,
            user_id=user_id,
            kind=kind,
            cancel_on_disconnect=cancel_on_disconnect,
            session_id=session_id,
            fingerprint=fingerprint,
            input_seed=input_seed,
            echo=echo,
            time_left=seconds_left(),
        )
        self._runs.add(run)
        try:
            await run._begin()
        except BaseException:
            self._runs.discard(run)
            raise
        if self.runs is None:
            self._runs.discard(run)
        return run

    async def stop_local(self, user_id: str, session_id: str | None = None, *, wait: float) -> None:
        """Cancel the runs of ``user_id`` (of ``session_id``, when given) executing in this
        process, stored yet or not (a run is stored ``first_write_delay`` after its start),
        and wait for their ends to be stored, at most ``wait`` seconds."""
        runs = [
            run
            for run in self._runs
            if run.user_id == user_id and session_id in (None, run.session_id)
        ]
        await _cancel_and_wait(runs, wait)

    def erase_local(self, user_id: str, session_id: str | None = None) -> None:
        """Have the runs of ``user_id`` (of ``session_id``, when given) still executing in
        this process store nothing more (see :meth:`RecordedRun.erase`)."""
        for run in list(self._runs):
            if run.user_id == user_id and session_id in (None, run.session_id):
                run.erase()

    def has_local(self, user_id: str, session_id: str | None = None) -> bool:
        """Whether runs of ``user_id`` (of ``session_id``, when given) execute in this
        process, stored yet or not, but those told to store nothing more
        (:meth:`erase_local`)."""
        return any(
            run.user_id == user_id and session_id in (None, run.session_id) and not run._erased
            for run in self._runs
        )

    def executing(self) -> bool:
        """Whether runs execute in this process now (those stored: the others end with
        their requests)."""
        return bool(self._runs)

    def cancel_local(self, user_id: str, run_id: str) -> bool:
        """Cancel the run at once if it executes in this process."""
        run = self._live.get((user_id, run_id))
        if run is None:
            return False
        run.cancel()
        return True

    async def aclose(self) -> None:
        """Cancel the runs still executing and wait for them to be stored, up to
        :data:`STOP_SECONDS` in all."""
        await _cancel_and_wait(list(self._runs), STOP_SECONDS)

    def _ended(self, run: RecordedRun) -> None:
        """Write the metrics of a run that has ended (one that failed before its first event
        is a request's error, not a run)."""
        if self.metrics is None or run._first is None:
            return
        try:
            self.metrics.run_ended(
                kind=run.kind,
                status=run.status if run.status in FINISHED else RunStatus.Canceled,
                duration_s=time.monotonic() - run._began,
                first_token_s=None if run._first_text is None else run._first_text - run._began,
                usage=run._usage,
            )
        except Exception:
            logger.exception("could not write the run's metrics")

    def _forget(self, run: RecordedRun) -> None:
        self._runs.discard(run)
        self._live.pop((run.user_id, run.run_id), None)


_recorders: weakref.WeakSet[RunRecorder] = weakref.WeakSet()


async def _cancel_and_wait(runs: list[RecordedRun], wait: float) -> None:
    """Cancel ``runs`` and wait, up to ``wait`` seconds in all, for them to be stored."""
    for run in runs:
        run.cancel()
    if runs:
        await asyncio.wait([asyncio.ensure_future(run.wait_stored()) for run in runs], timeout=wait)


async def stop_runs() -> None:
    """Cancel every run executing on this event loop (a server stopping, while their clients
    are still connected: each gets the run's ``canceled`` end) and wait for them to be
    stored, up to :data:`STOP_SECONDS` in all."""
    loop = asyncio.get_running_loop()
    runs = [
        run
        for recorder in list(_recorders)
        for run in recorder._runs
        if run._producer is not None and run._producer.get_loop() is loop
    ]
    await _cancel_and_wait(runs, STOP_SECONDS)


__all__ = [
    "FIRST_WRITE_DELAY",
    "STOP_SECONDS",
    "EventItem",
    "RecordedRun",
    "RunRecorder",
    "stop_runs",
    "write_last",
]
