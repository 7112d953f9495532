"""Lambda entry points: the shared application for some routers, behind Mangum (buffered).

>>> handler = make_handler(["sessions"])   # in functions/sessions/app.py

Importing this module and making a handler connects to nothing. The first invocation
reads the secrets (``SECRETS_ARN``), builds the application, starts its services once and
keeps them for the life of the execution environment, so later invocations reuse the
connections (Mangum would otherwise start and stop them around every request).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

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
        self._adapter: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self._app: FastAPI | None = None

    def _start(self) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
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


def make_handler(routers: Sequence[str]) -> LambdaHandler:
    """A Lambda handler serving ``routers`` (plus ``/health``) for Function URL events."""
    import_runtime(routers)
    return _LazyApplication(routers)


__all__ = ["build_app", "import_runtime", "make_handler"]
