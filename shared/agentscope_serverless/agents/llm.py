"""An agent on any OpenAI-compatible chat completions API, with tools.

It streams the model's tokens, runs the tools the model calls, hands the results back and
asks again, until the model answers without calling a tool (at most ``LLM_MAX_ITERATIONS``
model calls). A call that fails before any of its reply arrived (a rate limit, a server
error, a lost connection) is made again, up to ``LLM_MAX_RETRIES`` times, waiting as the
API's ``Retry-After`` says. A tool output longer than ``LLM_MAX_TOOL_OUTPUT_CHARS`` reaches
the model cut in the middle (the session keeps it whole), and the oldest messages of the
history are left out of a request longer than ``LLM_MAX_CONTEXT_CHARS`` (recalled memories
take at most a quarter of it). A reply longer than ``LLM_MAX_REPLY_CHARS`` (or one line of
it longer than such a reply could be) fails the run; a tool call whose arguments are not a
JSON object is answered without running it, and kept with the arguments ``{}``; a reply cut
at the model's output limit or by a content filter says so in its message's ``metadata``
(``finish_reason``); the model's refusal to answer is its message's ``RefusalContent``.
The API is reached with plain HTTP (``POST {LLM_BASE_URL}/chat/completions``, a query of
the URL kept after it, ``Authorization: Bearer {LLM_API_KEY}``, model ``LLM_MODEL``)::

    from agentscope_serverless.agents.llm import create_llm_app
    app = create_llm_app(tools=[weather_tool])

``app`` below is the same without tools, configured from settings
(``AGENT_APP=agentscope_serverless.agents.llm:app``); ``sandbox_app`` also offers the
built-in sandbox tools (Python, shell, files) on the user's session sandbox, on the sandbox
server of ``SANDBOX_BASE_URL`` (``AGENT_APP=agentscope_serverless.agents.llm:sandbox_app``)::

    app = create_llm_app(tools=[weather_tool], sandbox_tools=True)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import json
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from agentscope_serverless.agents.sandbox_tools import session_sandbox_tools
from agentscope_serverless.agents.tools import AgentTool
from agentscope_serverless.app import AgentApp
from agentscope_serverless.errors import AgentError
from agentscope_serverless.log import logger
from agentscope_serverless.runner import Runner
from agentscope_serverless.sandbox_protocol import BASE
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    DataContent,
    FunctionCall,
    FunctionCallOutput,
    Message,
    MessageType,
    RefusalContent,
    Role,
    TextContent,
    convert_to_openai_messages,
    convert_to_openai_tool_call,
)
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._validation import (
    nests_deeper_than,
    valid_streamed_text,
    valid_text,
)
from agentscope_serverless.services.sandbox.service import SandboxService
from agentscope_serverless.services.sandbox.tools import BUILTIN_TOOLS, ToolDefinition, as_tool
from agentscope_serverless.settings import Settings
from agentscope_serverless.unpacking import unpacking

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
# More tokens than any context holds: a usage count past it is no count of one model call.
MAX_USAGE_TOKENS = 10**9
# One line of a stream (or a reply not streamed) may take this many bytes per character of
# ``LLM_MAX_REPLY_CHARS`` (the most a character takes in JSON: an escaped surrogate pair,
# ``\ud83d\ude00``) plus the envelope: a longer line could not hold a reply that fits.
LINE_BYTES_PER_REPLY_CHAR = 12
LINE_ENVELOPE_BYTES = 1 << 20
# Why a reply may end that its message says (``metadata["finish_reason"]``): cut at the
# model's output limit, or by the API's content filter.
NOTABLE_FINISH_REASONS = frozenset({"length", "content_filter"})
# Recalled memories take at most this fraction (1/n) of ``LLM_MAX_CONTEXT_CHARS``.
MEMORY_SHARE = 4
# Answers worth asking again (as OpenAI's SDK does): a timeout, a conflict, a rate limit and
# server errors; an answer saying ``x-should-retry`` overrides this.
RETRIED_STATUSES = frozenset({408, 409, 429})
# The longest ``Retry-After`` followed; a longer one is replaced by the backoff's own wait.
MAX_RETRY_AFTER_SECONDS = 60.0
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 8.0


@dataclass(frozen=True)
class _Config:
    base_url: str
    api_key: SecretStr | None
    model: str
    system_prompt: str
    max_iterations: int
    timeout: float
    max_retries: int
    max_tool_output: int
    max_context: int
    max_reply_chars: int


class LLMAgent:
    """Chat with a model over an OpenAI-compatible API, calling ``tools`` as it asks.

    Every argument left out comes from ``settings``, else from the settings each run is given
    (the runner's, resolved by the process's composition root, secrets included).

    >>> agent = LLMAgent(base_url="http://127.0.0.1:9000/v1", model="local-model")
    """

    def __init__(
        self,
        *,
        tools: Sequence[AgentTool] = (),
        base_url: str | None = None,
        api_key: SecretStr | str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        max_iterations: int | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_tool_output: int | None = None,
        max_context: int | None = None,
        max_reply_chars: int | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.tools = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            raise ValueError("tool names must be unique")
        self._overrides: dict[str, Any] = {
            "base_url": base_url,
            "api_key": SecretStr(api_key) if isinstance(api_key, str) else api_key,
            "model": model,
            "system_prompt": system_prompt,
            "max_iterations": max_iterations,
            "timeout": timeout,
            "max_retries": max_retries,
            "max_tool_output": max_tool_output,
            "max_context": max_context,
            "max_reply_chars": max_reply_chars,
        }
        self._settings = settings
        self._config: _Config | None = None
        self._config_source: Settings | None = None
        self._http: httpx.AsyncClient | None = None

    async def run(
        self,
        messages: Sequence[Message],
        *,
        memories: Sequence[Message] = (),
        usage: dict[str, int] | None = None,
        tools: Sequence[AgentTool] = (),
        settings: Settings | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[TextContent | RefusalContent | Message]:
        """Answer the conversation ``messages``: text deltas, then tool calls and results.

        Yields :class:`TextContent` deltas as the model streams (and :class:`RefusalContent`
        deltas, in the same message, as it refuses to answer), and for each round of tool
        calls a ``function_call`` :class:`Message` and one ``function_call_output`` message
        per call. The token counts of each model call (the last it reports) are added to
        ``usage``. ``tools`` are
        offered for this run only, besides the agent's own. ``settings`` (the runner's, in an
        app) fill what the constructor left out, unless it was given settings of its own.
        ``sampling`` (``temperature``, ``max_tokens``...: see :func:`sampling_options`) goes
        with each model call.
        """
        available = {**self.tools, **{tool.name: tool for tool in tools}}
        if len(available) != len(self.tools) + len(tools):
            raise ValueError("tool names must be unique")
        config = self._settings_config(settings)
        chat = self._chat_messages(config, messages, memories)
        offered = [tool.to_openai() for tool in available.values()]
        for round_number in range(1, config.max_iterations + 1):
            calls = _StreamedToolCalls()
            # A thinking model's reasoning, streamed as a message of its own before the
            # answer (never sent back to the model: reasoning messages are left out).
            reasoning = _StreamedText(MessageType.REASONING)
            answer = _StreamedText(MessageType.MESSAGE)
            size, answered, finish_reason = 0, False, None
            async for chunk in self._complete(config, chat, offered, usage, sampling or {}):
                choice = _choice_of(chunk)
                delta = {} if choice is None else _delta_of(choice)
                if choice is not None:
                    answered = True
                    if isinstance(choice.get("finish_reason"), str):
                        finish_reason = choice["finish_reason"]
                thought = _reasoning_of(delta)
                piece = _text_of(delta.get("content"))
                refused = _refusal_of(delta)
                call_deltas = delta.get("tool_calls") or []
                size += max(
                    1, len(thought) + len(piece) + len(refused) + sum(map(calls.add, call_deltas))
                )
                if size > config.max_reply_chars:
                    raise AgentError(
                        f"the model's reply was longer than {config.max_reply_chars:,} characters",
                        code="LLM_ERROR",
                    )
                if thought:
                    for event in [*answer.close(), *reasoning.add(thought)]:
                        yield event
                if piece or refused or call_deltas:
                    for event in [*reasoning.close(), *answer.add(piece), *answer.refuse(refused)]:
                        yield event
            for event in reasoning.close():
                yield event
            if not answered:
                raise AgentError("the chat API sent no completion", code="LLM_ERROR")
            if not calls.calls:
                notable = finish_reason if finish_reason in NOTABLE_FINISH_REASONS else None
                if notable and not answer.text and not answer.refusal:
                    raise AgentError(UNANSWERED[notable], code="LLM_ERROR")
                for event in answer.close(notable):
                    yield event
                return
            if round_number == config.max_iterations:
                # No model call is left to read their results: the tools are not run.
                raise AgentError(
                    f"the model was still calling tools after {config.max_iterations} rounds",
                    code="AGENT_MAX_ITERATIONS",
                )
            for event in answer.close():
                yield event
            finished = calls.finished(finish_reason, available)
            function_calls = [call for call, _ in finished]
            yield Message(
                type=MessageType.FUNCTION_CALL,
                role=Role.ASSISTANT,
                content=[DataContent(data=call.model_dump()) for call in function_calls],
            )
            chat.append(
                {
                    "role": "assistant",
                    "content": valid_text("".join(answer.text)) or None,
                    "tool_calls": [convert_to_openai_tool_call(call) for call in function_calls],
                }
            )
            for call, refusal in finished:
                output = refusal or await _call_tool(available, call)
                result = FunctionCallOutput(
                    call_id=call.call_id or "", name=call.name, output=output
                )
                yield Message(
                    type=MessageType.FUNCTION_CALL_OUTPUT,
                    role=Role.TOOL,
                    content=[DataContent(data=result.model_dump())],
                )
                chat.append(
                    {
                        "role": "tool",
                        "tool_call_id": result.call_id,
                        "content": cut_tool_output(output, config.max_tool_output),
                    }
                )

    async def aclose(self) -> None:
        """Close the HTTP connections (a later run opens new ones)."""
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def missing_api_key(self, settings: Settings) -> bool:
        """Whether runs with ``settings`` would call the chat API without a key."""
        chosen = self._settings or settings
        return self._overrides["api_key"] is None and chosen.llm_api_key is None

    def _settings_config(self, settings: Settings | None) -> _Config:
        chosen = self._settings or settings
        if self._config is None or self._config_source is not chosen:
            # Settings never come from the environment here: the composition root gives
            # them; without any, the settings' defaults (no API key) are the base.
            self._config_source = chosen
            settings = chosen if chosen is not None else Settings.model_construct()
            defaults = _Config(
                base_url=settings.llm_base_url,
                api_key=settings.llm_api_key,
                model=settings.llm_model,
                system_prompt=settings.llm_system_prompt,
                max_iterations=settings.llm_max_iterations,
                timeout=settings.llm_timeout_seconds,
                max_retries=settings.llm_max_retries,
                max_tool_output=settings.llm_max_tool_output_chars,
                max_context=settings.llm_max_context_chars,
                max_reply_chars=settings.llm_max_reply_chars,
            )
            given = {k: v for k, v in self._overrides.items() if v is not None}
            self._config = dataclasses.replace(defaults, **given)
        return self._config

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # Its answers unpacked a bounded piece at a time (a few KiB may unpack to GiB).
            self._http = httpx.AsyncClient(event_hooks=unpacking())
        return self._http

    @staticmethod
    def _headers(config: _Config) -> dict[str, str]:
        # Per request, not per client: one agent may serve apps with different settings.
        headers = {"Accept": "text/event-stream"}
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        return headers

    def _chat_messages(
        self, config: _Config, messages: Sequence[Message], memories: Sequence[Message]
    ) -> list[dict[str, Any]]:
        system = (
            [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
        )
        # Each message's chat messages (one per output of a round of tool calls), in order.
        converted = [convert_to_openai_messages([message]) for message in messages]
        for group in converted:
            for message in group:
                if message["role"] == "tool" and isinstance(message.get("content"), str):
                    message["content"] = cut_tool_output(message["content"], config.max_tool_output)
                for call in message.get("tool_calls") or []:
                    # Arguments a model cut off, as earlier versions kept them: an API that
                    # reads them back would refuse every later turn of the session.
                    if not _is_json_object(call["function"]["arguments"]):
                        call["function"]["arguments"] = "{}"
        conversation = [message for group in converted for message in group]
        sizes = [_chars(message) for message in conversation]
        budget = config.max_context - sum(map(_chars, system))
        # Recalled memories have a quarter of the budget, and are of messages the request
        # leaves out: the conversation has the rest, or all of it when none is recalled.
        room = config.max_context // MEMORY_SHARE if memories else 0
        first = _first_fitting(conversation, sizes, budget - room)
        held: set[str] = set()
        position = 0
        for original, group in zip(messages, converted, strict=True):
            position += len(group)
            if position > first:
                held.add(_recalled_line(original))
        note = _memory_note(memories, held, room)
        if not note:
            first = _first_fitting(conversation, sizes, budget)
        return [*system, *note, *_paired_tool_messages(conversation[first:])]

    async def _complete(
        self,
        config: _Config,
        chat: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        usage: dict[str, int] | None,
        sampling: Mapping[str, Any],
    ) -> AsyncIterator[dict[str, Any]]:
        """The chunks of one streamed chat completion; its token counts (the last ones it
        reports: some APIs send the running total with every chunk) are added to ``usage``.

        A call that fails before its first chunk is made again (see :func:`_retry_delay`),
        up to ``config.max_retries`` times; once a chunk was handed on, a failure ends it.
        """
        payload: dict[str, Any] = {
            **sampling,
            "model": config.model,
            "messages": chat,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            payload["tools"] = tools
        max_bytes = LINE_BYTES_PER_REPLY_CHAR * config.max_reply_chars + LINE_ENVELOPE_BYTES
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            streamed = False
            # The answer's headers, and a failed answer's body, come within the timeout of
            # the call as a whole: each byte resets the read timeout of the connection, so a
            # server trickling them would hold the run for as long as it keeps on.
            deadline = loop.time() + config.timeout
            try:
                async with contextlib.AsyncExitStack() as answer:
                    try:
                        async with asyncio.timeout_at(deadline):
                            response = await answer.enter_async_context(
                                self._client().stream(
                                    "POST",
                                    _completions_url(config.base_url),
                                    json=payload,
                                    headers=self._headers(config),
                                    timeout=config.timeout,
                                )
                            )
                    except TimeoutError:
                        raise _NoAnswer(f"it did not answer within {config.timeout:g} s") from None
                    if not response.is_success:
                        failure = f"the chat API answered HTTP {response.status_code}"
                        failure += await _named_error(response, deadline)
                        delay = _retry_delay(response, attempt, config.max_retries)
                        if delay is None:
                            raise AgentError(failure, code="LLM_ERROR")
                    else:
                        # The counts of this call added to ``usage`` so far: the last a
                        # chunk gave (some APIs repeat the running total on every chunk).
                        counted: dict[str, int] = {}
                        async for chunk in _chunks(response, config.timeout, max_bytes):
                            streamed = True
                            counts = _usage_counts(chunk.get("usage"))
                            if usage is not None and counts is not None:
                                for key, count in counts.items():
                                    usage[key] = usage.get(key, 0) - counted.get(key, 0) + count
                                counted = counts
                            yield chunk
                        return
            except httpx.LocalProtocolError:
                # Refused here, before anything was sent (a key with a newline makes a header
                # no HTTP client sends): no retry can send it. Its text quotes the header.
                raise AgentError(
                    f"the request to {_chat_api(config.base_url)} cannot be sent: its headers "
                    "are invalid (an API key or header value holding a newline or other "
                    "control character?)",
                    code="LLM_ERROR",
                ) from None
            except (httpx.HTTPError, _NoAnswer) as exc:
                reason = str(exc) if isinstance(exc, _NoAnswer) else type(exc).__name__
                failure = f"cannot reach {_chat_api(config.base_url)}: {reason}"
                if streamed or attempt >= config.max_retries:
                    raise AgentError(failure, code="LLM_UNAVAILABLE") from None
                delay = _backoff(attempt)
            attempt += 1
            logger.warning(
                "%s: calling it again in %.2f s (retry %d of %d)",
                failure,
                delay,
                attempt,
                config.max_retries,
            )
            await asyncio.sleep(delay)


# The options of a request that tune the model's answer, sent with each of its model calls.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "frequency_penalty",
    "presence_penalty",
)


def sampling_options(request: Any) -> dict[str, Any]:
    """The sampling options ``request`` (an :class:`AgentRequest`) gives, as a chat API
    takes them: its limit on tokens is sent as ``max_completion_tokens`` when the client
    named it so (OpenAI's newer models refuse ``max_tokens``), else as ``max_tokens`` (the
    only name some other APIs know).

    >>> sampling_options(AgentRequest(input=[], temperature=0.2, max_tokens=5))
    {'temperature': 0.2, 'max_tokens': 5}
    >>> sampling_options(AgentRequest(input=[], max_tokens=5, max_completion_tokens=5))
    {'max_completion_tokens': 5}
    """
    if not isinstance(request, AgentRequest):
        return {}
    options = {
        field: getattr(request, field)
        for field in SAMPLING_FIELDS
        if getattr(request, field) is not None
    }
    named = (request.model_extra or {}).get("max_completion_tokens")
    if "max_tokens" in options and named == options["max_tokens"]:
        options["max_completion_tokens"] = options.pop("max_tokens")
    return options


def _retry_delay(response: httpx.Response, attempt: int, max_retries: int) -> float | None:
    """How long to wait before asking again after the failed ``response``; None when it
    is not to be asked again: an answer that cannot change (400, 401, 404...), or the last
    retry spent. ``x-should-retry: true``/``false`` decides when the API sends it."""
    if attempt >= max_retries:
        return None
    should_retry = response.headers.get("x-should-retry", "").strip().lower()
    if should_retry == "false":
        return None
    status = response.status_code
    if should_retry != "true" and status not in RETRIED_STATUSES and status < 500:
        return None
    wait = _retry_after(response.headers)
    return _backoff(attempt) if wait is None else wait


def _retry_after(headers: httpx.Headers) -> float | None:
    """The wait the API asks for (``retry-after-ms``, ``Retry-After`` in seconds or as a
    date), when it is one to follow: from 0 to :data:`MAX_RETRY_AFTER_SECONDS`."""
    wait: float | None = None
    try:
        if "retry-after-ms" in headers:
            wait = float(headers["retry-after-ms"]) / 1000
        elif "retry-after" in headers:
            value = headers["retry-after"]
            try:
                wait = float(value)
            except ValueError:
                when = email.utils.parsedate_to_datetime(value)
                wait = when.timestamp() - time.time()
    except (ValueError, TypeError, OverflowError):
        return None
    if wait is None or not 0 <= wait <= MAX_RETRY_AFTER_SECONDS:  # NaN fails both
        return None
    return wait


def _backoff(attempt: int) -> float:
    """The wait before retry ``attempt + 1`` when the API says none: 0.5 s, 1 s, 2 s... up
    to 8 s, less up to a quarter at random, so clients refused together come back apart."""
    wait = min(FIRST_BACKOFF_SECONDS * 2.0**attempt, MAX_BACKOFF_SECONDS)
    return wait * (1 - 0.25 * random.random())


class _NoAnswer(Exception):
    """The chat API did not answer (its headers) within the timeout; says so in words."""


def _completions_url(base_url: str) -> str:
    """``{base_url}/chat/completions``, appended to the URL's path: a query it holds (Azure's
    ``?api-version=...``) stays its query.

    >>> _completions_url("https://h/openai/deployments/d/?api-version=2024-06-01")
    'https://h/openai/deployments/d/chat/completions?api-version=2024-06-01'
    """
    base, mark, query = base_url.partition("?")
    return f"{base.rstrip('/')}/chat/completions{mark}{query}"


def _chat_api(url: str) -> str:
    """``the chat API at scheme://host[:port] (LLM_BASE_URL)``: where the calls went, without
    the credentials, path or query its URL may hold."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        parsed = None
    if parsed is None or not parsed.host:
        return "the chat API (LLM_BASE_URL)"
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    port = "" if parsed.port is None else f":{parsed.port}"
    return f"the chat API at {parsed.scheme}://{host}{port} (LLM_BASE_URL)"


