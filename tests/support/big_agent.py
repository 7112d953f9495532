"""An agent whose reply is 7,000,000 characters, streamed in 64 KB pieces: larger than a
buffered Lambda function returns (6 MB), in events that fit, but for those holding the whole
text (the message completed, the response). Also a custom JSON endpoint and a custom
stream (no run) of that size."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from agentscope_serverless.app import AgentApp

REPLY_CHARS = 7_000_000
_PIECE = 64 * 1024

app = AgentApp(app_name="big")


@app.query(framework="text")
async def query(self: Any, msgs: Any, session: Any = None, **kwargs: Any) -> AsyncIterator[str]:
    for done in range(0, REPLY_CHARS, _PIECE):
        yield "a" * min(_PIECE, REPLY_CHARS - done)


@app.endpoint("/big-json", methods=["GET"])
async def big_json() -> dict[str, str]:
    return {"data": "z" * REPLY_CHARS}


@app.endpoint("/big-stream", methods=["GET"])
async def big_stream() -> AsyncIterator[dict[str, Any]]:
    for done in range(0, REPLY_CHARS, _PIECE):
        yield {"at": done, "chunk": "s" * _PIECE}


@app.endpoint("/big-cr-stream", methods=["GET"])
async def big_cr_stream() -> StreamingResponse:
    """An event stream whose lines end with CR alone, as SSE allows."""

    async def events() -> AsyncIterator[str]:
        for done in range(0, REPLY_CHARS, _PIECE):
            yield f"id: {done}\rdata: {'c' * _PIECE}\r\r"

    return StreamingResponse(events(), media_type="text/event-stream")
