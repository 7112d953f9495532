"""How a request's JSON body is read: as UTF-8 text, and only so.

Python's JSON parser, given bytes, guesses their encoding: a body in UTF-16 or UTF-32 was
run as one in UTF-8, whatever its ``Content-Type`` said. Every route reads its body through
:class:`Utf8Request` instead (:func:`utf8_request`, where a route starts):

- bytes that are not UTF-8 are refused with 422 "the body is not valid UTF-8 text" (see
  :func:`~agentscope_serverless.http.errors.unreadable_body`); so is UTF-16 or UTF-32 text
  of ASCII characters, whose bytes are UTF-8 but hold NUL bytes no JSON text has;
- a ``Content-Type`` naming another charset than UTF-8 (``charset=latin-1``) is refused with
  415 saying the body must be UTF-8 (``utf-8`` or ``utf8``, in any case, or no charset, is);
- a UTF-8 byte order mark before the text is ignored, as RFC 8259 allows (a sender must not
  add one, but Windows tools do).

The body is decoded once, by its parse, as before: the check costs no pass over it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

_UTF8 = frozenset(("utf-8", "utf8"))


class NotUtf8Charset(HTTPException):
    """Raised when a body is read whose ``Content-Type`` names another charset than UTF-8."""

    def __init__(self, charset: str) -> None:
        super().__init__(
            status_code=415,
            detail=f"the body must be UTF-8 JSON: charset {charset[:40]!r} is not supported",
        )


def charset_of(content_type: str | None) -> str | None:
    """The ``charset`` parameter of a ``Content-Type`` (lower case), or None.

    >>> charset_of('application/json; Charset="UTF-8"'), charset_of("application/json")
    ('utf-8', None)
    """
    for parameter in (content_type or "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def loads_utf8(body: bytes) -> Any:
    """``body`` parsed as JSON text in UTF-8 (a UTF-8 byte order mark first is ignored).

    Raises :class:`UnicodeDecodeError` for bytes that are not UTF-8 text, as for text in
    UTF-16 or UTF-32 (its NUL bytes), and :class:`json.JSONDecodeError` for text that is
    not JSON.
    """
    text = body.decode("utf-8-sig")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        nul = body.find(b"\x00")
        if nul >= 0:  # no JSON text holds one: UTF-16 or UTF-32 of ASCII characters
            raise UnicodeDecodeError(
                "utf-8", body, nul, nul + 1, "a NUL byte: UTF-16 or UTF-32 text"
            ) from None
        raise


class Utf8Request(Request):
    """A request whose body is read as JSON in UTF-8 only (see the module)."""

    async def json(self) -> Any:
        """The body parsed as UTF-8 JSON (once); see :func:`loads_utf8`."""
        if not hasattr(self, "_json"):
            charset = charset_of(self.headers.get("content-type"))
            if charset is not None and charset not in _UTF8:
                raise NotUtf8Charset(charset)
            self._json = loads_utf8(await self.body())
        return self._json

    def read_as(self, value: Any) -> None:
        """Have the route read ``value`` as the body's JSON, not the body."""
        self._json = value


def utf8_request(request: Request) -> Utf8Request:
    """``request`` reading its body as UTF-8 JSON: called where a route starts, before its
    body is read."""
    if isinstance(request, Utf8Request):
        return request
    return Utf8Request(request.scope, request.receive)


__all__ = ["NotUtf8Charset", "Utf8Request", "charset_of", "loads_utf8", "utf8_request"]
