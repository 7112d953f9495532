"""The one Server-Sent Events encoder, and the streaming response with keep-alive comments.

>>> encode('{"a":1}')
b'data: {"a":1}\\n\\n'
>>> encode('{"a":1}', id=3)
b'id: 3\\ndata: {"a":1}\\n\\n'
>>> encode('{"a":1}', event="response.created")
b'event: response.created\\ndata: {"a":1}\\n\\n'
>>> encode('"a\\u2028b"')
b'data: "a\\\\u2028b"\\n\\n'

The JSON of an event is written with U+2028, U+2029 and U+0085 as JSON escapes: the value is
the same, and clients that split a stream with ``str.splitlines`` (httpx's ``iter_lines``
does), which breaks lines at these characters too, still read each event whole.

:class:`EventStreamResponse` streams encoded chunks and writes a ``: ping`` comment whenever
nothing was sent for ``ping_interval`` seconds, so proxies and load balancers keep the
connection open while an agent thinks. The chunks are produced in a task of their own, and
everything produced while the previous write was under way goes out in one write: an agent
streaming as fast as it can costs a few writes per run, not one per event. Given ``ends_in``
seconds, it ends then, whether or not its chunks have (a stream following a stored run ends
before the time limit of the Lambda invocation serving it; its client resumes it).

:class:`RunEventStream` streams the events of a run executing in this process (a
:class:`~agentscope_serverless.recorder.RecordedRun`) the same way, taking them straight from
the run's log: no task of its own unless it has to wait for the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from fastapi.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"

# Line breaks for str.splitlines, not for SSE, and their JSON escapes.
_SPLITLINES_BREAKS = (("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\x85", "\\u0085"))
_SPLITLINES_BREAKS_UTF8 = tuple(
    (char.encode(), escaped.encode()) for char, escaped in _SPLITLINES_BREAKS
)


def encode(data: str, *, event: str | None = None, id: int | None = None) -> bytes:
    """One SSE event: optional ``id:`` and ``event:`` lines and one ``data:`` line (``data`` is
    one line of JSON)."""
    if event is None:
        if id is not None:
            return b"id: %d\ndata: %b\n\n" % (id, _data(data))
        return b"data: " + _data(data) + b"\n\n"
    if id is not None:
        return b"id: %d\n" % id + encode(data, event=event)
    return b"event: " + event.encode() + b"\ndata: " + _data(data) + b"\n\n"


def _data(data: str) -> bytes:
    """``data`` (JSON) as UTF-8, U+2028, U+2029 and U+0085 escaped (found only in strings)."""
    return escape_line_breaks(data).encode()


def escape_line_breaks(data: str) -> str:
    """``data`` (JSON) with U+2028, U+2029 and U+0085 written as JSON escapes: the same value,
    on one line for every reader (see the module).

    >>> escape_line_breaks('"a\u2028b"')
    '"a\\\\u2028b"'
    """
    if not data.isascii():  # most events are ASCII: one quick pass over them
        for char, escaped in _SPLITLINES_BREAKS:
            if char in data:
                data = data.replace(char, escaped)
    return data


def escaping_line_breaks(send: Send) -> Send:
    """``send`` writing the body of a stream of JSON events (made by another encoder: the
    ``a2a-sdk``'s) with U+2028, U+2029 and U+0085 as JSON escapes, as :func:`encode` does.
    They are found only in JSON strings, so their UTF-8 bytes are replaced as they are; one
    split between two chunks waits for the rest of it."""
    held = b""

    async def escaped(message: Message) -> None:
        nonlocal held
        if message["type"] != "http.response.body":
            await send(message)
            return
        body = held + bytes(message.get("body", b""))
        held = _unfinished_break(body) if message.get("more_body", False) else b""
        body = body[: len(body) - len(held)]
        for char, escape in _SPLITLINES_BREAKS_UTF8:
            if char in body:
                body = body.replace(char, escape)
        await send({**message, "body": body})

    return escaped


def _unfinished_break(body: bytes) -> bytes:
    """The end of ``body`` that may be the first bytes of U+2028, U+2029 or U+0085 (lead
    bytes, never found in another character's encoding)."""
    if body.endswith(b"\xe2\x80"):
        return body[-2:]
    if body.endswith((b"\xe2", b"\xc2")):
        return body[-1:]
    return b""


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response of ``chunks``, with a ping after each silence. As a
    route's ``response_class``, it documents the route's success as an event stream only."""

    media_type = MEDIA_TYPE

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        ping_interval: float,
        headers: Mapping[str, str] | None = None,
        ends_in: float | None = None,
    ) -> None:
        super().__init__(
            chunks,
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self.ping_interval = ping_interval
        self.ends_in = ends_in

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        produced: list[bytes] = []
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        ends_at = None if self.ends_in is None else loop.time() + self.ends_in

        async def produce() -> None:
            try:
                async for chunk in self.body_iterator:
                    produced.append(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
                    ready.set()
            finally:
                ready.set()

        producer = asyncio.create_task(produce())
        try:
            while produced or not producer.done():
                if not produced:
                    ready.clear()
                    wait = self.ping_interval
                    if ends_at is not None:
                        wait = min(wait, ends_at - loop.time())
                        if wait <= 0:
                            break  # out of time: the stream ends here
                    try:
                        async with asyncio.timeout(wait):
                            await ready.wait()
                    except TimeoutError:
                        if wait == self.ping_interval:
                            await send(
                                {"type": "http.response.body", "body": PING, "more_body": True}
                            )
                    continue
                body = b"".join(produced)
                produced.clear()
                await send({"type": "http.response.body", "body": body, "more_body": True})
            else:
                producer.result()  # an error while producing ends the response as it did
        finally:
            if not producer.done():
                producer.cancel()
                # Its source is closed before the response ends: nothing of it is left to
                # run after (in a Lambda environment, frozen until its next invocation).
                await asyncio.wait([producer], timeout=1)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class LiveRun(Protocol):
    """What :class:`RunEventStream` needs of a run (a ``RecordedRun``)."""

    @property
    def done(self) -> bool: ...

    def take(self) -> list[tuple[Any, str]]: ...

    def changed(self) -> asyncio.Future[None]: ...

    def detach(self) -> None: ...

    async def wait_stored(self) -> None: ...


class RunEventStream(Response):
    """The events of an executing ``run`` as SSE, each with its sequence number as ``id:``,
    with a ping after each silence of ``ping_interval`` seconds.

    Whatever the run produced since the last write goes out in one write. The run's last
    events go out once the run is stored, in the write that ends the response: a client that
    has its final event can resume or read the run anywhere. A client leaving detaches the
    run (see ``RecordedRun.detach``).
    """

    def __init__(
        self, run: LiveRun, *, ping_interval: float, headers: Mapping[str, str] | None = None
    ) -> None:
        self.run = run
        self.ping_interval = ping_interval
        # Listens for the client leaving, started only when the run makes us wait.
        self._disconnected: asyncio.Future[Any] | None = None
        # When the stream last sent something (monotonic): a ping follows each silence.
        self._sent_at = 0.0
        self.status_code = 200
        self.media_type = MEDIA_TYPE
        self.background = None
        self.init_headers(
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self.run
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        self._sent_at = time.monotonic()
        try:
            while True:
                items = run.take()
                if run.done:
                    if await self._wait_stored(receive, send):
                        return
                    break
                if items:
                    await self._send(send, _body(items))
                    continue
                if await self._wait(run.changed(), receive, send):
                    return
        finally:
            if self._disconnected is not None:
                self._disconnected.cancel()
            run.detach()
        await send({"type": "http.response.body", "body": _body(items), "more_body": False})

    async def _send(self, send: Send, body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})
        self._sent_at = time.monotonic()

    def _until_ping(self) -> float:
        """Seconds left until the stream has been silent for ``ping_interval``."""
        return max(self._sent_at + self.ping_interval - time.monotonic(), 0.0)

    async def _wait_stored(self, receive: Receive, send: Send) -> bool:
        """Wait until the run's last write is done; True when the client has left meanwhile.

        The pings go on meanwhile: a store slow to answer (or down, the write then tried
        again) must not leave the stream silent, which proxies take for a dead connection.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._until_ping()):
                await self.run.wait_stored()  # at once, unless a write is under way
                return False
        stored = asyncio.ensure_future(self.run.wait_stored())
        try:
            while not stored.done():
                if await self._wait(stored, receive, send):
                    return True
        finally:
            stored.cancel()
        return False

    async def _wait(self, future: asyncio.Future[Any], receive: Receive, send: Send) -> bool:
        """Wait for ``future``, sending a ping if the stream has been silent for
        ``ping_interval`` by then; True when the client has left meanwhile."""
        if self._disconnected is None:
            self._disconnected = asyncio.ensure_future(receive())
        disconnected = self._disconnected
        ready, _ = await asyncio.wait(
            (future, disconnected), timeout=self._until_ping(), return_when=asyncio.FIRST_COMPLETED
        )
        if disconnected in ready:
            if disconnected.result().get("type") == "http.disconnect":
                return True
            self._disconnected = None
        elif not future.done():
            await self._send(send, PING)
        return False


def _body(items: list[tuple[Any, str]]) -> bytes:
    """Events and their JSON, as SSE with their sequence numbers as ids."""
    return b"".join([encode(data, id=event.sequence_number) for event, data in items])


__all__ = [
    "DONE",
    "MEDIA_TYPE",
    "PING",
    "EventStreamResponse",
    "LiveRun",
    "RunEventStream",
    "encode",
    "escape_line_breaks",
    "escaping_line_breaks",
]
