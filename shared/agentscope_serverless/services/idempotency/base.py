"""Idempotency records: the interface, and the logic every backend shares.

A write sent with an ``Idempotency-Key`` first *claims* the key with a record holding the
request's fingerprint and an in-progress lease. The record then either *completes* (it
keeps the response, which later requests with the same key and fingerprint get back
without writing again) or is *abandoned* (released: a retry, or another request with the
key, runs anew).

A record also holds the *seed* of its request's writes (see
:mod:`agentscope_serverless.services._once`): made when the key is claimed with no live
record, and kept while the record lives, through a release and a lapsed lease taken over,
so a run again after one whose write landed unseen stores nothing twice. A record made
anew (the key expired, or its record was erased with its session or its user) makes a new
seed: its request runs anew, and its writes are new ones.

The record model follows Powertools' idempotency utility (``INPROGRESS``/``COMPLETED``,
an expiry, an in-progress expiry, a payload hash), on our async stores: a request that
finds an in-progress record whose lease ran out (its process died, or its store call
timed out) takes the key over; one that finds another fingerprint is refused. A request
running longer than its lease renews it (:meth:`IdempotencyStore.renew`), so a retry never
runs it a second time while it still runs.

>>> async def demo(records: IdempotencyStore) -> None:
...     claim = await records.begin("u1", "key-1", "sha256-of-request")
...     assert claim.outcome is ClaimOutcome.CLAIMED
...     answer = StoredResponse(201, {"content-type": "application/json"}, b"{}")
...     await records.complete(claim, answer)
"""

from __future__ import annotations

import base64
import enum
import json
import math
import secrets
import time
from abc import abstractmethod
from dataclasses import dataclass, field

from agentscope_serverless.services._validation import require_user_id
from agentscope_serverless.services.base import (
    ServiceWithLifecycleManager,
    StartedGuard,
    service_call,
)

IN_PROGRESS = "in_progress"
COMPLETED = "completed"
KEPT = "kept"  # a note of the server's own (see IdempotencyStore.keep)
RELEASED = "released"  # abandoned: free for any request, keeping its seed
DEFAULT_EXPIRY_SECONDS = 24 * 3600
DEFAULT_LEASE_SECONDS = 60.0
# Responses larger than this are not kept (a DynamoDB item holds 400 KB): a replay of
# such a request is refused instead of running it again.
MAX_STORED_RESPONSE_BYTES = 256_000


