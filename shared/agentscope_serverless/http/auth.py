"""Authentication and tenancy: who is calling, and which user they act as.

``AUTH_MODE=keys`` (the default): every route except ``/health`` needs
``Authorization: Bearer <key>`` (given once: two ``Authorization`` headers get 401). A
**user key** acts only as its own user: a request naming another user (the ``X-User-Id``
header, a ``user_id`` query parameter, a ``user_id`` path parameter of an app's own route
(``@app.endpoint("/users/{user_id}/...")``, a route or WebSocket route added to its FastAPI
app) or a ``user_id`` body field) gets 403. A **service
key** acts for the user the request names: the ``X-User-Id`` header or a ``user_id`` query or
path parameter, and on the agent's routes (``/process``, the OpenAI-compatible ones) also the body's
``user_id`` or ``user``; naming none is a 422.

``AUTH_MODE=iam``: the function sits behind a Lambda Function URL with ``AuthType: AWS_IAM``,
so AWS has already checked the caller's SigV4 signature. The caller's IAM identity from the
Function URL request context is the user, and it acts like a user key (naming another user
gets 403). The identity is ``requestContext.authorizer.iam.userArn`` (for example
``arn:aws:iam::123456789012:user/alice`` or
``arn:aws:sts::123456789012:assumed-role/Role/session``), else ``callerId``, else ``userId``;
for a caller signing with the credentials of a Cognito identity pool (every identity of the
pool under one role and session name), its ``cognitoIdentity.identityId``.
The request context comes from the raw Lambda event that Mangum puts in the ASGI scope
(``scope["aws.event"]``, the buffered functions) or, when there is none, from the
``x-amzn-request-context`` header that the Lambda Web Adapter sets (the streaming function;
the adapter replaces any such header a client sends). The header is read only by an app
built to run behind the adapter (``build_web_adapter_app``), which hands it over in
``scope["aws.request_context"]``: any other server (the local one, an archive's) would take
it from the client, who could name any identity. A request without an IAM identity is
refused with 401. Only run iam mode behind an ``AWS_IAM`` Function URL. In keys mode
neither the event nor the header is ever read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import types
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

from fastapi import APIRouter, Depends, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from agentscope_serverless.auth.keys import Principal
from agentscope_serverless.errors import (
    AuthenticationError,
    InvalidInputError,
    PermissionDeniedError,
)
from agentscope_serverless.http.bodies import utf8_request
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.params import refuse_repeated, single_query_parameters
from agentscope_serverless.log import shortened, without_api_keys
from agentscope_serverless.services._validation import require_unpadded_user_id, require_user_id

USER_HEADER = "X-User-Id"
# The query parameter (and path parameter, see claiming_path_user) naming a user.
USER_PARAMETER = "user_id"
AUTHORIZATION_HEADER = "Authorization"
REQUEST_CONTEXT_HEADER = b"x-amzn-request-context"
# Where an app behind the Lambda Web Adapter puts the request context of its header, parsed.
REQUEST_CONTEXT_SCOPE_KEY = "aws.request_context"
IAM_KEY_ID = "iam"
# The fields of the Function URL's IAM authorizer that name the caller, best first.
IAM_IDENTITY_FIELDS = ("userArn", "callerId", "userId")
# Where a request keeps its caller once authenticated (its scope's state).
_CALLER_STATE = "agentscope_caller"
# Where a request whose body is refused unread (too large, compressed) keeps the error its
# authentication raises once the key holds: a caller without a valid key gets 401 first.
REFUSED_BODY_STATE = "agentscope_refused_body"
# The most characters of a user's id in a log line (one a service key names is unchecked).
_MAX_LOGGED_USER_CHARS = 256

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="APIKey",
    description=(
        "An API key (`ask_...`, made with `agentscope-serverless keys create`). A user key "
        f"acts as its user; a service key acts for the user named by the `{USER_HEADER}` "
        "header or a `user_id` query parameter (or path parameter, on an app's own routes; "
        "on `/process` and the OpenAI-compatible "
        "routes, also the body's `user_id` or `user`); naming two users is a 422."
    ),
)


@dataclass(frozen=True)
class Caller:
    """An authenticated request: its principal and the users it names outside the body."""

    principal: Principal
    claims: tuple[tuple[str, str], ...] = ()

    def user_id(
        self, body_user_id: str | None = None, *, body: Mapping[str, str] | None = None
    ) -> str:
        """The user this request acts as, checked against what the key may do.

        ``body_user_id`` is the ``user_id`` the request body names, if any (empty, it names
        none); ``body`` maps each body field naming a user (``user_id``, OpenAI's ``user``) to
        the user it names.
        """
        claims = list(self.claims)
        if body_user_id:
            claims.append(("user_id field", body_user_id))
        claims.extend((f"{field} field", claimed) for field, claimed in (body or {}).items())
        if self.principal.kind == "user":
            own = self.principal.user_id
            assert own is not None
            for where, claimed in claims:
                if claimed != own:
                    raise PermissionDeniedError(
                        f"this caller acts only as its own user, but the {where} names another user"
                    )
            return own
        if not claims:
            raise InvalidInputError(
                f"a service key must name the user it acts for: send the {USER_HEADER} header",
                field=USER_HEADER,
            )
        for where, claimed in claims:
            # Named in a body or a query, it could never be named in the header.
            require_unpadded_user_id(claimed, where=where)
        named = {claimed for _, claimed in claims}
        if len(named) > 1:
            raise InvalidInputError(
                "the request names more than one user",
                errors=[{"loc": [where], "msg": "names a different user"} for where, _ in claims],
            )
        return require_user_id(named.pop())


def header_text(value: str, *, name: str) -> str:
    """A header's value as the UTF-8 text it was sent as (422 when it is not UTF-8).

    The server hands header bytes over as Latin-1, so ``é`` sent as UTF-8 would arrive as
    ``Ã©``: the same user or session named in a header and in the body would be two.
    """
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise InvalidInputError(f"the {name} header is not UTF-8 text", field=name) from None


def request_context(scope: Mapping[str, Any]) -> Any:
    """The Function URL request context: from Mangum's event, else the one the Web Adapter's
    header carried (:func:`web_adapter_request_context`: never from a header of another
    server); None without one."""
    event = scope.get("aws.event")
    if event is not None:
        return event.get("requestContext") if isinstance(event, dict) else None
    return scope.get(REQUEST_CONTEXT_SCOPE_KEY)


def web_adapter_request_context(scope: Any) -> None:
    """Hand the request context of the Lambda Web Adapter's header over to authentication
    (an app behind the adapter only: it replaces any such header a client sends), parsed
    once for the request: None when it is not JSON."""
    for name, value in scope.get("headers", ()):
        if name == REQUEST_CONTEXT_HEADER:
            with contextlib.suppress(ValueError, RecursionError):
                scope[REQUEST_CONTEXT_SCOPE_KEY] = json.loads(value)
            return


def iam_user_id(scope: Mapping[str, Any]) -> str:
    """The IAM identity of a request to an ``AWS_IAM`` Function URL (401 when there is none)."""
    context = request_context(scope)
    authorizer = context.get("authorizer") if isinstance(context, dict) else None
    iam = authorizer.get("iam") if isinstance(authorizer, dict) else None
    if isinstance(iam, dict):
        # Every identity of a Cognito identity pool signs as the pool's role, under one
        # session name: its identity id is what tells them apart.
        cognito = iam.get("cognitoIdentity")
        identity_id = cognito.get("identityId") if isinstance(cognito, dict) else None
        if isinstance(identity_id, str) and identity_id.strip():
            return require_user_id(identity_id)
        for field in IAM_IDENTITY_FIELDS:
            identity = iam.get(field)
            if isinstance(identity, str) and identity.strip():
                return require_user_id(identity)
    raise AuthenticationError(
        "no IAM identity in the request: sign it with SigV4 for the AWS_IAM Function URL"
    )


async def get_caller(
    request: HTTPConnection,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Caller:
    """Authenticate the request (an HTTP request, or a WebSocket handshake): its bearer key,
    or in iam mode its IAM identity (else 401). Once per request: a route authenticating
    before its body is read keeps the caller."""
    state = request.scope.setdefault("state", {})
    known: Caller | None = state.get(_CALLER_STATE)
    if known is not None:
        return known
    context: AppContext = request.app.state.context
    if context.settings.auth_mode == "iam":
        principal = Principal(key_id=IAM_KEY_ID, kind="user", user_id=iam_user_id(request.scope))
    elif request.headers.getlist(AUTHORIZATION_HEADER)[1:]:
        # Which key would act? Servers take the first, proxies the last or both: refuse.
        raise AuthenticationError(f"the {AUTHORIZATION_HEADER} header is given more than once")
    elif "," in request.headers.get(AUTHORIZATION_HEADER, ""):
        # A Function URL (like most proxies) joins a repeated header's values with commas;
        # no key holds one.
        raise AuthenticationError(
            f"the {AUTHORIZATION_HEADER} header is given more than once (several arrive "
            "joined by ',')"
        )
    elif credentials is None:
        raise AuthenticationError(_no_bearer_key(request.headers.get(AUTHORIZATION_HEADER)))
    else:
        principal = await context.key_store.authenticate(credentials.credentials)
    # Read directly rather than as declared parameters: this runs on every request.
    claims: list[tuple[str, str]] = []
    headers = [
        header_text(value, name=USER_HEADER) for value in request.headers.getlist(USER_HEADER)
    ]
    for where, values in (
        (f"{USER_HEADER} header", headers),
        # A parameter that is not UTF-8 never gets here (see the request context middleware).
        ("user_id query parameter", request.query_params.getlist("user_id")),
    ):
        if len(values) > 1:
            # Proxies and frameworks disagree on which of several values wins: refuse.
            raise InvalidInputError(f"the {where} is given more than once", field=where)
        claims.extend((where, value) for value in values)
    if any("," in value for value in headers):
        # A Function URL (like most proxies) joins a repeated header's values with commas.
        raise InvalidInputError(
            f"the {USER_HEADER} header holds ',', as several {USER_HEADER} headers arrive "
            "joined: send one (name a user whose id holds ',' with ?user_id=)",
            field=f"{USER_HEADER} header",
        )
    caller = state[_CALLER_STATE] = Caller(principal=principal, claims=tuple(claims))
    refused: Exception | None = state.get(REFUSED_BODY_STATE)
    if refused is not None:
        raise refused
    return caller


def claiming_path_user(request: Request, caller: Caller) -> Caller:
    """``caller`` (the request's, authenticated) naming also the user of the request's
    ``user_id`` path parameter, as the ``X-User-Id`` header names one: the request's caller
    from now on. For the routes whose path holds one (an app's own)."""
    claimed = request.path_params.get(USER_PARAMETER)
    if not isinstance(claimed, str):
        return caller
    claims = (*caller.claims, (f"{USER_PARAMETER} path parameter", claimed))
    caller = request.scope["state"][_CALLER_STATE] = dataclasses.replace(caller, claims=claims)
    return caller


def _no_bearer_key(authorization: str | None) -> str:
    """Why a request's ``Authorization`` header (its value, None when not sent) holds no
    bearer key. Never says the value back: it may be a key sent without ``Bearer`` or a
    password."""
    usage = f"send the header '{AUTHORIZATION_HEADER}: Bearer <key>'"
    scheme, _ = get_authorization_scheme_param(authorization)
    if scheme and scheme.lower() != "bearer":
        return f"the {AUTHORIZATION_HEADER} header does not use the Bearer scheme: {usage}"
    return f"missing API key: {usage}"


def authenticated_caller(state: Mapping[str, Any]) -> Caller | None:
    """The caller a request (its ``state``) was authenticated as, None while it is not (on
    a route left open with :func:`public`, never)."""
    caller: Caller | None = state.get(_CALLER_STATE)
    return caller


def caller_fields(state: Mapping[str, Any]) -> dict[str, str]:
    """What a failed request's log line says of its caller, once authenticated (a request's
    ``state``): the key's id (its public part, never the secret) and the user it acts as,
    the user key's (or the IAM identity), else the one user a service key's request names
    outside the body."""
    caller: Caller | None = state.get(_CALLER_STATE)
    if caller is None:
        return {}
    fields = {"key_id": caller.principal.key_id}
    named = {claimed for _, claimed in caller.claims}
    user_id = caller.principal.user_id or (named.pop() if len(named) == 1 else None)
    if user_id is not None:
        fields["user_id"] = shortened(without_api_keys(user_id), _MAX_LOGGED_USER_CHARS)
    return fields


class KeyedRoute(APIRoute):
    """A route whose caller is authenticated before anything else, its body first: FastAPI
    reads and parses a route's body before its dependencies, so a caller without a valid
    key would get the body's errors (422) and make the server parse it for nothing. Its body
    is read as UTF-8 JSON only (see :mod:`.bodies`); a query parameter of one value given
    more than once is refused (422 naming it), not read as the last one."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        declared = super().get_route_handler()
        single = single_query_parameters(self.dependant)

        async def handle(request: Request) -> Response:
            request = utf8_request(request)
            await get_caller(request, await bearer_scheme(request))
            if single and request.scope["query_string"]:
                refuse_repeated(request.query_params, single)
            return await declared(request)

        return handle


# What marks a route, endpoint or application left open (see public).
_PUBLIC_MARK = "__agentscope_public__"
# What marks a route already behind the key (see require_key).
_KEYED_MARK = "__agentscope_keyed__"

PublicT = TypeVar("PublicT")


def public(target: PublicT) -> PublicT:
    """Leave ``target`` open to callers without a key, on an application of
    ``app.get_fastapi_app()``, where every route or mount a user adds needs one: an endpoint
    function, an ``APIRouter`` (each of its routes) or a mounted application.

    >>> from fastapi import FastAPI
    >>> web = FastAPI()
    >>> @web.get("/webhook")
    ... @public
    ... async def webhook() -> dict[str, bool]:
    ...     return {"ok": True}

    ``fastapi_app.mount("/static", public(StaticFiles(directory="static")))`` serves files to
    anyone.

    What is left open is the route given what ``public`` answers: for a function, a copy of
    it (the function itself, given to another route, needs a key there); for a router, its
    routes and itself as included (a route of another router, or of the application, sharing
    an endpoint function with one of them needs a key).
    """
    if isinstance(target, types.FunctionType):
        opened: Any = _copy_of(target)
        setattr(opened, _PUBLIC_MARK, True)
        return cast(PublicT, opened)
    if isinstance(target, APIRouter):
        for route in target.routes:
            setattr(route, _PUBLIC_MARK, True)
            endpoint = getattr(route, "endpoint", None)
            if isinstance(endpoint, types.FunctionType):
                # What a FastAPI copying an included router's routes copies them with
                # (their handlers are built already).
                route.endpoint = public(endpoint)  # type: ignore[attr-defined]
    try:
        setattr(target, _PUBLIC_MARK, True)
    except (AttributeError, TypeError):
        raise TypeError(
            f"public() marks a function, a router or an application, not {type(target).__name__}"
        ) from None
    return target


def _copy_of(function: types.FunctionType) -> types.FunctionType:
    """A function doing what ``function`` does (of its kind: a coroutine or generator
    function's code is its), with its name, signature and attributes, but not it."""
    copy = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = dict(function.__kwdefaults__ or {}) or None
    wrapped = function.__dict__.get("__wrapped__")
    functools.update_wrapper(copy, function)
    if wrapped is None:
        del copy.__dict__["__wrapped__"]  # its signature is its own, not the original's
    else:
        copy.__dict__["__wrapped__"] = wrapped
    return copy


def is_public(route: BaseRoute) -> bool:
    """Whether ``route`` was left open with :func:`public` (itself, its endpoint, its
    application or the router it includes)."""
    marked = (
        route,
        getattr(route, "endpoint", None),
        getattr(route, "app", None),
        getattr(route, "original_router", None),  # an included router (FastAPI's)
    )
    return any(getattr(target, _PUBLIC_MARK, False) is True for target in marked)


# Checks of an HTTP request to a route, its caller authenticated (None on a route left
# open): they answer the receive the route reads the request from (the body they read
# handed over again).
RequestGuard = Callable[[Request, "Caller | None"], Awaitable[Receive]]


def require_key(route: BaseRoute, guard: RequestGuard | None = None) -> None:
    """Authenticate every request ``route`` takes (a ``Route``, an ``APIRoute``, a ``Mount``,
    an included router...) before it handles it, as the runtime's routes do: without a valid
    key, a 401; a user key naming another user (``X-User-Id``, ``?user_id=``, a ``user_id``
    path parameter), a 403; a request naming two users, a 422. An HTTP
    request then passes ``guard``. A route left open with :func:`public` is not
    authenticated, its requests passing ``guard`` all the same, without a caller. A route
    already keyed is left as it is."""
    if getattr(route, _KEYED_MARK, False):
        return
    if is_public(route) and guard is None:
        return
    handle, opened = route.handle, is_public(route)

    async def keyed(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            request = Request({**scope, "type": "http"}, receive)
            caller: Caller | None = None
            if not opened:
                caller = await get_caller(request, await bearer_scheme(request))
                no_other_user(claiming_path_user(request, caller))
            if guard is not None and scope["type"] == "http":
                receive = await guard(request, caller)
        await handle(scope, receive, send)

    route.handle = keyed  # type: ignore[method-assign]
    setattr(route, _KEYED_MARK, True)


def no_other_user(caller: Caller) -> None:
    """On a route holding no user's data (where a service key need not name one), a user key
    naming another user gets 403, and a request naming two users (a service key's
    ``X-User-Id`` and ``?user_id=`` disagreeing) 422, as on every route."""
    if caller.principal.kind == "user" or caller.claims:
        caller.user_id()


async def current_user_id(caller: Annotated[Caller, Depends(get_caller)]) -> str:
    """The user a request without a body ``user_id`` acts as."""
    return caller.user_id()


CurrentCaller = Annotated[Caller, Depends(get_caller)]
CurrentUser = Annotated[str, Depends(current_user_id)]

__all__ = [
    "IAM_IDENTITY_FIELDS",
    "REFUSED_BODY_STATE",
    "REQUEST_CONTEXT_HEADER",
    "REQUEST_CONTEXT_SCOPE_KEY",
    "USER_HEADER",
    "USER_PARAMETER",
    "Caller",
    "CurrentCaller",
    "CurrentUser",
    "KeyedRoute",
    "RequestGuard",
    "authenticated_caller",
    "bearer_scheme",
    "caller_fields",
    "claiming_path_user",
    "current_user_id",
    "get_caller",
    "header_text",
    "iam_user_id",
    "is_public",
    "no_other_user",
    "public",
    "request_context",
    "require_key",
    "web_adapter_request_context",
]
