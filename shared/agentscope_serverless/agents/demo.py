"""A demo agent that needs no network and shows multi-turn memory.

It answers from the conversation so far: tell it your name, ask for it later in the same
session, and it remembers; in a new session it finds the name in long-term memory.

>>> demo_reply("My name is Alice", history=[])
'Nice to meet you, Alice! I will remember your name.'
>>> from agentscope_serverless.schemas.agent_schemas import Message
>>> demo_reply("What's my name?", history=[Message(role="user", content="My name is Alice")])
'Your name is Alice.'

``app`` is the ready :class:`AgentApp` (the default ``AGENT_APP``).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from agentscope_serverless.app import AgentApp
from agentscope_serverless.runner import Runner
from agentscope_serverless.schemas.agent_schemas import Message, Role
from agentscope_serverless.schemas.session import Session

_NAME_INTRO = re.compile(r"\b(?:my name is|call me)\s+([^\W\d_][\w'-]*)", re.IGNORECASE)
_NAME_QUESTION = re.compile(
    r"\b(?:what(?:'s|\s+is)\s+my\s+name|who\s+am\s+i|do\s+you\s+(?:know|remember)\s+my\s+name)\b",
    re.IGNORECASE,
)
_GREETING = re.compile(
    r"^\s*(?:hello|hi|hey|good\s+(?:morning|afternoon|evening))\b", re.IGNORECASE
)
_PIECE = re.compile(r"\S+\s*")


def demo_reply(
    text: str,
    history: Sequence[Message],
    memories: Sequence[Message] = (),
    *,
    window: int | None = None,
) -> str:
    """The demo agent's answer to ``text``, given the session's history and memories;
    ``window``: the most messages of the history a turn reads (None: all of them), so a
    history that long may have begun earlier.

    >>> demo_reply("ok", [Message(role="user", content="hi")] * 2, window=2)[16:]
    'That is message 3 or a later one of this conversation: I read its last 2 messages.'
    """
    introduced = _name_in([text])
    if introduced:
        return f"Nice to meet you, {introduced}! I will remember your name."
    name = _name_in(_user_texts(history))
    if _NAME_QUESTION.search(text):
        if name:
            return f"Your name is {name}."
        remembered = _name_in(_user_texts(memories))
        if remembered:
            return f"Your name is {remembered}: you told me in an earlier conversation."
        return 'I don\'t know your name yet. Tell me with "My name is ...".'
    if _GREETING.search(text):
        who = f", {name}" if name else ""
        return (
            f"Hello{who}! I am a demo agent that runs without a language model. "
            "Tell me your name, then ask me what it is."
        )
    turn = sum(1 for m in history if m.role == Role.USER) + 1
    if window is not None and len(history) >= window:
        return (
            f'You said: "{text}". That is message {turn} or a later one of this '
            f"conversation: I read its last {len(history)} messages."
        )
    return f'You said: "{text}". That is message {turn} of this conversation.'


def _user_texts(messages: Iterable[Message]) -> list[str]:
    return [m.get_text_content() or "" for m in messages if m.role == Role.USER]


def _name_in(texts: Sequence[str]) -> str | None:
    """The last name introduced in ``texts`` ("my name is X" or "call me X")."""
    for text in reversed(texts):
        matches = _NAME_INTRO.findall(text)
        if matches:
            name: str = matches[-1]
            return name[:1].upper() + name[1:]
    return None


app = AgentApp(
    app_name="demo",
    app_description="A demo agent that needs no network and remembers your name.",
)


@app.query(framework="text")
async def query(
    self: Runner,
    msgs: list[Message],
    request: Any = None,
    *,
    session: Session,
    memories: list[Message],
    **kwargs: Any,
) -> AsyncIterator[str]:
    """Stream the demo reply word by word."""
    text = " ".join(m.get_text_content() or "" for m in msgs if m.role == Role.USER).strip()
    history = [m for m in session.messages if isinstance(m, Message)]
    reply = demo_reply(text, history, memories, window=self.history_window)
    for piece in _PIECE.findall(reply):
        yield piece


__all__ = ["app", "demo_reply"]
