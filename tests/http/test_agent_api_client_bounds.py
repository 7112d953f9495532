"""``HTTPAgentAPIClient`` against an agent URL that is not ours and misbehaves: what it sends
is read within bounds. A failed answer is read only as far as its error needs, a line of the
event stream longer than ``max_line_chars`` fails once that much of it has come, and a
compressed answer is unpacked a bounded piece at a time, by ``stream`` as by ``astream``."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest

from agentscope_serverless.helpers.agent_api_client import (
    AgentAPIError,
    HTTPAgentAPIClient,
    create_simple_text_request,
    extract_text_from_event,
)
from agentscope_serverless.helpers.sse_lines import SSELineDecoder, SSELineTooLong
from agentscope_serverless.schemas.agent_schemas import AgentResponse, Event
from tests.support.raw_server import Answer, raw_servers, response

TEXT_EVENT = (
    'data: {"object":"content","type":"text","delta":true,"msg_id":"m1","index":0,"text":"hello"}'
)
DONE_EVENT = 'data: {"object":"response","status":"completed","id":"r1"}'
EVENT_STREAM = "Content-Type: text/event-stream"


def gzipped(chunks: Iterator[bytes]) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])


def events_of(client: HTTPAgentAPIClient, mode: str) -> list[Event]:
    """The events ``client`` streams, through ``stream`` or ``astream``."""
    request = create_simple_text_request("hi")
    if mode == "sync":
        return list(client.stream(request))

    async def collect() -> list[Event]:
        return [event async for event in client.astream(request)]

    return asyncio.run(collect())


def answering(*answers: bytes) -> Answer:
    def answer(connection: socket.socket, head: bytes) -> None:
        for data in answers:
            connection.sendall(data)

    return answer


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_huge_compressed_failed_answer_is_read_only_as_far_as_its_error_needs(
    mode: str,
) -> None:
    # 32 MiB of JSON (an error, then spaces) in a few KiB: gzip of gzip. The error is all
    # in its first bytes; the rest was unpacked and read whole into memory.
    error = b'{"error": {"code": "BAD_GATEWAY", "message": "upstream down"}}'
    spaces = b" " * 1024**2
    bomb = gzipped(iter([gzipped(iter([error, *(spaces for _ in range(32))]))]))
    headers = ("Content-Encoding: gzip, gzip", "Content-Type: application/json")
    answer = answering(response("502 Bad Gateway", bomb, *headers))
    with raw_servers() as start:
        client = HTTPAgentAPIClient(f"{start(answer).url}/process", token="ask_any", timeout=30)
        tracemalloc.start()
        try:
            with pytest.raises(AgentAPIError) as raised:
                events_of(client, mode)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert str(raised.value) == "the agent API answered HTTP 502: BAD_GATEWAY: upstream down"
    assert raised.value.status_code == 502
    assert peak < 4 * 1024**2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_line_that_never_ends_fails_once_it_is_past_max_line_chars(mode: str) -> None:
    def endless_line(connection: socket.socket, head: bytes) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\n" + EVENT_STREAM.encode() + b"\r\n\r\n")
        connection.sendall(TEXT_EVENT.encode() + b"\n\ndata: ")
        for _ in range(64):  # 64 MiB, and the line still not ended: until the client leaves
            connection.sendall(b"a" * 1024**2)

    with raw_servers() as start:
        server = start(endless_line)
        client = HTTPAgentAPIClient(
            f"{server.url}/process", token="ask_any", timeout=30, max_line_chars=64 * 1024
        )
        events: list[Event] = []
        began = time.monotonic()

        async def collect() -> None:
            async for event in client.astream(create_simple_text_request("hi")):
                events.append(event)

        with pytest.raises(AgentAPIError) as raised:
            if mode == "sync":
                events.extend(client.stream(create_simple_text_request("hi")))
            else:
                asyncio.run(collect())
    assert str(raised.value) == (
        "the agent API sent a line longer than 65,536 characters (the client's max_line_chars)"
    )
    assert [extract_text_from_event(event) for event in events] == ["hello"]
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_compressed_line_is_refused_without_being_unpacked_whole(mode: str) -> None:
    # 32 MiB of one line in a few KiB: gzip of gzip.
    mebibyte = b"a" * 1024**2
    bomb = gzipped(iter([gzipped(iter([b"data: ", *(mebibyte for _ in range(32))]))]))
    answer = answering(response("200 OK", bomb, "Content-Encoding: gzip, gzip", EVENT_STREAM))
    with raw_servers() as start:
        client = HTTPAgentAPIClient(
            f"{start(answer).url}/process", token="ask_any", timeout=30, max_line_chars=1024**2
        )
        tracemalloc.start()
        try:
            with pytest.raises(AgentAPIError, match="longer than 1,048,576 characters"):
                events_of(client, mode)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 12 * 1024**2


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "gzip, gzip", ""])
def test_a_stream_is_read_whole_in_any_coding_and_a_line_of_max_line_chars_is_read(
    mode: str, encoding: str
) -> None:
    long_text = "x" * 200_000
    long_event = TEXT_EVENT.replace('"hello"', json.dumps(long_text))
    body = f"{TEXT_EVENT}\r\n\r\n{long_event}\r\n\r\n{DONE_EVENT}\r\n\r\n".encode()
    for coding in reversed([c.strip() for c in encoding.split(",") if c.strip()]):
        body = gzipped(iter([body])) if coding == "gzip" else zlib.compress(body)
    headers = [EVENT_STREAM] + ([f"Content-Encoding: {encoding}"] if encoding else [])
    with raw_servers() as start:
        url = f"{start(answering(response('200 OK', body, *headers))).url}/process"
        client = HTTPAgentAPIClient(url, token="ask_any", max_line_chars=len(long_event))
        events = events_of(client, mode)
    assert [extract_text_from_event(event) for event in events[:2]] == ["hello", long_text]
    assert isinstance(events[-1], AgentResponse) and events[-1].status == "completed"


def test_a_compressed_stream_left_early_is_closed_and_read_inside_a_running_loop() -> None:
    # ``stream`` called from async code (blocking it), and its reader leaving after the
    # first event.
    body = gzipped(iter([f"{TEXT_EVENT}\n\n{DONE_EVENT}\n\n".encode()]))
    answer = answering(response("200 OK", body, "Content-Encoding: gzip", EVENT_STREAM))

    async def first_event(client: HTTPAgentAPIClient) -> Event:
        for event in client.stream(create_simple_text_request("hi")):
            return event
        raise AssertionError("no event")

    with raw_servers() as start:
        server = start(answer)
        client = HTTPAgentAPIClient(f"{server.url}/process", token="ask_any")
        for _ in range(2):
            assert extract_text_from_event(asyncio.run(first_event(client))) == "hello"
    assert server.requests == 2


def test_the_decoder_refuses_a_line_longer_than_its_limit_however_it_is_split() -> None:
    decoder = SSELineDecoder(max_line_length=5)
    assert decoder.decode("12345\r") == ["12345"]
    assert decoder.decode("\n123") == []
    assert decoder.decode("45") == []
    with pytest.raises(SSELineTooLong, match="longer than 5 characters") as raised:
        decoder.decode("6")
    assert raised.value.max_line_length == 5
    with pytest.raises(SSELineTooLong):
        SSELineDecoder(max_line_length=5).decode("ok\n123456\nok\n")
    with pytest.raises(SSELineTooLong):
        SSELineDecoder(max_line_length=5).decode("ok\n123456")
    assert SSELineDecoder().decode("x" * 100_000 + "\n") == ["x" * 100_000]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_answer_whose_body_trickles_fails_within_the_clients_timeout(mode: str) -> None:
    # The status and headers of a 500, then its body a byte every half second (each within
    # the read timeout): the caller was held for as long as the server kept it up.
    def trickling(connection: socket.socket, head: bytes) -> None:
        connection.sendall(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\nConnection: close\r\n\r\n"
        )
        for _ in range(120):  # 60 s, far past the client's timeout: until the client leaves
            connection.sendall(b" ")
            time.sleep(0.5)

    with raw_servers() as start:
        client = HTTPAgentAPIClient(f"{start(trickling).url}/process", token="ask_any", timeout=3)
        began = time.monotonic()
        with pytest.raises(AgentAPIError) as raised:
            events_of(client, mode)
        took = time.monotonic() - began
    assert str(raised.value) == (
        "the agent API answered HTTP 500, and its error body did not all arrive within 3 s"
    )
    assert raised.value.status_code == 500
    assert took < 20
