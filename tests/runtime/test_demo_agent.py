"""The demo agent: no network, and it remembers what you told it."""

from __future__ import annotations

import pytest

from agentscope_serverless.agents.demo import app, demo_reply
from agentscope_serverless.app import AgentApp
from agentscope_serverless.schemas.agent_schemas import Message


def said(*texts: str) -> list[Message]:
    return [Message(role="user", content=text) for text in texts]


@pytest.mark.parametrize(
    ("text", "history", "reply"),
    [
        ("My name is alice", [], "Nice to meet you, Alice! I will remember your name."),
        ("call me Bo", [], "Nice to meet you, Bo! I will remember your name."),
        ("What's my name?", said("My name is Alice"), "Your name is Alice."),
        ("who am I", said("My name is Alice", "actually, call me Ali"), "Your name is Ali."),
        ("What is my name?", [], 'I don\'t know your name yet. Tell me with "My name is ...".'),
        (
            "hello",
            said("my name is Kim"),
            "Hello, Kim! I am a demo agent that runs without a language model. "
            "Tell me your name, then ask me what it is.",
        ),
        (
            "the sky is blue",
            said("one", "two"),
            'You said: "the sky is blue". That is message 3 of this conversation.',
        ),
    ],
)
def test_replies(text: str, history: list[Message], reply: str) -> None:
    assert demo_reply(text, history) == reply


def test_assistant_messages_do_not_count_as_introductions() -> None:
    history = [Message(role="assistant", content='You said: "my name is Eve"')]
    assert demo_reply("what is my name", history).startswith("I don't know")


def test_a_name_from_long_term_memory() -> None:
    reply = demo_reply("what's my name?", [], memories=said("My name is Alice"))
    assert reply == "Your name is Alice: you told me in an earlier conversation."


async def test_past_the_history_window_the_count_says_it_may_be_later() -> None:
    """A conversation longer than the messages a turn reads is not miscounted: from the
    window alone the demo cannot tell its length."""
    from agentscope_serverless.agents.demo import query

    small = AgentApp(history_window=4)
    small.query(framework="text")(query)
    try:
        replies = [await small.query(f"note {n}", user_id="u", session_id="s") for n in range(1, 5)]
    finally:
        await small.stop()
    texts = [reply.output[0].get_text_content() for reply in replies if reply.output]
    assert texts[1] == 'You said: "note 2". That is message 2 of this conversation.'
    assert texts[3] == (
        'You said: "note 4". That is message 3 or a later one of this conversation: '
        "I read its last 4 messages."
    )


async def test_the_shipped_app_remembers_across_turns_and_sessions() -> None:
    try:
        await app.query("My name is Alice", user_id="demo-user", session_id="one")
        same = await app.query("What's my name?", user_id="demo-user", session_id="one")
        other = await app.query("What's my name?", user_id="demo-user", session_id="two")
        stranger = await app.query("What's my name?", user_id="someone-else", session_id="one")
    finally:
        await app.stop()
    assert same.output and same.output[0].get_text_content() == "Your name is Alice."
    assert other.output and "earlier conversation" in (other.output[0].get_text_content() or "")
    assert stranger.output and (stranger.output[0].get_text_content() or "").startswith("I don't")