async def _chunks(
    response: httpx.Response, silence: float, max_bytes: int
) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a successful reply: its ``data:`` lines, up to ``[DONE]``.

    A server or proxy that ignores ``stream`` answers with the whole completion as JSON: its
    message is one chunk. A reply with neither (a web page at a wrong base URL) is an error,
    not an empty answer. A stream that sends no part of a reply (see :func:`_makes_progress`)
    for ``silence`` seconds fails, however many keep-alive comments or empty chunks it sends
    meanwhile (each resets the read timeout of the connection, so a server stuck sending them
    would hold the run for ever); so does a completion not streamed that is not whole within
    ``silence`` seconds (one trickling a byte at a time). A line, or a completion, longer than
    ``max_bytes`` fails before it is read whole.
    """
    if response.headers.get("content-type", "").startswith("application/json"):
        try:
            async with asyncio.timeout(silence):
                body = await _whole_body(response, max_bytes)
        except TimeoutError:
            raise AgentError(
                f"cannot reach {_chat_api(str(response.url))}: its completion was not whole "
                f"within {silence:g} s",
                code="LLM_UNAVAILABLE",
            ) from None
        yield _as_chunk(_parse_chunk(body.decode(errors="replace")))
        return
    streamed = False
    loop = asyncio.get_running_loop()
    lines = aiter(_lines(response, max_bytes))
    deadline = loop.time() + silence
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                line = await anext(lines)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise AgentError(
                f"cannot reach {_chat_api(str(response.url))}: it sent no data for {silence:g} s",
                code="LLM_UNAVAILABLE",
            ) from None
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        streamed = True
        chunk = _parse_chunk(data)
        if _makes_progress(chunk):
            deadline = loop.time() + silence
        yield chunk
    if not streamed:
        raise AgentError("the chat API sent no completion", code="LLM_ERROR")


async def _whole_body(response: httpx.Response, max_bytes: int) -> bytearray:
    """The body of a completion not streamed; one longer than ``max_bytes`` fails before it
    is read whole."""
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > max_bytes:
            raise AgentError(
                f"the chat API sent a completion of more than {max_bytes:,} bytes",
                code="LLM_ERROR",
            )
    return body


# The fields of a chunk's delta that bring part of a reply.
PROGRESS_FIELDS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls")


def _makes_progress(chunk: dict[str, Any]) -> bool:
    """Whether ``chunk`` brings part of a reply: content, reasoning, a refusal, tool-call
    deltas, a ``finish_reason`` or usage (not ``{"choices": []}``, nor a delta that only
    names the role)."""
    if chunk.get("usage"):
        return True
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if choice.get("finish_reason") or (
            isinstance(delta, dict) and any(delta.get(field) for field in PROGRESS_FIELDS)
        ):
            return True
    return False


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _lines(response: httpx.Response, max_bytes: int) -> AsyncIterator[str]:
    """The lines of a streamed body, each read up to ``max_bytes`` bytes: a longer one fails
    (``aiter_lines`` would hold a line that never ends, however long it grows)."""
    line = bytearray()
    async for piece in response.aiter_bytes():
        *ended, rest = _LINE_END.split(piece)
        for part in ended:
            line += part
            _require_line_within(line, max_bytes)
            yield line.decode(errors="replace")
            line.clear()
        line += rest
        _require_line_within(line, max_bytes)
    if line:
        yield line.decode(errors="replace")


def _require_line_within(line: bytearray, max_bytes: int) -> None:
    if len(line) > max_bytes:
        raise AgentError(
            f"the chat API sent a line of more than {max_bytes:,} bytes", code="LLM_ERROR"
        )


# An API's name for an error (OpenAI's ``error.code``, else ``error.type``), quoted in the
# run's error when it is one: a key or a message quoting the request never looks like this.
_ERROR_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
# The most of a failed answer read to find its error's name.
_MAX_ERROR_BYTES = 64 * 1024


def _error_name(body: Any) -> str:
    """`` (<name>)`` for a body ``{"error": {"code": <name>}}`` (or ``type``), else ``""``."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        for field in ("code", "type"):
            name = error.get(field)
            if isinstance(name, str) and _ERROR_NAME.fullmatch(name):
                return f" ({name})"
    return ""


