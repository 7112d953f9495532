"""What every Redis backend shares: the client, key names, Lua scripts and the error policy.

Key names put the escaped user id in a hash tag, so all of one user's keys live in one
hash slot and every multi-key operation (a Lua script) works on Redis Cluster too::

    <prefix>:<kind>:{<escaped user id>}:<rest>

Ids are percent-encoded (:func:`escape`), so an id never contains ``:``, ``{``, ``}``,
glob characters or whitespace: no id can reach another user's keys or break the hash tag.

Writes are Lua scripts (atomic, one round trip). Only idempotent calls (reads, deletes) are
retried after a connection failure; a write that may have been applied is never replayed. A
cluster's MULTI answered MOVED never ran: it is sent again to the slot's new primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from hashlib import sha1
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import AuthenticationError as RedisAuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from agentscope_serverless.aws_secrets import credentials_refused
from agentscope_serverless.errors import ConfigurationError, StoreUnavailableError
from agentscope_serverless.log import logger
from agentscope_serverless.services._redis_shared import SharedConnection
from agentscope_serverless.services._validation import optional_ttl_seconds
from agentscope_serverless.services.base import PreparedWrite, StartedGuard, service_call

ResultT = TypeVar("ResultT")
RedisClient = Redis | RedisCluster
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
DEFAULT_KEY_PREFIX = "agentscope"
# Positions sent to Redis stay exact in Lua's doubles and its number formatting.
MAX_POSITION = 10**13

_RETRY_DELAY = 0.05
# How many times a cluster transaction answered MOVED is sent again (to the slot's new
# primary): more than one move of a slot while a call is under way is a reshard gone wrong.
_MOVED_RESENDS = 2
# The health check's own key (under the key prefix), written with this expiry: a Redis
# that answers PING but refuses writes (out of memory) is down for the users.
HEALTH_KEY = "health"
_HEALTH_KEY_MILLISECONDS = 10_000

# Shared by every script: refresh the expiry of the given keys when a TTL is configured.
LUA_TOUCH = """
local function touch(ttl, keys)
  if ttl > 0 then
    for _, key in ipairs(keys) do redis.call('EXPIRE', key, ttl) end
  end
