"""What the OpenAPI document says every route can answer besides its success.

``create_app`` gives each mounted router these responses, so a route added later documents
its errors without listing them. Every error body has the schema :class:`ErrorBody`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class FieldError(BaseModel):
    """One invalid field: where (``loc``) and what is wrong (``msg``)."""

    loc: list[str | int]
    msg: str


class ErrorDetail(BaseModel):
    """A stable machine-readable ``code`` and a message for humans."""

    code: str = Field(examples=["INVALID_INPUT"])
    message: str
    fields: list[FieldError] | None = None


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

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in _ERRORS.items()
}

__all__ = ["ERROR_RESPONSES", "ErrorBody", "ErrorDetail", "FieldError"]