async def _named_error(response: httpx.Response, deadline: float) -> str:
    """:func:`_error_name` of a failed answer's JSON (its first 64 KiB); ``""`` when it is
    not whole by ``deadline`` (of the event loop's clock)."""
    body = b""
    try:
        async with asyncio.timeout_at(deadline):
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > _MAX_ERROR_BYTES:
                    return ""
        return _error_name(json.loads(body))
    except (httpx.HTTPError, ValueError, RecursionError, TimeoutError):
        return ""


def _as_chunk(completion: dict[str, Any]) -> dict[str, Any]:
    """A whole (not streamed) chat completion as the one chunk that would stream it."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise AgentError("the chat API sent a completion without a message", code="LLM_ERROR")
    message = choice["message"]
    calls = message.get("tool_calls")
    delta = {
        "content": message.get("content"),
        "refusal": message.get("refusal"),
        "reasoning_content": message.get("reasoning_content") or message.get("reasoning"),
        "tool_calls": [
            {**call, "index": index}
            for index, call in enumerate(calls if isinstance(calls, list) else [])
            if isinstance(call, dict)
        ],
    }
    choice = {"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}
    return {"choices": [choice], "usage": completion.get("usage")}


async def _call_tool(tools: dict[str, AgentTool], call: FunctionCall) -> str:
    tool = tools.get(call.name or "")
    if tool is None:
        return f"error: there is no tool named {call.name!r}"
    return await tool.invoke(call.arguments)


def cut_tool_output(output: str, limit: int) -> str:
    """``output`` as the model reads it: whole up to ``limit`` characters, else its
    beginning and end (an error is often last) around a note of how much was cut.

    >>> cut_tool_output("a" * 300 + "b" * 300, 200)[-20:]
    'bbbbbbbbbbbbbbbbbbbb'
    """
    if len(output) <= limit:
        return output
    note = "\n\n[... {cut:,} characters of this tool output were cut here ...]\n\n"
    cut = len(output) - limit + len(note.format(cut=len(output)))
    if cut >= len(output):  # a limit shorter than the note
        return output[:limit]
    head = (len(output) - cut + 1) // 2
    return output[:head] + note.format(cut=cut) + output[head + cut :]


def _recalled_line(message: Message) -> str:
    return f"- {message.role}: {message.get_text_content()}"


def _memory_note(memories: Sequence[Message], held: set[str], room: int) -> list[dict[str, Any]]:
    """A system message recalling ``memories`` (best first, each whole or left out, in
    ``room`` characters), each said once, but for what the conversation already holds
    (``held``: the lines of its messages): a client that resends its whole conversation with
    every call, in a new session each time, leaves a copy of it in memory per call."""
    recalled: list[str] = []
    for memory in memories:
        if memory.type != MessageType.MESSAGE:
            continue  # what was said, not reasoning nor tool calls
        line = _recalled_line(memory)
        if memory.get_text_content() and line not in held and len(line) < room:
            held.add(line)
            recalled.append(line)
            room -= len(line) + 1
    if not recalled:
        return []
    note = "From earlier conversations with this user:\n" + "\n".join(recalled)
    return [{"role": "system", "content": note}]


def _chars(message: dict[str, Any]) -> int:
    """How many characters ``message`` takes in a request: its JSON's."""
    return len(json.dumps(message, ensure_ascii=False))


