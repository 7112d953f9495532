"""Authentication and tenancy: who is calling, and which user they act as.

Every route except ``/health`` needs ``Authorization: Bearer <key>``. A **user key** acts
only as its own user: a request naming another user (the ``X-User-Id`` header, a
``user_id`` query parameter or a ``user_id`` body field) gets 403. A **service key** acts
for the user the request names (``X-User-Id`` or ``user_id``); naming none is a 422.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from agentscope_serverless.auth.keys import Principal
from agentscope_serverless.errors import (
    AuthenticationError,
    InvalidInputError,
    PermissionDeniedError,
)
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.services._validation import require_user_id

USER_HEADER = "X-User-Id"

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="APIKey",
    description=(
        "An API key (`ask_...`, made with `agentscope-serverless keys create`). A user key "
        f"acts as its user; a service key acts for the user named by the `{USER_HEADER}` "
        "header (or a `user_id` query parameter or body field)."
    ),
)


@dataclass(frozen=True)
class Caller:
    """An authenticated request: its principal and the users it names outside the body."""

    principal: Principal
    claims: tuple[tuple[str, str], ...] = ()

    def user_id(self, body_user_id: str | None = None) -> str:
        """The user this request acts as, checked against what the key may do.

        ``body_user_id`` is the ``user_id`` the request body names, if any.
        """
        claims = list(self.claims)
        if body_user_id is not None:
            claims.append(("user_id field", body_user_id))
        if self.principal.kind == "user":
            own = self.principal.user_id
            assert own is not None
            for where, claimed in claims:
                if claimed != own:
                    raise PermissionDeniedError(
                        f"this key acts only as its own user, but the {where} names another user"
                    )
            return own
        if not claims:
            raise InvalidInputError(
                f"a service key must name the user it acts for: send the {USER_HEADER} header",
                field=USER_HEADER,
            )
        named = {claimed for _, claimed in claims}
        if len(named) > 1:
            raise InvalidInputError(
                "the request names more than one user",
                errors=[{"loc": [where], "msg": "names a different user"} for where, _ in claims],
            )
        return require_user_id(named.pop())


async def get_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Caller:
    """Authenticate the request's bearer key (401 when missing, malformed or unknown)."""
    if credentials is None:
        raise AuthenticationError("missing API key: send the header 'Authorization: Bearer <key>'")
    context: AppContext = request.app.state.context
    principal = await context.key_store.authenticate(credentials.credentials)
    # Read directly rather than as declared parameters: this runs on every request.
    claims: list[tuple[str, str]] = []
    header_user = request.headers.get(USER_HEADER)
    if header_user is not None:
        claims.append((f"{USER_HEADER} header", header_user))
    query_user = request.query_params.get("user_id")
    if query_user is not None:
        claims.append(("user_id query parameter", query_user))
    return Caller(principal=principal, claims=tuple(claims))


async def current_user_id(caller: Annotated[Caller, Depends(get_caller)]) -> str:
    """The user a request without a body ``user_id`` acts as."""
    return caller.user_id()


CurrentCaller = Annotated[Caller, Depends(get_caller)]
CurrentUser = Annotated[str, Depends(current_user_id)]

__all__ = [
    "USER_HEADER",
    "Caller",
    "CurrentCaller",
    "CurrentUser",
    "bearer_scheme",
    "current_user_id",
    "get_caller",
]
