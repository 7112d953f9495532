"""OpenAI wire formats: chat completions and responses, in and out of a run's events.

So the official ``openai`` SDK works unchanged with
``base_url=http://host:port/compatible-mode/v1`` and ``api_key=<our key>``.

**Session.** The ``X-Session-Id`` request header, else ``metadata["session_id"]``, else (for
``/responses``) ``conversation`` (an id, or ``{"id": ...}``), else the session of
``previous_response_id``. Without one, a call continues the session of the conversation it
resends, else starts a new one (see :mod:`agentscope_serverless.http.conversations`). The
session id is returned in the ``X-Session-Id`` response header, and in
``metadata["session_id"]`` of a responses object, whose ``id`` carries it too
(``resp_<run>_<session, base64url>``): a client continuing with ``previous_response_id``
continues the session, on every store and at once, with no lookup that a run not stored yet
could miss (a response continued already is branched from: see
:mod:`agentscope_serverless.http.conversations`). ``GET .../responses/{id}`` reads a
response again from its stored run (:func:`run_of_response`), which keeps what the object
repeats of its request (``echo``).

**User.** The ``user`` field is the ``user_id`` the request acts as (see
:mod:`agentscope_serverless.http.auth`): optional with a user key (it must then be the key's
user), the user to act for with a service key (or the ``X-User-Id`` header).

**Input.** Only the messages after the last assistant message are new input: with a
session, the earlier turns are in its history already (clients that resend the whole
conversation do not duplicate it); without one, or with one that does not exist (yet, or
any more), they become the new session's history.

**What an agent cannot do** is refused with a 400 naming the parameter
(:func:`check_chat_request`, :func:`check_responses_request`), rather than answered as if it
had been done: tools of the client (an agent runs its own, and hands back no tool calls),
a JSON ``response_format`` (an agent answers in its own words), ``logprobs``, audio output,
and for responses ``background`` and stored ``prompt`` templates. What only tunes an answer
(``temperature``, ``seed``, ``stop``, ``reasoning_effort``...) is taken, and reaches the agent
when its request has a field for it.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)

from agentscope_serverless.errors import (
    InvalidInputError,
    NotFoundError,
    UnsupportedParameterError,
)
from agentscope_serverless.http.errors import error_body, status_of_code
from agentscope_serverless.http.sse import DONE, encode
from agentscope_serverless.runner import TURN_ONLY, for_turn_only
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Error,
    Event,
    Message,
    MessageType,
    Penalty,
    RefusalContent,
    Role,
    RunStatus,
    Seed,
    Temperature,
    TextContent,
    TokenLimit,
    TopP,
    UnsupportedContentError,
)
from agentscope_serverless.services._validation import (
    BLANK_USER_MESSAGE,
    clean_session_id,
    is_blank_text,
    is_blank_user_message,
)

# What a chat completion answers for a run canceled before it completed (``POST
# /runs/{id}/cancel``): chat completions have no status to say it with.
RUN_CANCELED = Error(code="RUN_CANCELED", message="the run was canceled")
# The reasons a reply can say it was cut (its ``metadata["finish_reason"]``, as the LLM agent
# sets it), with their name in a response object's ``incomplete_details``.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


# OpenAI takes up to 4 stop sequences (more, and a model refuses the call).
MAX_STOP_SEQUENCES = 4
# Every chunk of a stream repeats the model's name: a bound on what one answer can weigh.
ModelName = Annotated[str, Field(max_length=256)]
# A session named as /process names it: taken, rather than dropped as an unknown field.
_SESSION_FIELD = "The session, when no X-Session-Id header names one (as /process takes it)."
# The values OpenAI takes (another one it refuses, as this server does rather than take it
# for something else). An object naming a tool or function forces it: refused (see
# :func:`check_chat_request`).
ToolChoice = Literal["none", "auto", "required"] | dict[str, Any] | None
FunctionCallChoice = Literal["none", "auto"] | dict[str, Any] | None
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None


class ChatStreamOptions(BaseModel):
    """The ``stream_options`` of a chat completion (other fields taken)."""

    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool | None = None


class ChatCompletionRequest(BaseModel):
    """The body of ``POST /chat/completions`` (fields we do not use are accepted; a boolean
    is ``true`` or ``false`` and a number a JSON number, as OpenAI takes them, not a string,
    nor a boolean for a number)."""

    model_config = ConfigDict(extra="allow")

    model: ModelName = "agent"
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: StrictBool = False
    stream_options: ChatStreamOptions | None = Field(
        None, description="Only with ``stream`` true, as OpenAI takes it."
    )
    user: str | None = None
    session_id: str | None = Field(None, description=_SESSION_FIELD)
    metadata: dict[str, Any] | None = None
    temperature: Temperature = None
    top_p: TopP = None
    max_tokens: TokenLimit = None
    max_completion_tokens: TokenLimit = Field(
        None, description="What current clients send for ``max_tokens`` (which wins if both)."
    )
    seed: Seed = None
    stop: str | list[str] | None = Field(None, description="Up to 4 sequences.")
    n: int | None = Field(
        None,
        ge=1,
        le=1,
        strict=True,
        description="How many choices to make: 1, as an agent gives one answer a turn.",
    )
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="Refused unless empty or ``tool_choice`` is ``none``."
    )
    tool_choice: ToolChoice = None
    functions: list[dict[str, Any]] | None = Field(None, description="Refused, as ``tools``.")
    function_call: FunctionCallChoice = None
    response_format: dict[str, Any] | None = Field(
        None, description='Only ``{"type": "text"}``: an agent answers in its own words.'
    )
    reasoning_effort: ReasoningEffort = None
    logprobs: StrictBool | None = Field(None, description="Refused when true.")
    top_logprobs: int | None = Field(None, strict=True, description="Refused when above 0.")
    modalities: list[str] | None = Field(None, description="Only ``text``.")
    audio: dict[str, Any] | None = Field(None, description="Refused: an agent answers in text.")

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, as OpenAI takes")
        return stop


class ResponsesText(BaseModel):
    """The ``text`` of a responses request: how the answer is given (other fields taken)."""

    model_config = ConfigDict(extra="allow")

    format: dict[str, Any] | None = Field(None, description='Only ``{"type": "text"}``.')


class ResponsesReasoning(BaseModel):
    """The ``reasoning`` of a responses request (other fields taken)."""

    model_config = ConfigDict(extra="allow")

    effort: ReasoningEffort = None


class ResponsesRequest(BaseModel):
    """The body of ``POST /responses`` (fields we do not use are accepted)."""

    model_config = ConfigDict(extra="allow")

    model: ModelName = "agent"
    input: str | list[dict[str, Any]]
    instructions: str | None = Field(None, description="Blank, as if not sent.")
    stream: StrictBool = False
    user: str | None = None
    session_id: str | None = Field(None, description=_SESSION_FIELD)
    metadata: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    temperature: Temperature = None
    top_p: TopP = None
    max_output_tokens: TokenLimit = None
    store: StrictBool | None = Field(
        None,
        description="``false``: the response is not kept to be read again (its turn is the "
        "session's all the same).",
    )
    tools: list[dict[str, Any]] | None = Field(
        None, description="Refused unless empty or ``tool_choice`` is ``none``."
    )
    tool_choice: ToolChoice = None
    text: ResponsesText | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: ResponsesReasoning | None = None
    top_logprobs: int | None = Field(None, strict=True, description="Refused when above 0.")
    include: list[str] | None = None
    background: StrictBool | None = Field(None, description="Refused when true.")
    prompt: dict[str, Any] | None = Field(None, description="Refused: no prompt templates here.")

    @field_validator("instructions")
    @classmethod
    def _blank_instructions_are_none(cls, instructions: str | None) -> str | None:
        # Taken, they were a system message of whitespace before the conversation.
        return None if instructions is not None and is_blank_text(instructions) else instructions


# Why client tools are refused: their calls would have to come back for the client to run.
_TOOLS_REASON = (
    "an agent calls its own tools and hands back no tool calls for the client to run "
    "(send no tools, or tool_choice 'none')"
)


def _forces_a_tool(tool_choice: str | Mapping[str, Any] | None) -> bool:
    return tool_choice == "required" or isinstance(tool_choice, Mapping)


def _check_tools(tools: list[Any] | None, tool_choice: str | Mapping[str, Any] | None) -> None:
    if tools and tool_choice != "none":
        raise UnsupportedParameterError("tools", _TOOLS_REASON)
    if _forces_a_tool(tool_choice):
        raise UnsupportedParameterError(
            "tool_choice", "an agent calls no tool of the client (use 'auto' or 'none')"
        )


def _check_format(parameter: str, response_format: Mapping[str, Any] | None) -> None:
    if response_format is not None and "type" not in response_format:
        raise InvalidInputError(f"{parameter} needs its type ('text')", field=parameter)
    kind = (response_format or {}).get("type", "text")
    if kind != "text":
        raise UnsupportedParameterError(
            parameter,
            f"an agent answers in its own words, not to the format {str(kind)[:40]!r} "
            "(ask for the format in the message instead)",
        )


def _check_logprobs(logprobs: bool | None, top_logprobs: int | None) -> None:
    if logprobs or top_logprobs:
        parameter = "logprobs" if logprobs else "top_logprobs"
        raise UnsupportedParameterError(parameter, "an agent's answer has no token logprobs")


def check_chat_request(body: ChatCompletionRequest) -> None:
    """Refuse (400) what a chat completion asks that an agent cannot give.

    >>> check_chat_request(ChatCompletionRequest(messages=[{}], response_format={"type": "text"}))
    >>> try:
    ...     check_chat_request(ChatCompletionRequest(messages=[{}], logprobs=True))
    ... except UnsupportedParameterError as refused:
    ...     print(refused.parameter)
    logprobs
    """
    _check_tools(body.tools, body.tool_choice)
    if body.stream_options is not None and not body.stream:
        raise InvalidInputError(
            "stream_options is only taken with stream true, as OpenAI takes it",
            field="stream_options",
        )
    if body.functions and body.function_call != "none":
        raise UnsupportedParameterError("functions", _TOOLS_REASON)
    if _forces_a_tool(body.function_call):
        raise UnsupportedParameterError("function_call", "an agent calls no function of the client")
    _check_format("response_format", body.response_format)
    _check_logprobs(body.logprobs, body.top_logprobs)
    if body.audio is not None or set(body.modalities or ()) - {"text"}:
        raise UnsupportedParameterError(
            "audio" if body.audio is not None else "modalities", "an agent answers in text"
        )


def check_responses_request(body: ResponsesRequest) -> None:
    """Refuse (400) what a responses request asks that an agent cannot give."""
    _check_tools(body.tools, body.tool_choice)
    _check_format("text.format", body.text.format if body.text else None)
    _check_logprobs(None, body.top_logprobs)
    if "message.output_text.logprobs" in (body.include or ()):
        raise UnsupportedParameterError("include", "an agent's answer has no token logprobs")
    if body.background:
        raise UnsupportedParameterError(
            "background", "a run is answered as it goes (use stream, and /runs to resume it)"
        )
    if body.prompt is not None:
        raise UnsupportedParameterError("prompt", "this server keeps no prompt templates")
    if body.conversation is not None and body.previous_response_id is not None:
        # As OpenAI's: which would the call continue?
        raise UnsupportedParameterError(
            "previous_response_id",
            "with conversation: a call continues a conversation or a response, not both",
        )


def _named_session(value: Any, field: str) -> str | None:
    """The session ``field`` names: a string (an empty one names none), or nothing."""
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{field} must be a string", field=field)
    return value or None


def session_id_of(
    header: str | None,
    metadata: Mapping[str, Any] | None,
    conversation: str | Mapping[str, Any] | None = None,
    previous_response_id: str | None = None,
    *,
    field: str | None = None,
) -> str | None:
    """The session a request names: header, then its ``session_id`` field, then metadata, then
    conversation, then the previous response's. A session named otherwise than by a string
    is refused, whichever would win: the call meant one, and would go to a new session."""
    in_metadata = _named_session((metadata or {}).get("session_id"), "metadata.session_id")
    if isinstance(conversation, Mapping):
        conversation = _named_session(conversation.get("id"), "conversation.id")
    if header:
        return header
    if field:
        return field
    if in_metadata:
        return in_metadata
    if conversation:
        return conversation
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
        # A session id this server would not make ("/", or blank): no response of its.
        if clean_session_id(decoded) != decoded:
            raise ValueError
        return decoded
    except ValueError:  # binascii.Error, UnicodeDecodeError and InvalidInputError among them
        raise InvalidInputError(
            "previous_response_id is not the id of a response of this server",
            field="previous_response_id",
        ) from None


class ResponseNotFoundError(NotFoundError):
    """No response of this id for the caller's user."""

    code = "RESPONSE_NOT_FOUND"

    def __init__(self, response_id: str, why: str | None = None) -> None:
        shown = response_id if len(response_id) <= 200 else response_id[:200] + "..."
        super().__init__(why or f"no response {shown!r} of this user")


