"""Recording runs: a run's events go to the runs store as they are produced, and the run
goes on when its client leaves.

:meth:`RunRecorder.start` takes the event stream of a run (``Runner.stream_query``) and
drives it in a task of its own, so the run is independent of the request that started it:

- every event is handed to the live listener (the HTTP response) and written to the runs
  store behind it, in batches, by a writer task (one write in flight at a time, so the
  stream never waits for the store);
- a watcher polls the store's cancellation mark (every ``poll_seconds``) and cancels the
  run's task with :data:`~agentscope_serverless.runner.RUN_CANCELED`: the handler's task
  is cancelled (its ``finally`` blocks run), the runner keeps the partial reply in the
  session history and ends the stream with a ``canceled`` response; nothing is stored
  after it;
- when the listener goes away (the client disconnected) the run goes on, stored and
  resumable, unless it was started with ``cancel_on_disconnect``.

The run's id is the ``id`` of its first event (the ``response`` event).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from agentscope_serverless.log import logger
from agentscope_serverless.runner import RUN_CANCELED
from agentscope_serverless.schemas.agent_schemas import AgentResponse, Event, RunStatus
from agentscope_serverless.services.runs.base import FINISHED, RunKind, RunRecord, RunsService

_END = object()


class RecordedRun:
    """One run executing in this process, recorded in the runs store."""

    def __init__(
        self,
        recorder: RunRecorder,
        events: AsyncGenerator[Event, None],
        *,
        user_id: str,
        kind: RunKind,
        cancel_on_disconnect: bool,
    ) -> None:
        self._recorder = recorder
        self._runs = recorder.runs
        self._source = events
        self.user_id = user_id
        self.kind: RunKind = kind
        self.cancel_on_disconnect = cancel_on_disconnect
        self.run_id = ""
        self.session_id: str | None = None
        self.status: str = RunStatus.InProgress
        self._queue: asyncio.Queue[Any] | None = asyncio.Queue()
        self._pending: list[tuple[int, str]] = []
        self._wrote = asyncio.Event()
        self._produced = False
        self._first: AgentResponse | None = None
        self._last_sequence = -1
        self._producer: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    # --- the run's task -----------------------------------------------------------------

    async def _produce(self) -> None:
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
            # Cancelled outside the agent (while loading or saving the session): end the
            # stream here. Any other cancellation (the server stopping) also ends it.
            if self._first is not None and not self._ended():
                ending = {"output": None, "sequence_number": self._last_sequence + 1}
                self._emit(self._first.model_copy(update=ending).canceled())
            elif self._first is None:
                self._put(exc)
            if exc.args != (RUN_CANCELED,):
                raise
        except Exception as exc:
            if self._first is None:
                self._put(exc)
            else:
                logger.exception("the run failed", extra={"run_id": self.run_id})
                self.status = RunStatus.Failed
        finally:
            self._produced = True
            self._wrote.set()
            self._put(_END)

    def _ended(self) -> bool:
        return self.status in FINISHED

    def _emit(self, event: Event) -> None:
        if self._first is None and isinstance(event, AgentResponse):
            self._first = event.model_copy()
            self.run_id = event.id or ""
            self.session_id = event.session_id
            self._writer = asyncio.create_task(self._write())
        if event.sequence_number is None:
            event.sequence_number = self._last_sequence + 1
        self._last_sequence = event.sequence_number
        if isinstance(event, AgentResponse) and event.status in FINISHED:
            self.status = event.status
        data = event.model_dump_json()
        self._pending.append((event.sequence_number, data))
        self._wrote.set()
        self._put((event, data))

    def _put(self, item: Any) -> None:
        if self._queue is not None:
            self._queue.put_nowait(item)

    async def _write(self) -> None:
        """Write the pending events in batches, then the run's final status."""
        created = False
        try:
            while True:
                await self._wrote.wait()
                self._wrote.clear()
                batch, self._pending = self._pending, []
                if not created:
                    await self._runs.create_run(
                        RunRecord(
                            id=self.run_id,
                            user_id=self.user_id,
                            session_id=self.session_id,
                            kind=self.kind,
                        )
                    )
                    created = True
                    self._watcher = asyncio.create_task(self._watch())
                await self._runs.append_events(self.user_id, self.run_id, batch)
                if self._produced and not self._pending:
                    break
            status = self.status if self._ended() else RunStatus.Failed
            await self._runs.finish_run(self.user_id, self.run_id, status)
        except Exception:
            logger.exception("could not store the run", extra={"run_id": self.run_id})
        finally:
            if self._watcher is not None:
                self._watcher.cancel()
            self._recorder._forget(self)

    async def _watch(self) -> None:
        """Cancel the run when its cancellation is requested in the store."""
        while not self._produced:
            await asyncio.sleep(self._runs.poll_seconds)
            try:
                requested = await self._runs.cancel_requested(self.user_id, self.run_id)
            except Exception:
                logger.exception("could not read the run's cancellation mark")
                continue
            if requested:
                self.cancel()
                return

    # --- for the request ----------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the run (a no-op once it has ended)."""
        if self._producer is not None and not self._producer.done():
            self._producer.cancel(RUN_CANCELED)

    async def _begin(self) -> None:
        self._producer = asyncio.create_task(self._produce())
        first = await self._next()
        if isinstance(first, BaseException):
            raise first
        assert first is not _END, "the run ended before its first event"
        self._head = first

    async def _next(self) -> Any:
        assert self._queue is not None
        return await self._queue.get()

    async def items(self) -> AsyncGenerator[tuple[Event, str], None]:
        """``(event, its JSON)`` as produced; leaving early detaches (or cancels) the run."""
        try:
            item = self._head
            while item is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
                item = await self._next()
            # The stream ends once the run is stored: a reader who saw the last event finds
            # the run finished, and on Lambda nothing is left to do when the response ends.
            await self.wait_stored()
        finally:
            self._queue = None
            if self.cancel_on_disconnect and not self._produced:
                self.cancel()

    async def events(self) -> AsyncGenerator[Event, None]:
        """The run's events as produced."""
        async with contextlib.aclosing(self.items()) as items:
            async for event, _ in items:
                yield event

    async def final(self) -> AgentResponse:
        """Wait for the end of the run and return its last response event."""
        last: Event | None = None
        async with contextlib.aclosing(self.items()) as items:
            async for event, _ in items:
                last = event
        assert isinstance(last, AgentResponse)
        return last

    async def wait_stored(self) -> None:
        """Wait until the run's events and status are stored."""
        if self._writer is not None:
            await asyncio.shield(self._writer)


