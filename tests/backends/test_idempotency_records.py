"""The seed of a key's record, which its request's write ids derive from, on every backend:
kept while the record lives (a retry after a failure, or after its process stopped, writes
with the same ids, storing nothing twice), new once the record is made anew (the key expired,
or was erased with its session or its user: the request runs anew, its writes new ones)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentscope_serverless.services.idempotency import ClaimOutcome, StoredResponse
from tests.support.backends import BACKENDS, idempotency_store

ANSWER = StoredResponse(201, {}, b"{}")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_request_failing_frees_its_key_and_its_retry_keeps_the_seed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request) as records:
        first = await records.begin(user, "key-1", "request")
        assert first.outcome is ClaimOutcome.CLAIMED and first.seed
        await records.abandon(first)
        retry = await records.begin(user, "key-1", "request")
        assert retry.outcome is ClaimOutcome.CLAIMED
        assert retry.seed == first.seed and retry.token != first.token
        # The first request's late word changes nothing: the key is the retry's.
        await records.complete(first, ANSWER)
        assert (await records.begin(user, "key-1", "request")).outcome is ClaimOutcome.IN_PROGRESS
        await records.complete(retry, ANSWER)
        replay = await records.begin(user, "key-1", "request")
        assert replay.outcome is ClaimOutcome.REPLAY and replay.response == ANSWER
        # A key freed by a failure may be taken by another request.
        other = await records.begin(user, "key-2", "request")
        await records.abandon(other)
        taken = await records.begin(user, "key-2", "another request")
        assert taken.outcome is ClaimOutcome.CLAIMED


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_lease_that_lapsed_is_taken_over_with_the_seed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request, lease_seconds=0.2) as records:
        stopped = await records.begin(user, "key-1", "request")
        await asyncio.sleep(0.3)  # its process stopped: the lease lapsed
        assert (await records.begin(user, "key-1", "another")).outcome is ClaimOutcome.MISMATCH
        retry = await records.begin(user, "key-1", "request")
        assert retry.outcome is ClaimOutcome.CLAIMED and retry.seed == stopped.seed


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_record_made_anew_has_a_new_seed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request, expiry_seconds=1) as records:
        seeds = []
        for forget in ("the session", "the user", "expiry"):
            claim = await records.begin(user, "key-1", "request")
            assert claim.outcome is ClaimOutcome.CLAIMED, forget
            seeds.append(claim.seed)
            await records.complete(claim, ANSWER, "s1")
            if forget == "the session":
                await records.delete_session_records(user, "s1")
            elif forget == "the user":
                await records.delete_user_records(user)
            else:
                await asyncio.sleep(2.1)  # DynamoDB counts whole seconds
        last = await records.begin(user, "key-1", "request")
        assert last.outcome is ClaimOutcome.CLAIMED
        assert len({*seeds, last.seed}) == 4


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_key_released_then_expired_has_a_new_seed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request, expiry_seconds=1) as records:
        failed = await records.begin(user, "key-1", "request")
        await records.abandon(failed)
        await asyncio.sleep(2.1)
        later = await records.begin(user, "key-1", "request")
        assert later.outcome is ClaimOutcome.CLAIMED and later.seed != failed.seed


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_record_whose_request_still_runs_outlives_its_expiry(
    backend: str, request: pytest.FixtureRequest
) -> None:
    # Its lease renewed, the record still expired IDEMPOTENCY_EXPIRY_SECONDS after its
    # claim: a retry then ran the request a second time beside the first.
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request, expiry_seconds=1, lease_seconds=2) as records:
        running = await records.begin(user, "key-1", "request")
        for _ in range(8):  # 4 s: past its expiry, and past its first lease
            await asyncio.sleep(0.5)
            await records.renew(running)
        assert (await records.begin(user, "key-1", "request")).outcome is ClaimOutcome.IN_PROGRESS
        await records.delete_user_records(user)  # still listed for its user's erase
        assert (await records.begin(user, "key-1", "request")).outcome is ClaimOutcome.CLAIMED


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_replay_forgotten_frees_its_key_for_one_retry(
    backend: str, request: pytest.FixtureRequest
) -> None:
    # A replay names the session its request wrote in: gone, its record is forgotten and
    # the retry claims the key anew (one of two retries at once), a new request.
    user = f"u-{uuid.uuid4().hex}"
    async with idempotency_store(backend, request) as records:
        first = await records.begin(user, "key-1", "request")
        await records.complete(first, ANSWER, "s1")
        found = [await records.begin(user, "key-1", "request") for _ in range(2)]
        assert [claim.outcome for claim in found] == [ClaimOutcome.REPLAY] * 2
        assert {claim.session_id for claim in found} == {"s1"}
        for claim in found:
            await records.forget(claim)
        retries = [await records.begin(user, "key-1", "request") for _ in range(2)]
        assert [claim.outcome for claim in retries] == [
            ClaimOutcome.CLAIMED,
            ClaimOutcome.IN_PROGRESS,
        ]
        assert retries[0].seed != first.seed
        await records.complete(retries[0], ANSWER, "s1")
        # A late forget of the record found before changes nothing: the key is the retry's.
        await records.forget(found[0])
        assert (await records.begin(user, "key-1", "request")).outcome is ClaimOutcome.REPLAY
        await records.delete_session_records(user, "s1")
        assert (await records.begin(user, "key-1", "request")).outcome is ClaimOutcome.CLAIMED
