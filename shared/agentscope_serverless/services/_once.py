"""Writes that land once: the identity of a write retried with its ``Idempotency-Key``.

While a request with an ``Idempotency-Key`` is served, each write that is not idempotent
by itself (a state save that allocates the next round, a memory add) takes the next *write
id*, derived from the user, the key, the request (its fingerprint: the key reused for
another request after it expired is another write) and the write's order in the request.
A store keeps
the ids it applied, in the same atomic step as the data, so a run of the request after
one whose store froze or failed mid-write (the write landed later, or its answer was lost)
stores nothing twice. Ids made for new sessions derive from the key the same way.

Callers without a key get ``None`` (and fresh uuids): their writes are unchanged.

>>> seed_writes("u1\\0key-1"); first = next_write_id()
>>> seed_writes("u1\\0key-1"); next_write_id() == first
True
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import uuid

# How long a store remembers an applied write id (the idempotency record's default life:
# a key reused after that is a new request).
WRITE_ID_SECONDS = 24 * 3600

_SEED: contextvars.ContextVar[tuple[str, itertools.count[int]] | None] = contextvars.ContextVar(
    "write_id_seed", default=None
)


def seed_writes(seed: str) -> None:
    """Derive the write ids (and new ids) made from now on in this context from ``seed``."""
    digest = hashlib.sha256(seed.encode("utf-8", "surrogateescape")).hexdigest()
    _SEED.set((digest, itertools.count()))


def next_write_id() -> str | None:
    """The id of the next write of this request, or None when it has no idempotency key."""
    seeded = _SEED.get()
    if seeded is None:
        return None
    base, counter = seeded
    return hashlib.sha256(f"{base}\0{next(counter)}".encode()).hexdigest()[:32]


def new_uuid() -> str:
    """A fresh uuid, or one derived from the request's key (the same on a retry)."""
    write_id = next_write_id()
    if write_id is None:
        return str(uuid.uuid4())
    return str(uuid.uuid5(uuid.NAMESPACE_URL, write_id))


__all__ = ["WRITE_ID_SECONDS", "new_uuid", "next_write_id", "seed_writes"]
