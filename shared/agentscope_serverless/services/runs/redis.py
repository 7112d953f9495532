"""Runs on Redis (standalone or Cluster): a hash per run and a stream of its events.

Keys of user ``U``, run ``R`` and session ``S`` (escaped, the user in the hash tag)::

    <prefix>:run:{U}:r:R          HASH    record (JSON), cancel ("1" once requested)
    <prefix>:run:{U}:r:R:events   STREAM  entry id 0-<sequence + 1>, field d: event JSON
    <prefix>:run:{U}:s:S          ZSET    run id -> creation time

Every write refreshes the expiry (``ttl_seconds``) of the keys it touches. Appending uses
the sequence number as the entry id, so an event is never stored twice.
"""

from __future__ import annotations

from typing import Any

from agentscope_serverless.services._redis import (
    LUA_TOUCH,
    RedisBackedService,
    escape,
    text,
    user_key_prefix,
)
from agentscope_serverless.services.runs.base import RunBurst, RunRecord, RunsService, StoredEvent

# The cancellation mark is kept apart from the record (its own hash field).
_NOT_STORED = {"cancel_requested"}

# KEYS: run, session index. ARGV: ttl, record, run id, created at.
_CREATE = (
    LUA_TOUCH
    + """
redis.call('HSET', KEYS[1], 'record', ARGV[2])
if KEYS[2] ~= KEYS[1] then redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3]) end
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# KEYS: run. ARGV: ttl, record.
_SAVE = (
    LUA_TOUCH
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[2])
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# KEYS: run, events. ARGV: ttl, then id, data pairs.
_APPEND = (
    LUA_TOUCH
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 2, #ARGV, 2 do
  redis.pcall('XADD', KEYS[2], ARGV[i], 'd', ARGV[i + 1])
end
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# One burst of a run executing here. KEYS: run, events, session index. ARGV: ttl, create
# ("1"/"0"), record (written when creating or finishing), run id, created at, finish
# ("1"/"0"), the events' entry ids joined by ",", their JSON joined by newlines (JSON text
# holds no raw newline). Returns -1 when the run is not found, else 1 when its cancellation
# was requested, 0 otherwise.
_RECORD = (
    LUA_TOUCH
    + """
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], 'record', ARGV[3])
  if KEYS[3] ~= KEYS[1] then redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4]) end
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local data, at = ARGV[8], 1
for id in string.gmatch(ARGV[7], '[^,]+') do
  local stop = string.find(data, '\\n', at, true) or (#data + 1)
  redis.pcall('XADD', KEYS[2], id, 'd', string.sub(data, at, stop - 1))
  at = stop + 1
end
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'record', ARGV[3]) end
touch(tonumber(ARGV[1]), KEYS)
return redis.call('HEXISTS', KEYS[1], 'cancel')
"""
)

_CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'cancel', '1')
return 1
"""

_LOAD = """
return redis.call('HMGET', KEYS[1], 'record', 'cancel')
"""

_SESSION_RUNS = """
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

# KEYS: events. ARGV: first entry id, count (0: all).
_READ = """
if tonumber(ARGV[2]) > 0 then
  return redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
end
return redis.call('XRANGE', KEYS[1], ARGV[1], '+')
"""


class RedisRunsService(RedisBackedService, RunsService):
    """Runs on Redis or Redis Cluster (managed Redis / Valkey).

    >>> runs = RedisRunsService(redis_url="redis://localhost:6379/0", ttl_seconds=86400)

    Takes the same connection arguments as the other Redis services.
    """

    def _run_key(self, user_id: str, run_id: str) -> str:
        base = user_key_prefix(self._redis.key_prefix, "run", user_id)
        return f"{base}:r:{escape(run_id)}"

    def _session_key(self, user_id: str, session_id: str) -> str:
        base = user_key_prefix(self._redis.key_prefix, "run", user_id)
        return f"{base}:s:{escape(session_id)}"

    async def _create(self, record: RunRecord) -> None:
        run = self._run_key(record.user_id, record.id)
        index = self._session_key(record.user_id, record.session_id) if record.session_id else run
        await self._redis.run(
            _CREATE,
            [run, index],
            [self._ttl, record.model_dump_json(), record.id, repr(record.created_at)],
            idempotent=True,
        )

    async def _save(self, record: RunRecord) -> None:
        stored = record.model_copy(update={"cancel_requested": False}).model_dump_json()
        await self._redis.run(
            _SAVE, [self._run_key(record.user_id, record.id)], [self._ttl, stored], idempotent=True
        )

    async def _append(self, user_id: str, run_id: str, events: list[StoredEvent]) -> None:
        run = self._run_key(user_id, run_id)
        args: list[Any] = [self._ttl]
        for sequence, data in events:
            args += [f"0-{sequence + 1}", data]
        await self._redis.run(_APPEND, [run, f"{run}:events"], args, idempotent=True)

    async def _record(
        self, record: RunRecord, events: list[StoredEvent], create: bool, finish: bool
    ) -> bool | None:
        keys, args = self._burst_call(RunBurst(record, events, create, finish))
        # A burst applied twice stores the same: events keep their entry ids, the record
        # written is the burst's own.
        return int(await self._redis.run(_RECORD, keys, args, idempotent=True)) == 1

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        if len(bursts) == 1:  # a pipeline of one costs more than the call alone
            burst = bursts[0]
            return [
                await self._record(burst.record, list(burst.events), burst.create, burst.finish)
            ]
        replies = await self._redis.run_many(_RECORD, [self._burst_call(b) for b in bursts])
        return [int(reply) == 1 for reply in replies]

    def _burst_call(self, burst: RunBurst) -> tuple[list[str], list[Any]]:
        record = burst.record
        run = self._run_key(record.user_id, record.id)
        index = self._session_key(record.user_id, record.session_id) if record.session_id else run
        args = [
            self._ttl,
            "1" if burst.create else "0",
            record.model_dump_json(exclude=_NOT_STORED),
            record.id,
            repr(record.created_at),
            "1" if burst.finish else "0",
            ",".join(f"0-{sequence + 1}" for sequence, _ in burst.events),
            "\n".join(data for _, data in burst.events),
        ]
        return [run, f"{run}:events", index], args

    async def _mark_cancel(self, user_id: str, run_id: str) -> None:
        await self._redis.run(_CANCEL, [self._run_key(user_id, run_id)], [], idempotent=True)

    async def _load(self, user_id: str, run_id: str) -> RunRecord | None:
        raw, cancel = await self._redis.run(
            _LOAD, [self._run_key(user_id, run_id)], [], idempotent=True
        )
        if raw is None:
            return None
        record = RunRecord.model_validate_json(raw)
        record.cancel_requested = cancel is not None
        return record

    async def _list(self, user_id: str, session_id: str) -> list[RunRecord]:
        ids = await self._redis.run(
            _SESSION_RUNS, [self._session_key(user_id, session_id)], [], idempotent=True
        )
        records = [await self._load(user_id, text(run_id)) for run_id in ids]
        return [record for record in records if record is not None]

    async def _read(
        self, user_id: str, run_id: str, after: int, limit: int | None
    ) -> list[StoredEvent]:
        key = f"{self._run_key(user_id, run_id)}:events"
        entries = await self._redis.run(
            _READ, [key], [f"0-{after + 2}", limit or 0], idempotent=True
        )
        events: list[StoredEvent] = []
        for entry_id, fields in entries:
            sequence = int(text(entry_id).partition("-")[2]) - 1
            events.append((sequence, text(fields[1])))
        return events


__all__ = ["RedisRunsService"]
