"""OpenAI wire formats: chat completions and responses, in and out of a run's events.

So the official ``openai`` SDK works unchanged with
``base_url=http://host:port/compatible-mode/v1`` and ``api_key=<our key>``.

**Session.** The ``X-Session-Id`` request header, else ``metadata["session_id"]``, else (for
``/responses``) ``conversation`` (an id, or ``{"id": ...}``), else the session of
``previous_response_id``. Without one, each call starts a new session. The session id is
returned in the ``X-Session-Id`` response header, and in ``metadata["session_id"]`` of a
responses object, whose ``id`` carries it too (``resp_<run>_<session, base64url>``): a
client continuing with ``previous_response_id`` continues the session, on every store and
at once, with no lookup that a run not stored yet could miss.

**User.** The ``user`` field is the ``user_id`` the request acts as (see
:mod:`agentscope_serverless.http.auth`): optional with a user key (it must then be the key's
user), the user to act for with a service key (or the ``X-User-Id`` header).

**Input.** With a session, only the messages after the last assistant message are new
input (the earlier turns are in the session's history already, so clients that resend the
whole conversation do not duplicate it); without a session, every message is input.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.http.sse import DONE, encode
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Error,
    Event,
    Message,
    MessageType,
    Role,
    RunStatus,
    TextContent,
    UnsupportedContentError,
)

# What a chat completion answers for a run canceled before it completed (``POST
# /runs/{id}/cancel``): chat completions have no status to say it with.
RUN_CANCELED = Error(code="RUN_CANCELED", message="the run was canceled")
# The reasons a reply can say it was cut (its ``metadata["finish_reason"]``, as the LLM agent
# sets it), with their name in a response object's ``incomplete_details``.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


class ChatCompletionRequest(BaseModel):
    """The body of ``POST /chat/completions`` (fields we do not use are accepted)."""

    model_config = ConfigDict(extra="allow")

    model: str = "agent"
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = Field(
        None, description="What current clients send for ``max_tokens`` (which wins if both)."
    )
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(
        None,
        ge=1,
        le=1,
        description="How many choices to make: 1, as an agent gives one answer a turn.",
    )


class ResponsesRequest(BaseModel):
    """The body of ``POST /responses`` (fields we do not use are accepted)."""

    model_config = ConfigDict(extra="allow")

    model: str = "agent"
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    user: str | None = None
    metadata: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None


def session_id_of(
    header: str | None,
    metadata: Mapping[str, Any] | None,
    conversation: str | Mapping[str, Any] | None = None,
    previous_response_id: str | None = None,
) -> str | None:
    """The session a request names: header, then metadata, then conversation, then the
    previous response's."""
    if header:
        return header
    if metadata and isinstance(metadata.get("session_id"), str) and metadata["session_id"]:
        return str(metadata["session_id"])
    if isinstance(conversation, str) and conversation:
        return conversation
    if isinstance(conversation, Mapping) and isinstance(conversation.get("id"), str):
        return str(conversation["id"])
    if previous_response_id is not None:
        return session_of_response(previous_response_id)
    return None


def response_id(response: AgentResponse, session_id: str) -> str:
    """The id of a responses object: its run's, and its session's.

    >>> from agentscope_serverless.schemas.agent_schemas import AgentResponse
    >>> run = AgentResponse(id="response_00000000-0000-0000-0000-00000000000a")
    >>> response_id(run, "chat-1")
    'resp_0000000000000000000000000000000a_Y2hhdC0x'
    >>> session_of_response(response_id(run, "chat-1"))
    'chat-1'
    """
    session = base64.urlsafe_b64encode(session_id.encode()).rstrip(b"=").decode()
    return f"resp_{_bare_id(response)}_{session}"


