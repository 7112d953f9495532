"""The client against a sandbox server that misbehaves at the HTTP level: it echoes the
request (bearer token included) into its errors, answers garbage, an endless or huge body,
or trickles its reply. Each way, the client raises a typed :class:`SandboxError` whose text
never holds the token, reads a bounded amount, and gives up within its time limit.

The server is a real one on loopback, written on a raw socket so it can break HTTP's rules.
"""

from __future__ import annotations

import gzip
import socket
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator

import pytest

from agentscope_serverless.errors import (
    SandboxCapacityError,
    SandboxError,
    SandboxRequestError,
    SandboxUnavailableError,
)
from agentscope_serverless.services.sandbox import SandboxClient
from tests.support.raw_server import Answer, RawServer, raw_servers, response

TOKEN = "echoed-token-0123456789abcdef"


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], RawServer]]:
    with raw_servers() as start:
        yield start


def echo_as_json_detail(connection: socket.socket, head: bytes) -> None:
    detail = head.decode("latin-1").replace('"', "'").replace("\r\n", " | ")
    body = f'{{"detail": "cannot parse: {detail}"}}'.encode()
    connection.sendall(response("400 Bad Request", body, "Content-Type: application/json"))


def echo_as_text(connection: socket.socket, head: bytes) -> None:
    connection.sendall(response("502 Bad Gateway", b"upstream said no to:\n" + head))


def echo_padded(connection: socket.socket, head: bytes) -> None:
    # The token straddles the length (1000) at which the client cuts a long detail.
    padding = b"x" * (992 - head.index(TOKEN.encode()))
    connection.sendall(response("503 Unavailable", padding + head))


async def get_info_error(
    server: RawServer, error: type[SandboxError], token: str = TOKEN
) -> SandboxError:
    """What ``get_info`` on ``server`` raises (an ``error``), asked with ``token``."""
    client = SandboxClient(server.url, token, retries=0)
    try:
        with pytest.raises(error) as caught:
            await client.get_info("sbx-1")
    finally:
        await client.aclose()
    return caught.value


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (echo_as_json_detail, SandboxRequestError),
        (echo_as_text, SandboxUnavailableError),
        (echo_padded, SandboxUnavailableError),
    ],
)
async def test_a_server_echoing_the_request_never_puts_the_token_in_an_error(
    serve: Callable[[Answer], RawServer], answer: Answer, error: type[SandboxError]
) -> None:
    message = str(await get_info_error(serve(answer), error))
    assert "Authorization" in message or "xxxx" in message
    assert TOKEN not in message
    assert TOKEN[:8] not in message


def at_capacity(connection: socket.socket, head: bytes) -> None:
    body = b'{"detail": "the sandbox server is at capacity"}'
    connection.sendall(response("429 Too Many Requests", body, "Content-Type: application/json"))


@pytest.mark.parametrize("token", ["t", "ity"])
async def test_a_token_too_short_to_be_a_secret_leaves_the_servers_error_as_it_said_it(
    serve: Callable[[Answer], RawServer], token: str
) -> None:
    # Masked wherever its letters stood, a token "t" made the error "a[redacted] capaci..."
    # (and showed what the token is).
    refused = await get_info_error(serve(at_capacity), SandboxCapacityError, token)
    assert str(refused).endswith("429 the sandbox server is at capacity")


def bad_gzip(status: str) -> Answer:
    def answer(connection: socket.socket, head: bytes) -> None:
        connection.sendall(response(status, b"this is not gzip", "Content-Encoding: gzip"))

    return answer


def nested_json(status: str) -> Answer:
    def answer(connection: socket.socket, head: bytes) -> None:
        body = b"[" * 200_000 + b"]" * 200_000
        connection.sendall(response(status, body, "Content-Type: application/json"))

    return answer


def retry_after(value: bytes) -> Answer:
    def answer(connection: socket.socket, head: bytes) -> None:
        body = b'{"detail": "full", "code": "SANDBOX_CAPACITY"}'
        head_lines = b"Content-Type: application/json\r\nRetry-After: " + value
        connection.sendall(response("429 Too Many Requests", body, head_lines.decode("latin-1")))

    return answer


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (bad_gzip("200 OK"), SandboxUnavailableError),
        (bad_gzip("500 Internal Server Error"), SandboxUnavailableError),
        (nested_json("200 OK"), SandboxError),
        (nested_json("400 Bad Request"), SandboxRequestError),
        (retry_after(b"9" * 5000), SandboxCapacityError),
        (retry_after("\u00b2".encode("latin-1")), SandboxCapacityError),
    ],
    ids=["bad-gzip", "bad-gzip-error", "deep-json", "deep-json-error", "long-retry", "sup-two"],
)
async def test_garbage_answers_raise_typed_errors(
    serve: Callable[[Answer], RawServer], answer: Answer, error: type[SandboxError]
) -> None:
    await get_info_error(serve(answer), error)