class ResponseInProgressError(InvalidInputError):
    """A call continues a response (``previous_response_id``) still in progress: its turn is
    not in its session yet (a 400, as OpenAI answers it)."""

    code = "RESPONSE_IN_PROGRESS"

    def __init__(self, response_id: str) -> None:
        shown = response_id if len(response_id) <= 200 else response_id[:200] + "..."
        super().__init__(
            f"previous_response_id names a response still in progress ({shown!r}): it can be "
            "continued once it has ended (wait for it, or cancel it)",
            field="previous_response_id",
        )


def run_of_response(response_id: str) -> tuple[str, str] | None:
    """The run and session of a response id made by :func:`response_id`, when it is one
    (a run id made by this server: ``response_`` and a UUID).

    >>> run = AgentResponse(id="response_00000000-0000-0000-0000-00000000000a")
    >>> run_of_response(response_id(run, "chat-1"))
    ('response_00000000-0000-0000-0000-00000000000a', 'chat-1')
    >>> run_of_response("resp_xyz_Y2hhdC0x") is None
    True
    """
    run = response_id.removeprefix("resp_").partition("_")[0]
    try:
        session = session_of_response(response_id)
        return f"response_{uuid.UUID(hex=run)}", session
    except (InvalidInputError, ValueError):
        return None