def _first_fitting(chat: list[dict[str, Any]], sizes: list[int], budget: int) -> int:
    """Where the newest messages of ``chat`` (whose characters are ``sizes``) that fit in
    ``budget`` start: the last one always (the input to answer), the ones before it while
    they fit. When some are left out, what is kept starts at a user's message (some APIs
    refuse a conversation that starts with the assistant's)."""
    start, used = len(chat), 0
    while start > 0 and (start == len(chat) or used + sizes[start - 1] <= budget):
        start -= 1
        used += sizes[start]
    if start:
        while start < len(chat) - 1 and chat[start]["role"] != "user":
            start += 1
    return start


UNANSWERED_CALL = "error: the tool gave no result (its run ended before it answered)"


def _paired_tool_messages(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``chat`` as chat APIs accept it: each assistant message with ``tool_calls`` directly
    followed by one ``tool`` message per call, and no other ``tool`` message.

    A history window can begin between a call and its results (those results are left
    out), and a run canceled during a tool call leaves the call without a result (it gets
    one saying so); the APIs reject either with a 400.
    """
    paired: list[dict[str, Any]] = []
    pending: list[Any] = []

    def close_round() -> None:
        paired.extend(
            {"role": "tool", "tool_call_id": call_id, "content": UNANSWERED_CALL}
            for call_id in pending
        )
        pending.clear()

    for message in chat:
        if message["role"] == "tool":
            if message.get("tool_call_id") in pending:
                pending.remove(message["tool_call_id"])
                paired.append(message)
            continue
        close_round()
        paired.append(message)
        if message["role"] == "assistant":
            pending.extend(call["id"] for call in message.get("tool_calls") or [])
    close_round()
    return paired


def _parse_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except (json.JSONDecodeError, RecursionError):
        raise AgentError("the chat API sent a chunk that is not JSON", code="LLM_ERROR") from None
    if not isinstance(chunk, dict):
        raise AgentError("the chat API sent a chunk that is not an object", code="LLM_ERROR")
    if chunk.get("error"):
        raise AgentError(
            "the chat API reported an error while streaming" + _error_name(chunk),
            code="LLM_ERROR",
        )
    return chunk


def _choice_of(chunk: dict[str, Any]) -> dict[str, Any] | None:
    """A chunk's first choice; None for a chunk without any (such as the usage's)."""
    choices = chunk.get("choices")
    if not choices:
        return None
    choice = choices[0] if isinstance(choices, list) else None
    if not isinstance(choice, dict):
        raise AgentError("the chat API sent a chunk of an unexpected shape", code="LLM_ERROR")
    return choice


def _delta_of(choice: dict[str, Any]) -> dict[str, Any]:
    """The ``delta`` of a choice."""
    delta = choice.get("delta") or {}
    if isinstance(delta, dict):
        calls = delta.get("tool_calls") or []
        if isinstance(calls, list) and all(isinstance(call, dict) for call in calls):
            return delta
    raise AgentError("the chat API sent a chunk of an unexpected shape", code="LLM_ERROR")


def _usage_counts(usage: Any) -> dict[str, int] | None:
    """The token counts of a chunk's ``usage`` (0 for one left out); None when there is no
    usage, or any count is not a whole number from 0 to :data:`MAX_USAGE_TOKENS`."""
    if not isinstance(usage, dict):
        return None
    counts: dict[str, int] = {}
    for key in USAGE_KEYS:
        count = usage.get(key)
        if count is None:
            count = 0
        if type(count) is not int or not 0 <= count <= MAX_USAGE_TOKENS:
            return None
        counts[key] = count
    return counts


def _reasoning_of(delta: dict[str, Any]) -> str:
    """The reasoning a delta streams: ``reasoning_content`` (DeepSeek, Qwen, vLLM) or
    ``reasoning`` (OpenRouter, Ollama), when text."""
    for field in ("reasoning_content", "reasoning"):
        thought = delta.get(field)
        if isinstance(thought, str) and thought:
            return thought
    return ""


def _refusal_of(delta: dict[str, Any]) -> str:
    """The model's refusal to answer a delta streams (``refusal``), when text."""
    refusal = delta.get("refusal")
    return refusal if isinstance(refusal, str) else ""


