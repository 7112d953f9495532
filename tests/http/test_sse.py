"""The SSE encoder and its keep-alive, in isolation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentscope_serverless.http.sse import PING, encode, with_keepalive


def test_encoding() -> None:
    assert encode('{"a": 1}') == b'data: {"a": 1}\n\n'
    assert encode("{}", event="response.created") == b"event: response.created\ndata: {}\n\n"


async def test_pings_fill_silences_and_chunks_pass_through() -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b"one"
        await asyncio.sleep(0.25)
        yield b"two"

    out = [chunk async for chunk in with_keepalive(slow(), 0.1)]
    assert out[0] == b"one" and out[-1] == b"two"
    assert out[1:-1] == [PING] * len(out[1:-1]) and len(out) >= 3


async def test_a_failing_source_raises_after_its_chunks() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"ok"
        raise ValueError("source failed")

    got: list[bytes] = []
    with pytest.raises(ValueError, match="source failed"):
        async for chunk in with_keepalive(failing(), 1.0):
            got.append(chunk)
    assert got == [b"ok"]


async def test_closing_the_stream_cancels_the_source() -> None:
    cancelled = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"x"
                await asyncio.sleep(0.01)
        finally:
            cancelled.set()

    stream = with_keepalive(endless(), 1.0)
    assert await anext(stream) == b"x"
    await stream.aclose()
    await asyncio.wait_for(cancelled.wait(), 1.0)
