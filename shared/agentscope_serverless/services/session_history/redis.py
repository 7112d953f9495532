"""Session history on Redis (standalone or Cluster), one round trip per operation.

Keys of user ``U`` (escaped, in the hash tag) and session ``S`` (escaped)::

    <prefix>:session:{U}:sessions        ZSET  session id -> creation order (the user's index)
    <prefix>:session:{U}:counter         STRING creation counter
    <prefix>:session:{U}:generation      STRING the counter's generation (random, set when
                                               the counter starts: list cursors name it)
    <prefix>:session:{U}:expiry          ZSET  session id -> expiry in ms (only with a TTL)
    <prefix>:session:{U}:s:S:meta        HASH  order, generation (random: tells the session
                                               from an earlier one of its id), dropped
                                               (every message numbered below it was
                                               trimmed or deleted), summary (when one is
                                               kept)
    <prefix>:session:{U}:s:S:messages    LIST  message JSON, in append order
    <prefix>:session:{U}:s:S:ids         HASH  message id -> its number (appends skip known ids)
    <prefix>:session:{U}:s:S:gone        ZSET  the numbers of the messages deleted, from
                                               dropped on (member and score)
    <prefix>:session:{U}:s:S:ids:order   LIST  message ids in append order (only with
                                               ``max_messages_per_session``: the trimmed
                                               messages' ids leave the hash with them)
    <prefix>:session:{U}:s:S:marks       HASH  message id -> its marks (a JSON list)

Appending is one ``RPUSH`` (plus ``LTRIM`` with ``max_messages_per_session``, which drops
the trimmed messages' ids too, so a session kept to N messages stays that size): O(1) per
message and atomic, so concurrent appends all land in one order. An append of messages
whose ids their sender gave appends none of them when the session holds one of their ids
(in the same script): what it holds is answered, refused when it says something else, else
the others are appended. A session read returns
its messages as stored and decodes them on first use; without a TTL, reading a whole
session is a ``MULTI`` of ``EXISTS`` and ``LRANGE``. Listing reads the user's index, never
``SCAN``. With ``ttl_seconds`` every read and write refreshes the session's and the index's
expiry (a page of sessions listed: theirs, in a second script); index entries of expired
sessions are dropped when the index is read.

Each message gets a number when it is appended (the session's count of messages appended
before it), never given again nor changed: a ``list_messages`` cursor holds the number to
read on from, so deleting messages neither skips nor repeats one for a reader paging through
the session (and a digest of the session's user, id and generation, so it pages no other
session, nor a later one of the same id: the creation order would not do, as the counter
giving it starts again once the user's data is erased or expires). A message's place in
the list is its number, less ``dropped`` and the deleted numbers below it (one ``ZCOUNT``).
Deleting messages (one script) removes them from the list, O(n) in the session's length,
and adds their numbers to ``gone``, which a trim prunes below the oldest message kept;
marks are updated in one script too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentscope_serverless.schemas.agent_schemas import Message
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._redis import (
    DEFAULT_KEY_PREFIX,
    DEFAULT_REDIS_URL,
    LUA_DELETE_KEYS,
    MAX_POSITION,
    RedisBackedService,
    RedisClient,
    RedisWrite,
    ScriptCall,
    escape,
    text,
    user_key_prefix,
)
from agentscope_serverless.services._stored import (
    decode_messages,
    encode_message,
    stored_session,
)
from agentscope_serverless.services._validation import (
    check_cursor_listing,
    check_cursor_session,
    listing_cursor,
    listing_cursor_position,
    listing_tag,
    new_session_generation,
    optional_positive_int,
    session_cursor,
    session_cursor_position,
    session_tag,
)
from agentscope_serverless.services.session_history.base import SessionHistoryService

# KEYS: meta, messages, index, expiry, counter, ids, id order, marks, gone, counter
# generation. ARGV: ttl, session id, ...
#
# index_of: where in the list the first message numbered ``number`` or more is (``dropped``:
# the meta's). number_from: the number of the message ``count`` places after the first one
# numbered ``number`` or more (the deleted numbers from ``number`` on are passed over).
_NUMBERS = """
local function index_of(number, dropped)
  if number <= dropped then return 0 end
  local below = redis.call('ZCOUNT', KEYS[9], '-inf', '(' .. string.format('%d', number))
  return number - dropped - below
