"""Long-term memory on Redis (standalone or Cluster) with an inverted index for search.

Every key of user ``U`` (escaped) shares the hash tag ``{U}``; there is a fixed set of
them, so deleting or expiring a user's memory touches the same keys, whatever its size::

    <prefix>:memory:{U}:stats       HASH  seq (last memory id), docs (count), length (tokens),
                                          sorted ("1" once every bucket's ids ascend)
    <prefix>:memory:{U}:docs        HASH  memory id -> message JSON
    <prefix>:memory:{U}:order       ZSET  memory id -> memory id (chronological pages)
    <prefix>:memory:{U}:sessions    ZSET  all scores 0, members "<escaped session>\\0<id>"
    <prefix>:memory:{U}:applied     ZSET  write id -> until (ms): the adds made under an
                                          Idempotency-Key and the steps of every bulk add,
                                          recorded by the script that stores them (a run
                                          of one again stores nothing)
    <prefix>:memory:{U}:entries     HASH  hex id -> "<length> <term>:<tf> <term>:<tf> ..."
    <prefix>:memory:{U}:buckets     ZSET  all scores 0, members "<term>\\0<~tf><length class>"
                                          and "<bucket>\\0<hex id>" (its pages)
    <prefix>:memory:{U}:bucket_ids  HASH  bucket or page -> hex ids of its memories
    <prefix>:memory:{U}:reserved    HASH  write id -> "<the id before those a bulk add
                                          reserved under it> <deletes then>" (forgotten
                                          with the write id; a bulk add has one, with or
                                          without a key)

The postings of a term are grouped in buckets, one per term frequency and length class
(a memory's length in tokens: each length up to 7, then four classes per doubling: 8-9,
10-11, 12-13, 14-15, 16-19, ...), so the BM25 contribution of the term to any memory of a
bucket is at most the one it gives the bucket's shortest possible memory. A term's
buckets are one lexicographic range of ``buckets``, ordered by term frequency
(descending) then length class (ascending): best first (search bounds the buckets left by
the largest of their bounds, which holds whatever length a memory was stored with).

Adding memories appends their ids to the buckets they fall in: each bucket touched is
read and written once, with a few variadic commands for the whole add (a new bucket, rare
once a user has some memory, is one sorted-set insert), instead of a sorted-set insert per
memory and term. A bucket's newest ids are in its tail, the field named after it; each
full 2 KiB of a tail becomes a page of its own, so adding to a bucket copies at most that
much, whatever the bucket's size. Ids are stored as 8 hexadecimal digits ("hex ids"): of
fixed width, they need no separator, a bucket holds ``HSTRLEN / 8`` memories, and a term's
document frequency is the sum over its buckets, with no counter to update per term and
batch (a user can be given 4,294,967,295 memories: ids are not reused). A bucket's ids
ascend through its pages (each named after its first id), then its tail: a bulk add's ids,
reserved before those of adds indexed meanwhile, are merged in their place. Buckets indexed
by earlier releases may not ascend: a user's ``sorted`` statistic says all do (set when the
user has no bucket: from the first add after the user's memory was erased or emptied).

An add of up to 1,000 memories falling in up to 4,000 buckets is one script. A larger one
(more memories, or a document of thousands of distinct words) is stored 1,000 at a time,
then indexed with its postings grouped by bucket over the whole add, 4,000 buckets a step,
so a bucket is written once per add rather than once per thousand memories (100,000
memories of everyday words fall in about 49,000 buckets: 1,000 memories touch 5,000), and
no step holds Redis long. Its ids are reserved
first, and every step is keyed by the add's write id: an add run again under its
Idempotency-Key gets the same ids and does only the steps left. Until its last step,
memories already stored are listed but not yet found by search; a session deleted before
then takes them with it (its delete passes over the buckets not made yet, and the index
steps left index only memories still stored, so no id of theirs is left in a bucket to
count in its term's document frequency). The user's memory erased before then (all
sessions) takes the add's reservation with it: its steps left store nothing, since the ids
they would store under are given again from 1.

Search is one Lua script that ranks exactly like
:func:`~agentscope_serverless.services.memory.text.bm25_score` (ties: newest first): it
reads each query term's buckets best first, scores the memories it meets from their
``entries``, and stops reading a term as soon as no unread memory can still enter the top
``k`` (a threshold algorithm), so a search reads what can match, never the whole memory. A
bucket is read newest first (its tail, then its pages from the last): for the last term
read, once the bucket's best possible contribution cannot beat the top ``k``'s last, nor
tie it being newer, it stops (memories that tie: the newest ``k`` only are read).

Deleting memories (a session's, 500 a script) reads and rewrites, in each bucket they are
in, only its tail and the pages holding them, found from the pages' names; a bucket left
empty goes.

Memory indexed by the layout before this one (an ``info`` hash, a ``postings`` sorted set
of one member per memory and term, and a ``tf`` hash; no release wrote it) is refused by
search, add and session deletion with an error saying so; deleting the user's memory
removes it.

With ``max_messages_per_session`` a session keeps its newest memories: an add that takes
it past them forgets the oldest as a session delete does (postings, statistics and all), in
its own script (a bulk add, after its last step; concurrent adds each trim to the newest, so
none leaves more). An add of more memories than a session keeps stores only its newest.

Memory never expires unless ``ttl_seconds`` is set; then the whole of a user's memory
expires ``ttl_seconds`` after its last use (read or write).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.services._once import WRITE_ID_SECONDS
from agentscope_serverless.services._redis import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_REDIS_URL,
    LUA_TOUCH,
    MAX_POSITION,
    RedisBackedService,
    RedisClient,
    escape,
    glob_escape,
    user_key_prefix,
)
from agentscope_serverless.services._stored import decode_messages
from agentscope_serverless.services._validation import optional_positive_int
from agentscope_serverless.services.idempotency.base import now_ms
from agentscope_serverless.services.memory.base import MemoryService, NewMemory
from agentscope_serverless.services.memory.text import BM25_B, BM25_K1, term_frequencies

_KEY_NAMES = (
    "stats",
    "docs",
    "order",
    "sessions",
    "applied",
    "entries",
    "buckets",
    "bucket_ids",
    "reserved",
    # The earlier layout's index, refused when present and removed with the user.
    "info",
    "postings",
    "tf",
)
# Messages stored per script call: bounds how long one call holds Redis.
_ADD_BATCH = 1000
# A bulk add's postings per index step: bounds how long one step holds Redis too.
_INDEX_BUCKETS = 4000
_INDEX_IDS = 65536
_DELETE_BATCH = 500

_PRELUDE = (
    LUA_TOUCH
    + """
