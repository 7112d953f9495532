"""Agent state on Redis (standalone or Cluster), one Lua script per operation.

Keys of user ``U`` (escaped, in the hash tag) and session ``S`` (escaped)::

    <prefix>:state:{U}:s:S:rounds    ZSET  round id -> round id (ordered rounds)
    <prefix>:state:{U}:s:S:states    HASH  round id -> state JSON
    <prefix>:state:{U}:sessions      SET   the user's session ids with state
    <prefix>:state:{U}:s:S:applied   HASH  write id -> "<round> <until (ms)>" (the saves
                                           made under an Idempotency-Key)
    <prefix>:state:{U}:s:S:applied_until  ZSET  write id -> until (ms)

Allocating the next round (highest + 1) and storing the state happen in one script, so
concurrent saves get distinct rounds; a keyed save records its write id in the same
script, and a run of it again gets that round back (storing its state there). Every save
forgets a few of the write ids remembered until a time past (at most
:data:`_FORGOTTEN_PER_SAVE`: more than a save adds), and the two keys of write ids expire
with the last one remembered (ids remembered by a release without ``applied_until`` go
then). With ``ttl_seconds`` every read and write refreshes the expiry of the session's
rounds and states.
"""

from __future__ import annotations

import json
from typing import Any

from agentscope_serverless.services._once import WRITE_ID_SECONDS
from agentscope_serverless.services._redis import (
    LUA_DELETE_KEYS,
    LUA_TOUCH,
    RedisBackedService,
    escape,
    text,
    user_key_prefix,
)
from agentscope_serverless.services.agent_state.base import (
    MAX_ROUND_ID,
    StateService,
    rounds_exhausted,
    stored_state,
)
from agentscope_serverless.services.idempotency.base import now_ms

# How many write ids past their time a save forgets, at most: each save adds one.
_FORGOTTEN_PER_SAVE = 8

# The keys a script refreshes the expiry of (with a TTL): the rounds, the states and the
# user's index, not the write ids, which expire with the last one remembered.
_TOUCHED = "{KEYS[1], KEYS[2], KEYS[3]}"

# KEYS: rounds, states, the user's index, applied write ids, their times. ARGV[1]: ttl,
# ..., ARGV[#ARGV]: the session id.
# ARGV[2]: the state, [3]: the write id ('' for none), [4]: now (ms), [5]: remembered until.
# Returns nil, storing nothing, when the highest round is the last (past it, scores are
# not exact, and two rounds would share one score).
_SAVE_NEXT = (
    LUA_TOUCH
    + """
local past = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. ARGV[4], 'LIMIT', 0, FORGOTTEN)
if #past > 0 then
  redis.call('HDEL', KEYS[4], unpack(past))
  redis.call('ZREM', KEYS[5], unpack(past))
end
local round
if ARGV[3] ~= '' then
  local seen = redis.call('HGET', KEYS[4], ARGV[3])
  if seen then
    local applied, remembered = string.match(seen, '^(%d+) (%d+)$')
    if tonumber(remembered) > tonumber(ARGV[4]) then round = applied end
  end
end
if not round then
  local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local highest = tonumber(top[2]) or 0
  if highest >= MAX_ROUND_ID then return false end
  round = string.format('%d', highest + 1)
  if ARGV[3] ~= '' then
    redis.call('HSET', KEYS[4], ARGV[3], round .. ' ' .. ARGV[5])
    redis.call('ZADD', KEYS[5], ARGV[5], ARGV[3])
    for i = 4, 5 do
      local left = redis.call('PTTL', KEYS[i])
      if left < 0 or tonumber(ARGV[4]) + left < tonumber(ARGV[5]) then
        redis.call('PEXPIREAT', KEYS[i], ARGV[5])
      end
    end
  end
end
redis.call('ZADD', KEYS[1], round, round)
redis.call('HSET', KEYS[2], round, ARGV[2])
redis.call('SADD', KEYS[3], ARGV[#ARGV])
touch(tonumber(ARGV[1]), TOUCHED)
return round
""".replace("MAX_ROUND_ID", str(MAX_ROUND_ID))
    .replace("FORGOTTEN", str(_FORGOTTEN_PER_SAVE))
    .replace("TOUCHED", _TOUCHED)
)

_SAVE_ROUND = (
    LUA_TOUCH
    + """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[#ARGV])
touch(tonumber(ARGV[1]), TOUCHED)
return 1
""".replace("TOUCHED", _TOUCHED)
)

