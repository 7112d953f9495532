"""Idempotency records on Redis: one hash per key, claimed by a Lua script.

Key: ``<prefix>:idempotency:{<escaped user id>}:<sha256 of the key>``, a hash with
``fingerprint``, ``state``, ``lease_until``, ``token``, ``response`` and ``seed``, expiring
after the record's expiry. ``<prefix>:idempotency:{<escaped user id>}:index``, a sorted set of
the user's records (the sha256, scored by its expiry in ms), lists them for erasing; its
expired entries are dropped as records are claimed. A completed record that wrote in a
session holds its id in ``session``, and is listed (its sha256) in the set
``<prefix>:idempotency:{<escaped user id>}:session:<sha256 of the session id>``, for
deleting the session; the index lists that set too (as ``session:<sha256 of the session
id>``, the rest of its key), so erasing the user deletes it with the records.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from agentscope_serverless.services._redis import RedisBackedService, text, user_key_prefix
from agentscope_serverless.services.idempotency.base import (
    IdempotencyRecord,
    IdempotencyStore,
    now_ms,
)

# KEYS: record, the user's index. ARGV: now (ms), fingerprint, token, lease until (ms),
# expiry (s), the record's sha256, seed. Returns the live record holding the key (with the
# session it wrote in), or the seed kept when claimed.
_CLAIM = """
local r = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'lease_until', 'token', 'response',
                     'seed', 'session')
if r[1] and r[2] ~= 'released' and not (r[2] == 'in_progress'
    and tonumber(r[3]) < tonumber(ARGV[1]) and r[1] == ARGV[2]) then
  return r
end
local seed = r[6] or ARGV[7]
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[2], 'state', 'in_progress',
           'lease_until', ARGV[4], 'token', ARGV[3], 'seed', seed)
redis.call('EXPIRE', KEYS[1], ARGV[5])
local expiry = tonumber(ARGV[1]) + 1000 * tonumber(ARGV[5])
redis.call('ZADD', KEYS[2], string.format('%d', expiry), ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return seed
"""

# KEYS: record, the user's index[, the session's set]. ARGV: token, response, expiry (s),
# now (ms), sha256[, session id, the session's set as the index lists it].
_COMPLETE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'response', ARGV[2], 'lease_until', 0)
redis.call('EXPIRE', KEYS[1], ARGV[3])
local expiry = tonumber(ARGV[4]) + 1000 * tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], string.format('%d', expiry), ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if KEYS[3] then
  redis.call('HSET', KEYS[1], 'session', ARGV[6])
  redis.call('SADD', KEYS[3], ARGV[5])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
  redis.call('ZADD', KEYS[2], string.format('%d', expiry), ARGV[7])
end
return 1
"""

# KEYS: record, the user's index. ARGV: token, lease until (ms), how long the record is kept
# (s), now (ms), the record's sha256.
_RENEW = """
local r = redis.call('HMGET', KEYS[1], 'token', 'state', 'lease_until')
if r[1] ~= ARGV[1] or r[2] ~= 'in_progress' or tonumber(r[3]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local expiry = tonumber(ARGV[4]) + 1000 * tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], string.format('%d', expiry), ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""

# KEYS: the user's index. ARGV: how many records to read.
_FIRST_RECORDS = """
return redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
"""

# KEYS: the user's index, then records. ARGV: the records' sha256, in the same order.
_DELETE_RECORDS = """
for i = 1, #ARGV do
  redis.call('DEL', KEYS[i + 1])
  redis.call('ZREM', KEYS[1], ARGV[i])
end
return 1
"""
# KEYS: the session's set. ARGV: how many records to read.
_SESSION_RECORDS = """
return redis.call('SRANDMEMBER', KEYS[1], tonumber(ARGV[1]))
"""

# KEYS: the user's index, the session's set, then records. ARGV: the session id, the
# session's set as the index lists it, then the records' sha256 in the order of KEYS. A
# record claimed again since (once expired) for a request in another session stays.
_DELETE_SESSION_RECORDS = """
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[i], 'session') == ARGV[1] then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
  redis.call('SREM', KEYS[2], ARGV[i])
end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('ZREM', KEYS[1], ARGV[2]) end
return 1
"""
# Records erased per script.
_DELETE_BATCH = 500

# KEYS: record, the user's index[, the session's set]. ARGV: token, sha256[, the session's
# set as the index lists it].
_FORGET = """
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or r[2] ~= 'completed' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
if KEYS[3] then
  redis.call('SREM', KEYS[3], ARGV[2])
  if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('ZREM', KEYS[2], ARGV[3]) end
end
return 1
"""

# KEYS: record, the user's index. ARGV: token, expiry (s), now (ms), sha256.
_ABANDON = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'released', 'lease_until', 0)
redis.call('HDEL', KEYS[1], 'token')
redis.call('EXPIRE', KEYS[1], ARGV[2])
local expiry = tonumber(ARGV[3]) + 1000 * tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], string.format('%d', expiry), ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# KEYS: record, the user's index. ARGV: value, expiry (s), now (ms), sha256.
_KEEP = """
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'kept', 'response', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
local expiry = tonumber(ARGV[3]) + 1000 * tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], string.format('%d', expiry), ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