end
local function number_from(number, count)
  local found, skip = number + count, 0
  while true do
    local gone = redis.call(
      'ZRANGEBYSCORE', KEYS[9], string.format('%d', number), '+inf', 'LIMIT', skip, 100)
    for _, deleted in ipairs(gone) do
      if tonumber(deleted) > found then return found end
      found = found + 1
    end
    if #gone < 100 then return found end
    skip = skip + 100
  end
end
"""

_PRELUDE = (
    _NUMBERS
    + """
local ttl = tonumber(ARGV[1])
local function ensure(generation)
  if redis.call('EXISTS', KEYS[1]) == 1 then return end
  local order = redis.call('INCR', KEYS[5])
  -- The counter starts (again, once the user's data was erased or expired): its orders
  -- are those of the sessions gone, so the cursors listing these are refused. The
  -- session's generation is random, so it does for the counter's too.
  if order == 1 then redis.call('SET', KEYS[10], generation) end
  redis.call('HSET', KEYS[1], 'order', order, 'dropped', 0, 'generation', generation)
  redis.call('ZADD', KEYS[3], order, ARGV[2])
end
local function touch()
  if ttl > 0 then
    local now = redis.call('TIME')
    local expiry = now[1] * 1000 + math.floor(now[2] / 1000) + ttl * 1000
    redis.call('ZADD', KEYS[4], string.format('%d', expiry), ARGV[2])
    for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
  end
end
"""
)

# ARGV[3]: the generation of the session, if made.
_CREATE = (
    _PRELUDE
    + """
ensure(ARGV[3])
touch()
return redis.call('LRANGE', KEYS[2], 0, -1)
"""
)

# ARGV[3]: how many of the last messages to return (0: none), ARGV[4]: the generation of
# the session, if made.
_OPEN = (
    _PRELUDE
    + """
ensure(ARGV[4])
touch()
local recent = tonumber(ARGV[3])
if recent == 0 then return {} end
return redis.call('LRANGE', KEYS[2], string.format('%d', -recent), -1)
"""
)

_GET = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
touch()
return redis.call('LRANGE', KEYS[2], 0, -1)
"""
)

# ARGV[3]: the number of the first message wanted (or the next one kept), ARGV[4]: how
# many. Returns the number to read on from (0: none, the last message was read), the
# messages, and the session's generation (its creation order, when stored by a version
# that kept none).
_PAGE = (
    _PRELUDE
    + """
local dropped = redis.call('HGET', KEYS[1], 'dropped')
if not dropped then return false end
local number = math.max(tonumber(ARGV[3]), tonumber(dropped))
local start = index_of(number, tonumber(dropped))
local stop = start + tonumber(ARGV[4]) - 1
local items = redis.call('LRANGE', KEYS[2], string.format('%d', start), string.format('%d', stop))
local following = 0
if #items > 0 and start + #items < redis.call('LLEN', KEYS[2]) then
  following = number_from(number, #items - 1) + 1
end
touch()
local generation = redis.call('HGET', KEYS[1], 'generation')
return {following, items, generation or redis.call('HGET', KEYS[1], 'order') or ''}
"""
)

# ARGV[3]: max messages (0: no limit), ARGV[4]: the generation of the session, if made,
# ARGV[5..]: message id, message JSON, ... Returns, per message, 0 when it was appended,
# else the stored message with that id.
_APPENDING = """
ensure(ARGV[4])
local dropped = tonumber(redis.call('HGET', KEYS[1], 'dropped'))
local length = redis.call('LLEN', KEYS[2])
local deleted = redis.call('ZCARD', KEYS[9])
local max = tonumber(ARGV[3])
local out = {}
for i = 5, #ARGV, 2 do
  local number = redis.call('HGET', KEYS[6], ARGV[i])
  if number then
    local stored = false
    if tonumber(number) >= dropped then
      local index = index_of(tonumber(number), dropped)
      stored = redis.call('LINDEX', KEYS[2], string.format('%d', index))
    end
    out[#out + 1] = stored or ARGV[i + 1]
  else
    length = redis.call('RPUSH', KEYS[2], ARGV[i + 1])
    redis.call('HSET', KEYS[6], ARGV[i], string.format('%d', dropped + deleted + length - 1))
    if max > 0 then redis.call('RPUSH', KEYS[7], ARGV[i]) end
    out[#out + 1] = 0
  end
end
if max > 0 and length > max then
  local trimmed = length - max
  -- The oldest message kept: the numbers below it are gone, trimmed or deleted.
  dropped = number_from(dropped, trimmed)
  redis.call('LTRIM', KEYS[2], trimmed, -1)
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', '(' .. string.format('%d', dropped))
  redis.call('HSET', KEYS[1], 'dropped', string.format('%d', dropped))
  -- The id order lists the last messages (those appended since the limit was set): the
  -- ids of the trimmed ones among them leave the hash, when it places them before the
  -- first message kept.
  local listed = redis.call('LLEN', KEYS[7])
  local gone = trimmed - (length - listed)
  if gone > 0 then
    for _, id in ipairs(redis.call('LRANGE', KEYS[7], 0, gone - 1)) do
      local at = redis.call('HGET', KEYS[6], id)
      if at and tonumber(at) < dropped then
        redis.call('HDEL', KEYS[6], id)
        redis.call('HDEL', KEYS[8], id)
      end
    end
    redis.call('LTRIM', KEYS[7], gone, -1)
  end
end
touch()
return out
"""
_APPEND = _PRELUDE + _APPENDING