# ARGV[2]: the round, or '' for the latest. Returns the round and its state.
_LOAD = (
    LUA_TOUCH
    + """
local round = ARGV[2]
if round == '' then
  round = redis.call('ZREVRANGE', KEYS[1], 0, 0)[1]
  if not round then return false end
end
touch(tonumber(ARGV[1]), TOUCHED)
local state = redis.call('HGET', KEYS[2], round)
if not state then return false end
return {round, state}
""".replace("TOUCHED", _TOUCHED)
)

_ROUNDS = (
    LUA_TOUCH
    + """
touch(tonumber(ARGV[1]), TOUCHED)
return redis.call('ZRANGE', KEYS[1], 0, -1)
""".replace("TOUCHED", _TOUCHED)
)

_DELETE = """
redis.call('SREM', KEYS[3], ARGV[#ARGV])
return redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[5])
"""

# KEYS: the user's index, then the rounds and states keys of the sessions the caller read
# from it. ARGV: those session ids. Deletes only when the index still holds exactly them.
_MEMBERS = """
return redis.call('SMEMBERS', KEYS[1])
"""

_DELETE_USER = (
    LUA_DELETE_KEYS
    + """
local expected = {}
for _, id in ipairs(ARGV) do expected[id] = true end
local now = redis.call('SMEMBERS', KEYS[1])
if #now ~= #ARGV then return 0 end
for _, id in ipairs(now) do
  if not expected[id] then return 0 end
end
delete_keys()
return 1
"""
)


class RedisStateService(RedisBackedService, StateService):
    """Agent state on Redis or Redis Cluster (managed Redis / Valkey).

    >>> state = RedisStateService(redis_url="redis://localhost:6379/0", ttl_seconds=86400)

    Takes the same connection arguments as
    :class:`~agentscope_serverless.services.session_history.redis.RedisSessionHistoryService`.
    """

    def _keys(self, user_id: str, session_id: str) -> list[str]:
        user = user_key_prefix(self._redis.key_prefix, "state", user_id)
        base = f"{user}:s:{escape(session_id)}"
        return [
            f"{base}:rounds",
            f"{base}:states",
            f"{user}:sessions",
            f"{base}:applied",
            f"{base}:applied_until",
        ]

    async def _call(
        self, script: str, user_id: str, session_id: str, *args: Any, idempotent: bool
    ) -> Any:
        return await self._redis.run(
            script,
            self._keys(user_id, session_id),
            [self._ttl, *args, session_id],
            idempotent=idempotent,
        )

    async def _delete_user_state(self, user_id: str) -> None:
        index = f"{user_key_prefix(self._redis.key_prefix, 'state', user_id)}:sessions"
        while True:
            session_ids = [
                text(s) for s in await self._redis.run(_MEMBERS, [index], [], idempotent=True)
            ]
            keys = [index]
            for session_id in session_ids:
                rounds, states, _, applied, until = self._keys(user_id, session_id)
                keys += [rounds, states, applied, until]
            if int(await self._redis.run(_DELETE_USER, keys, session_ids, idempotent=True)):
                return

    async def _save_next(
        self, user_id: str, session_id: str, state: dict[str, Any], write_id: str | None
    ) -> int:
        at = now_ms()
        round_id = await self._call(
            _SAVE_NEXT,
            user_id,
            session_id,
            json.dumps(state),
            write_id or "",
            at,
            at + WRITE_ID_SECONDS * 1000,
            # A keyed save run twice stores one round: the client may send it again.
            idempotent=write_id is not None,
        )
        if round_id is None:
            raise rounds_exhausted()
        return int(text(round_id))

    async def _save_round(
        self, user_id: str, session_id: str, round_id: int, state: dict[str, Any]
    ) -> None:
        await self._call(
            _SAVE_ROUND, user_id, session_id, str(round_id), json.dumps(state), idempotent=True
        )

    async def _load(
        self, user_id: str, session_id: str, round_id: int | None
    ) -> tuple[int, dict[str, Any]] | None:
        wanted = "" if round_id is None else str(round_id)
        raw = await self._call(_LOAD, user_id, session_id, wanted, idempotent=True)
        if raw is None:
            return None
        loaded = int(text(raw[0]))
        state = stored_state(raw[1], session_id, loaded)
        return None if state is None else (loaded, state)

    async def _list_rounds(self, user_id: str, session_id: str) -> list[int]:
        raw = await self._call(_ROUNDS, user_id, session_id, idempotent=True)
        return [int(text(member)) for member in raw]

    async def _delete(self, user_id: str, session_id: str) -> None:
        await self._call(_DELETE, user_id, session_id, idempotent=True)


__all__ = ["RedisStateService"]
