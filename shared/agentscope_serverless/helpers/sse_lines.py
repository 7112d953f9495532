"""The lines of a Server-Sent Events stream, split where the SSE spec says: at ``\\r\\n``,
``\\r`` or ``\\n`` only.

httpx's ``iter_lines`` splits with ``str.splitlines``, which breaks lines at U+2028, U+2029,
U+0085 and other characters as well: a reply holding one, sent raw inside an event's JSON,
would arrive as two lines that are not JSON.

>>> decoder = SSELineDecoder()
>>> decoder.decode('data: "a\\u2028b"\\r')
['data: "a\\u2028b"']
>>> decoder.decode("\\ndata: 2")
[]
>>> decoder.flush()
['data: 2']

With ``max_line_length``, a line longer than that many characters (its end not counted)
raises :class:`SSELineTooLong` once that much of it has come: a line that never ends is not
held for ever, however long it grows.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSELineTooLong(ValueError):
    """A line of the stream is longer than the ``max_line_length`` it is read with."""

    def __init__(self, max_line_length: int) -> None:
        super().__init__(f"a line of the stream is longer than {max_line_length:,} characters")
        self.max_line_length = max_line_length


class SSELineDecoder:
    """Splits text fed in pieces into lines at ``\\r\\n``, ``\\r`` and ``\\n``, a ``\\r\\n``
    split across two pieces included; with ``max_line_length``, a longer line raises
    :class:`SSELineTooLong`."""

    def __init__(self, max_line_length: int | None = None) -> None:
        self._pending: list[str] = []  # the pieces of the line not yet ended
        self._pending_length = 0
        self._after_cr = False  # the last piece ended with "\r": a "\n" first ends no line
        self._max_line_length = max_line_length

    def decode(self, text: str) -> list[str]:
        """The lines ``text`` ends."""
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        parts = _LINE_END.split(text)
        if len(parts) == 1:
            if text:
                self._pending.append(text)
                self._pending_length += len(text)
                self._require_within(self._pending_length)
            return []
        parts[0] = "".join(self._pending) + parts[0]
        rest = parts.pop()
        self._pending = [rest] if rest else []
        self._pending_length = len(rest)
        for line in parts:
            self._require_within(len(line))
        self._require_within(len(rest))
        return parts

    def _require_within(self, length: int) -> None:
        if self._max_line_length is not None and length > self._max_line_length:
            raise SSELineTooLong(self._max_line_length)

    def flush(self) -> list[str]:
        """The last line, when the stream ended without ending it."""
        rest = "".join(self._pending)
        self._pending = []
        self._pending_length = 0
        self._after_cr = False
        return [rest] if rest else []


def iter_sse_lines(response: httpx.Response, max_line_length: int | None = None) -> Iterator[str]:
    """The lines of a streamed response (``iter_lines``, split as SSE splits them); with
    ``max_line_length``, a longer line raises :class:`SSELineTooLong`."""
    decoder = SSELineDecoder(max_line_length)
    for text in response.iter_text():
        yield from decoder.decode(text)
    yield from decoder.flush()


async def aiter_sse_lines(
    response: httpx.Response, max_line_length: int | None = None
) -> AsyncIterator[str]:
    """The async twin of :func:`iter_sse_lines`."""
    decoder = SSELineDecoder(max_line_length)
    async for text in response.aiter_text():
        for line in decoder.decode(text):
            yield line
    for line in decoder.flush():
        yield line


__all__ = ["SSELineDecoder", "SSELineTooLong", "aiter_sse_lines", "iter_sse_lines"]
