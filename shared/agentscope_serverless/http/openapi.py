"""What the OpenAPI document says every route can answer besides its success, and with which
headers.

``create_app`` gives each mounted router these responses, so a route added later documents
its errors without listing them. Every error body is JSON of the schema :class:`ErrorBody`,
whatever the route's success is (an event stream too). A route that may answer a status
not every route does (429) adds it with :func:`error_answer`.

:func:`complete_document` finishes the document FastAPI generates: the headers each answer
carries, from one table (:data:`RESPONSE_HEADERS`), and ``Idempotency-Key`` on the writes
only, where it is honoured. What a route's answers carry beyond what its method says (a
run's ids) it declares with ``openapi_extra=answers(...)``. A plain Starlette route (A2A's)
is documented by a :class:`DocumentationRoute` declared as any route is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.routing import Match
from starlette.types import Scope

from agentscope_serverless.http.errors import ERROR_TYPES
from agentscope_serverless.http.idempotency import IDEMPOTENCY_HEADER, REPLAYED_HEADER
from agentscope_serverless.http.middleware import REQUEST_ID_HEADER
from agentscope_serverless.http.params import RUN_HEADER, SESSION_HEADER


class FieldError(BaseModel):
    """One invalid field: where (``loc``) and what is wrong (``msg``)."""

    loc: list[str | int]
    msg: str


class ErrorDetail(BaseModel):
    """A stable machine-readable ``code`` and a message for humans, with OpenAI's ``type``
    and ``param`` (what its SDKs read into their exceptions)."""

    code: str = Field(examples=["INVALID_INPUT"])
    message: str
    type: str = Field(
        description="The kind of error by its status, as OpenAI names them.",
        json_schema_extra={"enum": list(ERROR_TYPES)},
    )
    param: str | None = Field(
        description=(
            "The first offending field of the request (`messages[0].role`), as OpenAI's "
            "`param` says it; null when the error names none."
        ),
        examples=["messages[0].role"],
    )
    fields: list[FieldError] | None = Field(
        None, description="Each invalid field: present for an invalid request only."
    )
    detail: Any = Field(
        None,
        description=(
            "A route's structured detail of the error (an object or a list, its JSON text "
            "being the message): present only then."
        ),
    )


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


_ERRORS = {
    400: (
        "The request is malformed, or asks what an agent cannot give; on the OpenAI-compatible "
        "routes, any invalid request (what the others answer with 422), as OpenAI answers it."
    ),
    401: "No API key, or one that is not valid (see `WWW-Authenticate`).",
    403: "The key may not act for the user the request names.",
    404: "The thing asked for does not exist (or belongs to another user).",
    405: "The path does not take this method.",
    408: "The request body did not arrive in time.",
    409: (
        "A conflict: the `Idempotency-Key` was used for another request "
        "(`IDEMPOTENCY_KEY_REUSED`), or a request with it is still running "
        "(`REQUEST_IN_PROGRESS`, retry after `Retry-After` seconds); or the run of a chat "
        "completion was canceled (`RUN_CANCELED`)."
    ),
    413: "The request body is larger than the limit.",
    415: "The request body's media type is not accepted.",
    422: (
        "The request is not valid: a field (named in `fields`) has a bad value, holds text "
        "that is not valid Unicode, or the request names a user more than once (a 400 on the "
        "OpenAI-compatible routes)."
    ),
    500: (
        "A fault of the server (`INTERNAL_ERROR`, no details); or, for a run not streamed, the "
        "agent failed: its error's code and message; or, on a buffered Lambda function, the "
        "answer is larger than the 6 MB Lambda returns (`RESPONSE_TOO_LARGE`: ask for less)."
    ),
    503: (
        "A store (Redis, DynamoDB, the sandbox server) is unavailable, or a Lambda function "
        "could not start (`UNAVAILABLE`); retry later."
    ),
    504: (
        "A run not streamed was ended at its Lambda function's time limit (`TIME_LIMIT`); "
        "what the agent produced is in the session."
    ),
}
# Statuses only some routes answer (each adds it with error_answer).
_SOME_ERRORS = {
    406: "`Accept` takes neither `text/event-stream` nor `application/json`.",
    429: (
        "The sandbox server runs as many sandboxes as it may (`SANDBOX_CAPACITY`), or the "
        "user holds their share of them (`SANDBOX_QUOTA`): release some, or retry after "
        "`Retry-After` seconds."
    ),
}


def error_answer(status: int, description: str | None = None) -> dict[int | str, dict[str, Any]]:
    """The documented error answer of ``status`` (a route's ``responses`` entry): an
    :class:`ErrorBody`, described by ``description`` or as every route's is.

    >>> error_answer(404, "No such response.")[404]["description"]
    'No such response.'
    """
    return {
        status: {
            "model": ErrorBody,
            "description": description or {**_ERRORS, **_SOME_ERRORS}[status],
        }
    }


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: answer for code in _ERRORS for status, answer in error_answer(code).items()
}


class Answers(StrEnum):
    """What a route's answers carry beyond what its method says (``openapi_extra``, see
    :func:`answers`)."""

    #: Its success names the run and its session (``X-Run-Id``, ``X-Session-Id``).
    RUN = "run"
    #: A run not streamed that fails is answered with its error's status, naming the run.
    FAILED_RUN = "failed run"
    #: That answer tells OpenAI's SDKs not to retry it (but a 503's, a store that did not
    #: answer: a retry runs again).
    FAILED_RUN_NOT_RETRIED = "failed run not retried"


_ANSWERS_KEY = "x-agentscope-answers"  # taken out of the document as it is completed


def answers(*kinds: Answers) -> dict[str, Any]:
    """A route's ``openapi_extra`` saying what its answers carry (see :class:`Answers`)."""
    return {_ANSWERS_KEY: [str(kind) for kind in kinds]}


