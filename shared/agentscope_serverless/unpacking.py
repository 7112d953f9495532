"""Compressed answers of other servers, unpacked a bounded piece at a time.

httpx undoes an answer's ``Content-Encoding`` (gzip, deflate) one received chunk at a time,
each chunk unpacked whole: a few KiB of gzip of gzip unpack to gigabytes, all at once, before
whoever reads the answer could count them. The servers the runtime reads from are not all
its own (a sandbox server, the chat API of a model, another agent), so every client of one
has the event hooks of :func:`unpacking`: they unpack gzip and deflate layers, at most
:data:`PIECE_BYTES` per step, and hand httpx the plain answer; with ``max_bytes`` they also
stop an answer once it has given that many bytes.

>>> import httpx
>>> client = httpx.AsyncClient(event_hooks=unpacking(max_bytes=64 * 1024**2))
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx

# The most one step of unpacking gives (per layer): what a reader holds at once.
PIECE_BYTES = 64 * 1024
_CODINGS = frozenset({"gzip", "x-gzip", "deflate"})


class AnswerTooLarge(httpx.DecodingError):
    """An answer gave more than the ``max_bytes`` of :func:`unpacking`, unpacked."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the answer is larger than {max_bytes} bytes")
        self.max_bytes = max_bytes


class _Layer:
    """One coding undone: gzip, or deflate with its zlib header or without (as httpx reads
    it: servers send both)."""

    def __init__(self, coding: str) -> None:
        self._decompressor: Any = None  # deflate's: made once its first bytes tell which
        if coding != "deflate":
            self._decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)

    def unpack(self, data: bytes) -> Iterator[bytes]:
        """``data`` undone, in pieces of at most ``PIECE_BYTES``."""
        if self._decompressor is None:
            header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._decompressor = zlib.decompressobj(zlib.MAX_WBITS if header else -zlib.MAX_WBITS)
        decompressor = self._decompressor
        while data:
            try:
                piece = decompressor.decompress(data, PIECE_BYTES)
            except zlib.error as exc:
                raise httpx.DecodingError(
                    f"the answer is not valid compressed data: {exc}"
                ) from None
            data = decompressor.unconsumed_tail
            yield piece

    def flush(self) -> bytes:
        return b"" if self._decompressor is None else self._decompressor.flush()


def _unpack(layers: list[_Layer], data: bytes) -> Iterator[bytes]:
    """``data`` undone by each layer in turn, in pieces of at most ``PIECE_BYTES``."""
    if not layers:
        if data:
            yield data
        return
    for piece in layers[0].unpack(data):
        yield from _unpack(layers[1:], piece)


class _UnpackedStream(httpx.AsyncByteStream):
    def __init__(self, raw: httpx.AsyncByteStream, codings: list[str], max_bytes: int | None):
        self._raw = raw
        # Undone last applied first; a coding httpx does not know is left as it is (as
        # httpx leaves it).
        self._layers = [_Layer(coding) for coding in reversed(codings) if coding in _CODINGS]
        self._max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        given = 0
        async for piece in self._pieces():
            given += len(piece)
            if self._max_bytes is not None and given > self._max_bytes:
                raise AnswerTooLarge(self._max_bytes)
            yield piece

    async def _pieces(self) -> AsyncIterator[bytes]:
        async for chunk in self._raw:
            for piece in _unpack(self._layers, chunk):
                yield piece
        # What a layer still holds once all is read (a few bytes), through the layers after.
        for index, layer in enumerate(self._layers):
            for piece in _unpack(self._layers[index + 1 :], layer.flush()):
                yield piece

    async def aclose(self) -> None:
        await self._raw.aclose()


async def _ask_for_what_is_undone(request: httpx.Request) -> None:
    # Only the codings undone here (httpx would ask for more with brotli installed).
    request.headers["Accept-Encoding"] = "gzip, deflate"


def unpacking(max_bytes: int | None = None) -> dict[str, list[Callable[[Any], Any]]]:
    """``event_hooks`` for an ``httpx.AsyncClient`` whose answers come unpacked a bounded
    piece at a time, and with ``max_bytes`` end in :class:`AnswerTooLarge` once they have
    given more than that (unpacked, or sent plain).

    Hooks, not a transport: a client given a transport no longer takes the proxies of
    the environment (``HTTPS_PROXY``), which the hooks leave as they are.
    """

    async def unpack(response: httpx.Response) -> None:
        encoding = response.headers.get("Content-Encoding", "")
        codings = [coding.strip() for coding in encoding.lower().split(",")]
        packed = any(coding in _CODINGS for coding in codings)
        if not packed and max_bytes is None:
            return
        if packed:
            # What httpx reads from now on is the plain answer.
            del response.headers["Content-Encoding"]
            response.headers.pop("Content-Length", None)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _UnpackedStream(response.stream, codings, max_bytes)

    return {"request": [_ask_for_what_is_undone], "response": [unpack]}


__all__ = ["PIECE_BYTES", "AnswerTooLarge", "unpacking"]