@dataclass(frozen=True)
class StoredResponse:
    """A response as kept for replay: status, the headers worth replaying, the body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def to_json(self) -> str:
        return json.dumps(
            {
                "status": self.status,
                "headers": self.headers,
                "body": base64.b64encode(self.body).decode(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> StoredResponse:
        data = json.loads(text)
        return cls(int(data["status"]), dict(data["headers"]), base64.b64decode(data["body"]))


@dataclass(frozen=True)
class IdempotencyRecord:
    """A stored record (``response`` is the JSON of a :class:`StoredResponse` once completed;
    ``token`` names the request holding it in progress, or that completed it; ``session_id``,
    the session a completed one wrote in; ``seed``, the seed of its writes)."""

    fingerprint: str
    state: str
    lease_until_ms: int
    token: str
    response: str | None = None
    session_id: str | None = None
    seed: str = ""


class ClaimOutcome(enum.Enum):
    CLAIMED = "claimed"  # this request runs the write
    REPLAY = "replay"  # completed before: answer with the stored response
    IN_PROGRESS = "in_progress"  # another request with this key is running
    MISMATCH = "mismatch"  # the key was used for another request


@dataclass(frozen=True)
class Claim:
    """The outcome of :meth:`IdempotencyStore.begin`, and what the request needs to finish
    (``seed``: the seed of its writes, see :class:`IdempotencyRecord`). A replay names the
    record it found (``token``) and the session its request wrote in (``session_id``)."""

    outcome: ClaimOutcome
    user_id: str
    key: str
    fingerprint: str
    token: str = ""
    response: StoredResponse | None = field(default=None)
    seed: str = ""
    session_id: str | None = None


def now_ms() -> int:
    return int(time.time() * 1000)


class IdempotencyStore(StartedGuard, ServiceWithLifecycleManager):
    """Idempotency records per user and key, in the same store as the user's data.

    ``expiry_seconds``: how long a key is remembered after its first use;
    ``lease_seconds``: how long an in-progress record holds the key before a retry may
    take it over.
    """

    def __init__(
        self,
        expiry_seconds: int = DEFAULT_EXPIRY_SECONDS,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self.expiry_seconds = expiry_seconds
        self.lease_seconds = lease_seconds

    @property
    def held_seconds(self) -> int:
        """How long a record in progress is kept from its claim or its lease's last renewal:
        its expiry, or its lease when longer. A record expiring while its request still ran
        let a retry run the request a second time beside it."""
        return max(self.expiry_seconds, math.ceil(self.lease_seconds))

    @service_call
    async def begin(self, user_id: str, key: str, fingerprint: str) -> Claim:
        """Claim ``key`` for a request with ``fingerprint``, or say why it cannot run."""
        user_id = require_user_id(user_id)
        token = secrets.token_hex(8)
        lease_until = now_ms() + int(self.lease_seconds * 1000)
        record = IdempotencyRecord(
            fingerprint, IN_PROGRESS, lease_until, token, seed=secrets.token_hex(16)
        )
        existing = await self._claim(user_id, key, record)
        if existing.token == token:
            return Claim(ClaimOutcome.CLAIMED, user_id, key, fingerprint, token, seed=existing.seed)
        if existing.fingerprint != fingerprint:
            return Claim(ClaimOutcome.MISMATCH, user_id, key, fingerprint)
        if existing.state == COMPLETED and existing.response is not None:
            response = StoredResponse.from_json(existing.response)
            return Claim(
                ClaimOutcome.REPLAY,
                user_id,
                key,
                fingerprint,
                existing.token,
                response,
                session_id=existing.session_id,
            )
        return Claim(ClaimOutcome.IN_PROGRESS, user_id, key, fingerprint)

    @service_call
    async def renew(self, claim: Claim) -> None:
        """Extend the claim's lease to ``lease_seconds`` from now, while it still holds the
        key in progress: the request is still running. A lease is never shortened, so a
        renewal that reaches the store late (after a later one, or after the lease ran out
        and the key was taken over) changes nothing."""
        lease_until = now_ms() + int(self.lease_seconds * 1000)
        await self._renew(claim.user_id, claim.key, claim.token, lease_until)

    @service_call
    async def complete(
        self, claim: Claim, response: StoredResponse, session_id: str | None = None
    ) -> None:
        """Keep ``response`` as the answer to every later request with the claim's key;
        ``session_id`` is the session the request wrote in, whose deletion forgets it."""
        await self._complete(claim.user_id, claim.key, claim.token, response.to_json(), session_id)

    @service_call
    async def abandon(self, claim: Claim) -> None:
        """Release the claim (the request failed): a retry runs the write again (with the
        claim's seed), and another request may take the key."""
        await self._abandon(claim.user_id, claim.key, claim.token)

    @service_call
    async def forget(self, claim: Claim) -> None:
        """Delete the completed record a :data:`ClaimOutcome.REPLAY` ``claim`` found, if the
        key still holds that one (its session is gone: its answer would tell a retry that
        what it wrote is stored). The next :meth:`begin` with the key then claims it anew;
        of retries forgetting it at once, one claims it."""
        if claim.outcome is ClaimOutcome.REPLAY and claim.token:
            await self._forget(claim.user_id, claim.key, claim.token, claim.session_id)

    @service_call
    async def delete_user_records(self, user_id: str) -> None:
        """Forget every record of ``user_id`` (erasing the user's data: a completed record
        keeps its response, which may quote it). A request of theirs still in progress
        finishes unrecorded, so a retry of it runs again."""
        await self._delete_user(require_user_id(user_id))

    @service_call
    async def keep(self, user_id: str, key: str, value: str) -> None:
        """Keep ``value`` under ``key`` among the user's records, for as long as a record
        lasts, replacing what the key held: a note of the server's own, erased with the
        user's records. Its keys must be ones no client sends as an ``Idempotency-Key``
        (those are visible ASCII: a key holding a space is the server's)."""
        await self._keep(require_user_id(user_id), key, value)

    @service_call
    async def take(self, user_id: str, key: str) -> str | None:
        """The value kept under ``key`` (None when there is none, or it expired), removed as
        it is read: of callers taking one key at once, one gets it."""
        return await self._take(require_user_id(user_id), key)

    @service_call
    async def delete_session_records(self, user_id: str, session_id: str) -> None:
        """Forget the records of the requests that wrote in ``session_id`` (deleting the
        session: a kept answer quotes it, and would answer a retry as if it still were)."""
        await self._delete_session(require_user_id(user_id), session_id)

    @abstractmethod
    async def _claim(self, user_id: str, key: str, record: IdempotencyRecord) -> IdempotencyRecord:
        """Atomically store ``record`` unless a live record holds the key; return the record
        holding the key then: ``record`` as stored, or the live one (whose token differs).

        The key is free when there is no record, it has expired, it was released, or it is
        in progress with a lease that ran out and the same fingerprint. ``record`` taking
        over a live record (released, or a lapsed lease) keeps that one's seed.
        """

    @abstractmethod
    async def _renew(self, user_id: str, key: str, token: str, lease_until_ms: int) -> None:
        """Raise the record's lease to ``lease_until_ms``, if it still holds ``token``, is in
        progress, and its lease ends before that."""

    @abstractmethod
    async def _complete(
        self, user_id: str, key: str, token: str, response: str, session_id: str | None
    ) -> None:
        """Mark the record completed with ``response``, if it still holds ``token``, and
        list it under ``session_id`` when given."""

    @abstractmethod
    async def _abandon(self, user_id: str, key: str, token: str) -> None:
        """Mark the record :data:`RELEASED` (keeping its fingerprint and seed, with no token),
        expiring ``expiry_seconds`` from now, if it still holds ``token``."""

    @abstractmethod
    async def _forget(self, user_id: str, key: str, token: str, session_id: str | None) -> None:
        """Delete the record if it is completed and still holds ``token`` (and its listing
        under ``session_id``, when given)."""

    @abstractmethod
    async def _delete_user(self, user_id: str) -> None:
        """Delete every record of the user."""

    @abstractmethod
    async def _keep(self, user_id: str, key: str, value: str) -> None:
        """Store a record of state ``KEPT`` holding ``value`` as its response."""

    @abstractmethod
    async def _take(self, user_id: str, key: str) -> str | None:
        """Atomically delete the live ``KEPT`` record of the key and return its value."""

    @abstractmethod
    async def _delete_session(self, user_id: str, session_id: str) -> None:
        """Delete the records listed under the user's ``session_id``."""


__all__ = [
    "COMPLETED",
    "DEFAULT_EXPIRY_SECONDS",
    "DEFAULT_LEASE_SECONDS",
    "IN_PROGRESS",
    "KEPT",
    "MAX_STORED_RESPONSE_BYTES",
    "RELEASED",
    "Claim",
    "ClaimOutcome",
    "IdempotencyRecord",
    "IdempotencyStore",
    "StoredResponse",
    "now_ms",
]