def split_turn(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """The conversation so far and the new turn of messages a client sent whole.

    The conversation runs to the last assistant message; the turn is what follows it,
    after the messages before it that are for this turn alone (a responses request's
    ``instructions``, which precede a conversation sent whole). Without an assistant
    message, every message is the turn. A conversation that ends with assistant messages
    (a reply for the agent to continue) has them in its turn, after the messages that asked
    for them.

    >>> ask, reply = Message(role="user", content="hi"), Message(role="assistant", content="yo")
    >>> split_turn([ask, reply, ask]) == ([ask, reply], [ask])
    True
    >>> split_turn([ask, reply, ask, reply]) == ([ask, reply], [ask, reply])
    True
    """
    last_asked = max((i for i, m in enumerate(messages) if m.role != Role.ASSISTANT), default=-1)
    for position in range(last_asked - 1, -1, -1):
        if messages[position].role == Role.ASSISTANT:
            earlier = messages[: position + 1]
            for_this_turn = [m for m in earlier if for_turn_only(m)]
            conversation = [m for m in earlier if not for_turn_only(m)]
            return conversation, [*for_this_turn, *messages[position + 1 :]]
    return [], messages


# The roles a message may have here ("developer" is read as "system").
_ROLES = frozenset({Role.USER, Role.ASSISTANT, Role.SYSTEM, Role.TOOL, "developer"})


def _refused(where: list[Any], path: list[Any], says: str) -> InvalidInputError:
    """The error of the field at ``path`` in the item at ``where`` (``[field, position]``)."""
    return InvalidInputError(
        f"{where[0]}[{where[1]}]: {says}", errors=[{"loc": [*where, *path], "msg": says}]
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


# The longest id an input item may be given: ``input_items`` takes an item's id as ``after``.
MAX_ITEM_ID_LENGTH = 256


def _check_item_ids(items: list[dict[str, Any]]) -> None:
    """Refuse input items whose ids could not page ``input_items``: an id given twice (a
    page would end on it again and again) or longer than :data:`MAX_ITEM_ID_LENGTH`.

    >>> _check_item_ids([{"id": "a"}, {}, {"id": "b"}, {}])
    >>> try:
    ...     _check_item_ids([{"id": "a"}, {"id": "b"}, {"id": "a"}])
    ... except InvalidInputError as refused:
    ...     print(refused)
    input[2]: repeats the id of input[0]: each input item's id must be its own
    """
    seen: dict[str, int] = {}
    for position, item in enumerate(items):
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            continue
        where = ["input", position]
        if len(item_id) > MAX_ITEM_ID_LENGTH:
            says = f"an item's id must be at most {MAX_ITEM_ID_LENGTH} characters"
            raise _refused(where, ["id"], says)
        if item_id in seen:
            says = f"repeats the id of input[{seen[item_id]}]: each input item's id must be its own"
            raise _refused(where, ["id"], says)
        seen[item_id] = position


# The content parts a tool's output is read from: its text (see ``Message.from_openai_message``).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_NOT_TEXT = "a tool's output must be text: a string, or a list of text parts"


def _is_text_output(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return True
    return isinstance(value, list) and all(
        isinstance(part, dict) and part.get("type") in _TEXT_PARTS for part in value
    )


def _function_item_as_chat(item: dict[str, Any], where: list[Any]) -> dict[str, Any]:
    """A responses ``function_call`` or ``function_call_output`` input item as the chat
    message that says the same (an assistant's tool call, a tool's answer)."""
    call_id = item.get("call_id")
    if not _is_id(call_id):
        raise _refused(where, ["call_id"], f"a {item['type']} item needs its call_id")
    if item["type"] == "function_call_output":
        if not _is_text_output(item.get("output")):
            raise _refused(where, ["output"], _NOT_TEXT)
        return {"role": Role.TOOL, "tool_call_id": call_id, "content": item.get("output")}
    if not _is_id(item.get("name")):
        raise _refused(where, ["name"], "a function_call item needs the name of its function")
    function = {"name": item.get("name"), "arguments": item.get("arguments")}
    return {
        "role": Role.ASSISTANT,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


# The content parts chat APIs take in a system (developer) or assistant message: text alone
# (and an assistant's refusal).
_PARTS_OF_ROLE = {Role.SYSTEM: _TEXT_PARTS, Role.ASSISTANT: _TEXT_PARTS | {"refusal"}}


def _check_parts_of_role(item: dict[str, Any], where: list[Any]) -> None:
    """Refuse a part other than text in a system or assistant message: stored, it would
    reach the model with every later turn of the session, and chat APIs refuse it."""
    taken = _PARTS_OF_ROLE.get(item["role"])
    content = item.get("content")
    if taken is None or not isinstance(content, list):
        return
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in taken:
            says = f"a {item['role']} message takes text parts only, not {kind[:40]!r}"
            raise _refused(where, ["content", index, "type"], says)


def _check_tool_call_ids(item: dict[str, Any], where: list[Any]) -> None:
    """Refuse a tool call without its id or function's name, and a tool message without the
    id of the call it answers: stored, they would reach the model with every later turn of
    the session, and chat APIs refuse them. A tool's output that is not text (which would
    reach the model empty) is refused too."""
    if item["role"] == Role.TOOL:
        if not _is_id(item.get("tool_call_id")):
            says = "a tool message needs the tool_call_id of the call it answers"
            raise _refused(where, ["tool_call_id"], says)
        if not _is_text_output(item.get("content")):
            raise _refused(where, ["content"], _NOT_TEXT)
    calls = item.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else []):
        at = ["tool_calls", index]
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _refused(where, [*at, "function"], "a tool call needs its function")
        if not _is_id(call.get("id")):
            raise _refused(where, [*at, "id"], "a tool call needs its id")
        if call.get("type", "function") != "function":
            raise _refused(where, [*at, "type"], "a tool call's type is 'function'")
        if not _is_id(function.get("name")):
            says = "a tool call needs the name of its function"
            raise _refused(where, [*at, "function", "name"], says)


def chat_messages(items: list[dict[str, Any]], *, field: str = "messages") -> list[Message]:
    """OpenAI chat messages (or responses input items) as messages of our protocol.

    Of the responses' items, ``function_call`` and ``function_call_output`` (what a client
    sends back of a conversation with tool calls) are read as their chat messages; a
    ``reasoning`` item (a response's output sent back whole) is left out, as the agent's
    reasoning never goes back to its model.
    """
    messages: list[Message] = []
    for position, item in enumerate(items):
        where = [field, position]
        kind = item.get("type", "message")
        if field == "input" and kind == "reasoning":
            continue
        if field == "input" and kind in ("function_call", "function_call_output"):
            item = _function_item_as_chat(item, where)
        elif field == "input" and kind != "message":
            says = (
                f"is an item of the type {str(kind)[:40]!r}; the items taken are messages, "
                "function_call, function_call_output and reasoning"
            )
            raise InvalidInputError(
                f"{field}[{position}] {says}", errors=[{"loc": [*where, "type"], "msg": says}]
            )
        elif kind != "message" or not isinstance(item.get("role"), str):
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
        _check_tool_call_ids(item, where)
        _check_parts_of_role(item, where)
        # An OpenAI message: a protocol Message's dump (its "object") is read as one too, its
        # parts checked, rather than taken whole as from_openai_message takes it.
        openai_message = {key: value for key, value in item.items() if key != "object"}
        try:
            message = Message.from_openai_message(openai_message)
        except UnsupportedContentError as exc:
            raise InvalidInputError(
                f"{field}[{position}]: {exc}", errors=[{"loc": where, "msg": str(exc)}]
            ) from None
        except (ValidationError, AttributeError, TypeError):
            raise InvalidInputError(
                f"{field}[{position}] is not a valid message",
                errors=[{"loc": where, "msg": "not a valid message"}],
            ) from None
        if is_blank_user_message(message):
            raise _refused(where, ["content"], BLANK_USER_MESSAGE)
        if kind == "function_call" and position and items[position - 1].get("type") == kind:
            # Parallel calls come an item each, their outputs after them all: one message
            # holds them, as the chat APIs want the calls whose outputs follow.
            calls = messages[-1].content or []
            for part in message.content or []:
                calls.append(part.model_copy(update={"index": len(calls)}))
        else:
            messages.append(message)
    return messages


def responses_input(body: ResponsesRequest) -> list[Message]:
    """The input of a responses request as messages (``instructions`` first, as a system
    message for this turn alone: as OpenAI's, they are not carried over to the next
    response, and a client sending them with every turn does not pile them up in the
    session)."""
    if isinstance(body.input, str):
        if is_blank_text(body.input):
            raise InvalidInputError(f"input: {BLANK_USER_MESSAGE}", field="input")
        messages = [Message(role=Role.USER, content=[TextContent(text=body.input)])]
    elif not body.input:
        raise InvalidInputError("input holds no item: send a message", field="input")
    else:
        _check_item_ids(body.input)
        messages = chat_messages(body.input, field="input")
    if body.instructions:
        instructions = Message(
            role=Role.SYSTEM,
            content=[TextContent(text=body.instructions)],
            metadata={TURN_ONLY: True},
        )
        messages.insert(0, instructions)
    return messages


# The prefix of the id an input item is given when it has none, by its type (OpenAI's).
_ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def responses_input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The input of a responses request as OpenAI lists it again (``input_items``): its
    items, each with an id, a message's text content as a list of parts (``instructions``
    are no item, as OpenAI's).

    >>> [item["content"] for item in responses_input_items(ResponsesRequest(input="hi"))]
    [[{'type': 'input_text', 'text': 'hi'}]]
    """
    given = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    items = []
    for item in given:
        kind = str(item.get("type", "message"))
        listed: dict[str, Any] = {**item, "type": kind}
        content = listed.get("content")
        if kind == "message" and isinstance(content, str):
            part = "output_text" if listed.get("role") == Role.ASSISTANT else "input_text"
            listed["content"] = [{"type": part, "text": content}]
        if not _is_id(listed.get("id")):
            listed["id"] = f"{_ITEM_ID_PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}"
        items.append(listed)
    return items


def input_items_after(items: list[dict[str, Any]], after: str) -> list[dict[str, Any]]:
    """The input items listed after the one whose id is ``after``: after the last of that
    id, so that a page ending on an id given twice (as a response kept before such input
    was refused may hold) is not served again.

    >>> items = [{"id": i} for i in ("x", "a", "y", "a", "z")]
    >>> input_items_after(items, "a")
    [{'id': 'z'}]
    """
    ids = [item.get("id") for item in items]
    if after not in ids:
        raise InvalidInputError("after names no input item of this response", field="after")
    return items[len(ids) - ids[::-1].index(after) :]


def _is_reply(message: Message) -> bool:
    return message.type == MessageType.MESSAGE and message.role == Role.ASSISTANT


def _is_reasoning(message: Message) -> bool:
    return message.type == MessageType.REASONING


def text_of(message: Message) -> str:
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
    """The text of the agent's reply messages, separated by blank lines (a message without
    text, a picture's, adds none: a stream of the run sends none for it)."""
    texts = (text_of(m) for m in response.output or [] if _is_reply(m))
    return "\n\n".join(text for text in texts if text)


def refusal_of(message: Message) -> str:
    """The model's refusal to answer a message holds (its :class:`RefusalContent`)."""
    return "".join(
        part.refusal or "" for part in message.content or [] if isinstance(part, RefusalContent)
    )


def reply_reasoning(response: AgentResponse) -> str | None:
    """The text of the agent's reasoning messages (a thinking model's), separated by blank
    lines; None when it reasoned nothing aloud."""
    texts = (text_of(m) for m in response.output or [] if _is_reasoning(m))
    return "\n\n".join(text for text in texts if text) or None


def reply_refusal(response: AgentResponse) -> str | None:
    """The refusals of the agent's reply messages, separated by blank lines; None when the
    model refused nothing."""
    refusals = (refusal_of(m) for m in response.output or [] if _is_reply(m))
    return "\n\n".join(refusal for refusal in refusals if refusal) or None


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
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts["total_tokens"],
    }


def chat_completion(response: AgentResponse, *, model: str) -> dict[str, Any]:
    """A completed run as a ``chat.completion`` object: a refusal is its message's
    ``refusal`` (its ``content`` null when the model said nothing else, as OpenAI's), the
    agent's reasoning its ``reasoning_content`` (as DeepSeek's and vLLM's, when it reasoned)."""
    text, refusal = reply_text(response), reply_refusal(response)
    reasoning = reply_reasoning(response)
    return {
        "id": f"chatcmpl-{_bare_id(response)}",
        "object": "chat.completion",
        "created": response.created_at,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None if refusal and not text else text,
                    "refusal": refusal,
                    **({"reasoning_content": reasoning} if reasoning else {}),
                },
                "logprobs": None,
                "finish_reason": finish_reason(response.output),
            }
        ],
        "usage": chat_usage(response.usage),
    }


