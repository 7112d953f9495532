"""The one mapping from the project's errors to HTTP responses.

Every error body has the same shape, the one OpenAI's SDKs read into their exceptions
(``code``, ``message``, ``type``, ``param``)::

    {"error": {"code": "INVALID_INPUT", "message": "...", "type": "invalid_request_error",
               "param": "messages[0].role", "fields": [{"loc": [...], "msg": "..."}]}}

``type`` is the kind of error by its status (OpenAI's names), ``param`` the first offending
field (or null), ``fields`` is present for validation errors (400, 422), ``detail`` for a
route's ``HTTPException`` whose detail is not a text (a dict or a list, kept as given; its
JSON text is the message). Server errors (500)
say only ``internal server error``: no stack trace, no exception text, nothing secret. A
501 (a service does not implement a method, named in the message) and a 503 (a store is
unavailable) say what happened, in messages written here.

An invalid request is a 422, except on the OpenAI-compatible routes, where it is a 400 with
the same body, as OpenAI answers it (:func:`status_on`): code written against OpenAI catches
``openai.BadRequestError``, which the SDKs raise for a 400 only.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from agentscope_serverless.errors import (
    AgentScopeServerlessError,
    AuthenticationError,
    ConflictError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    MessageIdConflictError,
    MethodNotImplementedError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RequestTimeoutError,
    RunCanceledError,
    RunNotEndedError,
    SandboxAuthenticationError,
    SandboxCapacityError,
    SandboxRequestError,
    SandboxUnavailableError,
    ServiceNotStartedError,
    StoreUnavailableError,
    TaskCapacityError,
    TimeLimitError,
    UnsupportedParameterError,
    error_classes,
)
from agentscope_serverless.http.params import COMPATIBLE_PREFIX, PATTERN_RULES, is_json_type
from agentscope_serverless.log import logger, redacted
from agentscope_serverless.services._validation import too_deep

INTERNAL_ERROR = "INTERNAL_ERROR"
# Where an error response leaves its code, as it is sent, in the request's state (for the
# request's log line).
ERROR_CODE_STATE = "agentscope_error_code"

_STATUS_OF: dict[type[AgentScopeServerlessError], int] = {
    UnsupportedParameterError: 400,
    InvalidInputError: 422,
    AuthenticationError: 401,
    PermissionDeniedError: 403,
    NotFoundError: 404,
    ConflictError: 409,
    PayloadTooLargeError: 413,
    RequestTimeoutError: 408,
    TimeLimitError: 504,
    MethodNotImplementedError: 501,
    StoreUnavailableError: 503,
    ServiceNotStartedError: 503,
    SandboxUnavailableError: 503,
    # The sandbox server refuses this server's token: no fault of the caller's.
    SandboxAuthenticationError: 503,
    SandboxCapacityError: 429,
    TaskCapacityError: 429,
    SandboxRequestError: 422,
}

_CODE_OF_STATUS = {
    400: "BAD_REQUEST",
    401: AuthenticationError.code,
    403: PermissionDeniedError.code,
    404: NotFoundError.code,
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    408: RequestTimeoutError.code,
    409: ConflictError.code,
    413: PayloadTooLargeError.code,
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: InvalidInputError.code,
    501: MethodNotImplementedError.code,
    503: StoreUnavailableError.code,
}


def status_of(exc: AgentScopeServerlessError) -> int:
    """The HTTP status of one of our errors (500 for those without a client-side cause)."""
    for cls in type(exc).__mro__:
        if cls in _STATUS_OF:
            return _STATUS_OF[cls]
    return 500


def _status_of_codes() -> dict[str, int]:
    statuses: dict[str, int] = {}
    for cls in error_classes():
        status = next((_STATUS_OF[c] for c in cls.__mro__ if c in _STATUS_OF), 500)
        statuses.setdefault(cls.code, status)
    return statuses


def status_of_code(code: str) -> int:
    """The HTTP status of an error code (as carried by a ``failed`` event); 500 if unknown."""
    return _status_of_codes().get(code, 500)


def asks_retry(status: int) -> bool:
    """Whether an error answered with ``status`` is a failure its client may retry later: a
    429 (a sandbox server at capacity) or a 5xx (a store that did not answer, a time limit),
    but a 501 (a method the service does not implement, which a retry does not implement).

    >>> asks_retry(429), asks_retry(503), asks_retry(422), asks_retry(501)
    (True, True, False, False)
    """
    return status == 429 or (status >= 500 and status != 501)


# The ``type`` of an error by its status, as OpenAI names them; any other is a request error.
_TYPE_OF_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
#: Every ``type`` an error may have (see :func:`error_type`).
ERROR_TYPES = ("invalid_request_error", *_TYPE_OF_STATUS.values(), "server_error")


def error_type(status: int) -> str:
    """The OpenAI ``type`` of an error answered with ``status``.

    >>> error_type(422), error_type(401), error_type(503)
    ('invalid_request_error', 'authentication_error', 'server_error')
    """
    if status >= 500:
        return "server_error"
    return _TYPE_OF_STATUS.get(status, "invalid_request_error")


def status_on(path: str, status: int) -> int:
    """The status an answer of ``status`` is sent with on ``path``: an invalid request's 422 is
    a 400 on the OpenAI-compatible routes, as OpenAI answers it (the body is the same).

    >>> status_on("/compatible-mode/v1/chat/completions", 422), status_on("/process", 422)
    (400, 422)
    """
    if status == 422 and path.startswith(f"{COMPATIBLE_PREFIX}/"):
        return 400
    return status


def param_of(fields: Sequence[dict[str, Any]] | None) -> str | None:
    """The request parameter the first of ``fields`` names, as OpenAI's ``param`` says it
    (without the part of the request, ``body`` or ``query``, FastAPI puts first).

    >>> param_of([{"loc": ["body", "messages", 0, "role"], "msg": "..."}])
    'messages[0].role'
    >>> param_of([{"loc": [], "msg": "..."}]) is None
    True
    """
    loc = list((fields or [{}])[0].get("loc") or [])
    if len(loc) > 1 and loc[0] in ("body", "query", "path", "header"):
        loc = loc[1:]
    param = ""
    for part in loc:
        param += f"[{part}]" if isinstance(part, int) else f".{part}" if param else str(part)
    return param or None


def error_body(
    code: str,
    message: str,
    fields: Sequence[dict[str, Any]] | None = None,
    *,
    status: int = 500,
    detail: Any = None,
) -> dict[str, Any]:
    """The JSON body of an error response (``status`` gives its ``type``; ``detail``, when
    not None, is a route's structured detail)."""
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "type": error_type(status),
        "param": param_of(fields),
    }
    if fields is not None:
        error["fields"] = list(fields)
    if detail is not None:
        error["detail"] = detail
    return {"error": error}