async def test_a_retry_after_past_an_hour_is_capped(serve: Callable[[Answer], RawServer]) -> None:
    server = serve(retry_after(b"86400000"))
    client = SandboxClient(server.url, TOKEN, retries=0)
    try:
        with pytest.raises(SandboxCapacityError) as caught:
            await client.create_from_pool("base")
    finally:
        await client.aclose()
    assert caught.value.retry_after == 3600


def endless(connection: socket.socket, head: bytes, server: list[RawServer]) -> None:
    connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (1024**2, b" " * 1024**2)
    for _ in range(512):  # stops at 512 MiB, far past what the client may read
        server[0].send(connection, chunk)
    connection.sendall(b"0\r\n\r\n")


async def test_an_endless_answer_is_cut_off_at_the_reply_cap(
    serve: Callable[[Answer], RawServer],
) -> None:
    holder: list[RawServer] = []
    holder.append(serve(lambda connection, head: endless(connection, head, holder)))
    client = SandboxClient(holder[0].url, TOKEN, retries=0, max_reply_bytes=4 * 1024**2)
    try:
        with pytest.raises(SandboxUnavailableError, match="larger than 4194304 bytes"):
            await client.call_tool("sbx-1", "run_ipython_cell", {"code": "1"})
    finally:
        await client.aclose()
    # What the server got out before the client hung up: the cap and the socket buffers.
    assert holder[0].sent < 64 * 1024**2


async def test_a_compressed_answer_is_capped_once_decompressed(
    serve: Callable[[Answer], RawServer],
) -> None:
    bomb = gzip.compress(b'{"data": "' + b" " * 256 * 1024**2 + b'"}')
    server = serve(
        lambda connection, head: connection.sendall(
            response("200 OK", bomb, "Content-Encoding: gzip", "Content-Type: application/json")
        )
    )
    client = SandboxClient(server.url, TOKEN, retries=0)
    try:
        with pytest.raises(SandboxUnavailableError, match="larger than 67108864 bytes"):
            await client.get_info("sbx-1")
    finally:
        await client.aclose()


def gzipped(chunks: Iterator[bytes]) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])


async def test_an_answer_compressed_twice_is_capped_without_unpacking_it_whole(
    serve: Callable[[Answer], RawServer],
) -> None:
    # 256 MiB of JSON in a few KiB: gzip of gzip, which the answer may say it is.
    spaces = b" " * 1024**2
    inner = gzipped(iter([b'{"data": "', *(spaces for _ in range(256)), b'"}']))
    bomb = gzipped(iter([inner]))
    server = serve(
        lambda connection, head: connection.sendall(
            response(
                "200 OK", bomb, "Content-Encoding: gzip, gzip", "Content-Type: application/json"
            )
        )
    )
    client = SandboxClient(server.url, TOKEN, retries=0, max_reply_bytes=1024**2)
    tracemalloc.start()
    try:
        with pytest.raises(SandboxUnavailableError, match="larger than 1048576 bytes"):
            await client.get_info("sbx-1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await client.aclose()
    assert peak < 32 * 1024**2


def trickle(connection: socket.socket, head: bytes) -> None:
    body = b'{"data": {"container_name": "sbx-1"}}'
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
    for byte in body:
        connection.sendall(bytes([byte]))
        time.sleep(0.2)  # a slow server: each byte well within the read timeout


async def test_a_server_trickling_its_answer_is_given_up_on_within_the_time_limit(
    serve: Callable[[Answer], RawServer],
) -> None:
    server = serve(trickle)
    client = SandboxClient(server.url, TOKEN, retries=0, timeout=1.0, connect_timeout=1.0)
    try:
        with pytest.raises(SandboxUnavailableError, match="did not answer in time"):
            await client.get_info("sbx-1")
    finally:
        await client.aclose()


def answering(status: str, body: bytes, content_type: str = "application/json") -> Answer:
    def answer(connection: socket.socket, head: bytes) -> None:
        connection.sendall(response(status, body, f"Content-Type: {content_type}"))

    return answer


NOT_JSON = answering("200 OK", b"<html>oops not json</html>", "text/html")
NO_DATA = answering("200 OK", b'{"hello": [1,2,3], "tools": "nope"}')
A_LIST = answering("200 OK", b'["oops", "nope"]')
DATA_OF_ANOTHER_SHAPE = answering("200 OK", b'{"data": "oops nope"}')


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (NOT_JSON, "26 bytes of text/html, not JSON"),
        (NO_DATA, "a JSON object without 'data'"),
        (A_LIST, "JSON a list, not an object with 'data'"),
        (DATA_OF_ANOTHER_SHAPE, "'data' is a text, not"),
    ],
    ids=["not-json", "no-data", "a-list", "data-of-another-shape"],
)
@pytest.mark.parametrize(
    "operation",
    ["get_info", "list_tools", "call_tool", "get_session_mapping", "list_session_keys"],
)
async def test_a_2xx_that_is_not_the_protocols_is_unavailable_saying_so_without_quoting_it(
    serve: Callable[[Answer], RawServer], answer: Answer, said: str, operation: str
) -> None:
    server = serve(answer)
    client = SandboxClient(server.url, TOKEN, retries=0)
    calls = {
        "get_info": lambda: client.get_info("sbx-1"),
        "list_tools": lambda: client.list_tools("sbx-1"),
        "call_tool": lambda: client.call_tool("sbx-1", "run_shell_command", {"command": "ls"}),
        "get_session_mapping": lambda: client.get_session_mapping("s_u"),
        "list_session_keys": lambda: client.list_session_keys(),
    }
    try:
        with pytest.raises(SandboxUnavailableError) as caught:
            await calls[operation]()
    finally:
        await client.aclose()
    message = str(caught.value)
    assert message.startswith(f"{operation} failed: the sandbox server answered something ")
    assert "unreadable" in message
    if operation != "call_tool" or answer is not DATA_OF_ANOTHER_SHAPE:
        assert said in message
    for quoted in ("oops", "nope", "hello", TOKEN[:8]):
        assert quoted not in message


