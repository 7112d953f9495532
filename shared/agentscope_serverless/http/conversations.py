"""One session per conversation for OpenAI-compatible clients that name no session.

Most chat front ends speak to an OpenAI-compatible API without a session: they resend the
whole conversation with every call. Each such call would start a session of its own holding
a copy of the conversation so far, so a conversation of n turns would leave n sessions and
store its messages n²/2 times. Instead, once a turn is answered, the server notes (among the
user's idempotency records, see :meth:`IdempotencyStore.keep`) a digest of the conversation
*as the client will send it next* (what it sent, then the reply as the API showed it) with
the session holding it. A call naming no session whose earlier messages have a noted digest
continues that session, storing its new turn alone.

A note is taken by the call that uses it (:meth:`IdempotencyStore.take`), so what forks a
conversation starts a new session holding the conversation so far, the one it forked from
left as it was: a reply regenerated, an earlier message edited, the same call sent twice at
once. A turn that fails notes the conversation before it, for the client's retry. Notes last
as long as idempotency records (``IDEMPOTENCY_EXPIRY_SECONDS``, a day by default; a
conversation taken up later starts a new session holding it) and are erased with the user's
data. A note names, with its session, a message the session held when it was taken (the
turn's last reply; for a turn that replied nothing, the message before it, else its input;
the last message before a failed turn), and is followed only while
the session still holds it: one whose session was deleted (by its user, with the user's
data, or expired) is not followed, even once a session of the same id was made again.

A run cancelled (a chat client closing its stream to stop the reply) notes the conversation
with its partial reply too, as the session keeps it and as it was streamed until the client
left (empty, for a run stopped before it said anything, as for a turn that replied nothing),
so that the client resending what it got of it goes on in the session. The end of a run
whose client left is awaited apart from the request: a call sent before it (and the partial
reply stored) starts a new session, as does one resending less than was streamed.

The digest reads what a client resends of each message: its role, type, text and other
parts (without their envelope: :data:`agentscope_serverless.schemas.agent_schemas.PART_ENVELOPE`),
an assistant's refusal apart: clients resend it as a part, as chat's ``refusal`` field (which
is not read as input), or not at all, and a reply is noted as its text.
Consecutive assistant messages of text count as one whose texts are joined by a blank line,
as a chat completion joins the reply messages of a run (those with text: a picture's adds
none): a responses client resending its output items one by one writes the same digest.

**Continuing a response.** A call naming ``previous_response_id`` continues that response's
conversation as OpenAI's does: the conversation up to that response, whatever came after it.
A completed response notes its session too (:func:`responded`), with its last message, and
the call continuing it takes the note (:func:`continued`) and runs in that session, unless
the session no longer holds that message (deleted since, then made again: a 404, as when it
was not made again). A call finding no note (the
response was continued already: an earlier response continued again, a double submit) runs
in a new session holding the first session's messages up to that response's last one, a
branch; so does one continuing a response whose note expired. A response whose messages
cannot be found (stored with ``store: false``, on a server that keeps no runs) is continued
in its session. A response still in progress is continued by no call (a 400, as OpenAI's):
its turn is stored in its session as its run ends, and would follow the call's; one that
failed or was cancelled has ended, and is continued as any other.

>>> from agentscope_serverless.schemas.agent_schemas import Message
>>> ask = Message(role="user", content="hi")
>>> digest([ask, Message(role="assistant", content="a"), Message(role="assistant", content="b")]
... ) == digest([ask, Message(role="assistant", content="a\\n\\nb")])
True
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.openai_compat import (
    ResponseInProgressError,
    ResponseNotFoundError,
    reply_text,
    run_of_response,
    session_of_response,
    text_of,
)
from agentscope_serverless.http.routers.runs import read_record
from agentscope_serverless.http.sdk_retries import stored_events
from agentscope_serverless.log import logger
from agentscope_serverless.schemas.agent_schemas import (
    PART_ENVELOPE,
    AgentResponse,
    Event,
    Message,
    MessageType,
    RefusalContent,
    Role,
    RunStatus,
    TextContent,
)
from agentscope_serverless.services._once import new_uuid
from agentscope_serverless.services.session_history.base import MAX_PAGE_SIZE

# Keys of the notes: a space makes them keys no client sends (see IdempotencyStore.keep).
_KEY_PREFIX = "conversation "
_RESPONSE_PREFIX = "response "
# The statuses a run ends with.
_ENDED = frozenset({RunStatus.Completed, RunStatus.Failed, RunStatus.Canceled, RunStatus.Rejected})


def digest(messages: Sequence[Message]) -> str:
    """The digest of a conversation, as a client resends it."""
    shown: list[list[Any]] = []
    for message in messages:
        text = text_of(message)
        # An assistant's refusal is not read: clients resend it as a part, as chat's
        # ``refusal`` field (not read as input), or not at all.
        skipped = TextContent | RefusalContent if message.role == Role.ASSISTANT else TextContent
        others = [
            p.model_dump_json(exclude=set(PART_ENVELOPE))
            for p in message.content or []
            if not isinstance(p, skipped)
        ]
        if (
            shown
            and message.role == Role.ASSISTANT
            and message.type == MessageType.MESSAGE
            and not others
            and shown[-1][:2] == [Role.ASSISTANT, MessageType.MESSAGE]
            and not shown[-1][3]
        ):
            shown[-1][2] = "\n\n".join(t for t in (shown[-1][2], text) if t)
            continue
        shown.append([message.role, message.type, text, others])
    encoded = json.dumps(shown, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


async def resumed(
    context: AppContext, user_id: str, history: Sequence[Message]
) -> tuple[str, str] | None:
    """The session holding the conversation ``history``, taken from its note, with the id of
    the message of it the note names; None when there is none, the session no longer holds
    that message (it was deleted, even if made again since), or the store could not say."""
    if context.idempotency is None or not history:
        return None
    try:
        kept = await context.idempotency.take(user_id, _KEY_PREFIX + digest(history))
        found = _read_note(kept)
        if found is None or not await context.session_history.stored_messages(
            user_id, found[0], [found[1]]
        ):
            return None
    except AgentScopeServerlessError as exc:  # a new session instead: the call goes on
        logger.warning("conversation lookup failed: %s", exc.code)
        return None
    return found


def _read_note(kept: str | None) -> tuple[str, str] | None:
    """The session and message a conversation's note names (None for no note, or one of
    another form)."""
    try:
        value = json.loads(kept) if kept is not None else None
    except ValueError:
        return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    return None


async def noted(
    events: AsyncIterator[Event],
    context: AppContext,
    user_id: str,
    session_id: str,
    conversation: Sequence[Message],
    before: Sequence[Message] | None,
    held: str | None,
    asked: str | None,
    ended: Callable[[], Awaitable[AgentResponse]] | None = None,
) -> AsyncIterator[Event]:
    """``events``, noting the conversation with its reply before the run's completed
    response goes out (so that the client's next call finds it), with the id of the reply's
    last message (for a reply of no message, ``held``, else ``asked``: the turn's last input
    message the session keeps); a run that ends otherwise notes the conversation ``before``
    its turn, for the client's retry, with ``held``, the id of a message the session held
    before it.

    A cancelled run also notes the conversation with its partial reply, as the session keeps
    it and as it was streamed: a chat client that stopped a reply resends what it got of it.
    When the listener leaves before the run's end (the client stopped the stream), the end
    is awaited (``ended``) apart from the request, and noted alike.
    """
    ending = _Ending(context, user_id, session_id, conversation, before, held, asked)
    last: str | None = None
    streamed: dict[str, str] = {}  # the text of each reply message, as streamed so far
    done = False
    try:
        async for event in events:
            if isinstance(event, Message):
                last = event.id
                if _is_reply(event):
                    streamed.setdefault(event.id, "")
            elif isinstance(event, TextContent) and event.delta and event.msg_id in streamed:
                streamed[event.msg_id] += event.text or ""
            if isinstance(event, AgentResponse) and event.status in _ENDED:
                done = True
                await ending.note(event, _joined(streamed.values()), last)
            yield event
    except (asyncio.CancelledError, GeneratorExit):
        if not done and ended is not None:
            _later(ending.note_when_ended(ended, _joined(streamed.values()), last))
        raise


def _is_reply(message: Message) -> bool:
    return message.role == Role.ASSISTANT and message.type == MessageType.MESSAGE


def _joined(texts: Iterable[str]) -> str:
    """Reply messages' texts as one reply says them (see :func:`reply_text`)."""
    return "\n\n".join(text for text in texts if text)


def _reply(text: str) -> Message:
    return Message(role=Role.ASSISTANT, content=[TextContent(text=text)])


# The notes taken apart from the requests that started them (held here: the event loop
# keeps no reference to its tasks).
_pending: set[asyncio.Task[None]] = set()


def _later(step: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(step)
    _pending.add(task)
    task.add_done_callback(_pending.discard)


@dataclass(frozen=True)
class _Ending:
    """What a call naming no session notes as its run ends (see :func:`noted`)."""

    context: AppContext
    user_id: str
    session_id: str
    conversation: Sequence[Message]
    before: Sequence[Message] | None
    held: str | None
    asked: str | None

    async def note(self, final: AgentResponse, streamed: str, last: str | None) -> None:
        """Note the conversation as the run ended with ``final``, its reply ``streamed``
        so far, the last message the listener saw ``last``."""
        # The run's messages are kept in the session, the one open when it was cancelled
        # too (as it was then).
        last_kept = last or next((m.id for m in reversed(final.output or [])), None)
        if final.status == RunStatus.Completed:
            reply = _reply(reply_text(final))
            await self._note([*self.conversation, reply], last_kept or self.held or self.asked)
            return
        if self.before:
            await self._note(self.before, self.held)
        if final.status == RunStatus.Canceled:
            # The partial reply the session keeps, and the one streamed (the client got it,
            # or less: what it resends is found only if it is one of them); for a run
            # stopped before it said anything, the empty reply, as of a turn that replied
            # nothing (the client shows the turn so, and resends it so).
            kept = reply_text(final) if final.output else None
            for partial in dict.fromkeys(p for p in (kept, streamed) if p is not None):
                replied = [*self.conversation, _reply(partial)]
                await self._note(replied, last_kept or self.held or self.asked)

    async def note_when_ended(
        self, ended: Callable[[], Awaitable[AgentResponse]], streamed: str, last: str | None
    ) -> None:
        try:
            final = await ended()
        except Exception:  # a run that ends so is not continued: its next call starts anew
            logger.warning("could not follow a run to its end to note its conversation")
            return
        await self.note(final, streamed, last)

    async def _note(self, conversation: Sequence[Message], message_id: str | None) -> None:
        await _note(self.context, self.user_id, self.session_id, conversation, message_id)


async def _note(
    context: AppContext,
    user_id: str,
    session_id: str,
    conversation: Sequence[Message],
    message_id: str | None,
) -> None:
    if context.idempotency is None or message_id is None:
        return
    value = json.dumps([session_id, message_id], ensure_ascii=False)
    try:
        await context.idempotency.keep(user_id, _KEY_PREFIX + digest(conversation), value)
    except AgentScopeServerlessError as exc:  # its next call starts a session: no failure
        logger.warning("conversation note failed: %s", exc.code)


async def continued(
    context: AppContext, user_id: str, response_id: str
) -> tuple[str, list[Message]]:
    """The session a call continuing the response ``response_id`` runs in, and the history
    it starts with when it is a new one: the response's own session for the first call to
    continue it, else a branch holding that session's conversation up to the response.
    A response still in progress is refused (:func:`refuse_in_progress`)."""
    session_id = session_of_response(response_id)
    found = run_of_response(response_id)
    if found is None:
        return session_id, []
    noted: bool | None = None  # unknown without notes, or when they could not be read
    kept: str | None = None
    if context.idempotency is not None:
        try:
            kept = await context.idempotency.take(user_id, _RESPONSE_PREFIX + found[0])
            noted = kept is not None
        except AgentScopeServerlessError as exc:  # the session itself: the call goes on
            logger.warning("response note lookup failed: %s", exc.code)
    note = _read_note(kept)
    if note is not None and (
        note[0] != session_id
        or not await context.session_history.stored_messages(user_id, session_id, [note[1]])
    ):
        # The session no longer holds the response: deleted (or expired) since, a session
        # of its id made again holds none of its conversation.
        raise ResponseNotFoundError(response_id)
    if noted:
        return session_id, []
    await refuse_in_progress(context, user_id, response_id)
    history = None if noted is None else await _up_to(context, user_id, session_id, found[0])
    if history is None:
        return session_id, []
    return new_uuid(), history


async def refuse_in_progress(context: AppContext, user_id: str, response_id: str) -> None:
    """Refuse (:class:`ResponseInProgressError`) a call continuing the response
    ``response_id`` while its run goes on, as OpenAI does: the response's turn is stored in
    its session as the run ends, after the call's own turn."""
    runs = context.recorder.runs if context.recorder is not None else None
    found = run_of_response(response_id)
    if runs is None or found is None:
        return
    record = await read_record(context, lambda: runs.get_run(user_id, found[0]))
    if record is not None and not record.finished:
        raise ResponseInProgressError(response_id)


async def _up_to(
    context: AppContext, user_id: str, session_id: str, run_id: str
) -> list[Message] | None:
    """The session's messages up to the last one of the run; None when the run's messages
    are not known (not stored) or not in the session."""
    runs = context.recorder.runs if context.recorder is not None else None
    if runs is None:
        return None
    events = stored_events(runs, user_id, run_id, follow=False)
    ids = {event.id async for event in events if isinstance(event, Message)}
    if not ids:
        return None
    messages: list[Message] = []
    cursor: str | None = None
    while True:
        page = await context.session_history.list_messages(
            user_id, session_id, limit=MAX_PAGE_SIZE, cursor=cursor
        )
        messages += page.items
        cursor = page.next_cursor
        if cursor is None:
            break
    ends = [at for at, message in enumerate(messages) if message.id in ids]
    return messages[: ends[-1] + 1] if ends else None


async def responded(
    events: AsyncIterator[Event], context: AppContext, user_id: str, session_id: str, run_id: str
) -> AsyncIterator[Event]:
    """``events``, noting the session of a completed response before its completed event
    goes out, for the call that will continue it (:func:`continued`), with the id of the
    response's last message: the call is refused once the session no longer holds it."""
    notes = context.idempotency
    last: str | None = None
    async for event in events:
        if isinstance(event, Message):
            last = event.id
        completed = isinstance(event, AgentResponse) and event.status == RunStatus.Completed
        if completed and notes is not None and last is not None:
            value = json.dumps([session_id, last], ensure_ascii=False)
            try:
                await notes.keep(user_id, _RESPONSE_PREFIX + run_id, value)
            except AgentScopeServerlessError as exc:  # continuing it branches: no failure
                logger.warning("response note failed: %s", exc.code)
        yield event


__all__ = ["continued", "digest", "noted", "refuse_in_progress", "responded", "resumed"]