def session_of_response(response_id: str) -> str:
    """The session of a response id made by :func:`response_id` (its run's part holds no
    ``_``; the session's, base64url, may).

    >>> session_of_response("resp_0a_aGk_Pw")
    'hi??'
    """
    run, _, session = response_id.removeprefix("resp_").partition("_")
    try:
        padded = (session + "=" * (-len(session) % 4)).encode()
        decoded = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
        if not response_id.startswith("resp_") or not run or not decoded:
            raise ValueError
        return decoded
    except ValueError:  # binascii.Error and UnicodeDecodeError among them
        raise InvalidInputError(
            "previous_response_id is not the id of a response of this server",
            field="previous_response_id",
        ) from None


def new_turn(messages: list[Message]) -> list[Message]:
    """The messages after the last assistant message (all of them if there is none)."""
    for position in range(len(messages) - 1, -1, -1):
        if messages[position].role == Role.ASSISTANT:
            return messages[position + 1 :]
    return messages


# The roles a message may have here ("developer" is read as "system").
_ROLES = frozenset({Role.USER, Role.ASSISTANT, Role.SYSTEM, Role.TOOL, "developer"})


def chat_messages(items: list[dict[str, Any]], *, field: str = "messages") -> list[Message]:
    """OpenAI chat messages (or responses input items) as messages of our protocol."""
    messages: list[Message] = []
    for position, item in enumerate(items):
        where = [field, position]
        kind = item.get("type", "message")
        if kind != "message" or not isinstance(item.get("role"), str):
            raise InvalidInputError(
                f"{field}[{position}] must be a message with a role",
                errors=[{"loc": where, "msg": "must be a message with a role"}],
            )
        if item["role"] == "developer":
            # OpenAI's name for system instructions since its o1 models: the same message.
            item = {**item, "role": Role.SYSTEM}
        if item["role"] not in _ROLES:
            says = f"has the role {item['role'][:40]!r}; roles are {', '.join(sorted(_ROLES))}"
            raise InvalidInputError(
                f"{field}[{position}] {says}", errors=[{"loc": [*where, "role"], "msg": says}]
            )
        try:
            messages.append(Message.from_openai_message(item))
        except UnsupportedContentError as exc:
            raise InvalidInputError(
                f"{field}[{position}]: {exc}", errors=[{"loc": where, "msg": str(exc)}]
            ) from None
        except (ValidationError, AttributeError, TypeError):
            raise InvalidInputError(
                f"{field}[{position}] is not a valid message",
                errors=[{"loc": where, "msg": "not a valid message"}],
            ) from None
    return messages


def responses_input(body: ResponsesRequest) -> list[Message]:
    """The input of a responses request as messages (``instructions`` first, as system)."""
    if isinstance(body.input, str):
        messages = [Message(role=Role.USER, content=[TextContent(text=body.input)])]
    else:
        messages = chat_messages(body.input, field="input")
    if body.instructions:
        messages.insert(0, Message(role=Role.SYSTEM, content=[TextContent(text=body.instructions)]))
    return messages


def _is_reply(message: Message) -> bool:
    return message.type == MessageType.MESSAGE and message.role == Role.ASSISTANT


def _text_of(message: Message) -> str:
    return "".join(
        part.text or "" for part in message.content or [] if isinstance(part, TextContent)
    )


def finish_reason(messages: list[Message] | None) -> str:
    """Why the reply of a completed run ended, as chat completions say it: the last reply
    message's ``metadata["finish_reason"]`` when it was cut (``length``, ``content_filter``),
    else ``stop``."""
    replies = [m for m in messages or [] if _is_reply(m)]
    reason = (replies[-1].metadata or {}).get("finish_reason") if replies else None
    return reason if reason in INCOMPLETE_REASONS else "stop"


def reply_text(response: AgentResponse) -> str:
    """The text of the agent's reply messages, separated by blank lines."""
    return "\n\n".join(_text_of(m) for m in response.output or [] if _is_reply(m))


def _bare_id(response: AgentResponse) -> str:
    return (response.id or "").removeprefix("response_").replace("-", "")