def _text_of(content: Any) -> str:
    """The text of a delta's ``content``: a string, or (as some APIs stream it) a list of
    parts whose ``text`` parts are the answer (the others, such as thinking, are not)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


class _StreamedText:
    """The text of one kind (the answer, or the reasoning) a reply streams, as the events of
    its message: opened by the first piece, ended by :meth:`close`. The model's refusal to
    answer (:meth:`refuse`) streams in the same message, as its :class:`RefusalContent`.

    A piece ending with the first half of a UTF-16 surrogate pair (an emoji, as a model may
    cut it across two chunks) keeps that half for the next piece, so the pair arrives whole.
    """

    def __init__(self, message_type: str) -> None:
        self.type = message_type
        self.text: list[str] = []
        self.refusal: list[str] = []
        self._message: Message | None = None
        self._held = {"text": "", "refusal": ""}

    def add(self, piece: str) -> list[Message | TextContent | RefusalContent]:
        return self._add("text", piece)

    def refuse(self, piece: str) -> list[Message | TextContent | RefusalContent]:
        """The events of a piece of the model's refusal."""
        return self._add("refusal", piece)

    def _add(self, kind: str, piece: str) -> list[Message | TextContent | RefusalContent]:
        valid, self._held[kind] = valid_streamed_text(self._held[kind] + piece)
        return self._stream(kind, valid)

    def close(
        self, finish_reason: str | None = None
    ) -> list[Message | TextContent | RefusalContent]:
        """The events ending the open message, which says ``finish_reason`` when given."""
        events: list[Message | TextContent | RefusalContent] = []
        for kind, held in self._held.items():
            events += self._stream(kind, valid_text(held))
            self._held[kind] = ""
        if self._message is not None:
            if finish_reason:
                self._message.metadata = {"finish_reason": finish_reason}
            events.append(self._message.completed())
            self._message = None
        return events

    def _stream(self, kind: str, piece: str) -> list[Message | TextContent | RefusalContent]:
        if not piece:
            return []
        events: list[Message | TextContent | RefusalContent] = []
        if self._message is None:
            self._message = Message(type=self.type, role=Role.ASSISTANT)
            events.append(self._message.in_progress())
        if kind == "refusal":
            self.refusal.append(piece)
            events.append(RefusalContent(refusal=piece, delta=True))
        else:
            self.text.append(piece)
            events.append(TextContent(text=piece, delta=True))
        return events


