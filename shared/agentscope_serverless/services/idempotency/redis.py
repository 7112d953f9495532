"""Idempotency records on Redis: one hash per key, claimed by a Lua script.

Key: ``<prefix>:idempotency:{<escaped user id>}:<sha256 of the key>``, a hash with
``fingerprint``, ``state``, ``lease_until``, ``token`` and ``response``, expiring after
the record's expiry.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agentscope_serverless.services._redis import RedisBackedService, text, user_key_prefix
from agentscope_serverless.services.idempotency.base import (
    IdempotencyRecord,
    IdempotencyStore,
    now_ms,
)

# ARGV: now (ms), fingerprint, token, lease until (ms), expiry (s).
_CLAIM = """
local r = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'lease_until', 'token', 'response')
if r[1] and not (r[2] == 'in_progress' and tonumber(r[3]) < tonumber(ARGV[1])
                 and r[1] == ARGV[2]) then
  return r
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[2], 'state', 'in_progress',
           'lease_until', ARGV[4], 'token', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return false
"""

# ARGV: token, response, expiry (s).
_COMPLETE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'response', ARGV[2], 'lease_until', 0)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# ARGV: token.
_ABANDON = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
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

    def _key(self, user_id: str, key: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return f"{user_key_prefix(self._redis.key_prefix, 'idempotency', user_id)}:{digest}"

    async def _claim(
        self, user_id: str, key: str, record: IdempotencyRecord
    ) -> IdempotencyRecord | None:
        raw = await self._redis.run(
            _CLAIM,
            [self._key(user_id, key)],
            [
                now_ms(),
                record.fingerprint,
                record.token,
                record.lease_until_ms,
                self.expiry_seconds,
            ],
            idempotent=False,
        )
        if not raw:
            return None
        fingerprint, state, lease_until, token, response = (
            None if value is None else text(value) for value in raw
        )
        return IdempotencyRecord(
            fingerprint or "", state or "", int(lease_until or 0), token or "", response
        )

    async def _complete(self, user_id: str, key: str, token: str, response: str) -> None:
        await self._redis.run(
            _COMPLETE,
            [self._key(user_id, key)],
            [token, response, self.expiry_seconds],
            idempotent=True,
        )

    async def _abandon(self, user_id: str, key: str, token: str) -> None:
        await self._redis.run(_ABANDON, [self._key(user_id, key)], [token], idempotent=True)


__all__ = ["RedisIdempotencyStore"]
