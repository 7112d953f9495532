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
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSELineDecoder:
    """Splits text fed in pieces into lines at ``\\r\\n``, ``\\r`` and ``\\n``, a ``\\r\\n``
    split across two pieces included."""

    def __init__(self) -> None:
        self._pending: list[str] = []  # the pieces of the line not yet ended
        self._after_cr = False  # the last piece ended with "\r": a "\n" first ends no line

    def decode(self, text: str) -> list[str]:
        """The lines ``text`` ends."""
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        parts = _LINE_END.split(text)
        if len(parts) == 1:
            if text:
                self._pending.append(text)
            return []
        parts[0] = "".join(self._pending) + parts[0]
        rest = parts.pop()
        self._pending = [rest] if rest else []
        return parts

    def flush(self) -> list[str]:
        """The last line, when the stream ended without ending it."""
        rest = "".join(self._pending)
        self._pending = []
        self._after_cr = False
        return [rest] if rest else []


def iter_sse_lines(response: httpx.Response) -> Iterator[str]:
    """The lines of a streamed response (``iter_lines``, split as SSE splits them)."""
    decoder = SSELineDecoder()
    for text in response.iter_text():
        yield from decoder.decode(text)
    yield from decoder.flush()


async def aiter_sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The async twin of :func:`iter_sse_lines`."""
    decoder = SSELineDecoder()
    async for text in response.aiter_text():
        for line in decoder.decode(text):
            yield line
    for line in decoder.flush():
        yield line


__all__ = ["SSELineDecoder", "aiter_sse_lines", "iter_sse_lines"]