# What answers a tool call whose arguments are not a JSON object, instead of running it.
CUT_ARGUMENTS = (
    "error: the arguments were cut off at the model's output limit; the tool was not run"
)
INVALID_ARGUMENTS = "error: the arguments are not a JSON object; the tool was not run"
# A tool's name as chat APIs take one back (OpenAI's rule); a call naming none of the tools
# offered by another name (empty, 200,000 characters...) is answered, not run, and kept under
# UNNAMED_TOOL: some APIs refuse a conversation holding such a name, on every later turn.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
UNNAMED_TOOL = "unnamed_tool"
UNNAMED = "error: the call does not name a tool (a name is 1 to 64 letters, digits, _ or -)"
# Why a reply that ended so without an answer fails its run.
UNANSWERED = {
    "length": "the model reached its output limit before answering",
    "content_filter": "the chat API's content filter withheld the answer",
}


def _is_json_object(arguments: str) -> bool:
    """Whether tool-call ``arguments`` are a JSON object any chat API reads back (without
    ``NaN`` or ``Infinity``, nesting no deeper than tools read)."""
    if nests_deeper_than(arguments):
        return False
    try:
        return isinstance(json.loads(arguments, parse_constant=_refuse_constant), dict)
    except (ValueError, RecursionError):
        return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _call_fields(delta: dict[str, Any]) -> tuple[str, str, str]:
    """A tool-call delta's ``id``, ``function.name`` and ``function.arguments`` (empty when
    left out); an error (in fixed words: the fields could quote anything) when one is not
    text."""
    function = delta.get("function") or {}
    fields = (
        (delta.get("id"), function.get("name"), function.get("arguments"))
        if isinstance(function, dict)
        else ()
    )
    if not fields or not all(field is None or isinstance(field, str) for field in fields):
        raise AgentError("the chat API sent a tool call of an unexpected shape", code="LLM_ERROR")
    call_id, name, arguments = (field or "" for field in fields)
    return call_id, name, arguments


