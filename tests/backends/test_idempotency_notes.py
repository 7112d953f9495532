"""The server's notes among a user's idempotency records (``keep``/``take``), on every
backend: taken once, gone with the user's records, gone when expired."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.backends import BACKENDS, idempotency_store


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_note_is_taken_once_by_its_user_and_replaced_by_a_new_one(
    backend: str, request: pytest.FixtureRequest
) -> None:
    user, other = f"u-{uuid.uuid4().hex}", f"v-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request) as records:
        await records.keep(user, "conversation a", "first")
        await records.keep(user, "conversation a", "second")
        assert await records.take(other, "conversation a") is None
        takers = await asyncio.gather(*(records.take(user, "conversation a") for _ in range(4)))
        assert sorted(takers, key=str) == [None, None, None, "second"]
        assert await records.take(user, "conversation a") is None
        # A key claimed by a request is no note: taking it leaves the claim.
        claim = await records.begin(user, "key-1", "fingerprint")
        assert await records.take(user, "key-1") is None
        again = await records.begin(user, "key-1", "fingerprint")
        assert (claim.outcome.value, again.outcome.value) == ("claimed", "in_progress")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_notes_go_with_the_users_records_and_when_they_expire(
    backend: str, request: pytest.FixtureRequest
) -> None:
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request, expiry_seconds=1) as records:
        await records.keep(user, "conversation a", "session-a")
        await records.keep(user, "conversation b", "session-b")
        await records.delete_user_records(user)
        assert await records.take(user, "conversation a") is None
        await records.keep(user, "conversation c", "session-c")
        await asyncio.sleep(2.1)  # DynamoDB counts whole seconds
        assert await records.take(user, "conversation c") is None