local STATS, DOCS, ORDER, SESSIONS, APPLIED = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ENTRIES, BUCKETS, BUCKET_IDS, RESERVED = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local EARLIER_LAYOUT = KEYS[10]
local ttl = tonumber(ARGV[1])

local function earlier_layout()
  if redis.call('EXISTS', EARLIER_LAYOUT) == 1 then
    return redis.error_reply(
      'this memory was indexed by an earlier development layout: delete the memory of the '
      .. 'user and add it again')
  end
end

-- Full pages of PAGE bytes leave a bucket's tail, each named "<bucket>\\0<its first hex id>".
local PAGE = 2048

local function hex(id)
  return string.format('%08x', id)
end

-- As _bucket_suffix(tf, _length_class(length)) in Python.
local function bucket(term, tf, length)
  local class = length
  if length >= 4 then
    local bits, top = 3, length
    while top >= 8 do
      bits = bits + 1
      top = math.floor(top / 2)
    end
    class = bits * 4 + top - 4
  end
  return term .. '\\0' .. string.format('%08x%02x', 4294967295 - tf, class)
end

-- An entry: '<length> <term>:<tf> <term>:<tf> ...' (terms hold neither ' ' nor ':').
local function entry_length(entry)
  return tonumber(string.match(entry, '^%d+'))
