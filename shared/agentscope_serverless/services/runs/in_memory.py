"""Runs in the process's memory: the embedded default for local runs and tests.

Followers in the same process are woken as soon as events are appended. The store keeps each
user's ``max_runs`` most recent runs, and ``max_total_runs`` in all, never dropping a run in
progress (a long-lived local server does not grow without bound, and one user's runs do not
push out another's).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import time
from collections.abc import Iterable
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
    ``max_total_runs`` in all, the oldest of all (a user holds ``max_runs`` at most, so
    no one's runs fill the store); a run in progress is never dropped."""

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
        # By user, then by run id, each user's in the order they were created; and every
        # run's (user, run id), in that order too.
        self._runs: dict[str, dict[str, _Run]] = {}
        self._order: dict[tuple[str, str], None] = {}

    def _get(self, user_id: str, run_id: str) -> _Run | None:
        run = self._runs.get(user_id, {}).get(run_id)
        if run is not None and self._ttl and run.touched + self._ttl < time.time():
            self._pop(user_id, run_id)
            return None
        return run

    def _put(self, run: _Run) -> None:
        user_id, run_id = run.record.user_id, run.record.id
        self._runs.setdefault(user_id, {})[run_id] = run
        self._order[(user_id, run_id)] = None
        self._evict(user_id)

    def _pop(self, user_id: str, run_id: str) -> None:
        """Forget the run (its followers, woken, find it gone)."""
        mine = self._runs.get(user_id, {})
        run = mine.pop(run_id, None)
        if run is not None:
            del self._order[(user_id, run_id)]
            if not mine:
                del self._runs[user_id]
            self._wake(run)

    def _evict(self, user_id: str) -> None:
        """Drop the oldest runs that have ended: of ``user_id`` beyond its bound, then of all
        beyond the store's."""
        mine = self._runs.get(user_id, {})
        self._drop_oldest(((user_id, run_id) for run_id in mine), len(mine) - self._max_runs)
        self._drop_oldest(self._order, len(self._order) - self._max_total_runs)

    def _drop_oldest(self, oldest_first: Iterable[tuple[str, str]], count: int) -> None:
        """Drop the first ``count`` runs of ``oldest_first`` that are not in progress."""
        if count <= 0:
            return
        ended = (key for key in oldest_first if not self._running(*key))
        for user_id, run_id in list(itertools.islice(ended, count)):
            self._pop(user_id, run_id)

    def _running(self, user_id: str, run_id: str) -> bool:
        mine = self._runs[user_id]

        def run_of(other_id: str) -> RunRecord | None:
            other = mine.get(other_id)
            return None if other is None else other.record

        return seen_in_progress(mine[run_id].record, run_of)

    async def _create(self, record: RunRecord) -> None:
        self._put(_Run(record.model_copy()))

    async def _save(self, record: RunRecord) -> None:
        run = self._get(record.user_id, record.id)
        if record.submission is not None and run is not None:
            run = run if run.record.submission == record.submission else None
        if run is not None:
            run.record = record.model_copy(update={"cancel_requested": False})
            run.touched = time.time()
            self._wake(run)

    async def _append(self, user_id: str, run_id: str, events: list[StoredEvent]) -> None:
        run = self._get(user_id, run_id)
        if run is None:
            return
        # Kept in order of their sequence numbers, each once (see _read).
        last = run.events[-1][0] if run.events else -1
        for event in events:
            if event[0] > last:
                run.events.append(event)
                last = event[0]
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
        # In order (see _append): found by bisection, not by going through the run's
        # events, which a follower of a long run reads after each of its writes.
        start = bisect.bisect_right(run.events, after, key=lambda event: event[0])
        return run.events[start : None if limit is None else start + limit]

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