# _APPEND of messages of distinct ids, unless the session holds one of their ids: then
# none is appended, and the reply is, per message, the one stored with its id (its own
# JSON when that one was trimmed), or false.
_APPEND_UNLESS_HELD = (
    _PRELUDE
    + """
local dropped = redis.call('HGET', KEYS[1], 'dropped')
if dropped then
  local found, held = {}, false
  for i = 5, #ARGV, 2 do
    local number = redis.call('HGET', KEYS[6], ARGV[i])
    local stored = false
    if number then
      held = true
      if tonumber(number) >= tonumber(dropped) then
        local index = index_of(tonumber(number), tonumber(dropped))
        stored = redis.call('LINDEX', KEYS[2], string.format('%d', index))
      end
      stored = stored or ARGV[i + 1]
    end
    found[#found + 1] = stored
  end
  if held then
    touch()
    return found
  end
end
"""
    + _APPENDING
)

# ARGV[3..]: message ids. Returns, per id, the stored message with it, or false.
_STORED = (
    _NUMBERS
    + """
local dropped = redis.call('HGET', KEYS[1], 'dropped')
if not dropped then return {} end
dropped = tonumber(dropped)
local out = {}
for i = 3, #ARGV do
  local number = redis.call('HGET', KEYS[6], ARGV[i])
  local stored = false
  if number and tonumber(number) >= dropped then
    local index = index_of(tonumber(number), dropped)
    stored = redis.call('LINDEX', KEYS[2], string.format('%d', index))
  end
  out[#out + 1] = stored
end
return out
"""
)

# ARGV[3..]: the ids of the messages to delete. Returns how many were in the session.
_DELETE_MESSAGES = (
    _PRELUDE
    + """
local dropped = redis.call('HGET', KEYS[1], 'dropped')
if not dropped then return 0 end
dropped = tonumber(dropped)
local gone = {}
for i = 3, #ARGV do
  local number = redis.call('HGET', KEYS[6], ARGV[i])
  if number and tonumber(number) >= dropped then
    -- Emptied in place: the places of the others stay as they are until all are found.
    local index = index_of(tonumber(number), dropped)
    redis.call('LSET', KEYS[2], string.format('%d', index), '')
    redis.call('HDEL', KEYS[6], ARGV[i])
    redis.call('HDEL', KEYS[8], ARGV[i])
    redis.call('LREM', KEYS[7], 1, ARGV[i])
    gone[#gone + 1] = number
  end
end
if #gone == 0 then return 0 end
-- No message is empty: the deleted ones were emptied, and go together.
redis.call('LREM', KEYS[2], 0, '')
-- The others keep their numbers (a cursor holds one).
for _, number in ipairs(gone) do redis.call('ZADD', KEYS[9], number, number) end
touch()
return #gone
"""
)

# ARGV[3]: the new mark, ARGV[4]: the old mark ('' for none), ARGV[5]: '1' for every
# message, else ARGV[6..]: their ids. Returns how many messages were updated.
_UPDATE_MARKS = (
    _PRELUDE
    + """
local dropped = redis.call('HGET', KEYS[1], 'dropped')
if not dropped then return 0 end
dropped = tonumber(dropped)
local new, old = ARGV[3], ARGV[4]
local ids = {}
if ARGV[5] == '1' then
  ids = redis.call('HKEYS', KEYS[6])
else
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local updated = 0
for _, id in ipairs(ids) do
  local position = redis.call('HGET', KEYS[6], id)
  if position and tonumber(position) >= dropped then
    local raw = redis.call('HGET', KEYS[8], id)
    local marks = {}
    if raw then marks = cjson.decode(raw) end
    local had_old, kept, has_new = false, {}, false
    for _, mark in ipairs(marks) do
      if mark == old then had_old = true else kept[#kept + 1] = mark end
      if mark == new then has_new = true end
    end
    if old == '' or had_old then
      if new ~= '' and not has_new then kept[#kept + 1] = new end
      if #kept == 0 then
        redis.call('HDEL', KEYS[8], id)
      else
        redis.call('HSET', KEYS[8], id, cjson.encode(kept))
      end
      updated = updated + 1
    end
  end
end
touch()
return updated
"""
)