end
"""

# Deletes every key of KEYS, a thousand a call: a script's unpack takes about 8,000 values,
# and a user with thousands of sessions has more keys than that.
LUA_DELETE_KEYS = """
local function delete_keys()
  for i = 1, #KEYS, 1000 do
    redis.call('DEL', unpack(KEYS, i, math.min(i + 999, #KEYS)))
  end
end
"""


# The characters quote() never encodes.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def escape(value: str) -> str:
    """``value`` as a key segment: percent-encoded, so it is injective and separator-free.

    >>> escape("a:b{c}*")
    'a%3Ab%7Bc%7D%2A'
    """
    if _UNRESERVED.fullmatch(value):
        return value  # what quote() gives, faster: ids are mostly made of these
    return quote(value, safe="", errors="surrogatepass")


def user_key_prefix(key_prefix: str, kind: str, user_id: str) -> str:
    """The start of every key of ``kind`` for ``user_id``, with the user's hash tag."""
    return f"{key_prefix}:{kind}:{{{escape(user_id)}}}"


def glob_escape(value: str) -> str:
    """``value`` with the glob characters of ``SCAN MATCH`` escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


def text(value: Any) -> str:
    """A reply as ``str``, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """A Lua script to run on ``keys`` with ``args``, as one command of a transaction."""

    source: str
    keys: Sequence[str]
    args: Sequence[Any]


# A command of a transaction: its name and arguments, or a script call.
Command = Sequence[Any] | ScriptCall


@dataclass(frozen=True, slots=True)
class RedisWrite(PreparedWrite):
    """A write of ``service`` as Redis commands, prepared: applied (through its store)
    alone or with the writes of other services on the same Redis server in one MULTI/EXEC
    (their keys in one hash slot on a cluster). ``done`` turns the replies of ``commands``
    into the write's result.

    In a transaction nothing else runs between the commands; a failing command neither
    stops nor undoes the others (its error is raised once they ran).
    """

    service: RedisBackedService
    commands: list[Command]
    done: Callable[[list[Any]], Any]
    # Whether applying it twice stores the same (then tried again after a lost connection).
    idempotent: bool = False

    def joins(self, other: PreparedWrite) -> bool:
        store = self.service._redis
        if not isinstance(other, RedisWrite) or not store.same_server(other.service._redis):
            return False
        # Each write's keys share a slot (a script's must): both must share the same one.
        return not store.cluster or _slot(self.commands) == _slot(other.commands)

    async def apply(self, *others: PreparedWrite) -> list[Any]:
        writes = [self]
        for other in others:
            if not isinstance(other, RedisWrite) or not self.joins(other):
                raise TypeError("writes applied together must be on the same Redis server")
            writes.append(other)
        commands = [command for write in writes for command in write.commands]
        idempotent = all(write.idempotent for write in writes)
        replies = await self.service._apply_writes(commands, idempotent=idempotent)
        results, at = [], 0
        for write in writes:
            results.append(write.done(replies[at : at + len(write.commands)]))
            at += len(write.commands)
        return results


def _slot(commands: Sequence[Command]) -> int | None:
    """The hash slot of the first key of ``commands``."""
    for command in commands:
        keys = command.keys if isinstance(command, ScriptCall) else command[1:2]
        if keys:
            key = keys[0]
            return key_slot(key if isinstance(key, bytes) else str(key).encode())
    return None


def _names_of(commands: Sequence[Command]) -> str:
    """What a log line says ``commands`` were: their names (a script's as Redis names it:
    ``EVALSHA`` and its hash), in the ``MULTI`` they are sent in (all but a script alone),
    never their arguments (keys and values hold users' ids and data).

    >>> _names_of([("EXISTS", "k"), ("LRANGE", "k", 0, -1)])
    'MULTI EXISTS LRANGE EXEC'
    """
    names = [
        f"EVALSHA {sha1(command.source.encode(), usedforsecurity=False).hexdigest()}"
        if isinstance(command, ScriptCall)
        else text(command[0]).upper()
        for command in commands
    ]
    if len(commands) == 1 and isinstance(commands[0], ScriptCall):
        return names[0]
    return " ".join(("MULTI", *names, "EXEC"))


def _no_script(reply: Exception) -> bool:
    """Whether ``reply`` says Redis does not have the script (it restarted)."""
    return isinstance(reply, NoScriptError) or str(reply).startswith("NOSCRIPT")


def _validate_key_prefix(key_prefix: str) -> str:
    if not key_prefix or any(c in key_prefix for c in "{}") or key_prefix != key_prefix.strip():
        raise ConfigurationError(
            "REDIS_KEY_PREFIX must be non-empty, without braces or surrounding spaces"
        )
    return key_prefix


def _failure(exc: BaseException) -> str:
    """What went wrong, for the client: never the host, port, script hash, password or
    reply text."""
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return "the request timed out"
    if refuses_credentials(exc):
        return (
            "authentication failed: Redis refuses the password of REDIS_URL "
            "(the redis_url of the stack's secret)"
        )
    if _connection_lost(exc):
        return "the connection failed"
    if _out_of_memory(exc):
        return "it is out of memory (maxmemory reached, with no eviction): it refuses writes"
    if isinstance(exc, ResponseError) and "DB index is out of range" in str(exc):
        return (
            "REDIS_URL names a database Redis does not have (the number after the host's "
            "/: 0 to 15 on a Redis as it comes)"
        )
    if isinstance(exc, ResponseError):
        return "the command failed"
    return "the request failed"


def refuses_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing the password (or user) it was given, or asking for
    one when none was given; on a cluster, when no node could be reached for that reason
    (redis-py's error then has the node's refusal as its cause)."""
    if isinstance(exc, RedisClusterException) and exc.__cause__ is not None:
        return refuses_credentials(exc.__cause__)
    if isinstance(exc, RedisAuthenticationError):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(("WRONGPASS", "NOAUTH"))


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection failed or was lost, the command perhaps applied."""
    return isinstance(exc, RedisConnectionError | OSError) or _transport_closed(exc)


def _transport_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is uvloop refusing a write on a socket it already closed: redis-py
    raises it as it is when its connection was closed under it (its disconnect of a failed
    node's idle connections leaves them in the pool until it ends)."""
    message = str(exc)
    return (
        isinstance(exc, RuntimeError)
        and message.startswith("unable to perform operation on ")
        and message.endswith("; the handler is closed")
    )


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write as out of memory (``maxmemory`` reached
    under the ``noeviction`` policy); a transaction holding such a write is refused whole."""
    return isinstance(exc, ResponseError) and str(exc).startswith("OOM")


class RedisStore:
    """A Redis (or Redis Cluster) connection with the error and retry policy of the backends.

    With ``client`` given it is used as-is and never closed here; otherwise ``open()``
    creates one from ``url`` (``redis://`` or ``rediss://`` for TLS; credentials in the URL
    or as ``password``) and ``close()`` closes it.

    >>> store = RedisStore(url="rediss://:secret@cache.example.com:6379/0", cluster=True)
    """

    def __init__(
        self,
        *,
        url: str = DEFAULT_REDIS_URL,
        client: RedisClient | None = None,
        password: str | None = None,
        cluster: bool = False,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        socket_timeout: float | None = 5.0,
        socket_connect_timeout: float | None = 5.0,
        max_connections: int | None = None,
        retry_on_timeout: bool = True,
        health_check_interval: float = 30.0,
        socket_keepalive: bool = True,
    ) -> None:
        self.key_prefix = _validate_key_prefix(key_prefix)
        injected: object = client  # what a caller passed, whatever its annotation says
        if injected is not None and not isinstance(injected, (Redis, RedisCluster)):
            # A sync redis.Redis failed only at the first call, awaiting what it answers.
            kind = type(injected)
            given = kind.__qualname__
            if kind.__module__ != "builtins":
                given = f"{kind.__module__}.{given}"
            raise TypeError(
                "redis_client must be a redis.asyncio client (redis.asyncio.Redis or "
                f"redis.asyncio.RedisCluster), got {given}"
            )
        given_url: object = url  # what a caller passed, whatever its annotation says
        if not isinstance(given_url, str):
            if client is None:
                # redis_url=os.environ.get("REDIS_URL"), the variable unset, say.
                given = "None" if given_url is None else type(given_url).__name__
                raise ConfigurationError(
                    "REDIS_URL is not valid: redis_url must be a Redis URL (redis://, "
                    f"rediss:// or unix://), got {given}"
                )
            url = DEFAULT_REDIS_URL  # not used: the client given is
        self._url = url
        self._injected = client
        self._client: RedisClient | None = None
        self._password = password
        self._cluster = cluster
        self._retry_on_timeout = retry_on_timeout
        # Calls are bounded here, not by the client (see ``_call``): given to the client, the
        # timeout would make every command's write a task of its own (``asyncio.wait_for``).
        self._timeout = socket_timeout
        self._options: dict[str, Any] = {
            "socket_timeout": None,
            "socket_connect_timeout": socket_connect_timeout,
            "health_check_interval": health_check_interval,
            "socket_keepalive": socket_keepalive,
            # No blind retries inside the client: `run` decides what may be replayed.
            "retry": Retry(NoBackoff(), 0),
        }
        if max_connections is not None:
            self._options["max_connections"] = max_connections
        try:
            url_password = urlsplit(url).password
        except ValueError:
            # Not a URL (an unclosed "[" of an IPv6 address...): refused, without quoting it.
            raise ConfigurationError("REDIS_URL is not valid: it is not a URL") from None
        self._secrets = [s for s in (password, url_password and unquote(url_password)) if s]
        self._scripts: dict[str, AsyncScript] = {}
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._idle_limit = health_check_interval
        # Per event loop (a store may be shared by threads, each running a loop of its own):
        # the connection its calls share, and the one being opened.
        self._shared: dict[asyncio.AbstractEventLoop, SharedConnection] = {}
        self._opening: dict[asyncio.AbstractEventLoop, asyncio.Task[SharedConnection]] = {}
        # The event loop whose calls use the client through redis-py's own path (its
        # connections are that loop's).
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # Whether the client is a Redis Cluster client (once open). Known at open: the
        # check costs microseconds (RedisCluster is a protocol's subclass).
        self.cluster = False

    async def open(self) -> None:
        """Create the client (no connection is made until the first command); an open
        store keeps its client, which calls under way may be using."""
        if self._client is not None:
            return
        if self._injected is not None:
            self._client = self._injected
            self.cluster = isinstance(self._client, RedisCluster)
            return
        if _userinfo_misplaced(self._url):
            raise ConfigurationError(_MISPLACED_USERINFO)
        try:
            self._client = self._new_client()
            self.cluster = self._cluster
        except (ValueError, RedisError) as exc:
            if _userinfo_outside_address(self._url):
                raise ConfigurationError(_MISPLACED_USERINFO) from None
            raise ConfigurationError(f"REDIS_URL is not valid: {self._redact(exc)}") from None

    def _new_client(self) -> RedisClient:
        options = dict(self._options)
        if self._password is not None:
            options["password"] = self._password
        if urlsplit(self._url).scheme == "unix":
            options.pop("socket_keepalive")  # a TCP option: a Unix socket's connection refuses it
        if self._cluster:
            return RedisCluster.from_url(self._url, **options)
        return Redis.from_url(self._url, **options)

    async def close(self) -> None:
        """Close the client if this store created it."""
        client, self._client = self._client, None
        used, self._client_loop = self._client_loop, None
        self.cluster = False
        self._scripts.clear()
        self._ready = False
        for loop in list(self._shared):
            await _close_shared(self._shared.pop(loop, None))
        # A client of a loop closed since has nothing left to close.
        gone = used is not None and used.is_closed()
        if client is not None and client is not self._injected and not gone:
            await client.aclose()

    async def ping(self) -> bool:
        """True when Redis takes a write (of the health check's own key, which soon
        expires; on a cluster, after every primary answered PING), on the connection the
        calls use: a Redis out of memory answers PING but refuses every write.

        A connection found lost (Redis restarted since its last use) is made again, as a
        call would: a Redis that is back reads as healthy at once.
        """
        for attempt in range(2):
            try:
                async with asyncio.timeout(self._timeout):
                    return await self._ping()
            except (
                RedisError,
                RedisClusterException,
                OSError,
                RuntimeError,
                StoreUnavailableError,
            ) as exc:
                if isinstance(exc, RuntimeError) and not _transport_closed(exc):
                    raise
                if refuses_credentials(exc):
                    credentials_refused()
                lost = isinstance(exc, RedisConnectionError) or _transport_closed(exc)
                if lost or isinstance(exc, RedisTimeoutError | TimeoutError):
                    await self._drop_shared()
                if attempt or not lost:
                    return False
        return False

    async def _ping(self) -> bool:
        key = f"{self.key_prefix}:{HEALTH_KEY}"
        probe = ("SET", key, "1", "PX", _HEALTH_KEY_MILLISECONDS)
        shared = await self._shared_connection()
        if shared is not None:
            (reply,) = await shared.execute([probe])
            return bool(reply)
        await self._connect()
        client = self._client
        if isinstance(client, RedisCluster):
            # Every primary: with one of them down, the users whose keys it holds get
            # errors, while a PING to another node alone would say all is well.
            primaries = client.get_primaries()
            replies = await asyncio.gather(
                *(client.ping(target_nodes=node) for node in primaries), return_exceptions=True
            )
            failed = next((r for r in replies if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            if not (primaries and all(replies)):
                return False
        return client is not None and bool(await client.execute_command(*probe))

    def same_server(self, other: RedisStore) -> bool:
        """Whether ``other`` talks to the same server (or cluster) with the same client
        settings, so a script may run on either."""
        return self is other or (
            self._injected is other._injected
            and self._url == other._url
            and self._password == other._password
            and self._cluster == other._cluster
        )

    async def run(
        self, script: str, keys: Sequence[str], args: Sequence[Any], *, idempotent: bool
    ) -> Any:
        """Run a Lua ``script`` on ``keys`` (all in one hash slot) and return its reply.

        Failures become :class:`StoreUnavailableError`. An ``idempotent`` script is tried
        once more after a connection failure (or a timeout, with ``retry_on_timeout``).
        """
        return await self._call(
            lambda: self._evalsha(script, keys, args),
            idempotent=idempotent,
            commands=(ScriptCall(script, keys, args),),
        )

    async def _evalsha(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        shared = await self._shared_connection()
        if shared is None:
            async with asyncio.timeout(self._timeout):
                await self._connect()  # first: it may make the client anew
                return await self._script(source)(keys=list(keys), args=list(args))
        script = self._script(source)
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            (reply,) = await shared.execute([command])
        except NoScriptError:
            # Redis restarted or its scripts were flushed: load it and go again.
            (_, reply) = await shared.execute([("SCRIPT", "LOAD", script.script), command])
        return reply

    async def transaction(
        self, commands: Sequence[Command], *, idempotent: bool = True
    ) -> list[Any]:
        """Send ``commands`` (name and arguments, or :class:`ScriptCall`; keys of one hash
        slot) in one MULTI/EXEC (a script alone: as is) and return their replies. An error
        reply is raised (the first) once every command ran. An ``idempotent`` transaction
        is tried once more after a connection failure.

        A transaction of reads is what a script would do, without copying every reply
        through Lua: Redis sends a long list as it is. A script that Redis no longer has
        (it restarted) is loaded and run after the others.

        >>> async def read(store: RedisStore) -> None:
        ...     exists, items = await store.transaction([("EXISTS", "k"), ("LRANGE", "l", 0, -1)])
        """

        async def execute() -> list[Any]:
            if not commands:
                return []
            first = commands[0]
            if len(commands) == 1 and isinstance(first, ScriptCall):
                return [await self._evalsha(first.source, first.keys, first.args)]
            replies = await self._exec(commands)
            failed = [i for i, reply in enumerate(replies) if isinstance(reply, Exception)]
            lost = [i for i in failed if _no_script(replies[i])]
            if lost:
                for i in lost:
                    script = commands[i]
                    assert isinstance(script, ScriptCall)
                    await self._load(script.source)
                again = await self._exec([commands[i] for i in lost])
                for i, reply in zip(lost, again, strict=True):
                    replies[i] = reply
            for i in failed:
                if isinstance(replies[i], Exception):
                    raise replies[i]
            return replies

        return await self._call(execute, idempotent=idempotent, commands=commands)

    async def _exec(self, commands: Sequence[Command]) -> list[Any]:
        """The replies of ``commands`` in one MULTI/EXEC, errors in place."""
        wire = [self._command(command) for command in commands]
        shared = await self._shared_connection()
        if shared is not None:
            replies: list[Any] = (await shared.execute([("MULTI",), *wire, ("EXEC",)]))[-1]
            return replies
        async with asyncio.timeout(self._timeout):
            await self._connect()
            client = self._client
            if client is None:
                raise StoreUnavailableError("redis", "the client is closed")
            resends = 0
            while True:
                pipeline = client.pipeline(transaction=True)
                for command in wire:
                    pipeline.execute_command(*command)
                try:
                    executed: list[Any] = await pipeline.execute(raise_on_error=False)
                    return executed
                except MovedError as moved:
                    # The slot has another primary (a reshard): Redis refused the commands
                    # as they were queued, or the EXEC, and discarded the transaction, so
                    # none of it ran. Sent again where the error says the slot went.
                    if resends == _MOVED_RESENDS or not isinstance(client, RedisCluster):
                        raise
                    resends += 1
                    await client.nodes_manager.move_slot(moved)

    async def _load(self, source: str) -> None:
        """Load a script Redis lost (on every primary of a cluster)."""
        shared = await self._shared_connection()
        if shared is not None:
            await shared.execute([("SCRIPT", "LOAD", source)])
        elif self._client is not None:
            async with asyncio.timeout(self._timeout):
                await self._client.script_load(source)

    def _command(self, command: Command) -> Sequence[Any]:
        if isinstance(command, ScriptCall):
            sha = self._script(command.source).sha
            return ("EVALSHA", sha, len(command.keys), *command.keys, *command.args)
        return command

    async def _call(
        self,
        operation: Callable[[], Awaitable[ResultT]],
        *,
        idempotent: bool,
        commands: Sequence[Command],
    ) -> ResultT:
        """``await operation()``, which sends ``commands`` (named in the line logged when it
        fails)."""
        # Each path bounds its calls: the shared connection by its watchdog, redis-py's
        # own path by ``asyncio.timeout``.
        may_retry = idempotent
        while True:
            try:
                return await operation()
            except (RedisError, RedisClusterException, OSError, RuntimeError) as exc:
                if isinstance(exc, RuntimeError) and not _transport_closed(exc):
                    raise
                if isinstance(
                    exc, RedisTimeoutError | TimeoutError | RedisConnectionError
                ) or _transport_closed(exc):
                    await self._drop_shared()  # no answer in time: start afresh
                if self._client is None:
                    # Closed under the call (by stop()): Redis did not fail.
                    raise StoreUnavailableError("redis", "the client is closed") from None
                if may_retry and self._retryable(exc):
                    may_retry = False
                    await asyncio.sleep(_RETRY_DELAY)
                    continue
                logger.warning(
                    "redis command failed",
                    extra={"command": _names_of(commands), "error": self._redact(exc)},
                )
                if refuses_credentials(exc):
                    credentials_refused()
                raise StoreUnavailableError("redis", _failure(exc)) from None

    async def unlink_matching(self, pattern: str) -> int:
        """UNLINK every key matching the glob ``pattern`` (on every node of a cluster).

        A scan, so not atomic and O(keyspace): for operators' actions only, never a
        request's path. Returns how many keys were removed.
        """
        removed = 0
        try:
            await self._connect()
            if self._client is None:
                raise StoreUnavailableError("redis", "the client is closed")
            async for key in self._client.scan_iter(match=pattern, count=1000):
                removed += int(await self._client.unlink(key))
        except (RedisError, RedisClusterException, OSError) as exc:
            raise StoreUnavailableError("redis", self._redact(exc)) from None
        return removed

    async def _connect(self) -> None:
        # A cluster client discovers the nodes before its first command, under a lock,
        # because concurrent first commands make redis-py discover them concurrently and
        # close connections that are in use; and again, here, once a node failed (redis-py
        # then marks the client for it). Left to the next command, the discovery would run
        # in a transaction's queueing, which redis-py does in an event loop of its own, in a
        # thread: the connections it made there, left in the pools, broke later calls on
        # nodes that are up ("Event loop is closed", a 500) until the node came back.
        self._renew_for_loop()
        if not self.cluster:
            return
        if self._ready and not _needs_discovery(self._client):
            return
        async with self._ready_lock:
            client = self._client
            if isinstance(client, RedisCluster) and (not self._ready or _needs_discovery(client)):
                await client.initialize()
                self._ready = True

    def _renew_for_loop(self) -> None:
        """Make the client of redis-py's own path (a cluster's, or one speaking RESP3) anew
        when the event loop its calls used is closed (a script's earlier ``asyncio.run``, a
        test's own loop): its connections were that loop's. An injected client is kept as
        it is."""
        loop = asyncio.get_running_loop()
        used, self._client_loop = self._client_loop, loop
        if used is None or used is loop or not used.is_closed() or self._injected is not None:
            return
        self._client = self._new_client()
        self._scripts.clear()
        self._ready = False
        self._ready_lock = asyncio.Lock()

    async def _shared_connection(self) -> SharedConnection | None:
        """The connection the calls of this event loop share (see :mod:`._redis_shared`),
        opened on first use and again after it was lost or was idle longer than the
        health-check interval (when there is one); None when calls go through redis-py's
        own path. Those of loops closed since (a script's earlier ``asyncio.run``) are
        closed."""
        if self._client is None:
            raise StoreUnavailableError("redis", "the client is closed")
        loop = asyncio.get_running_loop()
        shared = self._shared.get(loop)
        if shared is not None:
            idle = time.monotonic() - shared.last_used
            if shared.usable and (not self._idle_limit or idle < self._idle_limit):
                return shared
            await self._drop_shared()
        for other in [other for other in list(self._shared) if other.is_closed()]:
            self._opening.pop(other, None)
            await _close_shared(self._shared.pop(other, None))
        client = self._client
        if not isinstance(client, Redis) or client.connection_pool.connection_kwargs.get(
            "protocol"
        ) not in (None, 2, "2"):
            return None
        opening = self._opening.get(loop)
        if opening is None:
            pool = client.connection_pool
            opening = self._opening[loop] = asyncio.ensure_future(
                SharedConnection.open(pool, reply_timeout=self._timeout)
            )
        try:
            shared = await asyncio.shield(opening)
        finally:
            if opening.done() and self._opening.get(loop) is opening:
                del self._opening[loop]
        return self._shared.setdefault(loop, shared)

    async def _drop_shared(self) -> None:
        """Close the connection of this event loop (the next call opens another)."""
        await _close_shared(self._shared.pop(asyncio.get_running_loop(), None))

    def _script(self, source: str) -> AsyncScript:
        if self._client is None:
            raise StoreUnavailableError("redis", "the client is closed")
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._client.register_script(source)
        return script

    def _retryable(self, exc: Exception) -> bool:
        if isinstance(exc, RedisTimeoutError | TimeoutError):
            return self._retry_on_timeout
        return _connection_lost(exc)

    def _redact(self, exc: BaseException) -> str:
        # redis-py's cluster pipeline puts the failing command in its errors, keys and
        # values (users' ids and data) included: only its number is kept.
        message = _PIPELINE_COMMAND.sub(r"\1", f"{type(exc).__name__}: {exc}")
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return message


# How redis-py's cluster pipeline names the failing command in its errors: its number, then
# up to 100 characters of its name, keys and values.
_PIPELINE_COMMAND = re.compile(r"(Command # \d+) \(.{0,100}\)(?= of pipeline caused error: )", re.S)


async def _close_shared(shared: SharedConnection | None) -> None:
    """Close ``shared``: in its own event loop when that runs in another thread (a store
    closed there meanwhile)."""
    if shared is None:
        return
    loop = shared.loop
    if loop is not asyncio.get_running_loop() and loop.is_running():
        with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
            asyncio.run_coroutine_threadsafe(shared.close(), loop)
        return
    await shared.close()


def _needs_discovery(client: RedisClient | None) -> bool:
    """Whether a cluster client is marked to discover its nodes again (a node failed)."""
    return bool(getattr(client, "_initialize", False))


_MISPLACED_USERINFO = (
    "REDIS_URL is not valid: a user name or password holding '/', '?' or '#' must"
    " percent-encode it (%2F, %3F, %23)"
)


def _userinfo_outside_address(url: str) -> bool:
    """Whether an ``@`` of ``url`` falls after its address (host and port), as when a
    password holds an unencoded ``/``, ``?`` or ``#``: the address ends there, and what
    precedes it, part of the password, reads as a host or a port that errors would quote."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return False
    return "@" in url and "@" not in netloc


def _userinfo_misplaced(url: str) -> bool:
    """Whether ``url`` surely has its user or password past its address: an ``@`` in the
    path (a database number) or fragment, or in a query part that is not ``name=value``."""
    if not _userinfo_outside_address(url):
        return False
    parts = urlsplit(url)
    in_query = any("@" in part and "=" not in part for part in parts.query.split("&"))
    return "@" in parts.path or "@" in parts.fragment or in_query


class RedisBackedService(StartedGuard):
    """A service on a :class:`RedisStore`: AgentScope's constructor arguments, and the
    lifecycle (``start`` opens, ``health`` pings).

    ``redis_client`` injects a ready client (used as-is, not closed by ``stop()``);
    ``ttl_seconds`` is a sliding expiry refreshed on every read and write (None: never).
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
        health_check_interval: float = 30.0,
        socket_keepalive: bool = True,
        *,
        password: str | None = None,
        cluster: bool = False,
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> None:
        self._redis = RedisStore(
            url=redis_url,
            client=redis_client,
            password=password,
            cluster=cluster,
            key_prefix=key_prefix,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            max_connections=max_connections,
            retry_on_timeout=retry_on_timeout,
            health_check_interval=health_check_interval,
            socket_keepalive=socket_keepalive,
        )
        self._ttl = optional_ttl_seconds(ttl_seconds) or 0

    async def start(self) -> None:
        await self._redis.open()
        self._set_started(True)

    async def stop(self) -> None:
        await self._finish_calls()
        await self._redis.close()

    @service_call
    async def _apply_writes(self, commands: Sequence[Command], *, idempotent: bool) -> list[Any]:
        """A transaction of prepared writes, applied through this service's store: a
        call of its own, which ``stop()`` lets finish."""
        return await self._redis.transaction(commands, idempotent=idempotent)

    async def health(self) -> bool:
        return self._started and await self._redis.ping()


__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFAULT_REDIS_URL",
    "LUA_DELETE_KEYS",
    "LUA_TOUCH",
    "MAX_POSITION",
    "Command",
    "RedisBackedService",
    "RedisClient",
    "RedisStore",
    "RedisWrite",
    "ScriptCall",
    "escape",
    "glob_escape",
    "text",
    "user_key_prefix",
]
