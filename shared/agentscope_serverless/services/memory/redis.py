"""Long-term memory on Redis (standalone or Cluster) with an inverted index for search.

Every key of user ``U`` (escaped) shares the hash tag ``{U}``; there is a fixed set of
them, so deleting or expiring a user's memory touches seven keys, whatever its size::

    <prefix>:memory:{U}:stats     HASH  seq (last memory id), docs (count), length (tokens)
    <prefix>:memory:{U}:docs      HASH  memory id -> message JSON
    <prefix>:memory:{U}:order     ZSET  memory id -> memory id (chronological pages)
    <prefix>:memory:{U}:postings  ZSET  all scores 0, members "<term>\\0<~tf><length><id>"
    <prefix>:memory:{U}:tf        HASH  "<term>\\0<id>" -> term frequency
    <prefix>:memory:{U}:info      HASH  memory id -> [length, {term: tf}] (for deletion)
    <prefix>:memory:{U}:sessions  ZSET  all scores 0, members "<escaped session>\\0<id>"

A term's postings are one lexicographic range of ``postings``, ordered by term frequency
(descending) then memory length (ascending): the order in which a memory's BM25
contribution for that term decreases. Search is one Lua script that ranks exactly like
:func:`~agentscope_serverless.services.memory.text.bm25_score` (ties: newest first) and
stops reading a term's postings as soon as no unread memory can still enter the top
``k`` (a threshold algorithm), so a search reads what can match, never the whole memory.

Memory never expires unless ``ttl_seconds`` is set; then the whole of a user's memory
expires ``ttl_seconds`` after its last use (read or write).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services._redis import (
    LUA_TOUCH,
    MAX_POSITION,
    RedisBackedService,
    escape,
    user_key_prefix,
)
from agentscope_serverless.services._stored import decode_messages, encode_message
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.memory.text import BM25_B, BM25_K1, term_frequencies

_KEY_NAMES = ("stats", "docs", "order", "postings", "tf", "info", "sessions")
# Messages stored per script call: bounds how long one call holds Redis.
_ADD_BATCH = 1000
_DELETE_BATCH = 500

# KEYS: stats, docs, order, postings, tf, info, sessions. ARGV[1]: ttl.
_PRELUDE = (
    LUA_TOUCH
    + """
local ttl = tonumber(ARGV[1])
local function posting(term, tf, length, id)
  return term .. '\\0' .. string.format('%08x%08x', 4294967295 - tf, length) .. id
end
"""
)

# ARGV: ttl, escaped session, count, then per memory: JSON, info JSON, length, number of
# terms, and (term, tf) pairs. Each key is written with a few variadic commands per batch,
# not one command per memory and term.
_ADD = (
    _PRELUDE
    + """
