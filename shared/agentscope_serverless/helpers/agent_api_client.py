"""A client of an agent API (``POST /process``): stream a request's events::

    client = HTTPAgentAPIClient("http://127.0.0.1:8090/process", token="ask_...")
    for event in client.stream(create_simple_text_request("hi", session_id="s1")):
        if isinstance(event, TextContent) and event.delta:
            print(event.text, end="")  # each piece as it comes
        elif isinstance(event, Message) and event.status == "completed":
            reply = extract_text_from_event(event)  # the whole message's text

``astream`` is the async twin. A non-2xx answer, or an ``{"error": ...}`` line, raises
:class:`AgentAPIError`; a run that fails arrives as its ``failed`` response event.

The agent API may be another party's server, so what it sends is read within bounds: a
compressed answer is unpacked a bounded piece at a time (see
:func:`~agentscope_serverless.unpacking.unpacking`), a failed answer is read up to its first
:data:`MAX_ERROR_BYTES` (all its error needs) for at most the client's ``timeout`` (a body
trickled slower raises :class:`AgentAPIError` saying so), and a line of the event stream
longer than ``max_line_chars`` characters (:data:`MAX_LINE_CHARS` by default) raises
:class:`AgentAPIError` once that much of it has come. The command line's ``invoke`` and
``chat`` read a server within the same bounds (:func:`read_error_body`).
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.helpers.sse_lines import (
    SSELineTooLong,
    aiter_sse_lines,
    iter_sse_lines,
)
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    AudioContent,
    Content,
    DataContent,
    Event,
    FileContent,
    ImageContent,
    Message,
    RefusalContent,
    Role,
    RunStatus,
    TextContent,
)
from agentscope_serverless.unpacking import unpacking

# The most of a failed answer read for its error: an ``{"error": ...}`` body is far shorter.
MAX_ERROR_BYTES = 64 * 1024
# The longest line of an event stream read (by default): a ``data:`` line is one event's
# JSON, a completed message's whole text included; far longer than any reply, it still
# bounds what a line that never ends holds.
MAX_LINE_CHARS = 16 * 1024**2

_CONTENTS: dict[str, type[Content]] = {
    "text": TextContent,
    "image": ImageContent,
    "data": DataContent,
    "audio": AudioContent,
    "file": FileContent,
    "refusal": RefusalContent,
}


class AgentAPIError(AgentScopeServerlessError):
    """The agent API refused the request or broke the protocol."""

    code = "AGENT_API_ERROR"

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class AgentAPIClientBase(ABC):
    """A client that streams the events of an agent request."""

    @abstractmethod
    def stream(self, request: AgentRequest) -> Iterator[Event]:
        """The events of ``request``, as they come."""

    @abstractmethod
    async def astream(self, request: AgentRequest) -> AsyncIterator[Event]:
        """The events of ``request``, as they come (async)."""
        nothing: tuple[Event, ...] = ()
        for event in nothing:  # an async generator, like the implementations
            yield event
        raise NotImplementedError


class HTTPAgentAPIClient(AgentAPIClientBase):
    """An agent API over HTTP: ``endpoint`` is the full URL of the process route.

    ``token`` (sent as a bearer token) and ``headers`` (sent with every request) are read
    when a request is sent: a token renewed by assigning ``client.token`` is the one used.
    A line of the event stream longer than ``max_line_chars`` characters raises
    :class:`AgentAPIError` (see the module's notes for the other bounds).
    """

    def __init__(
        self,
        endpoint: str,
        token: str | None = None,
        timeout: float = 300.0,
        headers: dict[str, str] | None = None,
        max_line_chars: int = MAX_LINE_CHARS,
    ) -> None:
        self.endpoint = endpoint
        self.token = token
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.max_line_chars = max_line_chars

    def _prepare_headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self.headers}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _body(self, request: AgentRequest | Mapping[str, Any]) -> dict[str, Any]:
        # A dict as Runner.stream_query takes one, validated before anything is sent.
        if isinstance(request, Mapping):
            request = AgentRequest.model_validate(request)
        elif not isinstance(request, AgentRequest):
            raise TypeError(
                f"request must be an AgentRequest or a dict, got {type(request).__name__}"
            )
        body = request.model_dump(mode="json", exclude_none=True)
        body["stream"] = True
        return body

    def stream(self, request: AgentRequest | Mapping[str, Any]) -> Iterator[Event]:
        with (
            httpx.Client(timeout=self.timeout, event_hooks=sync_unpacking()) as client,
            client.stream(
                "POST", self.endpoint, json=self._body(request), headers=self._prepare_headers()
            ) as response,
        ):
            if response.status_code >= 400:
                body = read_error_body(response, self.timeout)
                raise _refusal(response.status_code, body, self.timeout)
            try:
                for line in iter_sse_lines(response, self.max_line_chars):
                    event = _event_of_line(line)
                    if event is not None:
                        yield event
            except SSELineTooLong as exc:
                raise _line_too_long(exc) from None

    async def astream(self, request: AgentRequest | Mapping[str, Any]) -> AsyncIterator[Event]:
        async with (
            httpx.AsyncClient(timeout=self.timeout, event_hooks=unpacking()) as client,
            client.stream(
                "POST", self.endpoint, json=self._body(request), headers=self._prepare_headers()
            ) as response,
        ):
            if response.status_code >= 400:
                body = await aread_error_body(response, self.timeout)
                raise _refusal(response.status_code, body, self.timeout)
            try:
                async for line in aiter_sse_lines(response, self.max_line_chars):
                    event = _event_of_line(line)
                    if event is not None:
                        yield event
            except SSELineTooLong as exc:
                raise _line_too_long(exc) from None


def read_error_body(response: httpx.Response, seconds: float) -> bytes | None:
    """The first :data:`MAX_ERROR_BYTES` of a failed answer's body (``b""`` when reading it
    failed), or None when it did not all come within ``seconds``: a server trickling it a byte
    at a time holds its reader that long, and at most one more read (a read under way is not
    interrupted; the client's read timeout bounds it)."""
    deadline = time.monotonic() + seconds
    body = bytearray()
    try:
        for piece in response.iter_bytes():
            body += piece
            if len(body) >= MAX_ERROR_BYTES:
                break
            if time.monotonic() > deadline:
                return None
    except httpx.TimeoutException:
        return None
    except httpx.HTTPError:
        return b""
    return bytes(body[:MAX_ERROR_BYTES])


async def aread_error_body(response: httpx.Response, seconds: float) -> bytes | None:
    """The async twin of :func:`read_error_body`, its whole read ended at ``seconds``."""
    body = bytearray()
    try:
        async with asyncio.timeout(seconds):
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) >= MAX_ERROR_BYTES:
                    break
    except (TimeoutError, httpx.TimeoutException):
        return None
    except httpx.HTTPError:
        return b""
    return bytes(body[:MAX_ERROR_BYTES])


