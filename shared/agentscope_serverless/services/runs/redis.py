"""Runs on Redis (standalone or Cluster): a hash per run and a stream of its events.

Keys of user ``U``, run ``R`` and session ``S`` (escaped, the user in the hash tag)::

    <prefix>:run:{U}:r:R          HASH    record (JSON), cancel ("1" once requested),
                                          events (a run stored in one write),
                                          submission (a task's: a save of its record
                                          lands only while it is the same)
    <prefix>:run:{U}:r:R:events   STREAM  one entry per write of events
    <prefix>:run:{U}:s:S          ZSET    run id -> creation time
    <prefix>:run:{U}:all          ZSET    run id -> time of its last write (every run of
                                          the user, for erasing them; members not written
                                          for twice the expiry are dropped as runs are
                                          written)

A run stored whole in one write (it ended before its first write, as most runs do) keeps
its events in its hash, one per line: ``<sequence number> <JSON>\n``, with no stream.
Otherwise a write of events is one stream entry: its id is ``0-<last sequence number + 1>``
and its fields are the events' sequence numbers, each with the event's JSON as value. An
entry id is never reused, so a write applied twice stores its events once; a write
overlapping what is stored adds entries that readers skip (they keep the first of each
sequence number). Entries of one event with the field ``d`` (an earlier layout) are read
too.

Every write refreshes the expiry (``ttl_seconds``) of the keys it touches: a write of the
record (its creation, a burst of the run executing, its heartbeat, its end) touches all of
the run's keys and its indexes, and sets its time in the user's, so a run written for longer
than the expiry keeps all of it, listed and found by an erase.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentscope_serverless.services._redis import (
    LUA_TOUCH,
    Command,
    RedisBackedService,
    RedisWrite,
    ScriptCall,
    escape,
    text,
    user_key_prefix,
)
from agentscope_serverless.services.runs.base import RunBurst, RunRecord, RunsService, StoredEvent

# The cancellation mark is kept apart from the record (its own hash field).
_NOT_STORED = {"cancel_requested"}

# Sets the time of a run's last write (``at``) in the user's index, dropping the runs not
# written since ``cutoff`` (expired).
_LUA_INDEX_RUN = """
local function index_run(key, at, run_id, cutoff)
  redis.call('ZADD', key, at, run_id)
  if tonumber(cutoff) > 0 then redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. cutoff) end
end
"""

# KEYS: run, session index, user index. ARGV: ttl, record, run id, created at, cutoff,
# submission ("" for none), now.
_CREATE = (
    LUA_TOUCH
    + _LUA_INDEX_RUN
    + """
redis.call('HSET', KEYS[1], 'record', ARGV[2])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'submission', ARGV[6])
else
  redis.call('HDEL', KEYS[1], 'submission')
end
if KEYS[2] ~= KEYS[1] then redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3]) end
index_run(KEYS[3], ARGV[7], ARGV[3], ARGV[5])
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# KEYS: run, events, session index (the run's key without one), user index. ARGV: ttl,
# record, submission ("" for none: saved whichever is stored), run id, created at, now,
# cutoff.
_SAVE = (
    LUA_TOUCH
    + _LUA_INDEX_RUN
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'submission') ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[2])
if KEYS[3] ~= KEYS[1] then redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4]) end
index_run(KEYS[4], ARGV[6], ARGV[4], ARGV[7])
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# Appends ``count`` events to the stream ``key`` from ARGV[at...]: pairs of a sequence number
# and the event's JSON, which are an entry's fields as they stand. An entry per 500 events
# (a Lua stack holds a few thousand values), its id after the last of them. An entry whose
# id is taken was added by an earlier write; any other refusal (out of memory...) fails
# the write.
_LUA_ADD_EVENTS = """
local function add_events(key, at, count)
  for first = 0, count - 1, 500 do
    local from, to = at + 2 * first, at + 2 * math.min(first + 499, count - 1) + 1
    local added = redis.pcall('XADD', key, '0-' .. (tonumber(ARGV[to - 1]) + 1),
      unpack(ARGV, from, to))
    if type(added) == 'table' and added.err
        and not string.find(added.err, 'equal or smaller', 1, true) then
      error(added)
    end
  end
end
"""