class _StreamedToolCalls:
    """The tool calls of one streamed reply, folded from their deltas.

    A delta belongs to the call of its ``index``; one whose ``id`` differs from that call's
    starts a new call (some servers number every call 0), and so does, when the delta has
    no index (some servers send none), one with an ``id`` or a name when the last call has
    its own. A call without any ``id`` gets one, so that its result can answer it.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []
        self._position: dict[int, int] = {}

    def add(self, delta: dict[str, Any]) -> int:
        """Fold in ``delta``; how many characters it brought."""
        index = delta.get("index")
        call_id, name, arguments = _call_fields(delta)
        call = None
        if isinstance(index, int) and index in self._position:
            call = self.calls[self._position[index]]
        elif not isinstance(index, int) and self.calls:
            call = self.calls[-1]
            if not call_id and name and call["name"]:
                call = None
        if call is not None and call_id and call["id"] and call_id != call["id"]:
            call = None
        if call is None:
            call = {"id": "", "name": "", "arguments": ""}
            self.calls.append(call)
            if isinstance(index, int):
                self._position[index] = len(self.calls) - 1
        if call_id:
            call["id"] = call_id
        call["name"] += name
        call["arguments"] += arguments
        return len(call_id) + len(name) + len(arguments)

    def finished(
        self, finish_reason: str | None, tools: Container[str]
    ) -> list[tuple[FunctionCall, str | None]]:
        """The calls (their pieces joined, then made valid Unicode), each with what answers
        it instead of running it when its arguments are not a JSON object (cut off by the
        output limit, when the reply ended so), or its name is neither one of ``tools`` nor
        a name a chat API takes back. Such arguments become ``{}``, such names
        :data:`UNNAMED_TOOL`: some APIs refuse a conversation holding them, on every later
        turn."""
        finished: list[tuple[FunctionCall, str | None]] = []
        for call in self.calls:
            arguments = valid_text(call["arguments"]) if call["arguments"].strip() else "{}"
            name = valid_text(call["name"])
            refusal = None
            if name not in tools and not _TOOL_NAME.fullmatch(name):
                name, refusal = UNNAMED_TOOL, UNNAMED
            if not _is_json_object(arguments):
                arguments = "{}"
                refusal = CUT_ARGUMENTS if finish_reason == "length" else INVALID_ARGUMENTS
            function_call = FunctionCall(
                call_id=valid_text(call["id"]) or f"call_{uuid.uuid4().hex}",
                name=name,
                arguments=arguments,
            )
            finished.append((function_call, refusal))
        return finished


def create_llm_app(
    tools: Sequence[AgentTool] = (),
    *,
    sandbox_tools: bool | Sequence[ToolDefinition | str] = False,
    sandbox_types: Sequence[str] = (BASE,),
    sandbox_service: SandboxService | None = None,
    settings: Settings | None = None,
) -> AgentApp:
    """An :class:`AgentApp` serving an :class:`LLMAgent` with ``tools``.

    ``sandbox_tools`` adds sandbox tools (``True``: every built-in one; or a list of tools
    or tool names) that run on the sandboxes of the request's user and session (see
    :func:`~agentscope_serverless.agents.sandbox_tools.session_sandbox_tools`), on
    ``sandbox_service`` or, when none is given, one built from settings with the other
    services.
    """
    agent = LLMAgent(tools=tools, settings=settings)
    if sandbox_tools is True:
        sandbox_definitions = list(BUILTIN_TOOLS)
    elif sandbox_tools is False:
        sandbox_definitions = []
    else:
        sandbox_definitions = [as_tool(tool) for tool in sandbox_tools]
    app = AgentApp(
        app_name="llm",
        app_description="An agent on an OpenAI-compatible chat API, with tools.",
        sandbox_service=sandbox_service,
        with_sandbox=bool(sandbox_definitions),
    )

    @app.init
    async def check(self: Runner) -> None:
        if agent.missing_api_key(self.settings):
            logger.warning(
                "the LLM agent has no API key: set LLM_API_KEY, or the field llm_api_key of "
                "the SECRETS_ARN secret; the chat API is called without one"
            )

    @app.shutdown
    async def close(self: Runner) -> None:
        await agent.aclose()

    @app.query(framework="text")
    async def query(
        self: Runner,
        msgs: list[Message],
        request: Any = None,
        *,
        session: Session,
        memories: list[Message],
        response: AgentResponse,
        **kwargs: Any,
    ) -> AsyncIterator[TextContent | RefusalContent | Message]:
        history = [m for m in session.messages if isinstance(m, Message)]
        usage: dict[str, int] = {}
        run_tools: list[AgentTool] = []
        if sandbox_definitions:
            service = self.services["sandbox"]
            assert isinstance(service, SandboxService)
            run_tools = session_sandbox_tools(
                service,
                session.id,
                session.user_id,
                sandbox_definitions,
                sandbox_types=sandbox_types,
            )
        try:
            async for item in agent.run(
                [*history, *msgs],
                memories=memories,
                usage=usage,
                tools=run_tools,
                settings=self.settings,
                sampling=sampling_options(request),
            ):
                yield item
        finally:
            # The model calls made are billed however the run ends (failed, canceled, at
            # the time limit): their tokens are on its final response and in its metrics.
            if usage:
                response.usage = usage

    return app


app = create_llm_app()
sandbox_app = create_llm_app(sandbox_tools=True)

__all__ = ["LLMAgent", "app", "create_llm_app", "sampling_options", "sandbox_app"]
