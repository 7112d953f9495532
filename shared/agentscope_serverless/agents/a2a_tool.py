"""Another A2A agent as a tool: ``a2a_agent_tool(url, api_key=...)`` gives an
:class:`~agentscope_serverless.agents.tools.AgentTool` that sends the model's ``message`` to
that agent with the ``a2a-sdk`` client and returns the agent's reply text::

    from agentscope_serverless.agents.a2a_tool import a2a_agent_tool
    from agentscope_serverless.agents.llm import create_llm_app

    helper = await a2a_agent_tool("https://helper.example.com", api_key=KEY)
    app = create_llm_app(tools=[helper])

The tool's name and description come from the remote agent's card (fetched once, with the
key as a bearer token); :func:`ask_a2a_agent` is the same call without the tool wrapper.

Called in a run, the tool acts there for the run's user (``X-User-Id``): the remote agent
keeps each user's sessions and memory apart, as it does for its own users, rather than
holding everyone's under the key's user. So give it a service key of the remote agent; a
user key acts only as its own user, and the tool's calls in other users' runs are refused.

The key and the user go only to the origin (scheme, host and port) of the URL given: the
card's endpoints at another origin are not used (a card naming only such endpoints is
refused with :class:`A2AOriginError`), unless that origin is in ``allowed_origins``. What
the other agent says (its replies, its errors, its card) never carries the key: it is
replaced by ``[redacted]`` (a key of 4 characters or more: a shorter one is no secret to
mask). Each call ends within its ``timeout_seconds``, however slowly the other agent answers
(:class:`A2ATimeoutError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientTimeoutError
from a2a.helpers.proto_helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types import AgentCard, Role, SendMessageRequest, TaskState
from a2a.utils.errors import A2AError

from agentscope_serverless.agents.tools import AgentTool
from agentscope_serverless.errors import AgentError, ConfigurationError
from agentscope_serverless.log import MIN_SECRET_LENGTH, redact
from agentscope_serverless.services._turn import turn_user_id
from agentscope_serverless.settings import BLANK, PADDED
from agentscope_serverless.unpacking import unpacking

# The largest answer of the other agent read (a card, a reply with its task), unpacked.
MAX_ANSWER_BYTES = 64 * 1024**2
# The most of what the other agent said of a failure that an error quotes.
MAX_DETAIL_CHARS = 1000
# What the key is replaced by in what the other agent says (it may echo the request).
REDACTED = "[redacted]"

_PARAMETERS = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "What to ask the agent."}},
    "required": ["message"],
}
_DEFAULT_PORTS = {"http": 80, "https": 443}

# An origin: scheme, host (as sent: lower case, IDNA), port.
_Origin = tuple[str, str, int]


class A2AOriginError(AgentError):
    """The agent card names its endpoints only at origins (scheme, host, port) other than
    the one the tool was given (and those of ``allowed_origins``): the key and the user
    would go there. ``named`` lists the card's origins, ``given`` the allowed ones."""

    def __init__(self, message: str, *, named: list[str], given: list[str]) -> None:
        super().__init__(message)
        self.named = named
        self.given = given


class A2ATimeoutError(AgentError):
    """The other agent did not answer whole within ``limit_seconds``."""

    def __init__(self, message: str, *, limit_seconds: float) -> None:
        super().__init__(message)
        self.limit_seconds = limit_seconds


def _checked_key(api_key: str | None) -> str | None:
    """``api_key``, if an HTTP header can carry it; the key is never quoted (an error
    quoting the header it makes would print it). The key is masked in the log from now on."""
    if not api_key:
        return None
    if api_key != api_key.strip():
        raise ConfigurationError(
            f"the api_key of the A2A agent: {PADDED if api_key.strip() else BLANK}"
        )
    if not (api_key.isascii() and api_key.isprintable()):
        raise ConfigurationError(
            "the api_key of the A2A agent holds a control or non-ASCII character, which no "
            "HTTP header carries"
        )
    redact([api_key])
    return api_key


def _redacted(text: str, api_key: str | None) -> str:
    """``text`` without the key (the other agent may echo the request it got); a key
    shorter than :data:`MIN_SECRET_LENGTH` is left (as in the log): masked, it would blot
    out words, and show the key."""
    if api_key is None or len(api_key) < MIN_SECRET_LENGTH:
        return text
    return text.replace(api_key, REDACTED)