def _count(usage: Mapping[str, Any], *keys: str) -> int:
    return next((int(usage[k]) for k in keys if isinstance(usage.get(k), int)), 0)


def chat_usage(usage: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Token usage in the chat completions shape, when the agent reported any."""
    if not usage:
        return None
    prompt = _count(usage, "prompt_tokens", "input_tokens")
    completion = _count(usage, "completion_tokens", "output_tokens")
    total = _count(usage, "total_tokens") or prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def responses_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Token usage in the responses shape, when the agent reported any."""
    counts = chat_usage(usage)
    if counts is None:
        return None
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


def chat_completion(response: AgentResponse, *, model: str) -> dict[str, Any]:
    """A completed run as a ``chat.completion`` object."""
    return {
        "id": f"chatcmpl-{_bare_id(response)}",
        "object": "chat.completion",
        "created": response.created_at,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply_text(response)},
                "logprobs": None,
                "finish_reason": finish_reason(response.output),
            }
        ],
        "usage": chat_usage(response.usage),
    }


async def chat_completion_chunks(
    events: AsyncIterator[Event], *, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """A run's events as ``chat.completion.chunk`` SSE lines, ending with ``[DONE]``.

    An agent failure, or the run's cancellation, becomes an ``{"error": ...}`` line (the SDK
    raises it as an APIError).
    """
    completion_id, created = "chatcmpl", int(time.time())
    replies: set[str] = set()
    spoken: set[str] = set()

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
            **extra,
        }
        return encode(json.dumps(body))

    def delta(content: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish_reason}
        return chunk([choice])

    async for event in events:
        if isinstance(event, AgentResponse):
            if event.status == RunStatus.Created:
                completion_id, created = f"chatcmpl-{_bare_id(event)}", event.created_at
                yield delta({"role": "assistant", "content": ""})
            elif event.status == RunStatus.Completed:
                yield delta({}, finish_reason(event.output))
                if include_usage:
                    yield chunk([], usage=chat_usage(event.usage))
                yield DONE
            elif event.status == RunStatus.Failed and event.error is not None:
                yield encode(json.dumps({"error": event.error.model_dump()}))
            elif event.status == RunStatus.Canceled:
                yield encode(json.dumps({"error": RUN_CANCELED.model_dump()}))
        elif isinstance(event, Message) and event.status == RunStatus.InProgress:
            if _is_reply(event):
                replies.add(event.id)
        elif (
            isinstance(event, TextContent)
            and event.delta
            and event.text
            and event.msg_id in replies
        ):
            separator = "\n\n" if spoken and event.msg_id not in spoken else ""
            spoken.add(event.msg_id)
            yield delta({"content": separator + event.text})


