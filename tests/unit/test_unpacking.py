"""Answers of other servers unpacked a bounded piece at a time, through a real loopback
server sending the bytes it is given with the Content-Encoding it is given."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI, Request, Response

from agentscope_serverless.unpacking import PIECE_BYTES, AnswerTooLarge, unpacking
from tests.support.http import running

TEXT = b"The quick brown fox jumps over the lazy dog. " * 50_000  # 2.2 MB


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[str]]]:
    """``POST /answer?encoding=...`` answers with the body posted, as it is, labelled with
    that Content-Encoding; the Accept-Encoding of each request is kept."""
    asked: list[str] = []
    app = FastAPI()

    @app.post("/answer")
    async def answer(request: Request, encoding: str = "") -> Response:
        asked.append(request.headers.get("accept-encoding", ""))
        headers = {"Content-Encoding": encoding} if encoding else {}
        return Response(await request.body(), headers=headers)

    with running(app) as url:
        yield url, asked


async def read(url: str, body: bytes, encoding: str, max_bytes: int | None = None) -> list[bytes]:
    async with httpx.AsyncClient(event_hooks=unpacking(max_bytes)) as client:
        params = {"encoding": encoding}
        async with client.stream("POST", f"{url}/answer", params=params, content=body) as answer:
            return [piece async for piece in answer.aiter_raw()]


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("gzip", gzip.compress(TEXT)),
        ("x-gzip", gzip.compress(TEXT)),
        ("deflate", zlib.compress(TEXT)),
        ("deflate", raw_deflate(TEXT)),  # without the zlib header: servers send both
        ("gzip, deflate", zlib.compress(gzip.compress(TEXT))),
        ("deflate, gzip", gzip.compress(raw_deflate(TEXT))),
        ("", TEXT),
    ],
)
async def test_an_answer_is_unpacked_whole_in_bounded_pieces(
    server: tuple[str, list[str]], encoding: str, packed: bytes
) -> None:
    url, _ = server
    pieces = await read(url, packed, encoding)
    assert b"".join(pieces) == TEXT
    if encoding:
        assert max(map(len, pieces)) <= PIECE_BYTES


async def test_a_coding_not_undone_here_is_left_as_it_is(server: tuple[str, list[str]]) -> None:
    url, _ = server
    assert b"".join(await read(url, b"not brotli", "br")) == b"not brotli"


async def test_an_answer_past_max_bytes_ends_in_an_error_unpacked_or_plain(
    server: tuple[str, list[str]],
) -> None:
    url, _ = server
    for encoding, body in [("gzip", gzip.compress(TEXT)), ("", TEXT)]:
        with pytest.raises(AnswerTooLarge, match="larger than 1000000 bytes"):
            await read(url, body, encoding, max_bytes=1_000_000)
    assert b"".join(await read(url, gzip.compress(TEXT), "gzip", max_bytes=len(TEXT))) == TEXT


async def test_bytes_that_are_not_what_the_coding_says_are_a_decoding_error(
    server: tuple[str, list[str]],
) -> None:
    url, _ = server
    with pytest.raises(httpx.DecodingError, match="not valid compressed data"):
        await read(url, b"plain text, said to be gzip", "gzip")


async def test_only_the_codings_undone_here_are_asked_for(server: tuple[str, list[str]]) -> None:
    url, asked = server
    await read(url, b"x", "")
    assert asked[-1] == "gzip, deflate"


def test_the_proxies_of_the_environment_are_still_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # A client given a transport of its own ignores HTTPS_PROXY; hooks leave it be.
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    client = httpx.AsyncClient(event_hooks=unpacking())
    transport = client._transport_for_url(httpx.URL("https://api.example.com/v1"))
    assert isinstance(transport, httpx.AsyncHTTPTransport)
    assert transport is not client._transport  # the proxy's