def _origin(url: str) -> _Origin | None:
    """The origin of an http(s) ``url``; None for any other."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return None
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.raw_host:
        return None
    host = parsed.raw_host.decode("ascii")
    return parsed.scheme, host, parsed.port or _DEFAULT_PORTS[parsed.scheme]


def _shown(origin: _Origin | None) -> str:
    if origin is None:
        return "a URL that is not http(s)"
    scheme, host, port = origin
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" + ("" if _DEFAULT_PORTS[scheme] == port else f":{port}")


def _allowed(url: str, allowed_origins: Iterable[str]) -> list[_Origin]:
    """The origin of ``url`` and those of ``allowed_origins`` (one alone may be a string)."""
    if isinstance(allowed_origins, str):
        allowed_origins = [allowed_origins]
    given = _origin(url)
    if given is None:
        raise ConfigurationError("the URL of the A2A agent must be an http(s) URL with a host")
    origins = [given]
    for other in allowed_origins:
        origin = _origin(other)
        if origin is None:
            raise ConfigurationError(
                f"allowed_origins: {other!r} is not an http(s) URL with a host"
            )
        origins.append(origin)
    return origins


def _at(card: AgentCard, origins: list[_Origin], api_key: str | None) -> AgentCard:
    """``card`` with only its endpoints at ``origins``; refused if it has none there."""
    named = [_origin(interface.url) for interface in card.supported_interfaces]
    if all(origin in origins for origin in named):
        return card
    if not any(origin in origins for origin in named):
        shown = sorted({_redacted(_shown(origin), api_key) for origin in named})
        given = [_shown(origin) for origin in origins]
        raise A2AOriginError(
            f"the agent card at {given[0]} names its endpoint at "
            f"{', '.join(shown) if shown else 'no URL'}, not at {' or '.join(given)}: the "
            "key and the user go only to the origin given (list another in allowed_origins "
            "to send them there)",
            named=shown,
            given=given,
        )
    kept = AgentCard()
    kept.CopyFrom(card)
    del kept.supported_interfaces[:]
    kept.supported_interfaces.extend(
        interface
        for interface, origin in zip(card.supported_interfaces, named, strict=True)
        if origin in origins
    )
    return kept


def _headers(api_key: str | None, user_id: str | None = None) -> dict[bytes, bytes]:
    """The key, and the user in UTF-8 as the server reads it (httpx encodes a header given
    as text in ASCII only: a user "josé" could not be named)."""
    headers = {b"Authorization": f"Bearer {api_key}".encode()} if api_key else {}
    if user_id is not None:
        headers[b"X-User-Id"] = user_id.encode()
    return headers


def _hooks() -> dict[str, list[Callable[[Any], Any]]]:
    """The other agent's answers (read whole by the A2A client) up to MAX_ANSWER_BYTES,
    unpacked a bounded piece at a time; a refusal to act for the user named."""
    hooks = unpacking(max_bytes=MAX_ANSWER_BYTES)
    hooks["response"].append(_refused)
    return hooks


async def _refused(response: httpx.Response) -> None:
    if response.status_code == 403:
        raise AgentError(
            "the agent refused to act for this user: its key acts only as its own user "
            "(give the tool a service key of the agent, which acts for each user)"
        )


def _timed_out(exc: BaseException) -> bool:
    """Whether the A2A client's ``exc`` is a read that timed out."""
    return isinstance(exc, A2AClientTimeoutError) or isinstance(
        exc.__cause__, httpx.TimeoutException
    )


def _said(exc: BaseException, api_key: str | None) -> str:
    """What the A2A client's ``exc`` says (the other agent's words among it), without the
    key: redacted before it is cut, so no part of the key either."""
    return _redacted(str(exc), api_key)[:MAX_DETAIL_CHARS]


@contextlib.asynccontextmanager
async def _within(
    seconds: float, api_key: str | None, *, late: str, failed: Callable[[str], str]
) -> AsyncIterator[None]:
    """Bound what runs inside to ``seconds`` in all (:class:`A2ATimeoutError`: ``late``, then
    the limit), and turn the A2A client's failures into an :class:`AgentError` saying
    ``failed`` of what they said, the key left out."""
    limit = asyncio.timeout(seconds)
    try:
        async with limit:
            yield
    except (TimeoutError, A2AError, httpx.HTTPError) as exc:
        if limit.expired() or _timed_out(exc):
            raise A2ATimeoutError(f"{late} within {seconds:g} s", limit_seconds=seconds) from None
        if isinstance(exc, TimeoutError):
            raise
        raise AgentError(failed(_said(exc, api_key))) from None


