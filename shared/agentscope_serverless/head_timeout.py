"""A bound on the time a client takes to send a request's head (request line and headers).

uvicorn waits for a request head as long as its client keeps the connection open (its
keep-alive timeout covers only a connection idle between requests, and not one that never
sent anything): clients that connect and send half a request, without a token, would hold
the server's file descriptors forever. :func:`head_timeout_protocol` makes uvicorn's HTTP
protocol close a connection whose request head is not whole within the given seconds of the
connection being made, or of the first byte of a request after the previous one.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_HEAD_TIMEOUT_SECONDS = 15.0


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, closing a connection whose request head is late."""

    def __init__(
        self, *args: Any, head_timeout: float = DEFAULT_HEAD_TIMEOUT_SECONDS, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_received()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._expect_head()

    def on_headers_complete(self) -> None:
        self._head_received()
        super().on_headers_complete()

    def _expect_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_too_late)

    def _head_received(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def head_timeout_protocol(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (its ``http`` option) with a request head due within
    ``seconds``: a partial of :class:`HeadTimeoutProtocol`, which uvicorn calls as it calls a
    protocol class, and which its reloader pickles to hand to a worker process."""
    protocol = functools.partial(HeadTimeoutProtocol, head_timeout=seconds)
    return cast("type[asyncio.Protocol]", protocol)


__all__ = ["DEFAULT_HEAD_TIMEOUT_SECONDS", "HeadTimeoutProtocol", "head_timeout_protocol"]
