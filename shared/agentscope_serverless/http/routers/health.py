"""``GET /health`` (and ``HEAD``): each service's health, without authentication."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from agentscope_serverless.http.context import AppContext, get_context
from agentscope_serverless.http.openapi import ErrorBody, error_answer
from agentscope_serverless.services.manager import check_health

router = APIRouter(tags=["health"])


class Health(BaseModel):
    """``healthy`` when every service answers; ``degraded`` (with HTTP 503) otherwise.
    ``runner`` is ``ready`` where an agent is served (AgentScope Runtime's field, which its
    probes read)."""

    status: Literal["healthy", "degraded"]
    services: dict[str, bool]
    runner: Literal["ready", "not_ready"]


@router.get(
    "/health",
    response_model=Health,
    summary="Health of the services",
    responses={
        503: {
            "model": Health | ErrorBody,
            "description": (
                "A service is unhealthy (the body says which); or a Lambda function could "
                "not start (`UNAVAILABLE`, an error)."
            ),
        },
        # What the checks of every request refuse, which need no key: a URL that is not
        # UTF-8 (422), a body too large (413) or compressed (415).
        **error_answer(413),
        **error_answer(415),
        **error_answer(422, "The URL's path or query is not UTF-8 text once percent-decoded."),
        **error_answer(500, "A fault of the server (`INTERNAL_ERROR`, no details)."),
    },
)
async def health(context: Annotated[AppContext, Depends(get_context)]) -> JSONResponse:
    # Checked together, each within HEALTH_TIMEOUT_SECONDS: a store that does not answer
    # reads as down in that time, rather than holding the probe.
    services, keys = await asyncio.gather(
        context.lifecycle.health_check(), check_health(context.key_store)
    )
    services["auth_keys"] = keys
    healthy = all(services.values())
    body = Health(
        status="healthy" if healthy else "degraded",
        services=services,
        runner="ready" if context.runner is not None else "not_ready",
    )
    return JSONResponse(body.model_dump(), status_code=200 if healthy else 503)


__all__ = ["Health", "router"]