async def fetch_card(
    url: str,
    *,
    api_key: str | None = None,
    timeout_seconds: float = 30,
    allowed_origins: Iterable[str] = (),
) -> AgentCard:
    """The agent card of the A2A agent at ``url``, read within ``timeout_seconds``, with
    only its endpoints at the origin of ``url`` or one of ``allowed_origins`` (see the
    module): :func:`ask_a2a_agent` sends the key to the card's endpoint."""
    api_key = _checked_key(api_key)
    origins = _allowed(url, allowed_origins)
    async with (
        _within(
            timeout_seconds,
            api_key,
            late=f"the agent card at {url} was not read",
            failed=lambda said: f"cannot read the agent card at {url}: {said}",
        ),
        httpx.AsyncClient(
            headers=_headers(api_key),
            timeout=timeout_seconds,
            event_hooks=unpacking(max_bytes=MAX_ANSWER_BYTES),
        ) as http,
    ):
        card = await A2ACardResolver(http, url).get_agent_card()
    return _at(card, origins, api_key)


async def ask_a2a_agent(
    card: AgentCard,
    message: str,
    *,
    api_key: str | None = None,
    context_id: str | None = None,
    timeout_seconds: float = 120,
    user_id: str | None = None,
) -> str:
    """Send ``message`` to the agent of ``card`` and return its reply text; with
    ``user_id``, as that user (``X-User-Id``, for a service key of the agent).

    The key goes to the endpoint the card names: give a card of :func:`fetch_card` (which
    keeps only the endpoints at the origin it was given) or one of your own. The whole call
    ends within ``timeout_seconds`` (:class:`A2ATimeoutError`); the other agent's words in
    its reply and errors never carry the key.
    """
    api_key = _checked_key(api_key)
    name = _redacted(card.name, api_key)
    async with _within(
        timeout_seconds,
        api_key,
        late=f"the agent {name!r} did not answer",
        failed=lambda said: f"the call to the agent {name!r} failed ({said})",
    ):
        return await _ask(card, message, name, api_key, context_id, timeout_seconds, user_id)


async def _ask(
    card: AgentCard,
    message: str,
    name: str,
    api_key: str | None,
    context_id: str | None,
    timeout_seconds: float,
    user_id: str | None,
) -> str:
    async with httpx.AsyncClient(
        headers=_headers(api_key, user_id),
        timeout=timeout_seconds,
        event_hooks=_hooks(),
    ) as http:
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        request = SendMessageRequest(
            message=new_text_message(message, context_id=context_id, role=Role.ROLE_USER)
        )
        async for response in client.send_message(request):
            if response.HasField("message"):
                return _redacted(str(get_message_text(response.message, delimiter="")), api_key)
            task = response.task
            if task.status.state != TaskState.TASK_STATE_COMPLETED:
                # Its state, and what it said of it (a failed task's error), for the model.
                state = TaskState.Name(task.status.state).removeprefix("TASK_STATE_").lower()
                said = _redacted(get_message_text(task.status.message, delimiter=""), api_key)
                raise AgentError(
                    f"the agent {name!r} did not complete the task "
                    f"({state}{': ' + said if said else ''})"
                )
            reply = "".join(str(get_artifact_text(a, delimiter="")) for a in task.artifacts)
            return _redacted(reply, api_key)
    raise AgentError(f"the agent {name!r} sent no reply")


async def a2a_agent_tool(
    url: str,
    *,
    api_key: str | None = None,
    name: str | None = None,
    timeout_seconds: float = 120,
    allowed_origins: Iterable[str] = (),
) -> AgentTool:
    """The A2A agent at ``url`` as a tool taking one argument, ``message``, that acts for
    the user of the run calling it; the key and the user go only to the origin of ``url``
    or one of ``allowed_origins`` (see the module)."""
    card = await fetch_card(url, api_key=api_key, allowed_origins=allowed_origins)
    api_key = _checked_key(api_key)
    card_name = _redacted(card.name, api_key)
    tool_name = name or re.sub(r"[^A-Za-z0-9_-]", "_", card_name)[:64] or "a2a_agent"

    async def call(arguments: dict[str, Any]) -> str:
        return await ask_a2a_agent(
            card,
            str(arguments.get("message", "")),
            api_key=api_key,
            timeout_seconds=timeout_seconds,
            user_id=turn_user_id(),
        )

    return AgentTool(
        name=tool_name,
        description=_redacted(card.description, api_key) or f"Ask the agent {card_name}.",
        parameters=_PARAMETERS,
        call=call,
    )


__all__ = [
    "A2AOriginError",
    "A2ATimeoutError",
    "a2a_agent_tool",
    "ask_a2a_agent",
    "fetch_card",
]
