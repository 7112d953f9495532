"""One Redis connection that every call of a process shares, its commands pipelined.

Redis answers the commands of a connection in the order they came, so calls need not take
turns: each call writes its command at once and is answered by the next reply in line. A
call then costs one write and one future, where the client's pool costs a checkout, its
instrumentation and a read of its own per command (about 55 us against 10 us each, eight
calls at a time, measured here).

The connection itself is made by redis-py (TCP or TLS, AUTH, SELECT, as the URL and the
client's options say); only the traffic after its handshake goes through here, parsed by
``hiredis``. For RESP2 standalone servers: a cluster, or ``protocol=3``, keeps redis-py's
own path. Never for blocking commands (they would hold up every call behind them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Writes buffered beyond this wait for the socket to drain.
_HIGH_WATER = 1 << 20
# Commands this large are written at once rather than with the others of the loop's turn.
_WRITE_AT_ONCE = 1 << 16
_READ_SIZE = 1 << 16
# Arguments longer than this are packed a piece of this many characters at a time, other
# tasks running between pieces: a reply of 50 MB (in a run's events, its turn, its memory)
# packed at once held the event loop, and every other request, for 0.15 s per command.
_PIECE = 1 << 20


def pack(command: Sequence[Any]) -> bytes:
    """``command`` (its name and arguments: str, bytes, int or float) in RESP."""
    try:
        # hiredis packs in C: a burst of a run's events (dozens of arguments) in a third of
        # the time. It takes exact types only (no str subclass, no bool) and no lone
        # surrogates: those take the way below, which raises for what Redis cannot take.
        packed: bytes = hiredis.pack_command(command if type(command) is tuple else tuple(command))
        return packed
    except TypeError:
        return _pack(command)


def _pack(command: Sequence[Any]) -> bytes:
    parts = [b"*%d\r\n" % len(command)]
    for argument in command:
        data = _data(argument)
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


def _data(argument: Any) -> bytes:
    if isinstance(argument, bytes):
        return argument
    if isinstance(argument, str):
        return argument.encode()
    if isinstance(argument, int) and not isinstance(argument, bool):
        return b"%d" % argument  # an IntEnum as its value, not its repr
    if isinstance(argument, float):
        return repr(float(argument)).encode()
    raise DataError(f"a Redis argument must be str, bytes, int or float, not {argument!r}")


_TEXT = (str, bytes)


def _large(commands: Sequence[Sequence[Any]]) -> bool:
    """Whether an argument of ``commands`` is longer than :data:`_PIECE`. Asked before every
    call, so written as plain loops (a third of the time of ``any()`` over a generator: as
    long as packing the usual call)."""
    for command in commands:
        for argument in command:
            if type(argument) is not int and isinstance(argument, _TEXT) and len(argument) > _PIECE:
                return True
    return False


async def pack_in_pieces(commands: Sequence[Sequence[Any]]) -> list[bytes]:
    """``commands`` in RESP, as the parts of :func:`pack`'s bytes (joined, the same), their
    long text encoded :data:`_PIECE` characters at a time, each piece after a turn of the
    event loop."""
    parts: list[bytes] = []
    for command in commands:
        parts.append(b"*%d\r\n" % len(command))
        for argument in command:
            if isinstance(argument, str) and len(argument) > _PIECE:
                pieces = []
                for at in range(0, len(argument), _PIECE):
                    await asyncio.sleep(0)
                    pieces.append(argument[at : at + _PIECE].encode())
            else:
                pieces = [_data(argument)]
            parts += (b"$%d\r\n" % sum(map(len, pieces)), *pieces, b"\r\n")
    return parts


def _error(reply: ResponseError) -> ResponseError:
    """The error of an error reply, as redis-py would raise it (only NOSCRIPT matters)."""
    message = str(reply)
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    return reply


class _Call:
    """A call waiting for the replies of its commands, due by ``deadline`` (loop time)."""

    __slots__ = ("deadline", "expected", "received", "replies")

    def __init__(
        self, replies: asyncio.Future[list[Any]], deadline: float, commands: Sequence[Any]
    ) -> None:
        self.replies = replies
        self.deadline = deadline
        self.expected = len(commands)
        self.received: list[Any] = []


class SharedConnection:
    """A connected redis-py connection whose replies are read here, in order.

    >>> async def demo(pool: ConnectionPool) -> None:
    ...     connection = await SharedConnection.open(pool)
    ...     (pong,) = await connection.execute([("PING",)])
    ...     await connection.close()
    """

    def __init__(
        self, connection: AbstractConnection, *, reply_timeout: float | None = None
    ) -> None:
        reader, writer = connection._reader, connection._writer  # set by connect()
        if reader is None or writer is None:
            raise RedisConnectionError("the connection is not open")
        self._connection = connection
        self._reader = reader
        self._writer = writer
        self.loop = asyncio.get_running_loop()
        # The calls waiting for their replies, in the order they were sent.
        self._waiting: deque[_Call] = deque()
        self._timeout = reply_timeout
        self._watchdog: asyncio.TimerHandle | None = None
        self._parser = hiredis.Reader(replyError=ResponseError)
        self._lost = False
        self._unsent: list[bytes] = []
        self.last_used = time.monotonic()
        self._task = self.loop.create_task(self._read())

    @classmethod
    async def open(
        cls, pool: ConnectionPool, *, reply_timeout: float | None = None
    ) -> SharedConnection:
        """A new connection made with the pool's settings (not taken from the pool). When a
        reply takes more than ``reply_timeout`` seconds, its calls fail and it closes."""
        connection: AbstractConnection = pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            # The handshake's replies are bounded too: a server that accepts connections
            # but does not answer (stopped, or frozen) must not hold the caller forever.
            async with asyncio.timeout(reply_timeout):
                await connection.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.disconnect(nowait=True)
            raise
        return cls(connection, reply_timeout=reply_timeout)

    @property
    def usable(self) -> bool:
        """Whether calls can go through this connection (open, on the running loop)."""
        return not self._lost and self.loop is asyncio.get_running_loop()

    async def execute(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send ``commands`` in one write and return their replies, in order.

        An error reply raises (the first in order), once every reply has come.
        """
        if self._lost:
            raise RedisConnectionError("the connection was lost")
        if not commands:
            return []
        # Packed first: a command that cannot be packed fails before its call waits for a
        # reply (a call waiting for one that never comes would take the next call's).
        if _large(commands):
            parts = await pack_in_pieces(commands)
            if self._lost:
                raise RedisConnectionError("the connection was lost")
        else:
            parts = [b"".join(map(pack, commands))]
        call = _Call(self.loop.create_future(), self.loop.time() + (self._timeout or 0), commands)
        self._waiting.append(call)
        if self._watchdog is None and self._timeout:
            self._watchdog = self.loop.call_at(call.deadline, self._watch)
        if len(parts) > 1 or len(parts[0]) >= _WRITE_AT_ONCE:
            # Nothing to gain from waiting for others: out now, behind what is waiting, its
            # parts as they are (not copied into one).
            self._flush()
            if not self._lost:
                self._writer.writelines(parts)
        else:
            if not self._unsent:
                self.loop.call_soon(self.loop.call_soon, self._flush)
            self._unsent += parts
        self.last_used = time.monotonic()
        if self._writer.transport.get_write_buffer_size() > _HIGH_WATER:
            await self._writer.drain()
        replies = await call.replies
        failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if failed is not None:
            raise failed
        return replies

    def _watch(self) -> None:
        """Replies come in order: when the oldest is late, the connection is stuck."""
        self._watchdog = None
        if self._lost or not self._waiting:
            return
        deadline = self._waiting[0].deadline
        if self.loop.time() >= deadline:
            self._lose(RedisTimeoutError("no reply in time"))
        else:
            self._watchdog = self.loop.call_at(deadline, self._watch)

    def _flush(self) -> None:
        """Write what the calls of this turn of the event loop and the next sent, in one
        write.

        The next turn too: a task woken by a reply often calls again only a turn later
        (woken by another task it waits for). Eight ``/process`` requests at a time on Redis
        made 0.54 writes each with one turn, 0.33 with two (0.62 and 0.42 with their runs
        stored), for 7 to 9% less CPU per request; a third turn gained nothing.
        """
        unsent, self._unsent = self._unsent, []
        if unsent and not self._lost:
            self._writer.write(b"".join(unsent))

    async def close(self) -> None:
        """Close the connection; calls still waiting fail. From another event loop (the
        connection's own may be closed by now), only what needs no waiting is done."""
        with contextlib.suppress(Exception):  # RuntimeError: its loop is closed
            if not self._lost:
                self._lose(RedisConnectionError("the connection was closed"))
            self._task.cancel()
        if self.loop is asyncio.get_running_loop():
            await asyncio.wait([self._task])
            with contextlib.suppress(Exception):
                await self._connection.disconnect()

    async def _read(self) -> None:
        try:
            while True:
                data = await self._reader.read(_READ_SIZE)
                if not data:
                    raise RedisConnectionError("the server closed the connection")
                self._parser.feed(data)
                while (reply := self._parser.gets()) is not False:
                    call = self._waiting[0]
                    if isinstance(reply, ResponseError):
                        reply = _error(reply)
                    call.received.append(reply)
                    if len(call.received) == call.expected:
                        self._waiting.popleft()
                        if not call.replies.done():  # else its caller gave up
                            call.replies.set_result(call.received)
        except (Exception, asyncio.CancelledError) as exc:
            self._lose(exc)

    def _lose(self, exc: BaseException) -> None:
        self._lost = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        failure = (
            exc
            if isinstance(exc, RedisConnectionError | RedisTimeoutError)
            else RedisConnectionError(f"the connection was lost ({type(exc).__name__})")
        )
        while self._waiting:
            replies = self._waiting.popleft().replies
            if not replies.done():
                replies.set_exception(failure)
        self._writer.transport.abort()


__all__ = ["SharedConnection", "pack", "pack_in_pieces"]
