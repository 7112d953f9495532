"""The SSE encoder and the keep-alive streaming responses, driven as ASGI apps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from agentscope_serverless.http.sse import PING, EventStreamResponse, RunEventStream, encode


async def serve(
    response: EventStreamResponse | RunEventStream, *, client_leaves_after: float = 3600
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(client_leaves_after)
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}}
    await response(scope, receive, send)  # type: ignore[arg-type]
    return sent


def bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


def test_encoding() -> None:
    assert encode('{"a": 1}') == b'data: {"a": 1}\n\n'
    assert encode("{}", event="response.created") == b"event: response.created\ndata: {}\n\n"


async def test_pings_fill_silences_between_chunks() -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b"one"
        await asyncio.sleep(0.35)
        yield b"two"

    sent = await serve(EventStreamResponse(slow(), ping_interval=0.1))
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-cache"
    out = bodies(sent)
    assert out[0] == b"one" and out[-2:] == [b"two", b""]
    assert out[1:-2] == [PING] * len(out[1:-2]) and len(out[1:-2]) >= 2


async def test_no_ping_when_chunks_keep_coming_and_none_after_the_end() -> None:
    async def quick() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"x"
            await asyncio.sleep(0.02)

    sent = await serve(EventStreamResponse(quick(), ping_interval=0.1))
    await asyncio.sleep(0.25)
    assert bodies(sent) == [b"x"] * 5 + [b""]


async def test_a_failing_source_raises_its_error() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"ok"
        raise ValueError("source failed")

    with pytest.raises(ValueError, match="source failed"):
        await serve(EventStreamResponse(failing(), ping_interval=1.0))


async def test_chunks_ready_together_go_out_in_one_write() -> None:
    async def burst() -> AsyncIterator[bytes]:
        for piece in (b"a", b"b", b"c"):
            yield piece
        await asyncio.sleep(0.05)
        yield b"d"

    out = bodies(await serve(EventStreamResponse(burst(), ping_interval=10)))
    assert out == [b"abc", b"d", b""]


async def test_an_error_while_producing_ends_the_response_with_it() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"a"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await serve(EventStreamResponse(failing(), ping_interval=10))


async def test_a_cancelled_response_closes_the_chunks() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"x"
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    task = asyncio.create_task(serve(EventStreamResponse(endless(), ping_interval=10)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(closed.wait(), 2)


class EndedRun:
    """A run that has produced its events (``LiveRun``), whose last write takes
    ``store_seconds``: a store slow to answer, or down and the write tried again."""

    def __init__(self, events: list[str], *, store_seconds: float) -> None:
        self.items = [(SimpleNamespace(sequence_number=i), data) for i, data in enumerate(events)]
        self.stored_at = time.monotonic() + store_seconds
        self.detached = False

    @property
    def done(self) -> bool:
        return not self.items

    def take(self) -> list[tuple[Any, str]]:
        items, self.items = self.items, []
        return items

    def changed(self) -> asyncio.Future[None]:
        changed = asyncio.get_running_loop().create_future()
        changed.set_result(None)
        return changed

    def detach(self) -> None:
        self.detached = True

    async def wait_stored(self) -> None:
        await asyncio.sleep(max(self.stored_at - time.monotonic(), 0))


LAST_EVENTS = b'id: 0\ndata: {"a":1}\n\nid: 1\ndata: {"b":2}\n\n'


async def test_a_run_stored_at_once_ends_its_stream_with_its_last_events() -> None:
    run = EndedRun(['{"a":1}', '{"b":2}'], store_seconds=0)
    assert bodies(await serve(RunEventStream(run, ping_interval=0.1))) == [LAST_EVENTS]
    assert run.detached


async def test_pings_go_on_while_the_runs_last_write_is_slow() -> None:
    # The last events are held until the run is stored: the stream must not fall silent
    # meanwhile, or proxies would cut it as dead before the run's end reaches the client.
    run = EndedRun(['{"a":1}', '{"b":2}'], store_seconds=0.45)
    out = bodies(await serve(RunEventStream(run, ping_interval=0.1)))
    assert out[-1] == LAST_EVENTS
    assert out[:-1] == [PING] * len(out[:-1]) and len(out[:-1]) >= 3


async def test_a_client_leaving_during_the_runs_last_write_ends_the_response() -> None:
    run = EndedRun(['{"a":1}', '{"b":2}'], store_seconds=60)
    began = time.monotonic()
    sent = await serve(RunEventStream(run, ping_interval=0.1), client_leaves_after=0.3)
    assert time.monotonic() - began < 5
    assert LAST_EVENTS not in bodies(sent) and run.detached
