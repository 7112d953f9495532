"""Idempotency records for retried writes (``Idempotency-Key``): the interface and backends.

Backends are imported by :func:`agentscope_serverless.services.factory.create_idempotency_store`
only, like the services' backends.
"""

from agentscope_serverless.services.idempotency.base import (
    Claim,
    ClaimOutcome,
    IdempotencyRecord,
    IdempotencyStore,
    StoredResponse,
)
from agentscope_serverless.services.idempotency.in_memory import InMemoryIdempotencyStore

__all__ = [
    "Claim",
    "ClaimOutcome",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InMemoryIdempotencyStore",
    "StoredResponse",
]
