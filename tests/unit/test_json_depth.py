"""How deeply JSON text nests, measured without parsing it (``nests_deeper_than``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentscope_serverless.services._validation import nests_deeper_than


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


# Text made of what trips a bracket counter: brackets, quotes and backslashes (and U+2200,
# whose UTF-16 and UTF-32 hold a byte '"').
tricky_text = st.text(alphabet='[]{}"\\ a\u00e9\u2200\U0001f642', max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=60,
)


@settings(max_examples=400, deadline=None)
@given(value=json_values, limit=st.integers(min_value=0, max_value=12))
def test_it_agrees_with_the_depth_of_the_parsed_value(value: Any, limit: int) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        expected = depth(value) > limit
        assert nests_deeper_than(text, limit) is expected
        for encoding in ("utf-8", "utf-16", "utf-32"):  # the encodings json.loads reads
            assert nests_deeper_than(text.encode(encoding), limit) is expected


@pytest.mark.parametrize(
    ("text", "limit", "deeper"),
    [
        ("[]", 0, True),
        ("[]", 1, False),
        ('{"a": [[1], "]]]"]}', 2, True),
        ('{"a": [[1], "]]]"]}', 3, False),
        ('["\\"[[[[", "\\\\", []]', 1, True),
        ('["\\"[[[[", "\\\\", []]', 2, False),
        ('"' + "[" * 200 + '"', 100, False),  # every bracket inside the string
        # Not JSON: measured alike, a bracket closing nothing counting against later ones.
        ("[" * 101, 100, True),
        ("[" * 100, 100, False),
        ("]" * 500 + "[" * 550, 100, False),
        ("[" * 200 + "]" * 500, 100, True),
        ("[" * 60 + "[]" * 1000 + "]" * 60, 60, True),
        ('"' + "[" * 500, 100, True),  # a string that never ends: its brackets count
    ],
)
def test_examples(text: str, limit: int, deeper: bool) -> None:
    assert nests_deeper_than(text, limit) is deeper
