"""Runs in the process's memory: the embedded default for local runs and tests.

Followers in the same process are woken as soon as events are appended. The store keeps each
user's ``max_runs`` most recent runs, and ``max_total_runs`` in all, never dropping a run in
progress (a long-lived local server does not grow without bound, and one user's runs do not
push out another's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field

from agentscope_serverless.services._validation import (
    optional_positive_int,
    optional_ttl_seconds,
)
from agentscope_serverless.services.runs.base import (
    RunRecord,
    RunsService,
    StoredEvent,
    seen_in_progress,
)


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


# Runs an in-memory store keeps by default, of each user and in all: the oldest that have
# ended go first.
DEFAULT_MAX_RUNS = 1000
DEFAULT_MAX_TOTAL_RUNS = 10 * DEFAULT_MAX_RUNS


class InMemoryRunsService(RunsService):
    """Runs kept in a dict by user and run id; ``ttl_seconds`` drops runs idle that long.
    Beyond ``max_runs`` runs of a user, the user's oldest are dropped, and beyond
    ``max_total_runs`` in all, the oldest of the users holding the most; a run in progress
    is never dropped."""

    def __init__(
        self,
        ttl_seconds: int | None = None,
        max_runs: int = DEFAULT_MAX_RUNS,
        max_total_runs: int = DEFAULT_MAX_TOTAL_RUNS,
    ) -> None:
        self._ttl = optional_ttl_seconds(ttl_seconds)
        self._max_runs = optional_positive_int(max_runs, field="max_runs") or DEFAULT_MAX_RUNS
        self._max_total_runs = (
            optional_positive_int(max_total_runs, field="max_total_runs") or DEFAULT_MAX_TOTAL_RUNS
        )
        # By user, then by run id, each user's in the order they were created.
        self._runs: dict[str, dict[str, _Run]] = {}
        self._count = 0

    def _get(self, user_id: str, run_id: str) -> _Run | None:
        run = self._runs.get(user_id, {}).get(run_id)
        if run is not None and self._ttl and run.touched + self._ttl < time.time():
            self._pop(user_id, run_id)
            return None
        return run

    def _put(self, run: _Run) -> None:
        user_id, run_id = run.record.user_id, run.record.id
        mine = self._runs.setdefault(user_id, {})
        self._count += run_id not in mine
        mine[run_id] = run
        self._evict(user_id)

    def _pop(self, user_id: str, run_id: str) -> None:
        """Forget the run (its followers, woken, find it gone)."""
        mine = self._runs.get(user_id, {})
        run = mine.pop(run_id, None)
        if run is not None:
            self._count -= 1
            if not mine:
                del self._runs[user_id]
            self._wake(run)

    def _evict(self, user_id: str) -> None:
        """Drop the oldest runs that have ended of ``user_id`` beyond its bound, then of
        the users holding the most runs beyond the store's."""
        self._drop_oldest(user_id, len(self._runs.get(user_id, {})) - self._max_runs)
        excess = self._count - self._max_total_runs
        if excess <= 0:
            return
        for user in sorted(self._runs, key=lambda user: len(self._runs[user]), reverse=True):
            excess -= self._drop_oldest(user, excess)
            if excess <= 0:
                break

    def _drop_oldest(self, user_id: str, count: int) -> int:
        """Drop the ``count`` oldest runs of ``user_id`` that are not in progress; how many
        were."""
        mine = self._runs.get(user_id, {})
        if count <= 0 or not mine:
            return 0

        def run_of(run_id: str) -> RunRecord | None:
            run = mine.get(run_id)
            return None if run is None else run.record

        ended = (run_id for run_id, run in mine.items() if not seen_in_progress(run.record, run_of))
        dropped = list(itertools.islice(ended, count))
        for run_id in dropped:
            self._pop(user_id, run_id)
        return len(dropped)

    async def _create(self, record: RunRecord) -> None:
        self._put(_Run(record.model_copy()))

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
        self._put(_Run(record.model_copy(update={"cancel_requested": False}), list(events)))
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
            for run_id in list(self._runs.get(user_id, {}))
            if (record := await self._load(user_id, run_id)) is not None
            and record.created_at >= since
        ]

    async def _delete_user(self, user_id: str) -> None:
        for run_id in list(self._runs.get(user_id, {})):
            self._pop(user_id, run_id)

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        for run_id, run in list(self._runs.get(user_id, {}).items()):
            if run.record.session_id == session_id:
                self._pop(user_id, run_id)

    async def _delete_run_of(self, record: RunRecord) -> None:
        self._pop(record.user_id, record.id)

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


__all__ = ["DEFAULT_MAX_RUNS", "DEFAULT_MAX_TOTAL_RUNS", "InMemoryRunsService"]
