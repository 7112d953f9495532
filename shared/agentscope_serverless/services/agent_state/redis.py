"""Agent state on Redis (standalone or Cluster), one Lua script per operation.

Keys of user ``U`` (escaped, in the hash tag) and session ``S`` (escaped)::

    <prefix>:state:{U}:s:S:rounds    ZSET  round id -> round id (ordered rounds)
    <prefix>:state:{U}:s:S:states    HASH  round id -> state JSON

Allocating the next round (highest + 1) and storing the state happen in one script, so
concurrent saves get distinct rounds. With ``ttl_seconds`` every read and write refreshes
the session's expiry.
"""

from __future__ import annotations

import json
from typing import Any

from agentscope_serverless.services._redis import (
    LUA_TOUCH,
    RedisBackedService,
    escape,
    text,
    user_key_prefix,
)
from agentscope_serverless.services.agent_state.base import StateService

# KEYS: rounds, states. ARGV[1]: ttl.
_SAVE_NEXT = (
    LUA_TOUCH
    + """
local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local round = string.format('%d', (tonumber(top[2]) or 0) + 1)
redis.call('ZADD', KEYS[1], round, round)
redis.call('HSET', KEYS[2], round, ARGV[2])
touch(tonumber(ARGV[1]), KEYS)
return round
"""
)

_SAVE_ROUND = (
    LUA_TOUCH
    + """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# ARGV[2]: the round, or '' for the latest.
_LOAD = (
    LUA_TOUCH
    + """
local round = ARGV[2]
if round == '' then
  round = redis.call('ZREVRANGE', KEYS[1], 0, 0)[1]
  if not round then return false end
end
touch(tonumber(ARGV[1]), KEYS)
return redis.call('HGET', KEYS[2], round)
"""
)

_ROUNDS = (
    LUA_TOUCH
    + """
touch(tonumber(ARGV[1]), KEYS)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""
)

_DELETE = """
return redis.call('DEL', KEYS[1], KEYS[2])
"""


class RedisStateService(RedisBackedService, StateService):
    """Agent state on Redis or Redis Cluster (managed Redis / Valkey).

    >>> state = RedisStateService(redis_url="redis://localhost:6379/0", ttl_seconds=86400)

    Takes the same connection arguments as
    :class:`~agentscope_serverless.services.session_history.redis.RedisSessionHistoryService`.
    """

    async def _call(
        self, script: str, user_id: str, session_id: str, *args: Any, idempotent: bool
    ) -> Any:
        base = user_key_prefix(self._redis.key_prefix, "state", user_id)
        base = f"{base}:s:{escape(session_id)}"
        return await self._redis.run(
            script, [f"{base}:rounds", f"{base}:states"], [self._ttl, *args], idempotent=idempotent
        )

    async def _save_next(self, user_id: str, session_id: str, state: dict[str, Any]) -> int:
        round_id = await self._call(
            _SAVE_NEXT, user_id, session_id, json.dumps(state), idempotent=False
        )
        return int(text(round_id))

    async def _save_round(
        self, user_id: str, session_id: str, round_id: int, state: dict[str, Any]
    ) -> None:
        await self._call(
            _SAVE_ROUND, user_id, session_id, str(round_id), json.dumps(state), idempotent=True
        )

    async def _load(
        self, user_id: str, session_id: str, round_id: int | None
    ) -> dict[str, Any] | None:
        wanted = "" if round_id is None else str(round_id)
        raw = await self._call(_LOAD, user_id, session_id, wanted, idempotent=True)
        if raw is None:
            return None
        state: dict[str, Any] = json.loads(raw)
        return state

    async def _list_rounds(self, user_id: str, session_id: str) -> list[int]:
        raw = await self._call(_ROUNDS, user_id, session_id, idempotent=True)
        return [int(text(member)) for member in raw]

    async def _delete(self, user_id: str, session_id: str) -> None:
        await self._call(_DELETE, user_id, session_id, idempotent=True)


__all__ = ["RedisStateService"]