def error_of_body(body: bytes) -> dict[str, Any] | None:
    """The ``{"code", "message", ...}`` of an ``{"error": {...}}`` body (its first
    :data:`MAX_ERROR_BYTES`), else None."""
    try:
        error = json.loads(body[:MAX_ERROR_BYTES] or b"{}")
    except (ValueError, RecursionError):
        return None
    error = error.get("error") if isinstance(error, dict) else None
    return error if isinstance(error, dict) else None


def _refusal(status: int, body: bytes | None, seconds: float) -> AgentAPIError:
    """The error of a failed answer, quoting its ``{"error": {code, message}}`` when the
    first :data:`MAX_ERROR_BYTES` of its body are one (``body`` None: it came too slowly)."""
    if body is None:
        return AgentAPIError(
            f"the agent API answered HTTP {status}, and its error body did not all arrive "
            f"within {seconds:g} s",
            status_code=status,
        )
    error = error_of_body(body)
    detail = f": {error.get('code')}: {error.get('message')}" if error is not None else ""
    return AgentAPIError(f"the agent API answered HTTP {status}{detail}", status_code=status)


def _line_too_long(exc: SSELineTooLong) -> AgentAPIError:
    return AgentAPIError(
        f"the agent API sent a line longer than {exc.max_line_length:,} characters "
        "(the client's max_line_chars)"
    )


_T = TypeVar("_T")


def _now(step: Awaitable[_T]) -> _T:
    """The result of an awaitable that never waits (one of :func:`unpacking`'s, over a sync
    stream), got without an event loop."""
    steps = step.__await__()
    try:
        steps.send(None)
    except StopIteration as done:
        result: _T = done.value
        return result
    steps.close()
    raise RuntimeError("an unpacking step waited for something: it needs an event loop")


class _AsyncOfSync(httpx.AsyncByteStream):
    """A sync byte stream, as the async one :func:`unpacking` reads (it never waits)."""

    def __init__(self, stream: httpx.SyncByteStream) -> None:
        self.stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.stream:
            yield chunk

    async def aclose(self) -> None:
        self.stream.close()