# KEYS: run, events. ARGV: ttl, then the events (as for add_events).
_APPEND = (
    LUA_TOUCH
    + _LUA_ADD_EVENTS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
add_events(KEYS[2], 2, (#ARGV - 1) / 2)
touch(tonumber(ARGV[1]), KEYS)
return 1
"""
)

# Bursts of runs executing here (not stored whole: see ``_whole``), each with 4 KEYS (run,
# events, session index, user index) and, after ARGV[1] (the ttl), ARGV[2] (the user
# index's cutoff) and ARGV[3] (now), its ARGV: create ("1"/"0"), record (written when
# creating or finishing), run id, created at, finish ("1"/"0"), the number of events, then
# the events (as for add_events). Returns, per burst, -1 when the run is not found, else 1
# when its cancellation was requested, else 0.
_RECORD = (
    LUA_TOUCH
    + _LUA_ADD_EVENTS
    + _LUA_INDEX_RUN
    + """
local answers, a = {}, 4
for i = 1, #KEYS / 4 do
  local run, events, index, all = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local create, finish, count = ARGV[a] == '1', ARGV[a + 4] == '1', tonumber(ARGV[a + 5])
  if create or redis.call('EXISTS', run) == 1 then
    if create and index ~= run then redis.call('ZADD', index, ARGV[a + 3], ARGV[a + 2]) end
    index_run(all, ARGV[3], ARGV[a + 2], ARGV[2])
    if create or finish then redis.call('HSET', run, 'record', ARGV[a + 1]) end
    add_events(events, a + 6, count)
    touch(tonumber(ARGV[1]), {run, events, index, all})
    answers[i] = redis.call('HEXISTS', run, 'cancel')
  else
    answers[i] = -1
  end
  a = a + 6 + 2 * count
end
return answers
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

# KEYS: runs. Returns their records and cancellation marks, in pairs (nil for a run gone).
_RECORDS = """
local records = {}
for i, key in ipairs(KEYS) do
  local fields = redis.call('HMGET', key, 'record', 'cancel')
  records[2 * i - 1], records[2 * i] = fields[1] or false, fields[2] or false
end
return records
"""

# KEYS: an index of runs (a user's or a session's). ARGV: the last position to read (-1:
# all of them).
_INDEXED_RUNS = """
return redis.call('ZRANGE', KEYS[1], 0, ARGV[1])
"""

# KEYS: an index of runs. ARGV: the lowest score (creation time) to read.
_RUNS_SINCE = """
return redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf')
"""

# KEYS: user index, then per run: run, events, session index (the run's key without one).
# ARGV: the run ids. Deletes the runs and their entries in the indexes.
_DELETE_RUNS = """
for i = 1, #ARGV do
  local run, events, index = KEYS[3 * i - 1], KEYS[3 * i], KEYS[3 * i + 1]
  redis.call('DEL', run, events)
  if index ~= run then redis.call('ZREM', index, ARGV[i]) end
  redis.call('ZREM', KEYS[1], ARGV[i])
end
return 1
"""
# Runs erased per script.
_DELETE_BATCH = 200

# KEYS: run, events. ARGV: first entry id, count (0: all). Returns the lines of a run
# stored whole (or nil) and the stream's entries.
_READ = """
local whole = redis.call('HGET', KEYS[1], 'events')
if tonumber(ARGV[2]) > 0 then
  return {whole, redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', ARGV[2])}
end
return {whole, redis.call('XRANGE', KEYS[2], ARGV[1], '+')}
"""


class RedisRunsService(RedisBackedService, RunsService):
    """Runs on Redis or Redis Cluster (managed Redis / Valkey).

    >>> runs = RedisRunsService(redis_url="redis://localhost:6379/0", ttl_seconds=86400)

    Takes the same connection arguments as the other Redis services.
    """

    prepares_writes = True

    def _run_key(self, user_id: str, run_id: str) -> str:
        base = user_key_prefix(self._redis.key_prefix, "run", user_id)
        return f"{base}:r:{escape(run_id)}"

    def _session_key(self, user_id: str, session_id: str) -> str:
        base = user_key_prefix(self._redis.key_prefix, "run", user_id)
        return f"{base}:s:{escape(session_id)}"

    def _user_key(self, user_id: str) -> str:
        return f"{user_key_prefix(self._redis.key_prefix, 'run', user_id)}:all"

    def _index_cutoff(self) -> float:
        """Runs not written since this are dropped from their user's index (0: none are):
        expired, with room for the clocks of two machines to differ."""
        return time.time() - 2 * self._ttl if self._ttl else 0

    async def _create(self, record: RunRecord) -> None:
        run = self._run_key(record.user_id, record.id)
        index = self._session_key(record.user_id, record.session_id) if record.session_id else run
        await self._redis.run(
            _CREATE,
            [run, index, self._user_key(record.user_id)],
            [
                self._ttl,
                record.model_dump_json(),
                record.id,
                repr(record.created_at),
                repr(self._index_cutoff()),
                record.submission or "",
                repr(time.time()),
            ],
            idempotent=True,
        )

    async def _list_user(self, user_id: str, since: float) -> list[RunRecord]:
        ids = await self._redis.run(
            _RUNS_SINCE, [self._user_key(user_id)], [repr(since)], idempotent=True
        )
        records = await self._records(user_id, [text(run_id) for run_id in ids])
        # Listed by their last write: those created before ``since`` are left out here.
        return [record for record in records if record is not None and record.created_at >= since]

    async def _records(self, user_id: str, run_ids: list[str]) -> list[RunRecord | None]:
        """The records of ``run_ids`` with their cancellation marks, in order (None for a
        run gone), a batch of runs per request."""
        records: list[RunRecord | None] = []
        for start in range(0, len(run_ids), _DELETE_BATCH):
            runs = [self._run_key(user_id, r) for r in run_ids[start : start + _DELETE_BATCH]]
            stored = await self._redis.run(_RECORDS, runs, [], idempotent=True)
            for raw, cancel in zip(stored[::2], stored[1::2], strict=True):
                record = RunRecord.model_validate_json(raw) if raw else None
                if record is not None:
                    record.cancel_requested = bool(cancel)
                records.append(record)
        return records

    async def _delete_user(self, user_id: str) -> None:
        await self._delete_indexed(user_id, self._user_key(user_id), None)

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        await self._delete_indexed(user_id, self._session_key(user_id, session_id), session_id)

    async def _delete_indexed(self, user_id: str, index: str, session_id: str | None) -> None:
        """Delete the runs listed in ``index`` (the user's, or the session ``session_id``'s),
        a batch at a time until none is left (runs created meanwhile included)."""
        user_key = self._user_key(user_id)
        while True:
            first = await self._redis.run(
                _INDEXED_RUNS, [index], [_DELETE_BATCH - 1], idempotent=True
            )
            run_ids = [text(run_id) for run_id in first]
            if not run_ids:
                return
            sessions: list[str | None] = [session_id] * len(run_ids)
            if session_id is None:
                records = await self._records(user_id, run_ids)
                sessions = [record.session_id if record else None for record in records]
            keys = [user_key]
            for run_id, session in zip(run_ids, sessions, strict=True):
                run = self._run_key(user_id, run_id)
                keys += (
                    run,
                    f"{run}:events",
                    self._session_key(user_id, session) if session else run,
                )
            await self._redis.run(_DELETE_RUNS, keys, run_ids, idempotent=True)

    async def _delete_run_of(self, record: RunRecord) -> None:
        run = self._run_key(record.user_id, record.id)
        index = self._session_key(record.user_id, record.session_id) if record.session_id else run
        keys = [self._user_key(record.user_id), run, f"{run}:events", index]
        await self._redis.run(_DELETE_RUNS, keys, [record.id], idempotent=True)

    async def _save(self, record: RunRecord) -> None:
        stored = record.model_copy(update={"cancel_requested": False}).model_dump_json()
        run = self._run_key(record.user_id, record.id)
        index = self._session_key(record.user_id, record.session_id) if record.session_id else run
        await self._redis.run(
            _SAVE,
            [run, f"{run}:events", index, self._user_key(record.user_id)],
            [
                self._ttl,
                stored,
                record.submission or "",
                record.id,
                repr(record.created_at),
                repr(time.time()),
                repr(self._index_cutoff()),
            ],
            idempotent=True,
        )

    async def _append(self, user_id: str, run_id: str, events: list[StoredEvent]) -> None:
        run = self._run_key(user_id, run_id)
        await self._redis.run(
            _APPEND, [run, f"{run}:events"], [self._ttl, *_pairs(events)], idempotent=True
        )

    async def _record_many(self, bursts: list[RunBurst]) -> list[bool | None]:
        # One request (on a cluster, one per user: the keys of a request share a hash slot).
        by_user: dict[str, list[int]] = {}
        for position, burst in enumerate(bursts):
            user = burst.record.user_id if self._redis.cluster else ""
            by_user.setdefault(user, []).append(position)
        answers: list[bool | None] = [None] * len(bursts)

        async def record(positions: list[int]) -> None:
            (replies,) = await self._write([bursts[p] for p in positions]).apply()
            for position, reply in zip(positions, replies, strict=True):
                answers[position] = reply

        groups = list(by_user.values())
        if len(groups) == 1:
            await record(groups[0])
        else:
            await asyncio.gather(*(record(positions) for positions in groups))
        return answers

    def _prepare_record(self, burst: RunBurst) -> RedisWrite:
        return self._write([burst], answer=lambda answers: answers[0])

    def _write(
        self, bursts: list[RunBurst], answer: Callable[[list[bool]], Any] = list
    ) -> RedisWrite:
        """The write storing ``bursts``: plain commands for each run stored whole, one
        ``_RECORD`` call for the others. A burst applied twice stores the same: events
        keep their entry ids, the record written is the burst's own."""
        commands: list[Command] = []
        keys: list[str] = []
        args: list[Any] = [self._ttl, repr(self._index_cutoff()), repr(time.time())]
        # Per burst: its answer's position in the script's reply; None when stored whole.
        scripted: list[int | None] = []
        for burst in bursts:
            whole = self._whole(burst)
            if whole is None:
                scripted.append(len(keys) // 4)
                self._add_burst(burst, keys, args)
            else:
                commands += whole
                scripted.append(None)
        if keys:
            commands.append(ScriptCall(_RECORD, keys, args))

        def done(replies: list[Any]) -> Any:
            return answer([at is not None and _requested(replies[-1][at]) for at in scripted])

        return RedisWrite(self, commands, done, idempotent=True)

    def _whole(self, burst: RunBurst) -> list[Command] | None:
        """The commands storing a run whole (created and finished in one write), its
        events as lines in its hash, or None for another burst (or when an event's JSON
        holds a line break). A run stored whole was never stored before: nobody can have
        requested its cancellation.

        Plain commands: an event's JSON crossing into Lua and out again costs Redis more
        than the rest of the write (about 8 us per 6 KiB each way, measured here)."""
        if not (burst.create and burst.finish):
            return None
        lines = _lines(burst.events)
        if lines is None:
            return None
        record = burst.record
        run = self._run_key(record.user_id, record.id)
        commands: list[Command] = [
            ("HSET", run, "record", record.model_dump_json(exclude=_NOT_STORED), "events", lines)
        ]
        created = repr(record.created_at)
        if record.session_id:
            index = self._session_key(record.user_id, record.session_id)
            commands.append(("ZADD", index, created, record.id))
            if self._ttl:
                commands.append(("EXPIRE", index, self._ttl))
        user_key = self._user_key(record.user_id)
        commands.append(("ZADD", user_key, repr(time.time()), record.id))
        if self._ttl:
            cutoff = f"({self._index_cutoff()!r}"
            commands += [
                ("ZREMRANGEBYSCORE", user_key, "-inf", cutoff),
                ("EXPIRE", user_key, self._ttl),
                ("EXPIRE", run, self._ttl),
            ]
        return commands

    def _add_burst(self, burst: RunBurst, keys: list[str], args: list[Any]) -> None:
        record = burst.record
        run = self._run_key(record.user_id, record.id)
        index = self._session_key(record.user_id, record.session_id) if record.session_id else run
        keys += (run, f"{run}:events", index, self._user_key(record.user_id))
        args += (
            "1" if burst.create else "0",
            record.model_dump_json(exclude=_NOT_STORED),
            record.id,
            repr(record.created_at),
            "1" if burst.finish else "0",
            len(burst.events),
            *_pairs(burst.events),
        )

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
            _INDEXED_RUNS, [self._session_key(user_id, session_id)], [-1], idempotent=True
        )
        records = await self._records(user_id, [text(run_id) for run_id in ids])
        return [record for record in records if record is not None]

    async def _read(
        self, user_id: str, run_id: str, after: int, limit: int | None
    ) -> list[StoredEvent]:
        run = self._run_key(user_id, run_id)
        whole, entries = await self._redis.run(
            _READ, [run, f"{run}:events"], [f"0-{after + 2}", limit or 0], idempotent=True
        )
        events: list[StoredEvent] = []
        batches: list[list[tuple[Any, Any]]] = []
        if whole:
            # Split on "\n" alone: JSON may hold other line separators (U+2028...) as is.
            lines = (line.partition(" ") for line in text(whole).split("\n")[:-1])
            batches.append([(sequence, data) for sequence, _, data in lines])
        for entry_id, fields in entries:
            if len(fields) == 2 and text(fields[0]) == "d":  # one event (earlier layout)
                batches.append([(int(text(entry_id).partition("-")[2]) - 1, fields[1])])
            else:
                batches.append([(fields[i], fields[i + 1]) for i in range(0, len(fields), 2)])
        for batch in batches:
            for sequence, data in batch:
                if int(sequence) > after:  # an entry may start with events already read
                    after = int(sequence)
                    events.append((after, text(data)))
        return events[:limit] if limit else events


def _requested(reply: Any) -> bool:
    """A burst's answer: whether the run's cancellation was requested."""
    return int(reply) == 1


def _lines(events: Sequence[StoredEvent]) -> str | None:
    """``events`` as a whole run's lines (``<sequence number> <JSON>\\n`` each), or None
    when a JSON holds a line break (never one of ours: JSON escapes them)."""
    if any("\n" in data for _, data in events):  # a search per event: far cheaper than
        return None  # counting the lines after
    return "".join([f"{sequence} {data}\n" for sequence, data in events])


def _pairs(events: Sequence[StoredEvent]) -> list[int | str]:
    """``events`` as the scripts take them: sequence number, JSON, sequence number, ..."""
    return [item for event in events for item in event]


__all__ = ["RedisRunsService"]