def _error_line(error: Error, status: int) -> bytes:
    """The SSE line that ends a stream with ``error``, in the body's shape of an error answer
    of that status (the SDK raises it as an APIError, with its code, type and message)."""
    return encode(json.dumps(error_body(error.code, error.message, status=status)))


async def chat_completion_chunks(
    events: AsyncIterator[Event], *, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """A run's events as ``chat.completion.chunk`` SSE lines, ending with ``[DONE]``: the
    model's refusal streams as ``delta.refusal``, the agent's reasoning (its ``reasoning``
    messages) as ``delta.reasoning_content`` (as DeepSeek's and vLLM's). A part given whole
    (a refusal in a message yielded whole) streams as it completes, what its deltas streamed
    before not again.

    An agent failure, or the run's cancellation, becomes an ``{"error": ...}`` line (the SDK
    raises it as an APIError).
    """
    completion_id, created = "chatcmpl", int(time.time())
    replies: set[str] = set()
    thoughts: set[str] = set()
    # Per delta field, the messages that said something in it (a blank line parts two).
    said: dict[str, set[str]] = {}
    # What each reply part (by its message and index) streamed so far.
    streamed: dict[tuple[str, int | None], str] = {}

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
                yield _error_line(event.error, status_of_code(event.error.code))
            elif event.status == RunStatus.Canceled:
                yield _error_line(RUN_CANCELED, 409)
        elif isinstance(event, Message) and event.status == RunStatus.InProgress:
            if _is_reply(event):
                replies.add(event.id)
            elif _is_reasoning(event):
                thoughts.add(event.id)
        elif isinstance(event, TextContent | RefusalContent) and (
            event.msg_id in replies or event.msg_id in thoughts
        ):
            refusal, text = _said(event)
            part = (event.msg_id, event.index)
            if not event.delta:
                completed = event.status == RunStatus.Completed
                text = _unstreamed(text, streamed.get(part, "")) if completed else ""
            streamed[part] = streamed.get(part, "") + text
            if text:
                field = (
                    "reasoning_content"
                    if event.msg_id in thoughts
                    else "refusal"
                    if refusal
                    else "content"
                )
                saying = said.setdefault(field, set())
                separator = "\n\n" if saying and event.msg_id not in saying else ""
                saying.add(event.msg_id)
                yield delta({field: separator + text})


def responses_echo(body: ResponsesRequest) -> dict[str, Any]:
    """What a response object repeats of its request, as OpenAI's do (its ``metadata`` is
    the request's, with the session's id; its ``conversation``, the one it named)."""
    conversation = session_id_of(None, None, body.conversation)
    return {
        "conversation": {"id": conversation} if conversation else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": dict(body.metadata or {}),
        "previous_response_id": body.previous_response_id,
        "temperature": body.temperature,
        "top_p": body.top_p,
    }


def responses_object(
    response: AgentResponse,
    *,
    model: str,
    session_id: str,
    echo: Mapping[str, Any] | None = None,
    status: str | None = None,
    output: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A run as an OpenAI ``response`` object (``incomplete`` when its reply was cut), with
    ``echo`` (see :func:`responses_echo`)."""
    status = status or response.status
    if status == RunStatus.Canceled:
        status = "cancelled"  # OpenAI's spelling, the one its SDKs' types allow
    incomplete = None
    reason = finish_reason(response.output) if status == RunStatus.Completed else "stop"
    if reason != "stop":
        status, incomplete = "incomplete", {"reason": INCOMPLETE_REASONS[reason]}
    if output is None:
        output = [
            _output_item(m, RunStatus.Completed)
            for m in response.output or []
            if _is_reply(m) or _is_reasoning(m)
        ]
    echo = echo or {}
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
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "metadata": {**echo.get("metadata", {}), "session_id": session_id},
        "parallel_tool_calls": False,
        "previous_response_id": echo.get("previous_response_id"),
        "temperature": echo.get("temperature"),
        "tool_choice": "auto",
        "tools": [],
        "top_p": echo.get("top_p"),
        "usage": responses_usage(response.usage),
        # Only when the request named one: AgentScope Runtime's responses have no such key.
        **({"conversation": echo["conversation"]} if echo.get("conversation") else {}),
    }


def _unstreamed(whole: str, streamed: str) -> str:
    """What a part completed ``whole`` says past what its deltas ``streamed``: nothing when
    its text was rewritten (a stream cannot take back what it sent; the part's text whole
    follows it, in a response's output and its ``.done`` event).

    >>> _unstreamed("Hello there.", "Hello"), _unstreamed("Goodbye.", "Hello")
    (' there.', '')
    """
    return whole[len(streamed) :] if whole.startswith(streamed) else ""


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _said(part: TextContent | RefusalContent) -> tuple[bool, str]:
    """Whether ``part`` is the model's refusal, and what it says (its text, or refusal)."""
    if isinstance(part, RefusalContent):
        return True, part.refusal or ""
    return False, part.text or ""


def _output_part(refusal: bool, text: str) -> dict[str, Any]:
    """An output item's part: the model's refusal, else its text."""
    return {"type": "refusal", "refusal": text} if refusal else _output_text(text)


def _output_item(message: Message, status: str, *, empty: bool = False) -> dict[str, Any]:
    parts = [] if empty else message.content or []
    said = [_said(part) for part in parts if isinstance(part, TextContent | RefusalContent)]
    return _item(message.id, status, said, reasoning=_is_reasoning(message))


def _item(
    msg_id: str, status: str, said: list[tuple[bool, str]], *, reasoning: bool
) -> dict[str, Any]:
    """An output item: a ``reasoning`` item whose ``summary`` holds the reasoning's texts,
    else a ``message`` of what was said (see :func:`_said`)."""
    if reasoning:
        summary = [_summary_part(text) for _, text in said]
        return {"type": "reasoning", "id": msg_id, "status": status, "summary": summary}
    return _message_item(msg_id, status, [_output_part(*part) for part in said])


def _summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


def _part(reasoning: bool, refusal: bool, text: str) -> dict[str, Any]:
    """A part of an output item: of a reasoning item's summary, else of a message."""
    return _summary_part(text) if reasoning else _output_part(refusal, text)


def _message_item(msg_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": msg_id,
        "status": status,
        "role": "assistant",
        "content": parts,
    }


# The events streaming a part of an output item, by the item's kind and the part's: its
# start, its text's deltas, the text whole, its end; and the field the text whole is in.
_PART_EVENTS = {
    "reasoning": (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "text",
    ),
    "refusal": (
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "refusal",
    ),
    "text": (
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "text",
    ),
}


async def _responses_stream(
    events: AsyncIterator[Event], *, model: str, session_id: str, echo: Mapping[str, Any]
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A run's events as the responses API's events: ``(type, fields)``.

    A run that failed or was canceled ends with its output so far: the reply messages it
    completed, and the one it was writing, ``incomplete``, with the text it had streamed.
    The model's refusal is a ``refusal`` part (``response.refusal.delta`` as it streams).
    The agent's reasoning (a ``reasoning`` message) is a ``reasoning`` item, each of its
    texts a ``summary_text`` part (``response.reasoning_summary_text.delta`` as it streams),
    as OpenAI's reasoning models stream their summaries.
    """
    positions: dict[str, int] = {}
    thoughts: set[str] = set()
    # Per message, the place of each of its text and refusal parts (by their index among
    # all its parts) among those alone: an output item holds those only, and the SDKs read
    # a part's ``content_index`` (``summary_index``) as its place there.
    text_places: dict[str, dict[int, int]] = {}
    # Per message, by place: whether the part is a refusal, and its text so far.
    streamed: dict[str, dict[int, tuple[bool, str]]] = {}
    done_items: dict[str, dict[str, Any]] = {}

    def output_so_far() -> list[dict[str, Any]]:
        return [
            done_items.get(msg_id)
            or _item(
                msg_id,
                "incomplete",
                [part for _, part in sorted(streamed.get(msg_id, {}).items())],
                reasoning=msg_id in thoughts,
            )
            for msg_id in sorted(positions, key=positions.__getitem__)
        ]

    def response(event: AgentResponse, **fields: Any) -> dict[str, Any]:
        return responses_object(event, model=model, session_id=session_id, echo=echo, **fields)

    async for event in events:
        if isinstance(event, AgentResponse):
            if event.status in (RunStatus.Created, RunStatus.InProgress):
                body = response(event, status=RunStatus.InProgress, output=[])
                yield f"response.{event.status}", {"response": body}
            elif event.status == RunStatus.Completed:
                # Its replies as the run ended them, every one whole.
                body = response(event, output=None if event.output else output_so_far())
                yield f"response.{body['status']}", {"response": body}
            elif event.status == RunStatus.Failed:
                yield "response.failed", {"response": response(event, output=output_so_far())}
            elif event.status == RunStatus.Canceled:
                body = response(event, output=output_so_far())
                yield "response.incomplete", {"response": body}
        elif isinstance(event, Message) and (_is_reply(event) or _is_reasoning(event)):
            if event.status == RunStatus.InProgress:
                position = positions[event.id] = len(positions)
                if _is_reasoning(event):
                    thoughts.add(event.id)
                item = _output_item(event, RunStatus.InProgress, empty=True)
                yield "response.output_item.added", {"output_index": position, "item": item}
            elif event.status == RunStatus.Completed and event.id in positions:
                position = positions[event.id]
                item = _output_item(event, RunStatus.Completed)
                done_items[event.id] = item
                yield "response.output_item.done", {"output_index": position, "item": item}
        elif isinstance(event, TextContent | RefusalContent) and event.msg_id in positions:
            msg_id = event.msg_id
            refusal, text = _said(event)
            thought = msg_id in thoughts
            added, delta, done, part_done, field = _PART_EVENTS[
                "reasoning" if thought else "refusal" if refusal else "text"
            ]
            # What OpenAI's output text events carry besides (no log probabilities here).
            extra: dict[str, Any] = {} if thought or refusal else {"logprobs": []}
            places = text_places.setdefault(msg_id, {})
            opened = (event.index or 0) in places
            index = places.setdefault(event.index or 0, len(places))
            where: dict[str, Any] = {
                "item_id": msg_id,
                "output_index": positions[msg_id],
                "summary_index" if thought else "content_index": index,
            }
            if not opened:
                yield added, {**where, "part": _part(thought, refusal, "")}
            parts = streamed.setdefault(msg_id, {})
            so_far = parts.get(index, (refusal, ""))[1]
            # A part given whole streams what its deltas did not, as a delta before its done:
            # clients build the text from the deltas.
            if event.delta or event.status == RunStatus.Completed:
                new = text if event.delta else _unstreamed(text, so_far)
                parts[index] = (refusal, so_far + new)
                if new:
                    yield delta, {**where, "delta": new, **extra}
            if not event.delta and event.status == RunStatus.Completed:
                parts[index] = (refusal, text)
                yield done, {**where, field: text, **extra}
                yield part_done, {**where, "part": _part(thought, refusal, text)}


async def responses_events(
    events: AsyncIterator[Event],
    *,
    model: str,
    session_id: str,
    echo: Mapping[str, Any] | None = None,
    starting_after: int = -1,
) -> AsyncIterator[bytes]:
    """A run's events as the responses API's named SSE events (those whose
    ``sequence_number`` is above ``starting_after``: a stream read again from where it broke).

    ``response.created`` → ``response.in_progress`` → per reply message
    ``response.output_item.added`` → ``response.content_part.added`` →
    ``response.output_text.delta``\\ * → ``response.output_text.done`` →
    ``response.content_part.done`` → ``response.output_item.done``; then
    ``response.completed`` (``response.incomplete`` when the reply was cut; or
    ``response.failed``, or for a canceled run ``response.incomplete`` with the status
    ``cancelled``).
    """
    sequence = 0
    stream = _responses_stream(events, model=model, session_id=session_id, echo=echo or {})
    async for kind, fields in stream:
        payload = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        if payload["sequence_number"] > starting_after:
            yield encode(json.dumps(payload), event=kind)


async def responses_final(
    events: AsyncIterator[Event],
    *,
    model: str,
    session_id: str,
    echo: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object a run ends with: the last of :func:`responses_events`."""
    final: dict[str, Any] = {}
    stream = _responses_stream(events, model=model, session_id=session_id, echo=echo or {})
    async for _, fields in stream:
        final = fields.get("response", final)
    return final


__all__ = [
    "MAX_ITEM_ID_LENGTH",
    "RUN_CANCELED",
    "ChatCompletionRequest",
    "ResponseInProgressError",
    "ResponseNotFoundError",
    "ResponsesRequest",
    "ResponsesText",
    "chat_completion",
    "chat_completion_chunks",
    "chat_messages",
    "chat_usage",
    "check_chat_request",
    "check_responses_request",
    "finish_reason",
    "input_items_after",
    "refusal_of",
    "reply_refusal",
    "reply_text",
    "response_id",
    "responses_echo",
    "responses_events",
    "responses_final",
    "responses_input",
    "responses_input_items",
    "responses_object",
    "responses_usage",
    "run_of_response",
    "session_id_of",
    "session_of_response",
    "split_turn",
    "text_of",
]