end
local function entry_tf(entry, term)
  local at = string.find(entry, ' ' .. term .. ':', 1, true)
  if not at then return nil end
  return tonumber(string.match(entry, '^%d+', at + #term + 2))
end

local function add(list, a, b)
  list[#list + 1] = a
  list[#list + 1] = b
end
local function bulk(command, key, items)
  for i = 1, #items, 4000 do
    redis.call(command, key, unpack(items, i, math.min(i + 3999, #items)))
  end
end
"""
)

# Forgets memories of a session: members of SESSIONS ("<escaped session>\\0<id>"), at
# most a delete batch.
_FORGETTING = """
-- The text of a bucket's tail or page without the hex ids given, and those it did not hold.
local function drop(text, hex_ids)
  local at, absent = {}, {}
  for _, id in ipairs(hex_ids) do
    local from, found = 1, nil
    repeat
      found = string.find(text, id, from, true)
      if found then from = found + 1 end
    until not found or found % 8 == 1
    if found then at[#at + 1] = found else absent[#absent + 1] = id end
  end
  if #at == 0 then return text, absent end
  table.sort(at)
  local pieces, from = {}, 1
  for _, found in ipairs(at) do
    pieces[#pieces + 1] = string.sub(text, from, found - 1)
    from = found + 8
  end
  pieces[#pieces + 1] = string.sub(text, from)
  return table.concat(pieces), absent
end

-- Removes hex ids from a bucket, reading and writing only its tail and the pages holding
-- them: its ids ascend through its pages (each named after its first id), then its tail.
-- A bucket left empty goes. In memory indexed before ids were kept in order (no 'sorted'
-- in STATS), an id not where it would be is looked for in the bucket's other pages.
local function unindex(name, hex_ids, sorted)
  local tail = redis.call('HGET', BUCKET_IDS, name)
  -- None yet when a bulk add stored the memory and has still to index it.
  if not tail then return end
  local ids = {}
  for k, id in ipairs(hex_ids) do ids[k] = tonumber(id, 16) end
  table.sort(ids, function(a, b) return a > b end)
  local tail_first = #tail > 0 and tonumber(string.sub(tail, 1, 8), 16) or nil
  local pages, wanted, absent = {}, {[name] = {}}, {}
  local page, first = nil, nil
  for _, id in ipairs(ids) do
    local field = name
    if not tail_first or id < tail_first then
      -- The page named after the largest first id up to this one (newest first: a page
      -- found serves the ids down to its first).
      if page == nil or (page and id < first) then
        local found = redis.call(
          'ZREVRANGEBYLEX', BUCKETS, '[' .. name .. '\\0' .. hex(id), '(' .. name, 'LIMIT', 0, 1)
        page = found[1] or false
        first = page and tonumber(string.sub(page, -8), 16)
      end
      field = page
    end
    if field then
      if not wanted[field] then
        wanted[field] = {}
        pages[#pages + 1] = field
      end
      wanted[field][#wanted[field] + 1] = hex(id)
    else
      absent[#absent + 1] = hex(id)
    end
  end
  local texts, changed = {[name] = tail}, {}
  local function load(names)
    for i = 1, #names, 1000 do
      local last = math.min(i + 999, #names)
      local got = redis.call('HMGET', BUCKET_IDS, unpack(names, i, last))
      for k = i, last do texts[names[k]] = got[k - i + 1] or '' end
    end
  end
  local function remove(field, list)
    local text, left = drop(texts[field], list)
    if #left < #list then
      texts[field] = text
      if not changed[field] then
        changed[field] = true
        changed[#changed + 1] = field
      end
    end
    return left
  end
  load(pages)
  for _, id in ipairs(remove(name, wanted[name])) do absent[#absent + 1] = id end
  for _, field in ipairs(pages) do
    for _, id in ipairs(remove(field, wanted[field])) do absent[#absent + 1] = id end
  end
  if #absent > 0 and not sorted then
    local others = {}
    for _, member in ipairs(
      redis.call('ZRANGEBYLEX', BUCKETS, '(' .. name, '(' .. name .. '\\1')
    ) do
      if not texts[member] then others[#others + 1] = member end
    end
    load(others)
    for _, field in ipairs(others) do
      if #absent == 0 then break end
      absent = remove(field, absent)
    end
  end
  local fields, emptied = {}, {}
  for _, field in ipairs(changed) do
    if field ~= name and texts[field] == '' then
      emptied[#emptied + 1] = field
    else
      add(fields, field, texts[field])
    end
  end
  if #emptied > 0 then
    bulk('HDEL', BUCKET_IDS, emptied)
    bulk('ZREM', BUCKETS, emptied)
  end
  if #fields > 0 then bulk('HSET', BUCKET_IDS, fields) end
  if texts[name] == ''
    and redis.call('ZLEXCOUNT', BUCKETS, '(' .. name, '(' .. name .. '\\1') == 0 then
    redis.call('HDEL', BUCKET_IDS, name)
    redis.call('ZREM', BUCKETS, name)
  end
end

local function forget(forgotten, prefix)
  local ids, hex_ids = {}, {}
  for k, member in ipairs(forgotten) do
    ids[k] = string.sub(member, #prefix + 1)
    hex_ids[k] = hex(tonumber(ids[k]))
  end
  local stored = redis.call('HMGET', ENTRIES, unpack(hex_ids))
  local removed, removed_hex, removed_length = {}, {}, 0
  local bucket_names, dropped = {}, {}
  for k, id in ipairs(hex_ids) do
    local entry = stored[k]
    if entry then
      local length = entry_length(entry)
      for term, tf in string.gmatch(entry, ' ([^ :]+):(%d+)') do
        local name = bucket(term, tonumber(tf), length)
        local list = dropped[name]
        if not list then
          list = {}
          dropped[name] = list
          bucket_names[#bucket_names + 1] = name
        end
        list[#list + 1] = id
      end
      removed[#removed + 1] = ids[k]
      removed_hex[#removed_hex + 1] = id
      removed_length = removed_length + length
    end
  end
  if #removed > 0 then
    redis.call('HDEL', DOCS, unpack(removed))
    redis.call('HDEL', ENTRIES, unpack(removed_hex))
    redis.call('ZREM', ORDER, unpack(removed))
    local sorted = redis.call('HGET', STATS, 'sorted') == '1'
    for _, name in ipairs(bucket_names) do unindex(name, dropped[name], sorted) end
    redis.call('HINCRBY', STATS, 'docs', string.format('%d', -#removed))
    redis.call('HINCRBY', STATS, 'length', string.format('%d', -removed_length))
    redis.call('HINCRBY', STATS, 'deletes', 1)  -- bulk adds in flight: see _INDEX
  end
  redis.call('ZREM', SESSIONS, unpack(forgotten))
end

-- Forgets the oldest memories of a session past its newest keep (0: no cap), at most most
-- of them; returns how many are still past it.
local function trim(session, keep, most)
  if keep == 0 then return 0 end
  local prefix = session .. '\\0'
  local members = redis.call('ZRANGEBYLEX', SESSIONS, '[' .. prefix, '(' .. session .. '\\1')
  local over = #members - keep
  if over <= 0 then return 0 end
  local function id(member) return tonumber(string.sub(member, #prefix + 1)) end
  table.sort(members, function(a, b) return id(a) < id(b) end)
  local oldest = math.min(over, most)
  forget({unpack(members, 1, oldest)}, prefix)
  return over - oldest
end
"""

# What every add does. The last three ARGV of an add are its write id ('' for none), now
# (ms) and until when it is remembered (ms).
_ADDING = (
    _PRELUDE
    + """
local refused = earlier_layout()
if refused then return refused end
local write_id = ARGV[#ARGV - 2]

-- False when the write id was applied already; forgets the expired ones (with the ids
-- they reserved).
local function first_time()
  if write_id == '' then return true end
  local now = ARGV[#ARGV - 1]
  local expired = redis.call('ZRANGEBYSCORE', APPLIED, '-inf', now)
  if #expired > 0 then
    bulk('HDEL', RESERVED, expired)
    redis.call('ZREMRANGEBYSCORE', APPLIED, '-inf', now)
  end
  if redis.call('ZSCORE', APPLIED, write_id) then return false end
  redis.call('ZADD', APPLIED, ARGV[#ARGV], write_id)
  return true
end

-- The last memory id given; an add that would give ids past 4,294,967,295 is refused
-- before it writes anything.
local function last_id(count)
  local last = tonumber(redis.call('HGET', STATS, 'seq')) or 0
  if last + count > 4294967295 then error({err = 'memory ids exhausted'}) end
  return last
end

-- Stores count memories under the ids after the id given: their JSON in ARGV[at + 1 ..],
-- then their entries.
local function store(after, count, session, at)
  local docs, entries, order, sessions = {}, {}, {}, {}
  local total = 0
  for i = 1, count do
    local id = string.format('%d', after + i)
    add(docs, id, ARGV[at + i])
    local entry = ARGV[at + count + i]
    add(entries, hex(after + i), entry)
    add(order, id, id)
    add(sessions, 0, session .. '\\0' .. id)
    total = total + entry_length(entry)
  end
  bulk('HSET', DOCS, docs)
  bulk('HSET', ENTRIES, entries)
  bulk('ZADD', ORDER, order)
  bulk('ZADD', SESSIONS, sessions)
  redis.call('HINCRBY', STATS, 'docs', count)
  redis.call('HINCRBY', STATS, 'length', total)
end

-- The newest id of a bucket whose tail is empty (in its last page), or nil.
local function last_page_id(name)
  local page = redis.call(
    'ZREVRANGEBYLEX', BUCKETS, '(' .. name .. '\\1', '(' .. name, 'LIMIT', 0, 1)[1]
  if not page then return nil end
  return tonumber(string.sub(redis.call('HGET', BUCKET_IDS, page) or '', -8), 16)
end

-- The ids of a bucket from the page its first new id falls in (those pages forgotten),
-- merged with the new ids (hex, ascending), newer ids than some of them being there already.
local function merged(name, tail, ids)
  local from = redis.call('ZREVRANGEBYLEX', BUCKETS, '[' .. name .. '\\0' .. string.sub(ids, 1, 8),
    '(' .. name, 'LIMIT', 0, 1)[1]
  local pages = redis.call(
    'ZRANGEBYLEX', BUCKETS, from and '[' .. from or '(' .. name, '(' .. name .. '\\1')
  local held = {}
  for i = 1, #pages, 1000 do
    local last = math.min(i + 999, #pages)
    for _, text in ipairs(redis.call('HMGET', BUCKET_IDS, unpack(pages, i, last))) do
      held[#held + 1] = text or ''
    end
  end
  bulk('HDEL', BUCKET_IDS, pages)
  bulk('ZREM', BUCKETS, pages)
  held[#held + 1] = tail
  local old, out, a, b = table.concat(held), {}, 1, 1
  local x, y = tonumber(string.sub(old, 1, 8), 16), tonumber(string.sub(ids, 1, 8), 16)
  while x and y do
    if x < y then
      out[#out + 1] = string.sub(old, a, a + 7)
      a = a + 8
      x = tonumber(string.sub(old, a, a + 7), 16)
    else
      out[#out + 1] = string.sub(ids, b, b + 7)
      b = b + 8
      y = tonumber(string.sub(ids, b, b + 7), 16)
    end
  end
  out[#out + 1] = string.sub(old, a)
  out[#out + 1] = string.sub(ids, b)
  return table.concat(out)
end

-- Appends hex ids (ascending) to buckets: each bucket's tail is read and written once, a
-- thousand buckets at a time (a new bucket is one sorted-set insert), and its full pages
-- leave it. Ids given before newer ones were indexed (a bulk add's, reserved before: older)
-- are merged in their place, so a bucket's ids always ascend. With no bucket yet, STATS
-- says so ('sorted'): every bucket is in order.
local function index(names, ids, older)
  if redis.call('EXISTS', BUCKETS) == 0 then redis.call('HSET', STATS, 'sorted', '1') end
  local created = {}
  for i = 1, #names, 1000 do
    local last = math.min(i + 999, #names)
    local tails = redis.call('HMGET', BUCKET_IDS, unpack(names, i, last))
    local fields = {}
    for k = i, last do
      local name, tail = names[k], tails[k - i + 1]
      if not tail then
        add(created, 0, name)
        tail = ''
      end
      local newest = nil
      if older and tails[k - i + 1] then
        newest = #tail > 0 and tonumber(string.sub(tail, -8), 16) or last_page_id(name)
      end
      if newest and newest > tonumber(string.sub(ids[k], 1, 8), 16) then
        tail = merged(name, tail, ids[k])
      else
        tail = tail .. ids[k]
      end
      local at = 1
      while #tail - at + 1 >= PAGE do
        local page = name .. '\\0' .. string.sub(tail, at, at + 7)
        add(created, 0, page)
        add(fields, page, string.sub(tail, at, at + PAGE - 1))
        at = at + PAGE
      end
      add(fields, name, string.sub(tail, at))
    end
    bulk('HSET', BUCKET_IDS, fields)
  end
  bulk('ZADD', BUCKETS, created)
end
"""
)

# One batch, stored and indexed in one step, then the session trimmed to the memories it
# keeps. ARGV: ttl, escaped session, count, then per memory its JSON, then per memory its
# entry, then the buckets ("<bucket>\t<positions in the batch, 0-based, space-separated>\n"
# each), the memories a session keeps (0: all), the most forgotten here, then the write id,
# now and until. Returns how many memories of the session are still past those it keeps.
_ADD = (
    _ADDING
    + _FORGETTING
    + """
local count = tonumber(ARGV[3])
local after = last_id(count)
if not first_time() then
  touch(ttl, KEYS)
  return 0
end
redis.call('HINCRBY', STATS, 'seq', count)
store(after, count, ARGV[2], 3)
local hex_ids, names, ids = {}, {}, {}
for i = 1, count do hex_ids[string.format('%d', i - 1)] = hex(after + i) end
for name, at in string.gmatch(ARGV[4 + 2 * count], '([^\\t]+)\\t([^\\n]+)\\n') do
  names[#names + 1] = name
  ids[#ids + 1] = string.gsub(at, '(%d+) ?', hex_ids)
end
index(names, ids)
local over = trim(ARGV[2], tonumber(ARGV[5 + 2 * count]), tonumber(ARGV[6 + 2 * count]))
touch(ttl, KEYS)
return over
"""
)

# A bulk add takes three kinds of steps: its ids reserved (the id before them is returned,
# the same when the write id was applied already), its memories stored a batch at a time,
# then their ids added to the buckets, grouped over the whole add. Each step has its own
# write id.

# ARGV: ttl, count, write id, now, until.
_RESERVE = (
    _ADDING
    + """
local count = tonumber(ARGV[2])
local after = last_id(count)
if first_time() then
  redis.call('HINCRBY', STATS, 'seq', count)
  if write_id ~= '' then
    -- With the deletes made so far: its index steps look for deleted memories only after
    -- another delete.
    local deletes = redis.call('HGET', STATS, 'deletes') or '0'
    redis.call('HSET', RESERVED, write_id, string.format('%d', after) .. ' ' .. deletes)
  end
else
  local reserved = redis.call('HGET', RESERVED, write_id)
  after = reserved and tonumber(string.match(reserved, '^%d+')) or nil
end
touch(ttl, KEYS)
return after
"""
)

# ARGV: ttl, escaped session, the id before the batch's, count, the write id of the add's
# reservation, then per memory its JSON, then per memory its entry, then the write id, now
# and until. A reservation gone was erased with the user's memory (after which its ids are
# given again): the add's memories left are not stored, as if they came before the erase.
_STORE = (
    _ADDING
    + """
if first_time() and redis.call('HEXISTS', RESERVED, ARGV[5]) == 1 then
  store(tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[2], 5)
end
touch(ttl, KEYS)
return 0
"""
)

# ARGV: ttl, the buckets ("<bucket>\t<hex ids>\n" each), the write id of the add's
# reservation, then the write id, now and until. Only memories still stored are indexed:
# one deleted since its batch was stored (its session's memories) would stay in the
# buckets, found by no delete, counted by every search of its words. Nothing is once the
# reservation is gone: the ids may then be other memories' (see _STORE).
_INDEX = (
    _ADDING
    + """
local reserved = first_time() and redis.call('HGET', RESERVED, ARGV[3])
if reserved then
  local names, ids, stored = {}, {}, {}
  -- Each memory is looked up only when memories were deleted since the reservation.
  local deletes = redis.call('HGET', STATS, 'deletes') or '0'
  local look_up = string.match(reserved, ' (%d+)$') ~= deletes
  for name, at in string.gmatch(ARGV[2], '([^\\t]+)\\t([^\\n]+)\\n') do
    if look_up then
      local kept = {}
      for i = 1, #at, 8 do
        local id = string.sub(at, i, i + 7)
        if stored[id] == nil then stored[id] = redis.call('HEXISTS', ENTRIES, id) == 1 end
        if stored[id] then kept[#kept + 1] = id end
      end
      at = table.concat(kept)
    end
    if #at > 0 then
      names[#names + 1] = name
      ids[#ids + 1] = at
    end
  end
  index(names, ids, true)
end
touch(ttl, KEYS)
return 0
"""
)

# ARGV: ttl, first position, last position.
_LIST = (
    _PRELUDE
    + """
touch(ttl, KEYS)
local ids = redis.call('ZRANGE', ORDER, ARGV[2], ARGV[3])
if #ids == 0 then return {} end
return redis.call('HMGET', DOCS, unpack(ids))
"""
)

# ARGV: ttl, escaped session, batch size. Returns how many memories it looked at.
_DELETE_SESSION = (
    _PRELUDE
    + _FORGETTING
    + """
local refused = earlier_layout()
if refused then return refused end
local prefix = ARGV[2] .. '\\0'
local members = redis.call(
  'ZRANGEBYLEX', SESSIONS, '[' .. prefix, '(' .. ARGV[2] .. '\\1', 'LIMIT', 0, tonumber(ARGV[3]))
if #members > 0 then forget(members, prefix) end
touch(ttl, KEYS)
return #members
"""
)

# ARGV: ttl, escaped session, memories kept, batch size. Returns how many memories are still
# past those kept.
_TRIM = (
    _PRELUDE
    + _FORGETTING
    + """
local refused = earlier_layout()
if refused then return refused end
local over = trim(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
touch(ttl, KEYS)
return over
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
local refused = earlier_layout()
if refused then return refused end
local EPSILON, CHUNK = 1e-9, 256
local top_k = tonumber(ARGV[2])
touch(ttl, KEYS)
local stats = redis.call('HMGET', STATS, 'docs', 'length', 'sorted')
local documents = tonumber(stats[1]) or 0
if documents == 0 then return {} end
local avg = (tonumber(stats[2]) or 0) / documents
if avg == 0 then avg = 1.0 end
-- Whether every bucket's ids ascend (see index), so that one read newest first can stop
-- on ties.
local sorted = stats[3] == '1'

-- Same arithmetic, in the same order, as text.bm25_score: scores are bit-identical.
local function contribution(idf, tf, length)
  return idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg))
end

-- The term frequency of a bucket of a term of term_length bytes, and the shortest length
-- a memory of the bucket can have: where its length class starts. Not the tf: a memory
-- added by an earlier release may hold a token more often than its length counts.
local function decode(name, term_length)
  local at = term_length + 2
  local tf = 4294967295 - tonumber(string.sub(name, at, at + 7), 16)
  local class = tonumber(string.sub(name, at + 8, at + 9), 16)
  if class < 4 then return tf, class end
  return tf, (class % 4 + 4) * 2 ^ (math.floor(class / 4) - 3)
end

-- Query terms that occur: their buckets (each with its pages, oldest first), best first,
-- their idf (df: 8 bytes per memory in them) and bounds[b], the largest contribution a
-- memory of the b-th bucket or a later one can get (the contribution grows with tf and
-- shrinks with length).
local terms = {}
for i = 3, #ARGV do
  local term = ARGV[i]
  local members = redis.call('ZRANGEBYLEX', BUCKETS, '[' .. term .. '\\0', '(' .. term .. '\\1')
  local df, buckets = 0, {}
  for _, member in ipairs(members) do
    df = df + redis.call('HSTRLEN', BUCKET_IDS, member) / 8
    local name = string.sub(member, 1, #term + 11)  -- a page's name: "<bucket>\\0<hex id>"
    if #buckets == 0 or buckets[#buckets].name ~= name then
      buckets[#buckets + 1] = {name = name, pages = {}}
    end
    if #member > #name then table.insert(buckets[#buckets].pages, member) end
  end
  if df > 0 then
    local idf = math.log(1.0 + (documents - df + 0.5) / (df + 0.5))
    local bounds, most = {}, 0
    for b = #buckets, 1, -1 do
      most = math.max(most, contribution(idf, decode(buckets[b].name, #term)))
      bounds[b] = most
    end
    terms[#terms + 1] = {
      term = term, idf = idf, buckets = buckets, bounds = bounds, bound = bounds[1],
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

-- Scores memories from their entries: every query term they contain, in query order.
local function score(ids)
  local entries = redis.call('HMGET', ENTRIES, unpack(ids))
  for k, id in ipairs(ids) do
    local entry = entries[k]
    if entry then
      local length = entry_length(entry)
      local total = 0.0
      for j = 1, #terms do
        local tf = entry_tf(entry, terms[j].term)
        if tf then total = total + contribution(terms[j].idf, tf, length) end
      end
      push({total, tonumber(id, 16)})
    end
  end
end

-- A memory met again in a later term's buckets was scored in full already. One met but
-- left unscored because of a cut cannot enter the top k: its score is below the bound
-- that made the cut, and the threshold only rises.
local seen = {}
for p, index in ipairs(order) do
  local t = terms[index]
  local theta = threshold()
  if theta and t.bound + rest[p] + EPSILON < theta then break end
  local cut = false
  for n, b in ipairs(t.buckets) do
    -- No memory of this bucket gets more than one of its tf as short as its length class
    -- allows (whatever the length stored): top. None of it or of a later bucket gets more
    -- than bound.
    local top = contribution(t.idf, decode(b.name, #t.term))
    local bound = t.bounds[n]
    -- Newest first: the tail, then the pages from the last.
    local fields = {b.name}
    for k = #b.pages, 1, -1 do fields[#fields + 1] = b.pages[k] end
    local fresh, passed = {}, false
    for _, field in ipairs(fields) do
      local ids = redis.call('HGET', BUCKET_IDS, field) or ''
      for at = #ids - 7, 1, -8 do
        local id = string.sub(ids, at, at + 7)
        if #heap >= top_k then
          local low = heap[1]
          if bound + rest[p] + EPSILON < low[1] then
            cut = true
            break
          end
          -- With no term left after this one, a memory first met here scores its
          -- contribution for this term exactly, at most top: once that cannot beat the
          -- one to beat, nor tie it being newer, neither can the older memories left.
          if sorted and rest[p] == 0
            and (top < low[1] or (top == low[1] and tonumber(id, 16) < low[2])) then
            passed = true
            break
          end
        end
        if not seen[id] then
          seen[id] = true
          fresh[#fresh + 1] = id
          if #fresh == CHUNK or (#heap < top_k and #heap + #fresh >= top_k) then
            score(fresh)
            fresh = {}
          end
        end
      end
      if cut or passed then break end
    end
    if #fresh > 0 then score(fresh) end
    if cut then break end
  end
end

table.sort(heap, function(a, b) return worse(b, a) end)
local ids = {}
for i, entry in ipairs(heap) do ids[i] = string.format('%d', entry[2]) end
return redis.call('HMGET', DOCS, unpack(ids))
"""
)


def _analysed(memories: list[NewMemory]) -> Iterator[tuple[Counter[str], int, str]]:
    """Each memory's term counts, its length class and its entry."""
    for memory in memories:
        counts, length = term_frequencies(memory.text)
        # Tokens hold neither spaces, colons, tabs nor line breaks: they separate here.
        entry = f"{length} " + " ".join([f"{term}:{tf}" for term, tf in counts.items()])
        yield counts, _length_class(length), entry


def _add_arguments(
    ttl: int, session: str, memories: list[NewMemory], keep: int
) -> list[str | int] | None:
    """The arguments of ``_ADD`` but its write id: postings as positions in the batch.

    None when the memories fall in more buckets than one step indexes (a long document of
    thousands of distinct words is enough): indexed in one script, they would hold Redis,
    for every user, as long as a bulk add's steps together.
    """
    entries: list[str] = []
    buckets: defaultdict[tuple[str, int, int], list[str]] = defaultdict(list)
    for position, (counts, length_class, entry) in enumerate(_analysed(memories)):
        at = str(position)
        for term, tf in counts.items():
            buckets[term, tf, length_class].append(at)
        if len(buckets) > _INDEX_BUCKETS:
            return None
        entries.append(entry)
    lines = "".join(
        f"{term}\0{_bucket_suffix(tf, length_class)}\t{' '.join(at)}\n"
        for (term, tf, length_class), at in buckets.items()
    )
    raws = (m.raw for m in memories)
    return [ttl, session, len(memories), *raws, *entries, lines, keep, _DELETE_BATCH]


def _bulk_steps(
    ttl: int, session: str, memories: list[NewMemory], after: int, reservation: str
) -> Iterator[tuple[str, list[str | int]]]:
    """The scripts and arguments (but write ids) storing ``memories`` under the ids after
    ``after`` (reserved by the step whose write id is ``reservation``), then indexing them:
    postings grouped by bucket over the whole add, so each bucket is written once (or once
    per step it spans), not once per batch."""
    # (tf, length class) packed -> term -> hex ids: no tuple made per posting.
    postings: dict[int, defaultdict[str, list[str]]] = {}
    for start in range(0, len(memories), _ADD_BATCH):
        batch = memories[start : start + _ADD_BATCH]
        entries: list[str] = []
        for id_, (counts, length_class, entry) in enumerate(_analysed(batch), after + start + 1):
            hex_id = f"{id_:08x}"
            once = postings.get(1 << 8 | length_class)  # most terms are in a memory once
            if once is None:
                once = postings[1 << 8 | length_class] = defaultdict(list)
            for term, tf in counts.items():
                if tf == 1:
                    once[term].append(hex_id)
                    continue
                key = tf << 8 | length_class
                group = postings.get(key)
                if group is None:
                    group = postings[key] = defaultdict(list)
                group[term].append(hex_id)
            entries.append(entry)
        raws = (m.raw for m in batch)
        yield _STORE, [ttl, session, after + start, len(batch), reservation, *raws, *entries]
    lines: list[str] = []
    room = _INDEX_IDS
    for packed, group in postings.items():
        suffix = _bucket_suffix(packed >> 8, packed & 0xFF)
        for term, ids in group.items():
            at = 0
            while at < len(ids):
                taken = ids[at : at + room]
                lines.append(f"{term}\0{suffix}\t{''.join(taken)}\n")
                at += len(taken)
                room -= len(taken)
                if room == 0 or len(lines) == _INDEX_BUCKETS:
                    yield _INDEX, [ttl, "".join(lines), reservation]
                    lines, room = [], _INDEX_IDS
    if lines:
        yield _INDEX, [ttl, "".join(lines), reservation]


def _length_class(length: int) -> int:
    """Each length up to 7, then four classes per doubling (8-9, 10-11, ..., 16-19, ...).

    >>> [_length_class(n) for n in (3, 7, 8, 9, 10, 16, 19, 20)]
    [3, 15, 16, 16, 17, 20, 20, 21]
    """
    if length < 4:
        return length
    bits = length.bit_length()
    return bits * 4 + (length >> (bits - 3)) - 4


def _bucket_suffix(tf: int, length_class: int) -> str:
    """What follows ``<term>\\0`` in a bucket's name (``bucket`` in the scripts)."""
    return f"{0xFFFFFFFF - tf:08x}{length_class:02x}"


class RedisMemoryService(RedisBackedService, MemoryService):
    """Long-term memory on Redis or Redis Cluster (managed Redis / Valkey), indexed for search.

    >>> memory = RedisMemoryService(redis_url="redis://localhost:6379/0")

    Takes the same connection arguments as
    :class:`~agentscope_serverless.services.session_history.redis.RedisSessionHistoryService`;
    ``ttl_seconds=None`` (the default) keeps memory forever;
    ``max_messages_per_session`` keeps only the newest memories of each session (as
    AgentScope Runtime's), the older ones forgotten by the add that passes it.
    """

    def __init__(
        self,
        redis_url: str = DEFAULT_REDIS_URL,
        redis_client: RedisClient | None = None,
        socket_timeout: float | None = 5.0,
        socket_connect_timeout: float | None = 5.0,
        max_connections: int | None = None,
        retry_on_timeout: bool = True,
        ttl_seconds: int | None = None,
        max_messages_per_session: int | None = None,
        health_check_interval: float = 30.0,
        socket_keepalive: bool = True,
        *,
        password: str | None = None,
        cluster: bool = False,
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self._keep = (
            optional_positive_int(max_messages_per_session, field="max_messages_per_session") or 0
        )
        super().__init__(
            redis_url,
            redis_client,
            socket_timeout,
            socket_connect_timeout,
            max_connections,
            retry_on_timeout,
            ttl_seconds,
            health_check_interval,
            socket_keepalive,
            password=password,
            cluster=cluster,
            key_prefix=key_prefix,
        )

    async def _clear_all(self) -> None:
        await self._redis.unlink_matching(f"{glob_escape(self._redis.key_prefix)}:memory:*")

    def _keys(self, user_id: str) -> list[str]:
        base = user_key_prefix(self._redis.key_prefix, "memory", user_id)
        return [f"{base}:{name}" for name in _KEY_NAMES]

    async def _add(
        self, user_id: str, session_id: str, memories: list[NewMemory], write_id: str | None
    ) -> None:
        keys, session = self._keys(user_id), escape(session_id)
        if self._keep:
            memories = memories[-self._keep :]  # the older ones would be forgotten at once
        args = None
        if len(memories) <= _ADD_BATCH:
            args = _add_arguments(self._ttl, session, memories, self._keep)
        if args is not None:
            # Stored, indexed and the session trimmed in one step.
            if int(await self._keyed(_ADD, keys, args, write_id, "0")) > 0:
                await self._trim(keys, session)
            return
        # Keyed without an Idempotency-Key too: its steps check that its ids are still
        # reserved under its write id.
        write_id = write_id or uuid.uuid4().hex
        after = await self._keyed(_RESERVE, keys, [self._ttl, len(memories)], write_id, "ids")
        # One step after the other, but each is prepared while Redis runs the previous one.
        pending: asyncio.Future[Any] | None = None
        try:
            for number, (script, args) in enumerate(
                _bulk_steps(self._ttl, session, memories, int(after), f"{write_id}:ids")
            ):
                if pending is not None:
                    await pending
                pending = asyncio.ensure_future(
                    self._keyed(script, keys, args, write_id, str(number))
                )
                await asyncio.sleep(0)  # let it send the step before preparing the next
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
        if self._keep:
            await self._trim(keys, session)

    async def _trim(self, keys: list[str], session: str) -> None:
        """Forget the oldest memories of ``session`` past the newest it keeps."""
        args = [self._ttl, session, self._keep, _DELETE_BATCH]
        while int(await self._redis.run(_TRIM, keys, args, idempotent=True)) > 0:
            pass

    async def _keyed(
        self, script: str, keys: list[str], args: list[str | int], write_id: str | None, step: str
    ) -> Any:
        """Runs an add's ``script``: a step with a write id is applied once, so it may be
        sent again."""
        at = now_ms()
        step_id = "" if write_id is None else f"{write_id}:{step}"
        args = [*args, step_id, at, at + WRITE_ID_SECONDS * 1000]
        return await self._redis.run(script, keys, args, idempotent=write_id is not None)

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
