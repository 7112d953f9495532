"""Bounds on the time a client takes to send a request: its head (request line and headers)
and each part of its body.

uvicorn waits for a request head as long as its client keeps the connection open (its
keep-alive timeout covers only a connection idle between requests, and not one that never
sent anything), and for the rest of a body as long as the connection stays open, even once
it has answered without reading it (a 401): clients that connect and send half a request,
without a token, would hold the server's file descriptors forever.
:func:`head_timeout_protocol` makes uvicorn's HTTP protocol close a connection

- whose request head is not whole within the given seconds of the connection being made,
  or of the first byte of a request after the previous one;
- whose request body stops arriving: no part of it for ``body_timeout`` seconds (a slow
  upload that keeps arriving is not cut), plus :data:`ANSWER_GRACE_SECONDS` for an
  application bounding its own reads of the body to answer first (the 408 of
  ``REQUEST_BODY_TIMEOUT_SECONDS``);
- answered before its body was whole (a 401...): the answer says ``Connection: close``,
  then what the client still sends is read and dropped, for at most :data:`LINGER_SECONDS`
  and :data:`LINGER_BYTES`, before the connection closes (closing at once would reset it
  under a client still writing, which would lose the answer); an answer saying
  ``Connection: close`` itself (a 413 of the application, which drained the body its own
  way) closes it as it ends.

It also makes the event loop log a listening socket's ``accept()`` failing for want of file
descriptors once every :data:`ACCEPT_ERROR_LOG_SECONDS`, in one line: Python's loop logs it,
with its traceback, up to its backlog (2048 for uvicorn) times each time the socket is ready
(every second while it lasts), megabytes of log a minute.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

DEFAULT_HEAD_TIMEOUT_SECONDS = 15.0
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0
# How long, past the body timeout, an application has to answer a stalled body itself.
ANSWER_GRACE_SECONDS = 1.0
# How long, and how much, of what a client still sends after an answer given before its
# body is dropped.
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024 * 1024
# How often, at most, a listening socket failing to accept (out of descriptors) is logged.
ACCEPT_ERROR_LOG_SECONDS = 60.0

logger = logging.getLogger("uvicorn.error")


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, closing a connection whose request head is late, whose
    body stalls, or which was answered before its body was whole."""

    def __init__(
        self,
        *args: Any,
        head_timeout: float = DEFAULT_HEAD_TIMEOUT_SECONDS,
        body_timeout: float = DEFAULT_BODY_TIMEOUT_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        self._lingered = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not isinstance(self.loop.get_exception_handler(), _SparseAcceptErrors):
            self.loop.set_exception_handler(_SparseAcceptErrors(self.loop.get_exception_handler()))
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_received()
        self._body_received()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            # The rest of a body already answered: dropped, up to a bound.
            self._lingered += len(data)
            if self._lingered > LINGER_BYTES:
                self._give_up_body()
            return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._expect_head()

    def on_headers_complete(self) -> None:
        self._head_received()
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not previous:  # not an upgrade: a request with a response to come
            self._close_if_answered_early(self.cycle)
            self._expect_body(self.body_timeout)

    def on_body(self, body: bytes) -> None:
        self._body_received()
        self._expect_body(self.body_timeout)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_received()
        super().on_message_complete()

    def _expect_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_too_late)

    def _head_received(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_late(self) -> None:
        self._head_timer = None
        self._close()

    def _expect_body(self, seconds: float) -> None:
        self._body_timer = self.loop.call_later(seconds, self._body_too_late)

    def _body_received(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_too_late(self) -> None:
        self._body_timer = None
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.keep_alive = False  # its answer (a 408?) closes the connection
            self._body_timer = self.loop.call_later(ANSWER_GRACE_SECONDS, self._give_up_body)
            return
        self._give_up_body()

    def _give_up_body(self) -> None:
        self._body_timer = None
        self._close()

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _close_if_answered_early(self, cycle: RequestResponseCycle) -> None:
        """Make ``cycle``'s answer, when it starts before the body is whole, close the
        connection, after dropping what the client still sends for a while."""
        send = cycle.send

        async def send_closing(message: Any) -> None:
            if (
                message["type"] == "http.response.start"
                and cycle.more_body
                and not _says_close(message)  # else the application read what it would
            ):
                cycle.keep_alive = False  # uvicorn says Connection: close and closes
                cycle.transport = cast("asyncio.Transport", _Lingering(self))
            await send(message)

        cycle.send = send_closing  # type: ignore[method-assign]

    def _linger(self) -> None:
        """Close the connection once the client has read the answer: stop sending, drop
        what it still sends, close when it does, after :data:`LINGER_SECONDS` or past
        :data:`LINGER_BYTES`."""
        if self.transport.is_closing():
            return
        self._lingering = True
        self._body_received()
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self._give_up_body)


def _says_close(message: Any) -> bool:
    """Whether a response's start says ``Connection: close``: an application answering a
    body it refused so (a 413, a 408) has read and dropped what it would of it already."""
    return any(
        bytes(name).lower() == b"connection" and bytes(value).strip().lower() == b"close"
        for name, value in message.get("headers", ())
    )


class _Lingering:
    """A request's view of its connection's transport, whose ``close`` lingers."""

    def __init__(self, protocol: HeadTimeoutProtocol) -> None:
        self._protocol = protocol
        self._transport = protocol.transport

    def close(self) -> None:
        self._protocol._linger()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _SparseAcceptErrors:
    """An event loop's exception handler logging accept failures once in a while.

    Python 3.11's loop, once ``accept()`` fails so, goes on calling it (and logging) for the
    rest of its backlog (uvicorn's: 2048), scheduling as many retries a second later; those
    still pending when the server closes fail on its closed socket, each with a traceback:
    they are dropped as well."""

    def __init__(
        self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> None:
        self._previous = previous
        self._next_report = -math.inf
        self._unreported = 0
        self._failed = False

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if self._failed and message.startswith(_RETRY_ON_A_CLOSED_SOCKET):
            return
        if message != "socket.accept() out of system resource":
            if self._previous is None:
                loop.default_exception_handler(context)
            else:
                self._previous(loop, context)
            return
        self._failed = True
        self._unreported += 1
        if loop.time() < self._next_report:
            return
        logger.error(
            "cannot accept connections: %s (%d failed accepts since the last report; "
            "reported at most every %g s)",
            context.get("exception"),
            self._unreported,
            ACCEPT_ERROR_LOG_SECONDS,
        )
        self._unreported = 0
        self._next_report = loop.time() + ACCEPT_ERROR_LOG_SECONDS


# How the loop names a retry of accept() that failed (on a socket closed since).
_RETRY_ON_A_CLOSED_SOCKET = "Exception in callback BaseSelectorEventLoop._start_serving("


def head_timeout_protocol(
    seconds: float, body_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (its ``http`` option) with a request head due within
    ``seconds`` and each part of a body within ``body_seconds`` of the previous one: a
    partial of :class:`HeadTimeoutProtocol`, which uvicorn calls as it calls a protocol
    class, and which its reloader pickles to hand to a worker process."""
    protocol = functools.partial(
        HeadTimeoutProtocol, head_timeout=seconds, body_timeout=body_seconds
    )
    return cast("type[asyncio.Protocol]", protocol)


__all__ = [
    "DEFAULT_BODY_TIMEOUT_SECONDS",
    "DEFAULT_HEAD_TIMEOUT_SECONDS",
    "HeadTimeoutProtocol",
    "head_timeout_protocol",
]