def responses_object(
    response: AgentResponse,
    *,
    model: str,
    session_id: str,
    status: str | None = None,
    output: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A run as an OpenAI ``response`` object (``incomplete`` when its reply was cut)."""
    status = status or response.status
    if status == RunStatus.Canceled:
        status = "cancelled"  # OpenAI's spelling, the one its SDKs' types allow
    incomplete = None
    reason = finish_reason(response.output) if status == RunStatus.Completed else "stop"
    if reason != "stop":
        status, incomplete = "incomplete", {"reason": INCOMPLETE_REASONS[reason]}
    if output is None:
        output = [
            _output_item(m, RunStatus.Completed) for m in response.output or [] if _is_reply(m)
        ]
    return {
        "id": response_id(response, session_id),
        "object": "response",
        "created_at": response.created_at,
        "status": status,
        "model": model,
        "output": output,
        "error": (
            {"code": "server_error", "message": response.error.message} if response.error else None
        ),
        "incomplete_details": incomplete,
        "instructions": None,
        "metadata": {"session_id": session_id},
        "parallel_tool_calls": False,
        "temperature": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": responses_usage(response.usage),
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _output_item(message: Message, status: str, *, empty: bool = False) -> dict[str, Any]:
    texts = [] if empty else [p for p in message.content or [] if isinstance(p, TextContent)]
    parts = [_output_text(p.text or "") for p in texts]
    return {
        "type": "message",
        "id": message.id,
        "status": status,
        "role": "assistant",
        "content": parts,
    }


async def responses_events(
    events: AsyncIterator[Event], *, model: str, session_id: str
) -> AsyncIterator[bytes]:
    """A run's events as the responses API's named SSE events.

    ``response.created`` → ``response.in_progress`` → per reply message
    ``response.output_item.added`` → ``response.content_part.added`` →
    ``response.output_text.delta``\\ * → ``response.output_text.done`` →
    ``response.content_part.done`` → ``response.output_item.done``; then
    ``response.completed`` (``response.incomplete`` when the reply was cut; or
    ``response.failed``, or for a canceled run ``response.incomplete`` with the status
    ``cancelled``).
    """
    sequence = 0
    positions: dict[str, int] = {}
    opened_parts: set[tuple[str, int]] = set()
    done_items: list[dict[str, Any]] = []

    def named(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return encode(json.dumps(payload), event=kind)

    def part_added(msg_id: str, index: int) -> bytes | None:
        if (msg_id, index) in opened_parts:
            return None
        opened_parts.add((msg_id, index))
        return named(
            "response.content_part.added",
            item_id=msg_id,
            output_index=positions[msg_id],
            content_index=index,
            part=_output_text(""),
        )

    async for event in events:
        if isinstance(event, AgentResponse):
            if event.status in (RunStatus.Created, RunStatus.InProgress):
                kind = f"response.{event.status}"
                body = responses_object(
                    event,
                    model=model,
                    session_id=session_id,
                    status=RunStatus.InProgress,
                    output=[],
                )
                yield named(kind, response=body)
            elif event.status == RunStatus.Completed:
                body = responses_object(
                    event, model=model, session_id=session_id, output=done_items
                )
                yield named(f"response.{body['status']}", response=body)
            elif event.status == RunStatus.Failed:
                body = responses_object(
                    event, model=model, session_id=session_id, output=done_items
                )
                yield named("response.failed", response=body)
            elif event.status == RunStatus.Canceled:
                body = responses_object(
                    event, model=model, session_id=session_id, output=done_items
                )
                yield named("response.incomplete", response=body)
        elif isinstance(event, Message) and _is_reply(event):
            if event.status == RunStatus.InProgress:
                positions[event.id] = len(positions)
                item = _output_item(event, RunStatus.InProgress, empty=True)
                yield named(
                    "response.output_item.added", output_index=positions[event.id], item=item
                )
            elif event.status == RunStatus.Completed and event.id in positions:
                item = _output_item(event, RunStatus.Completed)
                done_items.append(item)
                yield named(
                    "response.output_item.done", output_index=positions[event.id], item=item
                )
        elif isinstance(event, TextContent) and event.msg_id in positions:
            msg_id, index = event.msg_id, event.index or 0
            where = {"item_id": msg_id, "output_index": positions[msg_id], "content_index": index}
            added = part_added(msg_id, index)
            if added is not None:
                yield added
            text = event.text or ""
            if event.delta:
                yield named("response.output_text.delta", **where, delta=text, logprobs=[])
            elif event.status == RunStatus.Completed:
                yield named("response.output_text.done", **where, text=text, logprobs=[])
                yield named("response.content_part.done", **where, part=_output_text(text))


__all__ = [
    "RUN_CANCELED",
    "ChatCompletionRequest",
    "ResponsesRequest",
    "chat_completion",
    "chat_completion_chunks",
    "chat_messages",
    "chat_usage",
    "finish_reason",
    "new_turn",
    "reply_text",
    "response_id",
    "responses_events",
    "responses_input",
    "responses_object",
    "responses_usage",
    "session_id_of",
    "session_of_response",
]
