"""Lambda entry points: the shared application for some routers, behind Mangum (buffered).

>>> handler = make_handler(["sessions"])   # in functions/sessions/app.py

Importing this module and making a handler connects to nothing. The first invocation
reads the secrets (``SECRETS_ARN``), builds the application, starts its services once and
keeps them for the life of the execution environment, so later invocations reuse the
connections (Mangum would otherwise start and stop them around every request).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import importlib
import json
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from mangum import Mangum

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]

# What a router needs beyond the HTTP application: the runtime of an agent (AgentApp, Runner)
# for the process router. The other functions never import it.
_RUNTIME_OF_ROUTER = {"process": "agentscope_serverless.app"}


def import_runtime(routers: Sequence[str]) -> None:
    """Import what serving ``routers`` needs beyond the HTTP application now, in Lambda's
    init phase, rather than in the first invocation (which builds the application)."""
    for name in routers:
        if name in _RUNTIME_OF_ROUTER:
            importlib.import_module(_RUNTIME_OF_ROUTER[name])


def build_app(routers: Sequence[str]) -> FastAPI:
    """The application for ``routers``, with the settings' secrets read from AWS.

    The composition root of every function: the settings (the environment, then the
    ``SECRETS_ARN`` secret) are read here, once, and handed down to everything else.
    """
    from agentscope_serverless.aws_secrets import resolve_secrets
    from agentscope_serverless.http.app import create_app
    from agentscope_serverless.settings import load_settings

    return create_app(routers, settings=resolve_secrets(load_settings()))


class _LazyApplication:
    def __init__(self, routers: Sequence[str]) -> None:
        self._routers = tuple(routers)
        self._adapter: Mangum | None = None
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._app: FastAPI | None = None

    def _start(self) -> Mangum:
        from mangum import Mangum

        app = build_app(self._routers)
        self._app = app
        adapter = Mangum(app, lifespan="off")
        lifespan = app.router.lifespan_context(app)
        asyncio.get_event_loop().run_until_complete(lifespan.__aenter__())
        self._lifespan = lifespan
        self._adapter = adapter
        return adapter

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        from agentscope_serverless.tasks import TASK_EVENT_KEY

        adapter = self._adapter or self._start()
        if TASK_EVENT_KEY in event:
            return self._run_task(event)
        problem = _unreadable(adapter, event, context)
        if problem is not None:
            return _bad_request(problem)
        return adapter(event, context)

    def _run_task(self, event: dict[str, Any]) -> dict[str, Any]:
        """Run a background task sent by an asynchronous invocation (not a Function URL)."""
        from agentscope_serverless.tasks import run_task_event

        assert self._app is not None
        app_context = self._app.state.context
        agent_app = app_context.agent_app
        tasks = agent_app.tasks if agent_app is not None else []
        work = run_task_event(app_context.runs, tasks, event)
        asyncio.get_event_loop().run_until_complete(work)
        return {"status": "done"}


def _unreadable(adapter: Mangum, event: dict[str, Any], context: Any) -> str | None:
    """What makes an HTTP event's request unreadable (None when it can be served).

    Mangum decodes the body and encodes the headers, path and query string outside the
    application, where a failure would be an invocation error (a 502 without a body): an
    event that does not decode is answered here instead. Events of other kinds are left to
    Mangum, which refuses them.
    """
    try:
        handler = adapter.infer(event, context)
    except RuntimeError:
        return None
    try:
        handler.scope  # noqa: B018 - building it encodes the headers, path and query string
    except UnicodeError:
        return "the request's headers, path or query string are not valid Unicode"
    except (AttributeError, KeyError, TypeError, ValueError):
        return "the request event is malformed"
    try:
        handler.body  # noqa: B018 - building it decodes the body
    except binascii.Error:
        return "the request body is not valid base64 (isBase64Encoded is true)"
    except UnicodeError:
        return "the request body is not valid Unicode"
    except (AttributeError, TypeError, ValueError):
        return "the request body is malformed"
    return None


def _bad_request(message: str) -> dict[str, Any]:
    """A 400 in the shape every HTTP event takes (API Gateway v1 and v2, Function URLs)."""
    from agentscope_serverless.http.errors import error_body
    from agentscope_serverless.log import log_request

    request_id = uuid.uuid4().hex
    log_request(request_id, None, None, 400, 0.0)
    body = error_body("BAD_REQUEST", message, status=400)
    return {
        "statusCode": 400,
        "headers": {"content-type": "application/json", "x-request-id": request_id},
        "body": json.dumps(body, separators=(",", ":")),
        "isBase64Encoded": False,
    }


def make_handler(routers: Sequence[str]) -> LambdaHandler:
    """A Lambda handler serving ``routers`` (plus ``/health``) for Function URL events."""
    import_runtime(routers)
    return _LazyApplication(routers)


__all__ = ["build_app", "import_runtime", "make_handler"]
