"""Runs in the process's memory: the embedded default for local runs and tests.

Followers in the same process are woken as soon as events are appended. The store keeps the
``max_runs`` most recent runs (a long-lived local server does not grow without bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from agentscope_serverless.services._validation import (
    optional_positive_int,
    optional_ttl_seconds,
)
from agentscope_serverless.services.runs.base import RunRecord, RunsService, StoredEvent


@dataclass(slots=True)
class _Run:
    record: RunRecord
    events: list[StoredEvent] = field(default_factory=list)
    cancel: bool = False
    # When it was last written (its expiry slides from there, as in the other stores: the
    # record's updated_at is what the record says).
    touched: float = field(default_factory=time.time)
    # Set when the run changes, made by the first follower waiting for that.
    changed: asyncio.Event | None = None


# Runs an in-memory store keeps by default: the oldest go first.
DEFAULT_MAX_RUNS = 1000


class InMemoryRunsService(RunsService):
    """Runs kept in a dict by user and run id; ``ttl_seconds`` drops runs idle that long,
    and beyond ``max_runs`` runs the oldest are dropped."""

    def __init__(self, ttl_seconds: int | None = None, max_runs: int = DEFAULT_MAX_RUNS) -> None:
        self._ttl = optional_ttl_seconds(ttl_seconds)
        self._max_runs = optional_positive_int(max_runs, field="max_runs") or DEFAULT_MAX_RUNS
        self._runs: dict[tuple[str, str], _Run] = {}

    def _get(self, user_id: str, run_id: str) -> _Run | None:
        run = self._runs.get((user_id, run_id))
        if run is not None and self._ttl and run.touched + self._ttl < time.time():
            del self._runs[(user_id, run_id)]
            return None
        return run

    async def _create(self, record: RunRecord) -> None:
        self._runs[(record.user_id, record.id)] = _Run(record.model_copy())
        self._evict()

    def _evict(self) -> None:
        while len(self._runs) > self._max_runs:
            del self._runs[next(iter(self._runs))]

    async def _save(self, record: RunRecord) -> None:
        run = self._get(record.user_id, record.id)
        if run is not None:
            run.record = record.model_copy(update={"cancel_requested": False})
            run.touched = time.time()
            self._wake(run)

    async def _append(self, user_id: str, run_id: str, events: list[StoredEvent]) -> None:
        run = self._get(user_id, run_id)
        if run is None:
            return
        last = run.events[-1][0] if run.events else -1
        run.events.extend(event for event in events if event[0] > last)
        run.touched = time.time()
        self._wake(run)

    async def _record(
        self, record: RunRecord, events: list[StoredEvent], create: bool, finish: bool
    ) -> bool | None:
        if not (create and finish):
            await super()._record(record, events, create, finish)
            run = self._get(record.user_id, record.id)
            return run is not None and run.cancel
        # A run stored whole: its record copied once, its events as they are.
        self._runs[(record.user_id, record.id)] = _Run(
            record.model_copy(update={"cancel_requested": False}), list(events)
        )
        self._evict()
        return False

    async def _mark_cancel(self, user_id: str, run_id: str) -> None:
        run = self._get(user_id, run_id)
        if run is not None:
            run.cancel = True

    async def _load(self, user_id: str, run_id: str) -> RunRecord | None:
        run = self._get(user_id, run_id)
        if run is None:
            return None
        return run.record.model_copy(update={"cancel_requested": run.cancel})

    async def _list(self, user_id: str, session_id: str) -> list[RunRecord]:
        return [r for r in await self._list_user(user_id, 0.0) if r.session_id == session_id]

    async def _list_user(self, user_id: str, since: float) -> list[RunRecord]:
        return [
            record
            for (user, run_id) in list(self._runs)
            if user == user_id
            and (record := await self._load(user_id, run_id)) is not None
            and record.created_at >= since
        ]

    async def _delete_user(self, user_id: str) -> None:
        for key in [key for key in self._runs if key[0] == user_id]:
            self._wake(self._runs.pop(key))

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        for key, run in list(self._runs.items()):
            if key[0] == user_id and run.record.session_id == session_id:
                self._wake(self._runs.pop(key))

    async def _delete_run_of(self, record: RunRecord) -> None:
        run = self._runs.pop((record.user_id, record.id), None)
        if run is not None:
            self._wake(run)

    async def _read(
        self, user_id: str, run_id: str, after: int, limit: int | None
    ) -> list[StoredEvent]:
        run = self._get(user_id, run_id)
        if run is None:
            return []
        events = [event for event in run.events if event[0] > after]
        return events[:limit] if limit is not None else events

    async def _wait(self, user_id: str, run_id: str, after: int) -> None:
        run = self._get(user_id, run_id)
        if run is None:
            return
        if run.changed is None:
            run.changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.changed.wait(), self.poll_seconds)

    @staticmethod
    def _wake(run: _Run) -> None:
        if run.changed is not None:
            run.changed.set()
            run.changed = None


__all__ = ["DEFAULT_MAX_RUNS", "InMemoryRunsService"]
