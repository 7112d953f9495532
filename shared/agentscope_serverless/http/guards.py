"""Checks every route of the API runs before its own code (``create_app`` adds them; a
route a user adds to ``app.get_fastapi_app()`` runs them too, see
:func:`guard_added_request`).

- **Text is valid Unicode.** A JSON body holding text that cannot be encoded as UTF-8 (a
  lone surrogate such as ``"\\ud800"``) is refused with 422 naming the field, before any
  route stores it.
- **Numbers are finite.** ``NaN``, ``Infinity`` and numbers beyond a double's range
  (``1e999``), which Python's JSON parser accepts but JSON cannot carry back, are refused
  with 422 naming the field.
- **One user per request.** A body ``user_id`` or OpenAI ``user`` field naming another
  user than the key acts for is 403 on every route, whether or not the route's body
  defines that field; a service key's request whose body names two users (``user_id`` and
  ``user`` disagreeing) is 422, as is a duplicated ``X-User-Id`` header or ``user_id``
  parameter (see :mod:`agentscope_serverless.http.auth`). A number names the user of its
  decimal digits (``42`` names user ``"42"``, as a model's ``user_id: int`` reads ``"42"``
  as 42). A ``user_id`` of another type (``true``, ``4.2``, an object, an array) is 422: a
  model's ``user_id: int`` would read ``true`` as user 1 and ``42.0`` as user 42, and no
  route takes a user to be such a value. A ``user`` that is an object, an array or a
  boolean names no user (payloads sent to webhooks carry ``"user": {"login": ...}``), nor
  does an empty one (``user`` or ``user_id``); a ``user`` that is a fraction is 422 as
  ``user_id``'s.
- **What a route a user adds reads.** On those routes (added to ``app.get_fastapi_app()``
  or with ``@app.endpoint``) a body is checked as the route may read it: a body of any
  declared type (``text/plain``, a form's, none) that parses as JSON is checked as a JSON
  body is, as Starlette's ``await request.json()`` reads it whatever its type and charset
  (UTF-8, UTF-16 or UTF-32); and the ``user_id`` or ``user`` fields of a form
  (``application/x-www-form-urlencoded``, or the fields, not the files, of
  ``multipart/form-data``), read by Starlette's own form parser, are checked as a body's
  (an empty one names no user, as FastAPI reads it as absent; see :func:`form_users`). A
  route of theirs that parses the request's body as JSON (``await request.json()``) and is
  sent a body that is not JSON answers 422 naming where it does not parse, not a 500
  (:func:`install_guards`); one that never reads it so is not refused.
- **Retried writes run once**: ``Idempotency-Key``, see
  :mod:`agentscope_serverless.http.idempotency`. A service key whose request names no user
  claims its keys for itself (its key id), apart from every user's.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import Response
from starlette import requests as starlette_requests
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.http.auth import Caller, CurrentCaller
from agentscope_serverless.http.bodies import utf8_request
from agentscope_serverless.http.errors import body_not_json, response_for, unreadable_body
from agentscope_serverless.http.idempotency import (
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_PATTERN,
    claim_key,
    is_write,
)
from agentscope_serverless.http.params import is_json_type
from agentscope_serverless.services._validation import (
    nests_deeper_than,
    require_finite,
    require_utf8,
    too_deep,
)

# Body fields that name the user a request acts as (ours, and OpenAI's ``user``).
USER_FIELDS = ("user_id", "user")
# The longest Idempotency-Key (as declared, see IdempotencyKey).
_MAX_IDEMPOTENCY_KEY_CHARS = 255
# Where a request to a route a user added keeps what its guard read: that its body is
# checked as such a route may read it (see read_as_users_route), and the body itself (for
# install_guards' answer to the route's failed parse of it).
_USERS_ROUTE = "agentscope_users_route"
_USERS_ROUTE_BODY = "agentscope_users_route_body"
# Starlette's reader of a form's type, None without python-multipart (no form is read then).
_parse_options_header = getattr(starlette_requests, "parse_options_header", None)


async def request_body(request: Request, *, any_type: bool = False) -> Any:
    """The request's JSON body (parsed once, shared with the route), or None: no body, a body
    of another content type than JSON (the routes do not read it as JSON; with ``any_type``
    it is read all the same), or a body that is not JSON (the route refuses it). A body that
    is not UTF-8 text, nests too deeply or holds an integer too long to read is refused
    here, saying so."""
    if not (any_type or is_json_type(request.headers.get("content-type"))):
        return None
    try:
        return await json_body(request)
    except _NotJson:
        return None


async def json_body(request: Request) -> Any:
    """The request's body read as JSON whatever its content type (None when empty); a body
    that cannot be read is refused (422) saying why."""
    body = await request.body()
    if not body:
        return None
    # The depth of a JSON body was measured as it arrived; that of another type, read as
    # JSON here all the same, is measured now.
    if not is_json_type(request.headers.get("content-type")) and nests_deeper_than(body):
        raise too_deep("body")
    try:
        return await request.json()
    except (ValueError, RecursionError) as exc:
        raise unreadable_body(exc) or _NotJson("the body is not valid JSON", field="body") from None


class _NotJson(InvalidInputError):
    """A body that is not JSON at all."""


async def body_as_read(request: Request) -> Any:
    """The request's body as a route reading ``await request.json()`` gets it, or None: a
    JSON body as :func:`request_body` reads it, and a body of another type (or none) when it
    is a JSON object or array as Starlette's ``request.json()`` reads it all the same
    (``json.loads`` of its bytes: UTF-8, UTF-16 or UTF-32 as its first bytes tell, lone
    surrogates kept, whatever charset the type names). A body that is not is None: the route
    cannot read it as JSON either, and a lone ``NaN`` or ``"\\ud800"`` sent as text is more
    likely text. One that parses but nests too deeply is refused, as a JSON body is. A
    request whose form the route has read (a FastAPI ``Form`` parameter) has no body left
    for it to read: None."""
    if request._form is not None and not hasattr(request, "_body"):
        return None
    if is_json_type(request.headers.get("content-type")):
        return await request_body(request)
    body = await request.body()
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict | list):
        return None
    if nests_deeper_than(body):
        raise too_deep("body")
    return parsed


async def form_users(request: Request) -> list[tuple[str, str]]:
    """The fields of the request's form naming a user (``user_id``, ``user``), as the route
    reads them: each (name, value) not empty (FastAPI reads an empty field as absent), every
    value of a repeated field. The form is read by Starlette's own parser (python-multipart),
    as the route's ``request.form()`` or ``Form`` parameters read it, with Starlette's
    limits: the form the route has read already (a FastAPI ``Form`` or ``File`` parameter),
    else the body parsed again apart from the request (the route reads it as sent). Files
    are not fields. A form the parser refuses (malformed, more than 1000 fields or files) is
    refused as the route would (400 saying why). Without python-multipart no route can read
    a form: none is read here either.
    """
    form = request._form
    if form is None:
        if _parse_options_header is None:
            return []
        body = await request.body()

        async def replay() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        try:
            form = await Request(dict(request.scope), replay).form()
        except HTTPException:
            raise
        except Exception as exc:  # as FastAPI answers a form it cannot parse
            raise HTTPException(400, "There was an error parsing the body") from exc
        try:
            return _user_fields(form)
        finally:
            await form.close()
    return _user_fields(form)


def _user_fields(form: FormData) -> list[tuple[str, str]]:
    """The text fields of ``form`` naming a user, not empty."""
    return [
        (name, value)
        for name, value in form.multi_items()
        if name in USER_FIELDS and isinstance(value, str) and value
    ]


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=_MAX_IDEMPOTENCY_KEY_CHARS,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description=(
            "Makes a write safe to retry: a request repeating the key and body gets the "
            "first answer without writing again; the key with another body is a 409."
        ),
    ),
]


async def guard_request(
    request: Request, caller: CurrentCaller, idempotency_key: IdempotencyKey = None
) -> None:
    """The checks above, in order: Unicode, numbers, users, then the idempotency claim."""
    await check_request(request, caller, idempotency_key)


async def guard_any_type_request(
    request: Request, caller: CurrentCaller, idempotency_key: IdempotencyKey = None
) -> None:
    """:func:`guard_request` for a route that reads its body as JSON whatever its content
    type (a plain function's)."""
    await check_request(request, caller, idempotency_key, any_type=True)


async def check_request(
    request: Request, caller: Caller, idempotency_key: str | None, *, any_type: bool = False
) -> None:
    """:func:`guard_request` for routes outside FastAPI's dependencies (A2A's), whose body
    is read as JSON whatever its content type with ``any_type``. A route a user added
    (:func:`read_as_users_route`) has its body checked as it may read it: see the module."""
    if request.scope.get("state", {}).get(_USERS_ROUTE):
        body = await body_as_read(request)
        check_body(body)
        form = await form_users(request)
        await check_claims(request, caller, idempotency_key, body, form)
        return
    body = await request_body(request, any_type=any_type)
    check_body(body)
    await check_claims(request, caller, idempotency_key, body)


def read_as_users_route(request: Request) -> None:
    """The request is to a route a user added (``@app.endpoint``, or one added to
    ``app.get_fastapi_app()``): its guard checks its body as the route may read it (a body
    of any type that parses as JSON, a form's fields), not as the runtime's routes read
    theirs (JSON bodies only)."""
    request.scope.setdefault("state", {})[_USERS_ROUTE] = True


async def guard_added_request(request: Request, caller: Caller | None) -> Receive:
    """:func:`guard_request` for a request to a route, router or mount a user added to the
    application (outside FastAPI's dependencies, as the route may be any ASGI one): its
    ``Idempotency-Key`` checked as the header's declaration does. On a route left open
    (``caller`` None) only the body is checked. Answers the receive the route reads the
    request from, the body read here handed over again."""
    request = utf8_request(request)
    if caller is None:
        check_body(await request_body(request))
        return _handing_over(request)
    keys = request.headers.getlist(IDEMPOTENCY_HEADER)
    idempotency_key = keys[0] if keys else None
    if idempotency_key is not None and not (
        0 < len(idempotency_key) <= _MAX_IDEMPOTENCY_KEY_CHARS
        and re.fullmatch(IDEMPOTENCY_KEY_PATTERN, idempotency_key)
    ):
        raise InvalidInputError(
            f"the {IDEMPOTENCY_HEADER} header must be 1 to {_MAX_IDEMPOTENCY_KEY_CHARS} "
            "visible ASCII characters",
            field=IDEMPOTENCY_HEADER,
        )
    read_as_users_route(request)
    await check_request(request, caller, idempotency_key)
    return _handing_over(request)


def _handing_over(request: Request) -> Receive:
    """What the route reads ``request`` from: its body, once read here, then the rest. The
    body is kept for the answer to the route's own parse of it failing (see
    :func:`install_guards`)."""
    if not hasattr(request, "_body"):  # its body unread: the route reads it as it comes
        return request.receive
    body: bytes = request._body
    request.scope.setdefault("state", {})[_USERS_ROUTE_BODY] = body
    receive, handed = request.receive, False

    async def replay() -> Message:
        nonlocal handed
        if handed:
            return await receive()
        handed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def check_body(body: Any) -> None:
    """Refuse (422 naming where) a body holding text that is not valid Unicode, or a number
    that is not finite."""
    require_utf8(body, field="body")
    require_finite(body, field="body")


async def check_claims(
    request: Request,
    caller: Caller,
    idempotency_key: str | None,
    body: Any,
    form: list[tuple[str, str]] | None = None,
) -> None:
    """Refuse a ``body`` (or the ``form`` fields of :func:`form_users`) naming another user
    than ``caller`` acts for (or two users), then claim the ``Idempotency-Key``: for the
    user the request acts as, or, a service key's naming none, for that key alone."""
    user_id: str | None = None
    named = named_users(body)
    if named:
        # All at once: a body whose user_id and user name two users is refused, as the
        # routes would disagree on which of them acts.
        user_id = caller.user_id(body=named)
    for name, value in form or ():
        also = caller.user_id(body={f"{name} form": value})
        if user_id is not None and also != user_id:
            raise InvalidInputError(
                "the request names more than one user",
                errors=[{"loc": [f"{name} form field"], "msg": "names a different user"}],
            )
        user_id = also
    if idempotency_key is None or not is_write(request):
        return
    users_route = request.scope.get("state", {}).get(_USERS_ROUTE)
    if users_route and user_id is None and caller.principal.kind == "service" and not caller.claims:
        # Acting for no user (a route of the app's own that needs none): the key is the
        # service key's, in a space of its own no user's key can reach (a header's key
        # holds no space).
        space = f"service key {caller.principal.key_id}"
        await claim_key(request, space, f"{space} {idempotency_key}")
        return
    await claim_key(request, user_id or caller.user_id(), idempotency_key)


def named_users(body: Any) -> dict[str, str]:
    """The users a JSON body names, by field (``user_id``, ``user``): a string (an empty
    one names none, as a form's), or an integer (not a boolean) as its decimal digits. A
    ``user_id`` of another type, or a ``user`` that is a fraction, is refused (422 naming
    it; see the module).

    >>> named_users({"user_id": 42, "user": {"login": "octocat"}})
    {'user_id': '42'}
    """
    if not isinstance(body, dict):
        return {}
    named = {}
    for name in USER_FIELDS:
        value = body.get(name)
        if value is None or value == "":
            continue
        if isinstance(value, str):
            named[name] = value
        elif isinstance(value, int) and not isinstance(value, bool):
            named[name] = str(value)
        elif name == "user_id" or isinstance(value, float):
            raise InvalidInputError(
                f"the body's {name} names a user with a string or an integer, not "
                f"{_json_type(value)}",
                field=name,
            )
    return named


def _json_type(value: Any) -> str:
    """What JSON calls ``value``'s type, with an article."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a fraction"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


def not_json(exc: json.JSONDecodeError) -> InvalidInputError:
    """The refusal of a body that is not JSON (as a route reading a body model says it)."""
    return body_not_json(f"{exc.msg} at line {exc.lineno}, column {exc.colno}")


def is_parse_of(exc: json.JSONDecodeError, body: bytes) -> bool:
    """Whether ``exc`` is the failed JSON parse of ``body`` (as Starlette's
    ``request.json()`` or ours reads it)."""
    for encoding in ("utf-8", "utf-8-sig"):
        try:
            if exc.doc == body.decode(encoding, "surrogatepass"):
                return True
        except UnicodeDecodeError:
            return False
    return False


async def _body_not_json(request: Request, exc: Exception) -> Response:
    """A route a user added parsed the request's body as JSON, and it is not: 422 naming
    where (any other failed parse is the route's own error, a 500)."""
    assert isinstance(exc, json.JSONDecodeError)
    body = request.scope.get("state", {}).get(_USERS_ROUTE_BODY)
    if isinstance(body, bytes) and body and is_parse_of(exc, body):
        return response_for(not_json(exc))
    # The route's own error: answered as it was before, by the handler of a class it is of
    # (one the app was given), else as an unexpected error.
    for kind in type(exc).__mro__[1:]:
        if kind in (Exception, BaseException):  # the 500's, which answers a re-raise
            break
        handler = request.app.exception_handlers.get(kind)
        if handler is not None:
            if inspect.iscoroutinefunction(handler):
                answer: Response = await handler(request, exc)
            else:
                answer = await run_in_threadpool(handler, request, exc)
            return answer
    raise exc


def install_guards(app: FastAPI) -> None:
    """Answer 422 to a route a user added whose parse of the request's body fails."""
    app.add_exception_handler(json.JSONDecodeError, _body_not_json)


__all__ = [
    "USER_FIELDS",
    "body_as_read",
    "check_body",
    "check_claims",
    "check_request",
    "form_users",
    "guard_added_request",
    "guard_any_type_request",
    "guard_request",
    "install_guards",
    "is_parse_of",
    "json_body",
    "named_users",
    "not_json",
    "read_as_users_route",
    "request_body",
]
