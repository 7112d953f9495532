"""Request parameters shared by the routers, with the limits the services enforce.

What the schema allows, the routes accept: an id is 1 to 512 characters without control
characters and not only whitespace (the services strip surrounding whitespace).
"""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import HTTPException, Path, Query
from fastapi._compat import field_annotation_is_sequence
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.json_schema import SkipJsonSchema
from starlette.datastructures import QueryParams

from agentscope_serverless.services._validation import MAX_ID_LENGTH

# No control characters but tab and line breaks (as the services), and at least one
# character Python's str.strip() keeps (the whitespace it strips, written out: JSON
# Schema's \s differs from Python's).
_TEXT = r"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
_NOT_BLANK = r"[^\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
ID_PATTERN = rf"^{_TEXT}*{_NOT_BLANK}{_TEXT}*$"
# An optional id in a body: blank means "make one", control characters are refused.
OPTIONAL_ID_PATTERN = rf"^{_TEXT}*$"
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"
# What a value one of these patterns refuses must be, as a refusal says it.
PATTERN_RULES = {
    ID_PATTERN: "must not be blank (only whitespace) nor contain control characters",
    OPTIONAL_ID_PATTERN: "must not contain control characters",
    CURSOR_PATTERN: "must be the next_cursor of the previous page",
}
# The header naming the session of an OpenAI-compatible call (and, in answers, of any run).
SESSION_HEADER = "X-Session-Id"
# The header naming, in an answer, the run it started or reads.
RUN_HEADER = "X-Run-Id"
# Where the OpenAI-compatible routes are: an SDK's base_url is http://<host>:<port> with it.
COMPATIBLE_PREFIX = "/compatible-mode/v1"

SessionIdPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        pattern=ID_PATTERN,
        description="The session's id (surrounding whitespace is ignored).",
    ),
    # The id the stores keep (and routes answer with): without that whitespace.
    AfterValidator(str.strip),
]
Cursor = Annotated[
    str | None,
    Query(
        max_length=1024,
        pattern=CURSOR_PATTERN,
        description="`next_cursor` of the previous page (empty or absent: the first page).",
    ),
]


class RequestBody(BaseModel):
    """The body of one of our own REST routes: a field it does not have is refused (a 422
    naming it), not ignored as if the request had been done as it asked.

    The bodies of the protocol (an ``AgentRequest``, its messages) and of the
    OpenAI-compatible routes take fields they do not name, as AgentScope's and OpenAI's do.
    """

    model_config = ConfigDict(extra="forbid")

    # The user a body names, taken on every route: the guards check that it is the one the
    # key acts as (another is a 403) before the route runs. Out of the schema, as a fuzzer
    # would name other users with it.
    user_id: SkipJsonSchema[str | None] = None
    user: SkipJsonSchema[str | None] = None


def is_json_type(content_type: str | None) -> bool:
    """Whether a body of ``content_type`` is read as JSON: ``application/json`` or
    ``application/<type>+json``, not a body without a type (as FastAPI decides, its content
    types strict)."""
    if not content_type:
        return False
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


# What the agent's route answers in: the run's events, or JSON (its errors always).
ANSWER_TYPES = ("text/event-stream", "application/json")
# What a route that only streams answers in (its errors are JSON all the same).
EVENTS_ONLY = ("text/event-stream",)


def accepts_an_answer(accept: str, types: tuple[str, ...] = ANSWER_TYPES) -> bool:
    """Whether an ``Accept`` header takes one of ``types``: for each, the most specific
    media range matching it (the type, ``text/*``, ``*/*``) says, one of ``q=0`` refusing
    it. A header without a media range (empty) takes anything, as none does.

    >>> accepts_an_answer("application/xml"), accepts_an_answer("text/*;q=0.5")
    (False, True)
    >>> accepts_an_answer("*/*;q=0"), accepts_an_answer("*/*;q=0, application/json")
    (False, True)
    >>> accepts_an_answer("application/json", EVENTS_ONLY)
    False
    """
    ranges = [_media_range(part) for part in accept.split(",") if part.strip()]
    return not ranges or any(_quality(ranges, kind) > 0 for kind in types)


def not_acceptable(accept: str | None, types: tuple[str, ...]) -> HTTPException | None:
    """The 406 refusing an ``Accept`` header that takes none of ``types``, the media types
    a route answers in (None when it takes one: no header, or ``*/*``, without parsing).

    >>> not_acceptable("application/json", EVENTS_ONLY).detail.split(",")[0]
    'Accept does not take text/event-stream'
    """
    if not accept or accept == "*/*" or accepts_an_answer(accept, types):
        return None
    if len(types) == 1:
        return HTTPException(
            406,
            f"Accept does not take {types[0]}, the type this route answers in (send no "
            "Accept, or */*, to take it)",
        )
    return HTTPException(
        406,
        f"Accept takes neither {' nor '.join(types)}, the types this route answers in (send "
        "no Accept, or */*, to take either)",
    )


def _media_range(part: str) -> tuple[str, float]:
    """A media range of an ``Accept`` header and its quality (1 unless a valid ``q`` says)."""
    media, *parameters = part.split(";")
    quality = 1.0
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            with contextlib.suppress(ValueError):
                quality = float(value.strip())
    return media.strip().lower(), quality


def _quality(ranges: list[tuple[str, float]], kind: str) -> float:
    """The quality ``ranges`` give ``kind``: its most specific matching range's (0: none)."""
    specificity = {kind: 3, f"{kind.partition('/')[0]}/*": 2, "*/*": 1}
    best, quality = 0, 0.0
    for media, given in ranges:
        rank = specificity.get(media, 0)
        if rank > best or (rank == best and rank and given > quality):
            best, quality = rank, given
    return quality


def single_query_parameters(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route (its ``dependant``, dependencies included) takes one
    value of: not a list."""
    names: set[str] = set()
    pending = [dependant]
    while pending:
        current = pending.pop()
        names.update(
            field.alias
            for field in current.query_params
            if not field_annotation_is_sequence(field.field_info.annotation)
        )
        pending.extend(current.dependencies)
    return frozenset(names)


def refuse_repeated(query: QueryParams, single: frozenset[str]) -> None:
    """Refuse (422, naming them) the parameters of ``single`` that ``query`` gives more than
    once (``?limit=10&limit=20``): FastAPI would take the last one, the others ignored."""
    repeated = sorted(name for name in single if len(query.getlist(name)) > 1)
    if repeated:
        raise RequestValidationError(
            [
                {"type": "repeated", "loc": ("query", name), "msg": "given more than once"}
                for name in repeated
            ]
        )


__all__ = [
    "ANSWER_TYPES",
    "CURSOR_PATTERN",
    "ID_PATTERN",
    "OPTIONAL_ID_PATTERN",
    "PATTERN_RULES",
    "RUN_HEADER",
    "SESSION_HEADER",
    "Cursor",
    "RequestBody",
    "SessionIdPath",
    "accepts_an_answer",
    "is_json_type",
    "refuse_repeated",
    "single_query_parameters",
]
