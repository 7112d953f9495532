"""A retry of an OpenAI SDK joins the run it repeats, rather than running the turn again.

OpenAI's SDKs (Stainless's: Python, Node, and the clients built on them, LangChain's among
them) retry a request that timed out, lost its connection, or got a 408, 409, 429 or 5xx (a
gateway's 504 in front of a long run, say), twice by default, numbering each try in
``X-Stainless-Retry-Count``; they send no ``Idempotency-Key``. The run of the first try goes
on without its client (see :mod:`agentscope_serverless.recorder`): a retry that ran the agent
again would store the turn twice, and repeat whatever the agent did.

So an OpenAI-compatible run keeps the fingerprint of its request with its record
(:func:`~agentscope_serverless.http.idempotency.fingerprint`: path, ``X-Session-Id`` and body),
and a retry answers with the newest run of the same user and fingerprint started within the
time the SDK's tries can span (``X-Stainless-Read-Timeout`` each, and the wait between them):
the run's events as stored, followed until it ends (a failed run's error, then, which tells
the SDK not to retry). A retry that finds none (its first try never reached the server) runs,
and so does one whose run was canceled (a streamed chat completion's run stops when its
client leaves, which is when the SDK retries, or its user canceled it), or failed as
unavailable (a 503: its store did not answer), the failure a retry is for. Such a run may
have stored its input: the ids of a run's input derive from a seed kept with its record, which
the run of a retry after it takes again, so that its input is recognised as stored and its
reply follows (a new request with the same text, another turn, gets a new seed and is stored
again). A request with an ``Idempotency-Key`` is left to that key.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from agentscope_serverless.errors import TimeLimitError
from agentscope_serverless.http.errors import status_of_code
from agentscope_serverless.http.idempotency import IDEMPOTENCY_HEADER
from agentscope_serverless.schemas.agent_schemas import (
    AgentResponse,
    Event,
    Message,
    RefusalContent,
    RunStatus,
    TextContent,
)
from agentscope_serverless.services.runs.base import RunRecord, RunsService, StoredEvent

RETRY_COUNT_HEADER = "X-Stainless-Retry-Count"
READ_TIMEOUT_HEADER = "X-Stainless-Read-Timeout"
# The SDKs' default timeout of a try, in seconds; and more than their longest wait (8 s)
# between two tries, with room for a slow connection.
DEFAULT_READ_TIMEOUT = 600.0
BETWEEN_TRIES = 60.0
# Bounds on what the headers say: no SDK waits longer for one answer, or tries this often.
MAX_READ_TIMEOUT = 3600.0
MAX_RETRIES = 10


def _header_number(request: Request, name: str) -> float | None:
    value = request.headers.get(name)
    try:
        number = float(value) if value else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) and number > 0 else None


def retry_window(request: Request) -> float | None:
    """How long ago, at most, the first try of this retry began (seconds); None when the
    request is not an SDK's retry, or has an ``Idempotency-Key``."""
    retries = _header_number(request, RETRY_COUNT_HEADER)
    if retries is None or IDEMPOTENCY_HEADER in request.headers:
        return None
    timeout = _header_number(request, READ_TIMEOUT_HEADER) or DEFAULT_READ_TIMEOUT
    timeout = min(timeout, MAX_READ_TIMEOUT)
    return min(retries, MAX_RETRIES) * (timeout + BETWEEN_TRIES)


async def earlier_run(
    runs: RunsService | None, request: Request, user_id: str, fingerprint: str
) -> RunRecord | None:
    """The newest run an earlier try of ``request``, an SDK's retry, started (None when it
    is no retry, runs are not stored, or none of the user's recent runs had this request)."""
    window = retry_window(request)
    if runs is None or window is None:
        return None
    recent = await runs.recent_runs(user_id, time.time() - window)
    same = [run for run in recent if run.kind == "openai" and run.fingerprint == fingerprint]
    return same[-1] if same else None


def original_run(earlier: RunRecord | None) -> RunRecord | None:
    """The run the retry whose :func:`earlier_run` is ``earlier`` answers with (None when it
    runs again)."""
    if earlier is None or _runs_again(earlier):
        return None
    return earlier


def _runs_again(earlier: RunRecord) -> bool:
    """Whether a retry after ``earlier`` runs again: it was canceled (most often as its
    client left a stream, which ends with it) and has no answer to give, or it failed as
    unavailable (its store did not answer), which the retry is for."""
    if earlier.status == RunStatus.Canceled:
        return True
    code = (earlier.error or {}).get("code")
    return (
        earlier.status == RunStatus.Failed
        and isinstance(code, str)
        and (status_of_code(code) == 503)
    )


def input_seed(request: Request, earlier: RunRecord | None) -> str | None:
    """What the ids of the input of the run started for ``request`` derive from: the seed of
    ``earlier``, the run of an earlier try that runs again (it may have stored the input),
    or a new one; None for a request with an ``Idempotency-Key``, whose ids the key seeds."""
    if IDEMPOTENCY_HEADER in request.headers:
        return None
    if earlier is not None and _runs_again(earlier) and earlier.input_seed:
        return earlier.input_seed
    return str(uuid.uuid4())


# The content parts an OpenAI answer reads, by their type.
_ANSWER_PARTS: dict[str, type[TextContent | RefusalContent]] = {
    "text": TextContent,
    "refusal": RefusalContent,
}


def _answer_event(data: str) -> Event | None:
    """A stored event, when it is one an OpenAI answer is made of: the run's responses, its
    messages, and their text and refusals."""
    fields = json.loads(data)
    kind, part = fields.get("object"), fields.get("type")
    if kind == "response":
        return AgentResponse.model_validate(fields)
    if kind == "message":
        return Message.model_validate(fields)
    if kind == "content" and part in _ANSWER_PARTS:
        return _ANSWER_PARTS[part].model_validate(fields)
    return None


class FollowCutError(TimeLimitError):
    """The invocation's time ended while following a run that goes on (elsewhere)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"this invocation's time ran out before run {run_id}, of the first try, ended; "
            f"it goes on: retry, or read it at GET /runs/{run_id}"
        )
        self.run_id = run_id


async def stored_events(
    runs: RunsService,
    user_id: str,
    run_id: str,
    *,
    follow: bool = True,
    ends_in: float | None = None,
) -> AsyncIterator[Event]:
    """The run's events as stored, from its first, followed until it ends unless ``follow``
    is false (those that make an OpenAI answer); given ``ends_in`` seconds (the time left of
    a Lambda invocation), a run still going then raises :class:`FollowCutError`."""
    stored = runs.follow(user_id, run_id) if follow else _read(runs, user_id, run_id)
    ends_at = None if ends_in is None else asyncio.get_running_loop().time() + ends_in
    try:
        while True:
            try:
                async with asyncio.timeout_at(ends_at):
                    _, data = await anext(stored)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise FollowCutError(run_id) from None
            event = _answer_event(data)
            if event is not None:
                yield event
    finally:
        close = getattr(stored, "aclose", None)  # both are async generators
        if close is not None:
            await close()


async def _read(runs: RunsService, user_id: str, run_id: str) -> AsyncIterator[StoredEvent]:
    for stored in await runs.read_events(user_id, run_id):
        yield stored


__all__ = [
    "READ_TIMEOUT_HEADER",
    "RETRY_COUNT_HEADER",
    "FollowCutError",
    "earlier_run",
    "input_seed",
    "original_run",
    "retry_window",
    "stored_events",
]
