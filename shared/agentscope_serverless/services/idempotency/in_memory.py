"""Idempotency records in the process's memory (with the in-memory services)."""

from __future__ import annotations

import time
from dataclasses import replace

from agentscope_serverless.services.idempotency.base import (
    COMPLETED,
    IN_PROGRESS,
    KEPT,
    RELEASED,
    IdempotencyRecord,
    IdempotencyStore,
    now_ms,
)


class InMemoryIdempotencyStore(IdempotencyStore):
    """Records in a dict; every operation runs without awaiting, so it is atomic.

    >>> records = InMemoryIdempotencyStore(expiry_seconds=3600)
    """

    def __init__(self, expiry_seconds: int = 24 * 3600, lease_seconds: float = 60.0) -> None:
        super().__init__(expiry_seconds, lease_seconds)
        self._records: dict[tuple[str, str], tuple[float, IdempotencyRecord]] = {}

    def _live(self, user_id: str, key: str) -> IdempotencyRecord | None:
        entry = self._records.get((user_id, key))
        if entry is None or entry[0] <= time.monotonic():
            self._records.pop((user_id, key), None)
            return None
        return entry[1]

    async def _claim(self, user_id: str, key: str, record: IdempotencyRecord) -> IdempotencyRecord:
        existing = self._live(user_id, key)
        if existing is not None:
            lapsed = (
                existing.state == IN_PROGRESS
                and existing.lease_until_ms < now_ms()
                and existing.fingerprint == record.fingerprint
            )
            if not (lapsed or existing.state == RELEASED):
                return existing
            record = replace(record, seed=existing.seed or record.seed)
        self._records[(user_id, key)] = (time.monotonic() + self.held_seconds, record)
        return record

    async def _renew(self, user_id: str, key: str, token: str, lease_until_ms: int) -> None:
        existing = self._live(user_id, key)
        if (
            existing is not None
            and existing.token == token
            and existing.state == IN_PROGRESS
            and existing.lease_until_ms < lease_until_ms
        ):
            renewed = replace(existing, lease_until_ms=lease_until_ms)
            self._records[(user_id, key)] = (time.monotonic() + self.held_seconds, renewed)

    async def _complete(
        self, user_id: str, key: str, token: str, response: str, session_id: str | None
    ) -> None:
        existing = self._live(user_id, key)
        if existing is not None and existing.token == token:
            done = IdempotencyRecord(
                existing.fingerprint, COMPLETED, 0, token, response, session_id
            )
            self._records[(user_id, key)] = (time.monotonic() + self.expiry_seconds, done)

    async def _abandon(self, user_id: str, key: str, token: str) -> None:
        existing = self._live(user_id, key)
        if existing is not None and existing.token == token:
            released = IdempotencyRecord(existing.fingerprint, RELEASED, 0, "", seed=existing.seed)
            self._records[(user_id, key)] = (time.monotonic() + self.expiry_seconds, released)

    async def _forget(self, user_id: str, key: str, token: str, session_id: str | None) -> None:
        existing = self._live(user_id, key)
        if existing is not None and existing.state == COMPLETED and existing.token == token:
            del self._records[(user_id, key)]

    async def _delete_user(self, user_id: str) -> None:
        for user_and_key in [entry for entry in self._records if entry[0] == user_id]:
            del self._records[user_and_key]

    async def _keep(self, user_id: str, key: str, value: str) -> None:
        kept = IdempotencyRecord("", KEPT, 0, "", value)
        self._records[(user_id, key)] = (time.monotonic() + self.expiry_seconds, kept)

    async def _take(self, user_id: str, key: str) -> str | None:
        existing = self._live(user_id, key)
        if existing is None or existing.state != KEPT:
            return None
        del self._records[(user_id, key)]
        return existing.response

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        for (owner, key), (_, record) in list(self._records.items()):
            if owner == user_id and record.session_id == session_id:
                del self._records[(owner, key)]


__all__ = ["InMemoryIdempotencyStore"]