_WRITES = frozenset(("post", "put", "patch", "delete"))
# What only a write is: its Idempotency-Key is honoured (its answers may be replayed).
_WRITE = "write"
# The statuses a run not streamed may fail with (its error's: see errors.status_of_code).
_RUN_FAILURES = frozenset(("409", "422", "429", "500", "503", "504"))


def _success(status: str) -> bool:
    return status.startswith("2")


def _failed_run(kinds: frozenset[str], status: str) -> bool:
    return Answers.FAILED_RUN in kinds and status in _RUN_FAILURES


def _names_run(kinds: frozenset[str], status: str) -> bool:
    return (Answers.RUN in kinds and _success(status)) or _failed_run(kinds, status)


def _not_retried(kinds: frozenset[str], status: str) -> bool:
    """Where ``X-Should-Retry: false`` is sent: a write's conflict a retry would meet again
    (its key reused, its run canceled, a message id taken, a response not ended), a Lambda
    answer too large, a chat completion's failed run (but a 503)."""
    if status == "500" or (_WRITE in kinds and status == "409"):
        return True
    return (
        Answers.FAILED_RUN_NOT_RETRIED in kinds and _failed_run(kinds, status) and status != "503"
    )


@dataclass(frozen=True)
class ResponseHeader:
    """A header answers carry: on an operation's answer of ``status`` whose kinds
    (:class:`Answers`, and ``write``) make ``sent(kinds, status)`` true."""

    name: str
    description: str
    sent: Callable[[frozenset[str], str], bool]
    schema: Mapping[str, Any]
    required: bool = False

    def document(self) -> dict[str, Any]:
        """The header's OpenAPI Header Object."""
        return {"description": self.description, "required": self.required, "schema": self.schema}


_TEXT = {"type": "string"}