class RunRecorder:
    """Starts recorded runs and keeps track of those executing in this process."""

    def __init__(self, runs: RunsService) -> None:
        self.runs = runs
        self._live: dict[tuple[str, str], RecordedRun] = {}
        self._runs: set[RecordedRun] = set()

    async def start(
        self,
        events: AsyncGenerator[Event, None],
        *,
        user_id: str,
        kind: RunKind = "process",
        cancel_on_disconnect: bool = False,
    ) -> RecordedRun:
        """Start driving ``events`` as a recorded run; returns once its first event is out.

        An error before the first event (the session could not be loaded...) is raised here.
        """
        run = RecordedRun(
            self, events, user_id=user_id, kind=kind, cancel_on_disconnect=cancel_on_disconnect
        )
        self._runs.add(run)
        try:
            await run._begin()
        except BaseException:
            self._runs.discard(run)
            raise
        self._live[(user_id, run.run_id)] = run
        return run

    def cancel_local(self, user_id: str, run_id: str) -> bool:
        """Cancel the run at once if it executes in this process."""
        run = self._live.get((user_id, run_id))
        if run is None:
            return False
        run.cancel()
        return True

    async def aclose(self) -> None:
        """Cancel the runs still executing and wait for them to be stored."""
        runs = list(self._runs)
        for run in runs:
            run.cancel()
        for run in runs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run.wait_stored(), 5)

    def _forget(self, run: RecordedRun) -> None:
        self._runs.discard(run)
        self._live.pop((run.user_id, run.run_id), None)


__all__ = ["RecordedRun", "RunRecorder"]