# ARGV[3]: the summary ('' removes it), ARGV[4]: the generation of the session, if made.
_SET_SUMMARY = (
    _PRELUDE
    + """
ensure(ARGV[4])
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 'summary')
else
  redis.call('HSET', KEYS[1], 'summary', ARGV[3])
end
touch()
return 1
"""
)

_SUMMARY = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
touch()
return redis.call('HGET', KEYS[1], 'summary')
"""
)

_MARKS = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
touch()
return redis.call('HGETALL', KEYS[8])
"""
)

_DELETE = """
redis.call('DEL', KEYS[1], KEYS[2], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""

# KEYS: index, expiry, counter, counter generation, then the meta, messages, ids, id
# order, marks and gone keys of the sessions the caller read from the index. ARGV: the
# counter value then. Deletes only when no session was created since (else returns 0 and
# the caller reads the index again).
_DELETE_USER = (
    LUA_DELETE_KEYS
    + """
if (redis.call('GET', KEYS[3]) or '') ~= ARGV[1] then return 0 end
delete_keys()
return 1
"""
)

# KEYS: index, expiry, counter, counter generation. The counter and every session id of
# the index.
_READ_INDEX = """
return {redis.call('GET', KEYS[3]), redis.call('ZRANGE', KEYS[1], 0, -1)}
"""

# KEYS: index, expiry, counter, counter generation. ARGV: ttl, list after this order, how
# many. Returns the counter's generation (false: none), and the sessions with their orders.
_LIST = """
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  local now = redis.call('TIME')
  local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now_ms))
  for i = 1, #expired, 1000 do
    local batch = {unpack(expired, i, math.min(i + 999, #expired))}
    redis.call('ZREM', KEYS[1], unpack(batch))
    redis.call('ZREM', KEYS[2], unpack(batch))
  end
  for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
end
return {
  redis.call('GET', KEYS[4]),
  redis.call(
    'ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'WITHSCORES', 'LIMIT', 0, ARGV[3]),
}
"""

# Slides the expiry of sessions just listed (with a TTL: a listing reads them). KEYS: the
# user's expiry, then the meta, messages, ids, id order, marks and gone keys of each
# session. ARGV: ttl, then the session ids. A session gone meanwhile is left gone.
_TOUCH_LISTED = """
local ttl = tonumber(ARGV[1])
local now = redis.call('TIME')
local expiry = string.format('%d', now[1] * 1000 + math.floor(now[2] / 1000) + ttl * 1000)
for i = 2, #ARGV do
  local first = 2 + (i - 2) * 6
  if redis.call('EXISTS', KEYS[first]) == 1 then
    redis.call('ZADD', KEYS[1], expiry, ARGV[i])
    for k = first, first + 5 do redis.call('EXPIRE', KEYS[k], ttl) end
  end
end
return 1
"""


class RedisSessionHistoryService(RedisBackedService, SessionHistoryService):
    """Session history on Redis or Redis Cluster (managed Redis / Valkey).

    >>> service = RedisSessionHistoryService(redis_url="redis://localhost:6379/0")
    >>> tls = RedisSessionHistoryService(
    ...     redis_url="rediss://:secret@my-cache.example.com:6379", cluster=True
    ... )

    ``redis_client`` injects a ready client (used as-is, not closed by ``stop()``).
    ``ttl_seconds`` is a sliding expiry refreshed on every read and write (None: never
    expires); ``max_messages_per_session`` keeps only the newest messages.
    """

    prepares_writes = True

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
        self._max_messages = (
            optional_positive_int(max_messages_per_session, field="max_messages_per_session") or 0
        )

    def _user_keys(self, user_id: str) -> list[str]:
        base = user_key_prefix(self._redis.key_prefix, "session", user_id)
        return [f"{base}:sessions", f"{base}:expiry", f"{base}:counter", f"{base}:generation"]

    def _session_keys(self, user_id: str, session_id: str) -> list[str]:
        """The keys of one session: meta, messages, ids, id order, marks, gone."""
        base = user_key_prefix(self._redis.key_prefix, "session", user_id)
        session = f"{base}:s:{escape(session_id)}"
        suffixes = ("meta", "messages", "ids", "ids:order", "marks", "gone")
        return [f"{session}:{suffix}" for suffix in suffixes]

    def _keys(self, user_id: str, session_id: str) -> list[str]:
        """The keys of a session's scripts (see their KEYS)."""
        meta, messages, ids, order, marks, gone = self._session_keys(user_id, session_id)
        index, expiry, counter, generation = self._user_keys(user_id)
        return [meta, messages, index, expiry, counter, ids, order, marks, gone, generation]

    async def _session_call(
        self, script: str, user_id: str, session_id: str, *extra: Any, idempotent: bool
    ) -> Any:
        return await self._redis.run(
            script,
            self._keys(user_id, session_id),
            [self._ttl, session_id, *extra],
            idempotent=idempotent,
        )

    async def _delete_user_sessions(self, user_id: str) -> None:
        while True:
            # Read the index, then delete it with every session's keys in one script that
            # checks no session was created meanwhile: all of them go at once.
            keys = self._user_keys(user_id)
            before = await self._redis.run(_READ_INDEX, keys, [], idempotent=True)
            counter_value, session_ids = text(before[0] or ""), [text(s) for s in before[1]]
            for session_id in session_ids:
                keys += self._session_keys(user_id, session_id)
            done = await self._redis.run(_DELETE_USER, keys, [counter_value], idempotent=True)
            if int(done):
                return

    async def _create_session(self, user_id: str, session_id: str) -> Session:
        raw = await self._session_call(
            _CREATE, user_id, session_id, new_session_generation(), idempotent=True
        )
        return stored_session(user_id, session_id, raw)

    async def _open_session(self, user_id: str, session_id: str, recent: int) -> Session:
        raw = await self._session_call(
            _OPEN, user_id, session_id, recent, new_session_generation(), idempotent=True
        )
        return stored_session(user_id, session_id, raw)

    async def _get_session(self, user_id: str, session_id: str) -> Session | None:
        if self._ttl:
            raw = await self._session_call(_GET, user_id, session_id, idempotent=True)
            if raw is None:
                return None
        else:
            # No expiry to refresh, so no script: a script would copy every message through
            # Lua, which takes about as long again as Redis sending them.
            meta, messages = self._keys(user_id, session_id)[:2]
            exists, raw = await self._redis.transaction(
                [("EXISTS", meta), ("LRANGE", messages, 0, -1)]
            )
            if not exists:
                return None
        return stored_session(user_id, session_id, raw)

    async def _delete_session(self, user_id: str, session_id: str) -> None:
        await self._session_call(_DELETE, user_id, session_id, idempotent=True)

    async def _list_sessions_page(
        self, user_id: str, limit: int, cursor: str | None
    ) -> Page[Session]:
        after, tag = listing_cursor_position(cursor)
        generation, raw = await self._redis.run(
            _LIST, self._user_keys(user_id), [self._ttl, after, limit + 1], idempotent=True
        )
        # None: a counter started by a version that kept no generation.
        listing = None if generation is None else listing_tag(user_id, text(generation))
        check_cursor_listing(tag, listing)
        rows = [(text(raw[i]), int(float(text(raw[i + 1])))) for i in range(0, len(raw), 2)]
        page = rows[:limit]
        if self._ttl and page:
            await self._touch_listed(user_id, [sid for sid, _ in page])
        return Page[Session](
            items=[Session(id=sid, user_id=user_id, messages=[]) for sid, _ in page],
            next_cursor=listing_cursor(page[-1][1], listing) if len(rows) > limit else None,
        )

    async def _touch_listed(self, user_id: str, session_ids: list[str]) -> None:
        """Slide the expiry of the sessions of a page just listed, as a read of each does."""
        keys = [self._user_keys(user_id)[1]]
        for session_id in session_ids:
            keys += self._session_keys(user_id, session_id)
        await self._redis.run(_TOUCH_LISTED, keys, [self._ttl, *session_ids], idempotent=True)

    async def _list_messages(
        self, user_id: str, session_id: str, limit: int, cursor: str | None
    ) -> Page[Message] | None:
        offset, tag = session_cursor_position(cursor, "offset")
        raw = await self._session_call(
            _PAGE, user_id, session_id, min(offset, MAX_POSITION), limit, idempotent=True
        )
        if raw is None:
            return None
        # The session's generation tells it from an earlier session of the same id.
        session = session_tag(user_id, session_id, text(raw[2]))
        check_cursor_session(tag, session)
        following = int(raw[0])
        return Page[Message](
            items=decode_messages(raw[1]),
            next_cursor=session_cursor("offset", following, session) if following else None,
        )

    async def _append_messages(
        self, user_id: str, session_id: str, messages: list[Message]
    ) -> list[Message]:
        (appended,) = await self._prepare_append(user_id, session_id, messages, _same).apply()
        return appended  # type: ignore[no-any-return]

    async def _stored_messages(
        self, user_id: str, session_id: str, message_ids: list[str]
    ) -> dict[str, Message]:
        raw = await self._session_call(_STORED, user_id, session_id, *message_ids, idempotent=True)
        found = [(i, r) for i, r in zip(message_ids, raw, strict=False) if r is not None]
        return dict(zip([i for i, _ in found], decode_messages([r for _, r in found]), strict=True))

    async def _delete_messages(self, user_id: str, session_id: str, message_ids: list[str]) -> int:
        deleted = await self._session_call(
            _DELETE_MESSAGES, user_id, session_id, *message_ids, idempotent=True
        )
        return int(deleted)

    async def _message_marks(self, user_id: str, session_id: str) -> dict[str, list[str]]:
        raw = await self._session_call(_MARKS, user_id, session_id, idempotent=True)
        return {text(raw[i]): json.loads(raw[i + 1]) for i in range(0, len(raw), 2)}

    async def _session_summary(self, user_id: str, session_id: str) -> str:
        summary = await self._session_call(_SUMMARY, user_id, session_id, idempotent=True)
        return "" if summary is None else text(summary)

    async def _set_session_summary(self, user_id: str, session_id: str, summary: str) -> None:
        await self._session_call(
            _SET_SUMMARY, user_id, session_id, summary, new_session_generation(), idempotent=True
        )

    async def _update_message_marks(
        self,
        user_id: str,
        session_id: str,
        new_mark: str | None,
        old_mark: str | None,
        message_ids: list[str] | None,
    ) -> int:
        every = "1" if message_ids is None else "0"
        updated = await self._session_call(
            _UPDATE_MARKS,
            user_id,
            session_id,
            new_mark or "",
            old_mark or "",
            every,
            *(message_ids or ()),
            idempotent=True,
        )
        return int(updated)

    async def _append_messages_unless(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        refuse: Callable[[list[Message]], None],
    ) -> list[Message]:
        # The first message of each id, appended in one script unless the session holds
        # one of their ids: then what it holds is answered (and refused, or taken as
        # stored), and the others are tried again.
        first: dict[str, Message] = {}
        for message in messages:
            first.setdefault(message.id, message)
        held: dict[str, Message] = {}
        while True:
            result = [held.get(message.id, first[message.id]) for message in messages]
            refuse(result)
            new = [message for message_id, message in first.items() if message_id not in held]
            if not new:
                return result
            found = await self._session_call(
                _APPEND_UNLESS_HELD,
                user_id,
                session_id,
                self._max_messages,
                new_session_generation(),
                *self._pairs(new, messages),
                idempotent=False,
            )
            if all(reply == 0 for reply in found):
                return result
            held |= {
                message.id: Message.model_validate_json(reply)
                for message, reply in zip(new, found, strict=True)
                if reply is not None
            }

    @staticmethod
    def _pairs(messages: list[Message], given: list[Message]) -> list[str]:
        """The script arguments of ``messages`` (out of ``given``): id, JSON, ..."""
        return [part for m in messages for part in (m.id, encode_message(m, given))]

    def _prepare_append(
        self,
        user_id: str,
        session_id: str,
        messages: list[Message],
        stored: Callable[[list[Message]], Any],
    ) -> RedisWrite:
        arguments = [
            self._ttl,
            session_id,
            self._max_messages,
            new_session_generation(),
            *self._pairs(messages, messages),
        ]

        def done(replies: list[Any]) -> Any:
            (raw,) = replies
            return stored(
                [
                    message if reply == 0 else Message.model_validate_json(reply)
                    for message, reply in zip(messages, raw, strict=True)
                ]
            )

        call = ScriptCall(_APPEND, self._keys(user_id, session_id), arguments)
        return RedisWrite(self, [call], done)


def _same(messages: list[Message]) -> list[Message]:
    return messages


__all__ = ["RedisSessionHistoryService"]