# KEYS: record, the user's index. ARGV: sha256.
_TAKE = """
local r = redis.call('HMGET', KEYS[1], 'state', 'response')
if r[1] ~= 'kept' then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return r[2]
"""


class RedisIdempotencyStore(RedisBackedService, IdempotencyStore):
    """Idempotency records on Redis or Redis Cluster (with the Redis services).

    >>> records = RedisIdempotencyStore(redis_url="redis://localhost:6379/0")
    """

    def __init__(
        self,
        *args: Any,
        expiry_seconds: int = 24 * 3600,
        lease_seconds: float = 60.0,
        **kwargs: Any,
    ) -> None:
        RedisBackedService.__init__(self, *args, **kwargs)
        IdempotencyStore.__init__(self, expiry_seconds, lease_seconds)

    def _base(self, user_id: str) -> str:
        return user_key_prefix(self._redis.key_prefix, "idempotency", user_id)

    def _keys(self, user_id: str, key: str) -> tuple[list[str], str]:
        """The record's key and the user's index, and the record's sha256."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        base = self._base(user_id)
        return [f"{base}:{digest}", f"{base}:index"], digest

    async def _claim(self, user_id: str, key: str, record: IdempotencyRecord) -> IdempotencyRecord:
        keys, digest = self._keys(user_id, key)
        raw = await self._redis.run(
            _CLAIM,
            keys,
            [
                now_ms(),
                record.fingerprint,
                record.token,
                record.lease_until_ms,
                self.held_seconds,
                digest,
                record.seed,
            ],
            idempotent=False,
        )
        if not isinstance(raw, list):
            return replace(record, seed=text(raw))
        fingerprint, state, lease_until, token, response, seed, session = (
            None if value is None else text(value) for value in raw
        )
        return IdempotencyRecord(
            fingerprint or "",
            state or "",
            int(lease_until or 0),
            token or "",
            response,
            session,
            seed or "",
        )

    async def _renew(self, user_id: str, key: str, token: str, lease_until_ms: int) -> None:
        keys, digest = self._keys(user_id, key)
        args: list[str | int] = [token, lease_until_ms, self.held_seconds, now_ms(), digest]
        await self._redis.run(_RENEW, keys, args, idempotent=True)

    def _session_key(self, user_id: str, session_id: str) -> tuple[str, str]:
        """The key of the set listing the records of the session, and the rest of that key
        after the user's (as the user's index lists it)."""
        listed = f"session:{hashlib.sha256(session_id.encode()).hexdigest()}"
        return f"{self._base(user_id)}:{listed}", listed

    async def _complete(
        self, user_id: str, key: str, token: str, response: str, session_id: str | None
    ) -> None:
        keys, digest = self._keys(user_id, key)
        args: list[str | int] = [token, response, self.expiry_seconds, now_ms(), digest]
        if session_id is not None:
            listing, listed = self._session_key(user_id, session_id)
            keys.append(listing)
            args += [session_id, listed]
        await self._redis.run(_COMPLETE, keys, args, idempotent=True)

    async def _abandon(self, user_id: str, key: str, token: str) -> None:
        keys, digest = self._keys(user_id, key)
        args = [token, self.expiry_seconds, now_ms(), digest]
        await self._redis.run(_ABANDON, keys, args, idempotent=True)

    async def _forget(self, user_id: str, key: str, token: str, session_id: str | None) -> None:
        keys, digest = self._keys(user_id, key)
        args = [token, digest]
        if session_id is not None:
            listing, listed = self._session_key(user_id, session_id)
            keys.append(listing)
            args.append(listed)
        await self._redis.run(_FORGET, keys, args, idempotent=True)

    async def _delete_user(self, user_id: str) -> None:
        base = self._base(user_id)
        index = f"{base}:index"
        while True:
            first = await self._redis.run(_FIRST_RECORDS, [index], [_DELETE_BATCH], idempotent=True)
            digests = [text(digest) for digest in first]
            if not digests:
                return
            records = [f"{base}:{digest}" for digest in digests]
            await self._redis.run(_DELETE_RECORDS, [index, *records], digests, idempotent=True)

    async def _keep(self, user_id: str, key: str, value: str) -> None:
        keys, digest = self._keys(user_id, key)
        await self._redis.run(
            _KEEP, keys, [value, self.expiry_seconds, now_ms(), digest], idempotent=True
        )

    async def _take(self, user_id: str, key: str) -> str | None:
        keys, digest = self._keys(user_id, key)
        value = await self._redis.run(_TAKE, keys, [digest], idempotent=False)
        return None if value is None else text(value)

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        base = self._base(user_id)
        listing, listed = self._session_key(user_id, session_id)
        while True:
            some = await self._redis.run(
                _SESSION_RECORDS, [listing], [_DELETE_BATCH], idempotent=True
            )
            digests = [text(digest) for digest in some]
            if not digests:
                return
            records = [f"{base}:{digest}" for digest in digests]
            await self._redis.run(
                _DELETE_SESSION_RECORDS,
                [f"{base}:index", listing, *records],
                [session_id, listed, *digests],
                idempotent=True,
            )


__all__ = ["RedisIdempotencyStore"]
