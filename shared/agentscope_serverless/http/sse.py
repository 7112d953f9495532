"""The one Server-Sent Events encoder, and the streaming response with keep-alive comments.

>>> encode('{"a":1}')
b'data: {"a":1}\\n\\n'
>>> encode('{"a":1}', id=3)
b'id: 3\\ndata: {"a":1}\\n\\n'
>>> encode('{"a":1}', event="response.created")
b'event: response.created\\ndata: {"a":1}\\n\\n'

:class:`EventStreamResponse` streams encoded chunks and writes a ``: ping`` comment whenever
nothing was sent for ``ping_interval`` seconds, so proxies and load balancers keep the
connection open while an agent thinks. The chunks are produced in the request's own task;
only the (mostly sleeping) pinger runs beside it, so a fast stream pays almost nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping

from fastapi.responses import StreamingResponse
from starlette.types import Send

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"


def encode(data: str, *, event: str | None = None, id: int | None = None) -> bytes:
    """One SSE event: optional ``id:`` and ``event:`` lines and one ``data:`` line (``data`` is
    one line)."""
    if id is not None:
        return b"id: " + str(id).encode() + b"\n" + encode(data, event=event)
    if event is None:
        return b"data: " + data.encode() + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data.encode() + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response of ``chunks``, with a ping after each silence."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        ping_interval: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            chunks,
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self.ping_interval = ping_interval

    async def stream_response(self, send: Send) -> None:
        last_sent = time.monotonic()

        async def ping_when_silent() -> None:
            while True:
                await asyncio.sleep(max(0.0, last_sent + self.ping_interval - time.monotonic()))
                if time.monotonic() - last_sent >= self.ping_interval:
                    await send({"type": "http.response.body", "body": PING, "more_body": True})

        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        # Each send writes whole events, so a ping landing between two of them is harmless:
        # no lock is needed between the pinger and this loop.
        pinger = asyncio.create_task(ping_when_silent())
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                last_sent = time.monotonic()
        finally:
            pinger.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


__all__ = ["DONE", "MEDIA_TYPE", "PING", "EventStreamResponse", "encode"]