local session, count = ARGV[2], tonumber(ARGV[3])
local first = redis.call('HINCRBY', KEYS[1], 'seq', count) - count
local docs, infos, order, sessions, postings, tfs = {}, {}, {}, {}, {}, {}
local function add(list, a, b)
  list[#list + 1] = a
  list[#list + 1] = b
end
local at, total = 4, 0
for i = 1, count do
  local id = string.format('%d', first + i)
  local length, terms = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  add(docs, id, ARGV[at])
  add(infos, id, ARGV[at + 1])
  add(order, id, id)
  add(sessions, 0, session .. '\\0' .. id)
  at = at + 4
  for _ = 1, terms do
    local term, tf = ARGV[at], ARGV[at + 1]
    add(postings, 0, posting(term, tonumber(tf), length, id))
    add(tfs, term .. '\\0' .. id, tf)
    at = at + 2
  end
  total = total + length
end
local function bulk(command, key, items)
  for i = 1, #items, 4000 do
    redis.call(command, key, unpack(items, i, math.min(i + 3999, #items)))
  end
end
bulk('HSET', KEYS[2], docs)
bulk('HSET', KEYS[6], infos)
bulk('ZADD', KEYS[3], order)
bulk('ZADD', KEYS[7], sessions)
bulk('ZADD', KEYS[4], postings)
bulk('HSET', KEYS[5], tfs)
redis.call('HINCRBY', KEYS[1], 'docs', count)
redis.call('HINCRBY', KEYS[1], 'length', total)
touch(ttl, KEYS)
return count
"""
)

# ARGV: ttl, first position, last position.
_LIST = (
    _PRELUDE
    + """
touch(ttl, KEYS)
local ids = redis.call('ZRANGE', KEYS[3], ARGV[2], ARGV[3])
if #ids == 0 then return {} end
return redis.call('HMGET', KEYS[2], unpack(ids))
"""
)

# ARGV: ttl, escaped session, batch size. Returns how many memories it looked at.
_DELETE_SESSION = (
    _PRELUDE
    + """
local prefix = ARGV[2] .. '\\0'
local members = redis.call(
  'ZRANGEBYLEX', KEYS[7], '[' .. prefix, '(' .. ARGV[2] .. '\\1', 'LIMIT', 0, tonumber(ARGV[3]))
local removed, removed_length = 0, 0
for _, member in ipairs(members) do
  local id = string.sub(member, #prefix + 1)
  local info = redis.call('HGET', KEYS[6], id)
  if info then
    local decoded = cjson.decode(info)
    local length = decoded[1]
    for term, tf in pairs(decoded[2]) do
      redis.call('ZREM', KEYS[4], posting(term, tf, length, id))
      redis.call('HDEL', KEYS[5], term .. '\\0' .. id)
    end
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('ZREM', KEYS[3], id)
    removed = removed + 1
    removed_length = removed_length + length
  end
  redis.call('ZREM', KEYS[7], member)
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[1], 'docs', -removed)
  redis.call('HINCRBY', KEYS[1], 'length', -removed_length)
end
touch(ttl, KEYS)
return #members
"""
)

_DELETE_USER = """
return redis.call('UNLINK', unpack(KEYS))
"""

# ARGV: ttl, top_k, query terms (distinct, in query order).
_SEARCH = (
    _PRELUDE
    + f"""
local K1, B = {BM25_K1!r}, {BM25_B!r}
"""
    + """
local EPSILON, CHUNK = 1e-9, 256
local top_k = tonumber(ARGV[2])
touch(ttl, KEYS)
local stats = redis.call('HMGET', KEYS[1], 'docs', 'length')
local documents = tonumber(stats[1]) or 0
if documents == 0 then return {} end
local avg = (tonumber(stats[2]) or 0) / documents
if avg == 0 then avg = 1.0 end

-- Same arithmetic, in the same order, as text.bm25_score: scores are bit-identical.
local function contribution(idf, tf, length)
  return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg))
end

local function decode(member, term_length)
  local at = term_length + 2
  local tf = 4294967295 - tonumber(string.sub(member, at, at + 7), 16)
  return tf, tonumber(string.sub(member, at + 8, at + 15), 16), string.sub(member, at + 16)
end

-- Query terms that occur, with their idf and the largest contribution any memory can get
-- (tf <= length, and the contribution grows with tf and shrinks with length).
local terms = {}
for i = 3, #ARGV do
  local term = ARGV[i]
  local low, high = '[' .. term .. '\\0', '(' .. term .. '\\1'
  local df = redis.call('ZLEXCOUNT', KEYS[4], low, high)
  if df > 0 then
    local idf = math.log(1.0 + (documents - df + 0.5) / (df + 0.5))
    local tf_max = decode(redis.call('ZRANGEBYLEX', KEYS[4], low, high, 'LIMIT', 0, 1)[1], #term)
    terms[#terms + 1] = {
      term = term, idf = idf, low = low, high = high,
      bound = contribution(idf, tf_max, tf_max),
    }
  end
end
if #terms == 0 then return {} end

-- Read the terms with the largest possible contribution first; rest[p] bounds what the
-- terms read after the p-th can still add.
local order = {}
for i = 1, #terms do order[i] = i end
table.sort(order, function(a, b) return terms[a].bound > terms[b].bound end)
local rest, sum = {}, 0
for p = #order, 1, -1 do
  rest[p] = sum
  sum = sum + terms[order[p]].bound
end

-- The best top_k so far in a min-heap: heap[1] is the one to beat (lowest score, oldest).
local heap = {}
local function worse(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function sift_down(i)
  while true do
    local low, left, right = i, 2 * i, 2 * i + 1
    if left <= #heap and worse(heap[left], heap[low]) then low = left end
    if right <= #heap and worse(heap[right], heap[low]) then low = right end
    if low == i then return end
    heap[i], heap[low] = heap[low], heap[i]
    i = low
  end
end
local function push(entry)
  if #heap < top_k then
    heap[#heap + 1] = entry
    local i = #heap
    while i > 1 and worse(heap[i], heap[math.floor(i / 2)]) do
      heap[i], heap[math.floor(i / 2)] = heap[math.floor(i / 2)], heap[i]
      i = math.floor(i / 2)
    end
  elseif worse(heap[1], entry) then
    heap[1] = entry
    sift_down(1)
  end
end
local function threshold()
  if #heap < top_k then return nil end
  return heap[1][1]
end

-- Scores memories first met in the postings of terms[index]. They contain no term whose
-- postings were read to the end (those memories were all met already), so only the other
-- terms are looked up, most promising first, dropping a memory as soon as it can no
-- longer reach the top_k.
local complete = {}
local function score(index, ids, lengths, tfs)
  local found, known, alive = {}, {}, {}
  for i = 1, #ids do
    found[i] = {[index] = tfs[i]}
    known[i] = contribution(terms[index].idf, tfs[i], lengths[i])
    alive[i] = i
  end
  local unknown, remaining = {}, 0
  for _, j in ipairs(order) do
    if j ~= index and not complete[j] then
      unknown[#unknown + 1] = j
      remaining = remaining + terms[j].bound
    end
  end
  local theta = threshold()
  for _, j in ipairs(unknown) do
    if theta then
      local kept = {}
      for _, i in ipairs(alive) do
        if known[i] + remaining + EPSILON >= theta then kept[#kept + 1] = i end
      end
      alive = kept
    end
    if #alive == 0 then return end
    local fields = {}
    for k, i in ipairs(alive) do fields[k] = terms[j].term .. '\\0' .. ids[i] end
    local values = redis.call('HMGET', KEYS[5], unpack(fields))
    for k, i in ipairs(alive) do
      local tf = tonumber(values[k])
      if tf then
        found[i][j] = tf
        known[i] = known[i] + contribution(terms[j].idf, tf, lengths[i])
      end
    end
    remaining = remaining - terms[j].bound
  end
  for _, i in ipairs(alive) do
    local total = 0.0
    for j = 1, #terms do
      local tf = found[i][j]
      if tf then total = total + contribution(terms[j].idf, tf, lengths[i]) end
    end
    push({total, tonumber(ids[i])})
  end
end

local seen = {}
for p, index in ipairs(order) do
  local t = terms[index]
  local theta = threshold()
  if theta and t.bound + rest[p] + EPSILON < theta then break end
  local low, done, cut = t.low, false, false
  while not done do
    local chunk = redis.call('ZRANGEBYLEX', KEYS[4], low, t.high, 'LIMIT', 0, CHUNK)
    local ids, lengths, tfs = {}, {}, {}
    theta = threshold()
    for _, member in ipairs(chunk) do
      local tf, length, id = decode(member, #t.term)
      if theta then
        -- Everything after this member has a lower tf, or the same tf and a longer text.
        local bound = contribution(t.idf, tf, length)
        if tf > 1 then bound = math.max(bound, contribution(t.idf, tf - 1, tf - 1)) end
        if bound + rest[p] + EPSILON < theta then
          cut = true
          break
        end
      end
      if not seen[id] then
        seen[id] = true
        ids[#ids + 1], lengths[#lengths + 1], tfs[#tfs + 1] = id, length, tf
      end
    end
    if #ids > 0 then score(index, ids, lengths, tfs) end
    if cut or #chunk < CHUNK then
      done = true
    else
      low = '(' .. chunk[#chunk]
    end
  end
  complete[index] = not cut
end

table.sort(heap, function(a, b) return worse(b, a) end)
local ids = {}
for i, entry in ipairs(heap) do ids[i] = string.format('%d', entry[2]) end
return redis.call('HMGET', KEYS[2], unpack(ids))
"""
)


def _add_arguments(ttl: int, session: str, messages: list[Message]) -> list[str | int]:
    args: list[str | int] = [ttl, session, len(messages)]
    for message in messages:
        terms, length = term_frequencies(message)
        info = json.dumps([length, terms], ensure_ascii=False, separators=(",", ":"))
        args += [encode_message(message), info, length, len(terms)]
        for term, tf in terms.items():
            args += [term, tf]
    return args


class RedisMemoryService(RedisBackedService, MemoryService):
    """Long-term memory on Redis or Redis Cluster (managed Redis / Valkey), indexed for search.

    >>> memory = RedisMemoryService(redis_url="redis://localhost:6379/0")

    Takes the same connection arguments as
    :class:`~agentscope_serverless.services.session_history.redis.RedisSessionHistoryService`;
    ``ttl_seconds=None`` (the default) keeps memory forever.
    """

    def _keys(self, user_id: str) -> list[str]:
        base = user_key_prefix(self._redis.key_prefix, "memory", user_id)
        return [f"{base}:{name}" for name in _KEY_NAMES]

    async def _add(self, user_id: str, session_id: str, messages: list[Message]) -> None:
        # Batches go one after the other (memory ids follow the messages' order), but the
        # next batch is prepared while Redis indexes the previous one.
        keys, session = self._keys(user_id), escape(session_id)
        pending: asyncio.Future[Any] | None = None
        try:
            for start in range(0, len(messages), _ADD_BATCH):
                args = _add_arguments(self._ttl, session, messages[start : start + _ADD_BATCH])
                if pending is not None:
                    await pending
                pending = asyncio.ensure_future(self._redis.run(_ADD, keys, args, idempotent=False))
                await asyncio.sleep(0)  # let it send the batch before preparing the next
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()

    async def _search(self, user_id: str, terms: list[str], top_k: int) -> list[Message]:
        raw = await self._redis.run(
            _SEARCH, self._keys(user_id), [self._ttl, top_k, *terms], idempotent=True
        )
        return decode_messages(raw)

    async def _list(self, user_id: str, offset: int, limit: int) -> list[Message]:
        if offset > MAX_POSITION:
            return []
        raw = await self._redis.run(
            _LIST, self._keys(user_id), [self._ttl, offset, offset + limit - 1], idempotent=True
        )
        return decode_messages(raw)

    async def _delete(self, user_id: str, session_id: str | None) -> None:
        keys = self._keys(user_id)
        if session_id is None:
            await self._redis.run(_DELETE_USER, keys, [], idempotent=True)
            return
        while True:
            looked_at = await self._redis.run(
                _DELETE_SESSION,
                keys,
                [self._ttl, escape(session_id), _DELETE_BATCH],
                idempotent=True,
            )
            if int(looked_at) < _DELETE_BATCH:
                return


__all__ = ["RedisMemoryService"]
