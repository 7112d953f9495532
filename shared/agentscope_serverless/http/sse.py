"""The one Server-Sent Events encoder, and the streaming response with keep-alive comments.

>>> encode('{"a":1}')
b'data: {"a":1}\\n\\n'
>>> encode('{"a":1}', event="response.created")
b'event: response.created\\ndata: {"a":1}\\n\\n'

:class:`EventStreamResponse` streams encoded chunks and writes a ``: ping`` comment whenever
nothing was sent for ``ping_interval`` seconds, so proxies and load balancers keep the
connection open while an agent thinks. The chunks are produced in a task of their own, and
everything produced while the previous write was under way goes out in one write: an agent
streaming as fast as it can costs a few writes per run, not one per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from fastapi.responses import StreamingResponse
from starlette.types import Send

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"


def encode(data: str, *, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line and one ``data:`` line (``data`` is one line)."""
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
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        produced: list[bytes] = []
        ready = asyncio.Event()

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
                    try:
                        async with asyncio.timeout(self.ping_interval):
                            await ready.wait()
                    except TimeoutError:
                        await send({"type": "http.response.body", "body": PING, "more_body": True})
                    continue
                body = b"".join(produced)
                produced.clear()
                await send({"type": "http.response.body", "body": body, "more_body": True})
            producer.result()  # an error while producing ends the response as it did
        finally:
            producer.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


__all__ = ["DONE", "MEDIA_TYPE", "PING", "EventStreamResponse", "encode"]
