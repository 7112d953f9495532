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
  parameter (see :mod:`agentscope_serverless.http.auth`).
- **Retried writes run once**: ``Idempotency-Key``, see
  :mod:`agentscope_serverless.http.idempotency`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Header, Request
from starlette.types import Message, Receive

from agentscope_serverless.errors import InvalidInputError
from agentscope_serverless.http.auth import Caller, CurrentCaller
from agentscope_serverless.http.bodies import utf8_request
from agentscope_serverless.http.errors import unreadable_body
from agentscope_serverless.http.idempotency import (
    IDEMPOTENCY_HEADER,
    IDEMPOTENCY_KEY_PATTERN,
    claim_key,
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
    is read as JSON whatever its content type with ``any_type``."""
    body = await request_body(request, any_type=any_type)
    check_body(body)
    await check_claims(request, caller, idempotency_key, body)


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
    await check_request(request, caller, idempotency_key)
    return _handing_over(request)


def _handing_over(request: Request) -> Receive:
    """What the route reads ``request`` from: its body, once read here, then the rest."""
    if not hasattr(request, "_body"):  # its body unread: the route reads it as it comes
        return request.receive
    body: bytes = request._body
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
    request: Request, caller: Caller, idempotency_key: str | None, body: Any
) -> None:
    """Refuse a ``body`` naming another user than ``caller`` acts for (or two users), then
    claim the ``Idempotency-Key``."""
    user_id: str | None = None
    if isinstance(body, dict):
        # All at once: a body whose user_id and user name two users is refused, as the
        # routes would disagree on which of them acts.
        named = {name: body[name] for name in USER_FIELDS if isinstance(body.get(name), str)}
        if named:
            user_id = caller.user_id(body=named)
    if idempotency_key is not None and request.method in {"POST", "PUT", "PATCH", "DELETE"}:
        await claim_key(request, user_id or caller.user_id(), idempotency_key)


__all__ = [
    "USER_FIELDS",
    "check_body",
    "check_claims",
    "check_request",
    "guard_added_request",
    "guard_any_type_request",
    "guard_request",
    "json_body",
    "request_body",
]