@pytest.mark.parametrize(
    "answer",
    [NOT_JSON, NO_DATA, A_LIST, DATA_OF_ANOTHER_SHAPE],
    ids=["not-json", "no-data", "a-list", "data-of-another-shape"],
)
async def test_a_server_answering_200_not_in_the_protocol_is_not_healthy(
    serve: Callable[[Answer], RawServer], answer: Answer
) -> None:
    server = serve(answer)
    client = SandboxClient(server.url, TOKEN, retries=0)
    try:
        assert await client.health() is False
    finally:
        await client.aclose()


def hang(connection: socket.socket, head: bytes) -> None:
    """Never answers; returns when the client hangs up."""
    while connection.recv(65536):
        pass


async def test_a_hung_server_holds_an_idempotent_call_once_its_time_limit_retries_included(
    serve: Callable[[Answer], RawServer],
) -> None:
    server = serve(hang)
    client = SandboxClient(server.url, TOKEN, timeout=1.0, connect_timeout=1.0, retry_backoff=0)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxUnavailableError, match=r"did not answer in time \(1 s\)"):
            await client.get_info("sbx-1")
    finally:
        await client.aclose()
    # A retry would take it past 2 s: the rest is slack for a busy machine.
    assert time.monotonic() - started < 1.9
    assert server.requests == 1


def unavailable_after(seconds: float) -> Answer:
    def answer(connection: socket.socket, head: bytes) -> None:
        time.sleep(seconds)
        connection.sendall(response("503 Service Unavailable", b'{"detail": "busy"}'))

    return answer


async def test_no_retry_starts_with_too_little_of_the_time_limit_left(
    serve: Callable[[Answer], RawServer],
) -> None:
    # The answer takes 2.9 s of the 4 s limit: after the 0.2 s backoff, 0.9 s would be left,
    # less than the second a retry needs. (A second of slack for a busy machine.)
    server = serve(unavailable_after(2.9))
    client = SandboxClient(server.url, TOKEN, timeout=4.0, retries=2, retry_backoff=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxUnavailableError, match="503 busy"):
            await client.list_tools("sbx-1")
    finally:
        await client.aclose()
    assert time.monotonic() - started < 4.0
    assert server.requests == 1


async def test_a_retry_has_what_is_left_of_the_time_limit(
    serve: Callable[[Answer], RawServer],
) -> None:
    server = serve(unavailable_after(0.3))
    client = SandboxClient(server.url, TOKEN, timeout=2.0, retries=5, retry_backoff=0.05)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxUnavailableError, match="503 busy"):
            await client.list_tools("sbx-1")
    finally:
        await client.aclose()
    assert time.monotonic() - started < 2.0
    # 0.3 s each, 0.05, 0.1, 0.2 s between: 1.55 s for four; a fifth, after 0.4 s, would
    # have 0.05 s, less than the quarter of the limit a retry needs (on a loaded machine,
    # slower answers leave room for fewer).
    assert 2 <= server.requests <= 4
