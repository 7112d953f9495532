"""The one Server-Sent Events encoder, with keep-alive comments.

>>> encode('{"a":1}')
b'data: {"a":1}\\n\\n'
>>> encode('{"a":1}', event="response.created")
b'event: response.created\\ndata: {"a":1}\\n\\n'

:func:`sse_response` streams encoded chunks and writes a ``: ping`` comment whenever the
source has been silent for ``ping_interval`` seconds, so proxies and load balancers keep
the connection open while an agent thinks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from fastapi.responses import StreamingResponse

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
MEDIA_TYPE = "text/event-stream"


def encode(data: str, *, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line and one ``data:`` line (``data`` is one line)."""
    if event is None:
        return b"data: " + data.encode() + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data.encode() + b"\n\n"


class _End:
    """Marks the end of the source in the queue."""


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


async def with_keepalive(
    chunks: AsyncIterator[bytes], ping_interval: float
) -> AsyncIterator[bytes]:
    """``chunks``, with a :data:`PING` after every ``ping_interval`` seconds of silence.

    The source runs in its own task, so waiting for it never cancels it; when the consumer
    goes away (the client disconnected), the source is cancelled.
    """
    queue: asyncio.Queue[bytes | _End | _Failure] = asyncio.Queue(maxsize=64)

    async def pump() -> None:
        try:
            async for chunk in chunks:
                await queue.put(chunk)
        except Exception as exc:
            await queue.put(_Failure(exc))
        else:
            await queue.put(_End())

    task = asyncio.create_task(pump())
    try:
        while True:
            if queue.empty():
                try:
                    async with asyncio.timeout(ping_interval):
                        item = await queue.get()
                except TimeoutError:
                    yield PING
                    continue
            else:
                item = queue.get_nowait()
            if isinstance(item, _End):
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def sse_response(
    chunks: AsyncIterator[bytes],
    *,
    ping_interval: float,
    headers: Mapping[str, str] | None = None,
) -> StreamingResponse:
    """A streaming ``text/event-stream`` response of ``chunks`` with keep-alive pings."""
    return StreamingResponse(
        with_keepalive(chunks, ping_interval),
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )


__all__ = ["DONE", "MEDIA_TYPE", "PING", "encode", "sse_response", "with_keepalive"]
