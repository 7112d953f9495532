"""Writes that land once: the identity of a write retried with its ``Idempotency-Key``.

While a request with an ``Idempotency-Key`` is served, each write that is not idempotent
by itself (a state save that allocates the next round, a memory add) takes the next *write
id*, derived from the user, the key, the request (its fingerprint: the key reused for
another request is another write), the seed of the key's idempotency record and the
write's order in the request. A store keeps the ids it applied, in the same atomic step as
the data, so a run of the request after one whose store froze or failed mid-write (the
write landed later, or its answer was lost) stores nothing twice. The record keeps its seed
while it lives, through the failures that free the key for a retry; a record made anew (the
key expired, or was erased with its session or its user) has a new one, so the request
then runs anew: its writes are new ones, and a save takes the next round.

Ids made for new sessions and tasks derive from the user, the key and the request alone,
as message ids do: the same request names the same session whenever it runs.

Callers without a key get ``None`` (and fresh uuids): their writes are unchanged.

>>> seed_writes("u1\\0key-1", "record-1"); first = next_write_id()
>>> seed_writes("u1\\0key-1", "record-1"); next_write_id() == first
True
>>> seed_writes("u1\\0key-1", "record-2"); next_write_id() == first
False
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import uuid
from typing import NamedTuple

# How long a store remembers an applied write id: at least the life of an idempotency
# record (24 hours by default), after which its seed is gone and no write takes the id.
WRITE_ID_SECONDS = 24 * 3600


class _Seeds(NamedTuple):
    request: str  # what new ids derive from
    record: str  # what write ids derive from
    order: itertools.count[int]


_SEED: contextvars.ContextVar[_Seeds | None] = contextvars.ContextVar("write_id_seed", default=None)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def seed_writes(seed: str, record_seed: str = "") -> None:
    """Derive the ids made from now on in this context from ``seed`` (the request's): new
    ids from it alone, write ids from it and ``record_seed`` (its key's record's)."""
    request = _digest(seed)
    _SEED.set(_Seeds(request, _digest(f"{request}\0{record_seed}"), itertools.count()))


def next_write_id() -> str | None:
    """The id of the next write of this request, or None when it has no idempotency key."""
    seeded = _SEED.get()
    if seeded is None:
        return None
    return _digest(f"{seeded.record}\0{next(seeded.order)}")[:32]


def new_uuid() -> str:
    """A fresh uuid, or one derived from the request's key (the same on a retry)."""
    seeded = _SEED.get()
    if seeded is None:
        return str(uuid.uuid4())
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{seeded.request}\0{next(seeded.order)}"))


__all__ = ["WRITE_ID_SECONDS", "new_uuid", "next_write_id", "seed_writes"]
