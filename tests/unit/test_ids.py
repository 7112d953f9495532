"""Ids are any text but control characters and what UTF-8 cannot carry, however they are
checked (most ids, printable ASCII, take a shorter way)."""

from __future__ import annotations

import re

import pytest

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.services._validation import (
    clean_session_id,
    require_user_id,
    valid_text,
)

CONTROLS = [
    chr(c) for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0))
]
ACCEPTED = [
    *("alice", "a b", "a\tb", "line\nbreak", "é", "ユーザー", "🙂", "~!@#$%^&*()", "a\u2028b"),
    *("...", ".a", "a.", "a\\b", "%2F", "a?b#c"),
]


@pytest.mark.parametrize("control", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
def test_an_id_holding_a_control_character_is_refused(control: str) -> None:
    for text in (f"user{control}", f"é{control}x"):
        with pytest.raises(InvalidInputError, match="control characters"):
            require_user_id(text)
        with pytest.raises(InvalidInputError, match="control characters"):
            clean_session_id(text)
    with pytest.raises(InvalidInputError):  # blank, when it is whitespace
        require_user_id(control)


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb", "é\ud83d"])
def test_an_id_that_is_not_valid_unicode_is_refused(text: str) -> None:
    with pytest.raises(InvalidInputError, match="not valid Unicode"):
        require_user_id(text)
    with pytest.raises(InvalidInputError, match="not valid Unicode"):
        clean_session_id(text)


@pytest.mark.parametrize("text", ["a/b", "/", " / ", "/a", ".", "..", " .. "])
def test_a_session_id_a_url_path_cannot_carry_is_refused(text: str) -> None:
    refusal = re.escape("must not contain '/' nor be '.' or '..'")
    with pytest.raises(InvalidInputError, match=refusal):
        clean_session_id(text)
    assert require_user_id(text) == text  # a user id is never in a path


@pytest.mark.parametrize("text", ACCEPTED)
def test_other_ids_are_taken_as_given(text: str) -> None:
    assert require_user_id(text) == text
    assert clean_session_id(text) == text.strip()


def test_valid_text_replaces_each_lone_surrogate_and_joins_pairs() -> None:
    assert valid_text("ok") == "ok"
    assert valid_text("é\u2028") == "é\u2028"
    assert valid_text("\ud83d\ude42 \ud800\ud800 \udc00") == "\U0001f642 \ufffd\ufffd \ufffd"
    assert valid_text("\ufeffkept") == "\ufeffkept"
