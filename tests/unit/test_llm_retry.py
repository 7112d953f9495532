"""When the LLM agent asks the chat API again, and how long it waits first."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from agentscope_serverless.agents.llm import _backoff, _retry_after, _retry_delay


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # the finer one wins
        ({"retry-after": "61"}, None),  # past a minute: the backoff's own wait
        ({"retry-after": "-1"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after-ms": "1e400"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_followed_when_it_is_a_wait_from_zero_to_a_minute(
    headers: dict[str, str], wait: float | None
) -> None:
    assert _retry_after(httpx.Headers(headers)) == wait


def test_retry_after_may_be_a_date() -> None:
    soon = email.utils.formatdate(time.time() + 10, usegmt=True)
    wait = _retry_after(httpx.Headers({"retry-after": soon}))
    assert wait is not None and 8 <= wait <= 10
    past = email.utils.formatdate(time.time() - 10, usegmt=True)
    assert _retry_after(httpx.Headers({"retry-after": past})) is None


def test_the_backoff_doubles_up_to_eight_seconds_less_a_random_quarter() -> None:
    for attempt, full in [(0, 0.5), (1, 1.0), (2, 2.0), (4, 8.0), (10, 8.0)]:
        waits = {_backoff(attempt) for _ in range(50)}
        assert all(0.75 * full <= wait <= full for wait in waits)
        assert len(waits) > 1


def answer(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
def test_busy_and_failing_apis_are_asked_again_until_the_retries_are_spent(status: int) -> None:
    assert _retry_delay(answer(status, **{"retry-after": "3"}), 0, 2) == 3
    assert _retry_delay(answer(status, **{"retry-after": "3"}), 1, 2) == 3
    assert _retry_delay(answer(status, **{"retry-after": "3"}), 2, 2) is None


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_an_answer_that_cannot_change_is_not_asked_again(status: int) -> None:
    assert _retry_delay(answer(status), 0, 2) is None
    assert _retry_delay(answer(status, **{"x-should-retry": "true"}), 0, 2) is not None
    assert _retry_delay(answer(503, **{"x-should-retry": "false"}), 0, 2) is None
