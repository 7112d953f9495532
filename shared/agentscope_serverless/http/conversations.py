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
data; one whose session was deleted is not followed.

The digest reads what a client resends of each message: its role, type, text and other
parts (without their envelope: :data:`agentscope_serverless.runner.PART_ENVELOPE`).
Consecutive assistant messages of text count as one whose texts are joined by a blank line,
as a chat completion joins the reply messages of a run: a responses client resending its
output items one by one writes the same digest.

>>> from agentscope_serverless.schemas.agent_schemas import Message
>>> ask = Message(role="user", content="hi")
>>> digest([ask, Message(role="assistant", content="a"), Message(role="assistant", content="b")]
... ) == digest([ask, Message(role="assistant", content="a\\n\\nb")])
True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentscope_serverless.errors import AgentScopeServerlessError
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.openai_compat import reply_text, text_of
from agentscope_serverless.log import logger
from agentscope_serverless.runner import PART_ENVELOPE
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Event,
    Message,
    MessageType,
    Role,
    RunStatus,
    TextContent,
)

# Keys of the notes: a space makes them keys no client sends (see IdempotencyStore.keep).
_KEY_PREFIX = "conversation "
# The statuses a run ends with.
_ENDED = frozenset({RunStatus.Completed, RunStatus.Failed, RunStatus.Canceled, RunStatus.Rejected})


def digest(messages: Sequence[Message]) -> str:
    """The digest of a conversation, as a client resends it."""
    shown: list[list[Any]] = []
    for message in messages:
        text = text_of(message)
        others = [
            p.model_dump_json(exclude=set(PART_ENVELOPE))
            for p in message.content or []
            if not isinstance(p, TextContent)
        ]
        if (
            shown
            and message.role == Role.ASSISTANT
            and message.type == MessageType.MESSAGE
            and not others
            and shown[-1][:2] == [Role.ASSISTANT, MessageType.MESSAGE]
            and not shown[-1][3]
        ):
            shown[-1][2] += "\n\n" + text
            continue
        shown.append([message.role, message.type, text, others])
    encoded = json.dumps(shown, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


async def resumed(context: AppContext, user_id: str, history: Sequence[Message]) -> str | None:
    """The session holding the conversation ``history``, taken from its note; None when
    there is none (or the store could not say)."""
    if context.idempotency is None or not history:
        return None
    try:
        session_id = await context.idempotency.take(user_id, _KEY_PREFIX + digest(history))
        if session_id is None or not await context.session_history.has_session(user_id, session_id):
            return None
    except AgentScopeServerlessError as exc:  # a new session instead: the call goes on
        logger.warning("conversation lookup failed: %s", exc.code)
        return None
    return session_id


async def noted(
    events: AsyncIterator[Event],
    context: AppContext,
    user_id: str,
    session_id: str,
    conversation: Sequence[Message],
    before: Sequence[Message] | None,
) -> AsyncIterator[Event]:
    """``events``, noting the conversation with its reply before the run's completed
    response goes out (so that the client's next call finds it); a run that ends otherwise
    notes the conversation ``before`` its turn, for the client's retry."""
    async for event in events:
        if isinstance(event, AgentResponse) and event.status in _ENDED:
            if event.status == RunStatus.Completed:
                reply = Message(role=Role.ASSISTANT, content=[TextContent(text=reply_text(event))])
                await _note(context, user_id, session_id, [*conversation, reply])
            elif before:
                await _note(context, user_id, session_id, before)
        yield event


async def _note(
    context: AppContext, user_id: str, session_id: str, conversation: Sequence[Message]
) -> None:
    if context.idempotency is None:
        return
    try:
        await context.idempotency.keep(user_id, _KEY_PREFIX + digest(conversation), session_id)
    except AgentScopeServerlessError as exc:  # its next call starts a session: no failure
        logger.warning("conversation note failed: %s", exc.code)


__all__ = ["digest", "noted", "resumed"]