#: Every header the API's answers carry, and which answers carry it.
RESPONSE_HEADERS = (
    ResponseHeader(
        REQUEST_ID_HEADER,
        "The request's id (the client's `X-Request-Id` when it is up to 128 letters, digits, "
        "`.`, `_` or `-`; on Lambda, the invocation's): its log lines carry it.",
        lambda kinds, status: True,
        _TEXT,
        required=True,
    ),
    ResponseHeader(
        "Cache-Control",
        "`no-store`, no cache is to keep the answer, unless its route sends its own (an "
        "event stream: `no-cache`).",
        lambda kinds, status: True,
        _TEXT,
        required=True,
    ),
    ResponseHeader(
        "WWW-Authenticate",
        "`Bearer`: how to authenticate.",
        lambda kinds, status: status == "401",
        _TEXT,
        required=True,
    ),
    ResponseHeader(
        "Retry-After",
        "Seconds to wait before retrying: with a 429, or a 409 `REQUEST_IN_PROGRESS`.",
        lambda kinds, status: status == "429" or (_WRITE in kinds and status == "409"),
        {"type": "integer", "minimum": 1},
    ),
    ResponseHeader(
        "X-Should-Retry",
        "`false`: a retry would get the same answer (OpenAI's SDKs read it and do not retry).",
        _not_retried,
        {"type": "string", "enum": ["false"]},
    ),
    ResponseHeader(
        REPLAYED_HEADER,
        "`true`: the answer kept for this `Idempotency-Key`, sent again (nothing was written).",
        lambda kinds, status: _WRITE in kinds and _success(status),
        {"type": "string", "enum": ["true"]},
    ),
    ResponseHeader(
        RUN_HEADER,
        "The run's id (`GET /runs/{run_id}`), when runs are stored.",
        _names_run,
        _TEXT,
    ),
    ResponseHeader(
        SESSION_HEADER,
        "The run's session (absent when its id is not printable ASCII: it is in the body).",
        _names_run,
        _TEXT,
    ),
)


class DocumentationRoute(APIRoute):
    """A route of the OpenAPI document only, declared as any route is: it matches no
    request, the route it documents (a plain Starlette one, A2A's) serving them."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return Match.NONE, {}


def complete_document(
    document: dict[str, Any], reads: Collection[tuple[str, str]] = ()
) -> dict[str, Any]:
    """Finish ``document`` (FastAPI's) in place: each error answer as JSON, ``Idempotency-Key``
    on writes only (not on the operations of ``reads``, (path, method) pairs of routes that
    take a POST only to read), and each answer's headers (:data:`RESPONSE_HEADERS`)."""
    for path, item in document.get("paths", {}).items():
        for method, documented in item.items():
            _complete_operation(method, documented, write=(path, method) not in reads)
    return document


# The media types of a route's success (its ``response_class``'s) that no error answer has.
_SUCCESS_ONLY_TYPES = ("text/event-stream", "text/plain")


def _complete_operation(method: str, documented: dict[str, Any], *, write: bool) -> None:
    """One operation: ``Idempotency-Key`` on a write only, each error answer as JSON (FastAPI
    gives an answer's model the route's media type: an event stream's, or plain text's), a
    streamed success without a schema, the headers of each of its answers."""
    kinds = frozenset(documented.pop(_ANSWERS_KEY, ()))
    if method in _WRITES and write:
        kinds |= {_WRITE}
    else:
        parameters = [
            parameter
            for parameter in documented.get("parameters", [])
            if not (parameter["name"] == IDEMPOTENCY_HEADER and parameter["in"] == "header")
        ]
        if parameters:
            documented["parameters"] = parameters
        else:
            documented.pop("parameters", None)
    for status, answer in documented.get("responses", {}).items():
        content = answer.get("content", {})
        streamed = [media_type for media_type in _SUCCESS_ONLY_TYPES if media_type in content]
        if status[0] in "45" and streamed and "application/json" not in content:
            # No error answer is a stream or text: each is JSON, sent before any stream begins.
            answer["content"] = {"application/json": content.pop(streamed[0]), **content}
        stream = content.get("text/event-stream")
        if _success(status) and stream is not None and stream.get("schema") == _TEXT:
            # FastAPI's schema of a streamed success (its body as text) is read by clients
            # and fuzzers as each event's: it is documented as /process's is, without one.
            del stream["schema"]
        headers = {
            header.name: header.document()
            for header in RESPONSE_HEADERS
            if header.sent(kinds, status)
        }
        answer.setdefault("headers", {}).update(headers)


__all__ = [
    "ERROR_RESPONSES",
    "RESPONSE_HEADERS",
    "Answers",
    "DocumentationRoute",
    "ErrorBody",
    "ErrorDetail",
    "FieldError",
    "ResponseHeader",
    "answers",
    "complete_document",
    "error_answer",
]