class ErrorResponse(JSONResponse):
    """An error's answer (the body :func:`error_body` makes), which, as it is sent, leaves
    its code in the request's state (:data:`ERROR_CODE_STATE`) for the request's log line:
    every error answer of the application is one."""

    def __init__(
        self, body: dict[str, Any], status: int, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(body, status_code=status, headers=headers)
        self.code: str = body["error"]["code"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})[ERROR_CODE_STATE] = self.code
        await super().__call__(scope, receive, send)


def error_response(
    status: int,
    code: str,
    message: str,
    fields: Sequence[dict[str, Any]] | None = None,
    *,
    detail: Any = None,
) -> ErrorResponse:
    """An error response; a 401 also tells the client how to authenticate."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status >= 500 and status not in (501, 503):
        code, message, fields, detail = INTERNAL_ERROR, "internal server error", None, None
    body = error_body(code, message, fields, status=status, detail=detail)
    return ErrorResponse(body, status, headers)


def response_for(exc: AgentScopeServerlessError) -> JSONResponse:
    """The response for one of our errors."""
    if isinstance(exc, SandboxAuthenticationError):
        logger.error(
            "the sandbox server refuses the configured credentials", extra={"code": exc.code}
        )
        exc = SandboxUnavailableError(
            "the sandbox server refuses the configured credentials (SANDBOX_BEARER_TOKEN): "
            f"{exc.message}"
        )
    fields = exc.errors if isinstance(exc, InvalidInputError) else None
    status = status_of(exc)
    if status == 500:
        logger.error("request failed", extra={"code": exc.code, "error": type(exc).__name__})
    response = error_response(status, exc.code, exc.message, fields)
    if exc.retry_after is not None:
        response.headers["Retry-After"] = str(exc.retry_after)
    not_retried = (
        RunCanceledError
        | IdempotencyKeyReusedError
        | MessageIdConflictError
        | RunNotEndedError
        | MethodNotImplementedError
    )
    if isinstance(exc, not_retried):
        # OpenAI's SDKs retry a 409 and a 5xx: the retry would run the turn again, in a session
        # deleted (or data erased) on purpose; get the same answer again; or delete a
        # response that ended meanwhile, its caller told it was in progress; or find the
        # method still not implemented.
        response.headers["X-Should-Retry"] = "false"
    return response


# The part pydantic puts in an error's ``loc`` naming the branch of a union that refused the
# value ("str", "list[str]", "dict[str,any]", "function-after[...]", a model's class name):
# no part of the request the client sent.
_UNION_BRANCH = re.compile(r"str|int|float|bool|bytes|none|any|[a-z-]+\[.*\]|[A-Z]\w*")


def _request_loc(loc: Sequence[Any]) -> list[Any]:
    """Where in the request a validation error is, without the union branches in its path.

    >>> _request_loc(["body", "stop", "list[str]", 1])
    ['body', 'stop', 1]
    """
    return [
        part
        for at, part in enumerate(loc)
        if at < 2 or not (isinstance(part, str) and _UNION_BRANCH.fullmatch(part))
    ]


def _validation_fields(errors: Sequence[Any]) -> list[dict[str, Any]]:
    # Only where and what: pydantic's "input" echoes the value sent, which may be secret.
    # Each once: a parameter two dependencies of a route declare (the guards' header) is
    # validated by each. A value no branch of a union takes is one field saying what each
    # wanted.
    fields: dict[tuple[Any, ...], dict[str, Any]] = {}
    for err in errors:
        loc, msg = _request_loc(err.get("loc", ())), _what_is_wrong(err)
        field = fields.setdefault(tuple(loc), {"loc": loc, "msg": msg})
        if msg not in field["msg"].split(", or "):
            field["msg"] += f", or {msg[:1].lower()}{msg[1:]}"
    return list(fields.values())


def _what_is_wrong(err: Mapping[str, Any]) -> str:
    """What a validation error says: for a value one of the routes' patterns refuses, what
    it must be (see :data:`PATTERN_RULES`), not the pattern."""
    if err.get("type") == "string_pattern_mismatch":
        rule = PATTERN_RULES.get(str((err.get("ctx") or {}).get("pattern")))
        if rule is not None:
            return rule
    return str(err.get("msg", ""))


async def _our_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AgentScopeServerlessError)
    return response_for(exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content_type = request.headers.get("content-type")
    if not is_json_type(content_type) and any(e["loc"] == ("body",) for e in exc.errors()):
        # A route reading a JSON body was sent another kind of body.
        return not_json_type(content_type)
    unparsed = _not_json(exc)
    if unparsed is not None:
        return response_for(unparsed)
    fields = _validation_fields(exc.errors())
    where = "; ".join(f"{'.'.join(str(p) for p in f['loc'])}: {f['msg']}" for f in fields[:5])
    message = f"invalid request: {where}{_other_shape(exc)}"
    return error_response(422, InvalidInputError.code, message, fields)


def not_json_type(content_type: str | None) -> JSONResponse:
    """The 415 answering a body of ``content_type``, not JSON, on a route that reads JSON."""
    kind = (content_type or "").partition(";")[0].strip()[:100]
    sent = f"not {kind!r}" if content_type else "and no Content-Type was sent"
    return error_response(
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        f"the body must be JSON (Content-Type: application/json), {sent}",
    )


def _not_json(exc: RequestValidationError) -> InvalidInputError | None:
    """Why and where a body is not JSON (a Python dict's single quotes, a trailing comma),
    without quoting it; None when it is JSON."""
    for err in exc.errors():
        if err.get("type") != "json_invalid":
            continue
        reason = str((err.get("ctx") or {}).get("error") or "it does not parse")[:200]
        loc = tuple(err.get("loc", ()))
        where = ""
        if len(loc) == 2 and isinstance(loc[1], int) and isinstance(exc.body, str):
            at = loc[1]
            line = exc.body.count("\n", 0, at) + 1
            column = at - exc.body.rfind("\n", 0, at)
            where = f" at line {line}, column {column}"
        return body_not_json(f"{reason}{where}")
    return None


def body_not_json(why: str) -> InvalidInputError:
    """The refusal of a body that is not JSON, saying ``why`` and where (never quoting it)."""
    return InvalidInputError(
        f"the body is not valid JSON: {why} (JSON takes double quotes, and no comma after a "
        "last item)",
        field="body",
    )


# A body of the other shape: a chat completion's messages where /process or a response's input
# is required, or the other way round; or a text where a list of messages is required.
_SHAPES = {
    ("input", "messages"): " ('messages' is the body of /compatible-mode/v1/chat/completions: "
    "this route takes 'input', a list of messages)",
    ("messages", "input"): " ('input' is the body of /process and /compatible-mode/v1/responses: "
    "this route takes 'messages', a list of {role, content})",
}


def _other_shape(exc: RequestValidationError) -> str:
    body = exc.body
    if not isinstance(body, dict):
        return ""
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "missing" and len(loc) == 2 and loc[0] == "body":
            for (missing, given), hint in _SHAPES.items():
                if loc[1] == missing and given in body:
                    return hint
        is_text = len(loc) == 2 and loc[0] == "body" and isinstance(body.get(loc[1]), str)
        if err.get("type") == "list_type" and is_text and loc[1] in ("input", "messages"):
            return (
                f" ({loc[1]} is a list of messages, as "
                '[{"role": "user", "content": "Hello"}], not a text)'
            )
    return ""


def unreadable_body(exc: BaseException) -> InvalidInputError | None:
    """What is wrong with a body whose JSON parse raised ``exc``, when it is not a mere
    syntax error: not UTF-8, nested too deeply for the parser, an integer too long to read."""
    if isinstance(exc, UnicodeDecodeError):
        return InvalidInputError("the body is not valid UTF-8 text", field="body")
    if isinstance(exc, RecursionError):
        return too_deep("body")
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return InvalidInputError(
            f"the body holds an integer of more than {sys.get_int_max_str_digits()} digits",
            field="body",
        )
    return None


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    # FastAPI answers 400 to any body its JSON parse failed on: say what is wrong.
    unreadable = unreadable_body(exc.__cause__) if exc.__cause__ is not None else None
    if exc.status_code == 400 and unreadable is not None:
        return response_for(unreadable)
    # A route's own text may quote a secret (a key upstream refused): masked as any error is.
    given: Any = exc.detail  # a text, or any value a route gave
    detail = None
    if isinstance(given, str):
        message = redacted(given)
    else:
        detail = json.loads(redacted(json.dumps(_as_json(given), ensure_ascii=False)))
        message = json.dumps(detail, ensure_ascii=False)
    if exc.status_code == 404 and message == "Not Found":  # no route has this path
        message = _no_route(request.scope)
    code = _CODE_OF_STATUS.get(exc.status_code, "HTTP_ERROR")
    response = error_response(exc.status_code, code, message, detail=detail)
    if exc.status_code == 405:
        response.headers["Allow"] = _allowed_methods(request) or (exc.headers or {})["Allow"]
    for name, value in (exc.headers or {}).items():
        response.headers.setdefault(name, value)
    return response


def _as_json(detail: Any) -> Any:
    """An ``HTTPException``'s detail as plain JSON values (its ``str()`` when it has none)."""
    try:
        return json.loads(json.dumps(jsonable_encoder(detail), allow_nan=False))
    except (TypeError, ValueError):
        return str(detail)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves the request's path with (Starlette's 405 names only
    those of the first route matching the path: ``/sessions`` is served by two)."""
    routes = request.app.router.routes
    methods = {
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    }
    if "GET" in methods:
        methods.add("HEAD")  # answered as its GET, without the body (see .middleware)
    return ", ".join(sorted(methods))


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


# What OpenAI's SDKs append to their base URL: a base URL without /compatible-mode/v1 (the
# SDKs' default /v1, or the server's bare URL) asks for these.
_OPENAI_PATHS = re.compile(r"/(chat/completions|completions|responses|models|embeddings)(/.*)?$")


def _no_route(scope: Scope) -> str:
    """Why no route has the request's path, and where to look. The path compared is the
    routes' (after the root path: an API Gateway stage, a custom domain's base path), and
    the paths advised keep the root path: behind ``/prod``, an SDK already at
    ``/prod/compatible-mode/v1`` was told to use ``/compatible-mode/v1``, and the routes
    were said to be at ``/docs``, outside the stage."""
    path: str = scope["path"]
    root = str(scope.get("root_path") or "").rstrip("/")
    if root and path.startswith(f"{root}/"):
        path = path[len(root) :]
    if _OPENAI_PATHS.search(path) and not path.startswith(f"{COMPATIBLE_PREFIX}/"):
        return (
            f"Not Found: the OpenAI-compatible routes are under {root}{COMPATIBLE_PREFIX} (an "
            f"SDK's base_url is http://<host>:<port>{root}{COMPATIBLE_PREFIX})"
        )
    return f"Not Found: no route has this path (the API's routes are listed at {root}/docs)"


def unexpected_error(exc: Exception) -> JSONResponse:
    """The 500 answering an error no handler maps, logged (as one line) with its traceback."""
    logger.error("unexpected error", exc_info=exc, extra={"error": type(exc).__name__})
    return error_response(500, INTERNAL_ERROR, "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    """Route the errors raised while serving ``app`` through this mapping (any other is
    answered by :func:`unexpected_error`, from the request context middleware)."""
    app.add_exception_handler(AgentScopeServerlessError, _our_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)


__all__ = [
    "ERROR_CODE_STATE",
    "ERROR_TYPES",
    "ErrorResponse",
    "asks_retry",
    "body_not_json",
    "error_body",
    "error_response",
    "error_type",
    "install_error_handlers",
    "not_json_type",
    "param_of",
    "response_for",
    "status_of",
    "status_of_code",
    "status_on",
    "unexpected_error",
    "unreadable_body",
]