class _SyncOfAsync(httpx.SyncByteStream):
    """The async byte stream :func:`unpacking` gives, over a sync one, read step by step."""

    def __init__(self, stream: httpx.AsyncByteStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[bytes]:
        pieces = aiter(self.stream)
        try:
            while True:
                try:
                    yield _now(anext(pieces))
                except StopAsyncIteration:
                    return
        finally:
            close: Callable[[], Awaitable[None]] | None = getattr(pieces, "aclose", None)
            if close is not None:
                _now(close())

    def close(self) -> None:
        _now(self.stream.aclose())


def sync_unpacking() -> dict[str, list[Callable[[Any], Any]]]:
    """The ``event_hooks`` of an ``httpx.Client`` unpacking a compressed answer a bounded
    piece at a time, as :func:`~agentscope_serverless.unpacking.unpacking`'s do an
    ``httpx.AsyncClient``'s."""
    return _sync_hooks(unpacking())


def _sync_hooks(
    hooks: dict[str, list[Callable[[Any], Any]]],
) -> dict[str, list[Callable[[Any], Any]]]:
    """The async ``event_hooks`` of :func:`unpacking`, for an ``httpx.Client``: its answer's
    sync stream is read through them (none of their steps waits), so a sync client unpacks a
    bounded piece at a time as an async one does."""

    def on_request(request: httpx.Request) -> None:
        for hook in hooks["request"]:
            _now(hook(request))

    def on_response(response: httpx.Response) -> None:
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        response.stream = _AsyncOfSync(stream)
        for hook in hooks["response"]:
            _now(hook(response))
        unpacked = response.stream
        assert isinstance(unpacked, httpx.AsyncByteStream)
        # Left as it was (a plain answer, no cap): read directly.
        is_plain = isinstance(unpacked, _AsyncOfSync) and unpacked.stream is stream
        response.stream = stream if is_plain else _SyncOfAsync(unpacked)

    return {"request": [on_request], "response": [on_response]}


def _event_of_line(line: str) -> Event | None:
    field, value = parse_sse_line(line)
    if field != "data" or value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        raise AgentAPIError("the agent API sent a data line that is not JSON") from None
    if isinstance(data, dict) and "error" in data and "object" not in data:
        raise AgentAPIError(f"the agent API refused the request: {data['error']}")
    return parse_event_from_json(data) if isinstance(data, dict) else None


def parse_sse_line(line: str) -> tuple[str | None, str | None]:
    """``("data", value)`` for ``data: value`` (any field likewise); ``(None, None)`` for a
    blank line or a comment."""
    line = line.rstrip("\r\n")
    if not line or line.startswith(":"):
        return None, None
    field, _, value = line.partition(":")
    return field, value[1:] if value.startswith(" ") else value


def parse_sse_line_bytes(line: bytes) -> tuple[str | None, str | None]:
    """:func:`parse_sse_line` of a UTF-8 line."""
    return parse_sse_line(line.decode("utf-8", errors="replace"))


def parse_event_from_json(data: dict[str, Any]) -> Event | None:
    """The event a ``/process`` data line carries (None if it is not one)."""
    kind = data.get("object")
    try:
        if kind == "response":
            return AgentResponse.model_validate(data)
        if kind == "message":
            return Message.model_validate(data)
        if kind == "content":
            content_class = _CONTENTS.get(str(data.get("type")))
            return content_class.model_validate(data) if content_class else None
    except ValidationError:
        return None
    return None


def extract_text_from_event(event: Event) -> str | None:
    """The text of an event, as AgentScope Runtime's client gives it: a text content's text
    (a delta's piece, or a completed part's whole text), or the text of a completed
    message's text parts joined; None for other events."""
    if isinstance(event, TextContent):
        return event.text
    if isinstance(event, Message) and event.status == RunStatus.Completed and event.content:
        texts = [part.text for part in event.content if isinstance(part, TextContent)]
        return "".join(text for text in texts if text) or None
    return None


def create_simple_text_request(
    query: str, session_id: str | None = None, **kwargs: Any
) -> AgentRequest:
    """A request of one user message with the text ``query``."""
    message = Message(role=Role.USER, content=[TextContent(text=query)])
    return AgentRequest(input=[message], session_id=session_id, **kwargs)


__all__ = [
    "AgentAPIClientBase",
    "AgentAPIError",
    "AgentRequest",
    "AgentResponse",
    "Content",
    "DataContent",
    "Event",
    "HTTPAgentAPIClient",
    "ImageContent",
    "Message",
    "TextContent",
    "aread_error_body",
    "create_simple_text_request",
    "error_of_body",
    "extract_text_from_event",
    "parse_event_from_json",
    "parse_sse_line",
    "parse_sse_line_bytes",
    "read_error_body",
    "sync_unpacking",
]
