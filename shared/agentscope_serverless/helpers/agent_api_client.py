"""A client of an agent API (``POST /process``): stream a request's events::

    client = HTTPAgentAPIClient("http://127.0.0.1:8090/process", token="ask_...")
    for event in client.stream(create_simple_text_request("hi", session_id="s1")):
        if isinstance(event, TextContent) and event.delta:
            print(event.text, end="")  # each piece as it comes
        elif isinstance(event, Message) and event.status == "completed":
            reply = extract_text_from_event(event)  # the whole message's text

``astream`` is the async twin. A non-2xx answer, or an ``{"error": ...}`` line, raises
:class:`AgentAPIError`; a run that fails arrives as its ``failed`` response event.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from pydantic import ValidationError

from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.helpers.sse_lines import aiter_sse_lines, iter_sse_lines
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
    """

    def __init__(
        self,
        endpoint: str,
        token: str | None = None,
        timeout: float = 300.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.token = token
        self.timeout = timeout
        self.headers = dict(headers or {})

    def _prepare_headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self.headers}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _body(self, request: AgentRequest) -> dict[str, Any]:
        body = request.model_dump(mode="json", exclude_none=True)
        body["stream"] = True
        return body

    def stream(self, request: AgentRequest) -> Iterator[Event]:
        with (
            httpx.Client(timeout=self.timeout) as client,
            client.stream(
                "POST", self.endpoint, json=self._body(request), headers=self._prepare_headers()
            ) as response,
        ):
            _check(response.status_code, lambda: response.read())
            for line in iter_sse_lines(response):
                event = _event_of_line(line)
                if event is not None:
                    yield event

    async def astream(self, request: AgentRequest) -> AsyncIterator[Event]:
        async with (
            httpx.AsyncClient(timeout=self.timeout) as client,
            client.stream(
                "POST", self.endpoint, json=self._body(request), headers=self._prepare_headers()
            ) as response,
        ):
            if response.status_code >= 400:
                body = await response.aread()
                _check(response.status_code, lambda: body)
            async for line in aiter_sse_lines(response):
                event = _event_of_line(line)
                if event is not None:
                    yield event


def _check(status: int, read: Any) -> None:
    if status < 400:
        return
    detail = ""
    try:
        body = json.loads(read() or b"{}")
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            detail = f": {error.get('code')}: {error.get('message')}"
    except (ValueError, httpx.HTTPError):
        pass
    raise AgentAPIError(f"the agent API answered HTTP {status}{detail}", status_code=status)


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
    "create_simple_text_request",
    "extract_text_from_event",
    "parse_event_from_json",
    "parse_sse_line",
    "parse_sse_line_bytes",
]
