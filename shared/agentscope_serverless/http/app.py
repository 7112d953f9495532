"""``create_app``: the one factory of the web application, for any subset of routers.

>>> settings = load_settings(agent_app="mypkg.agent:app")  # once, where the process starts
>>> app = create_app(["sessions"], settings=settings)   # one Lambda function per router...
>>> app = create_app(settings=settings)                 # ...or every router in one server

Routers: ``process`` (``/process`` and ``/compatible-mode/v1/{chat/completions,responses}``),
``sessions``, ``memory``, ``state``, ``sandbox`` (``/sandboxes``); ``/health`` is always
there, and the chat page at ``/`` when the ``WEB_UI`` setting is on. Without a ``routers``
argument every router is mounted, except ``sandbox`` when no sandbox server is configured
(``SANDBOX_BASE_URL``): an embedded sandbox starts a local server and needs bubblewrap, so
it is mounted only when named. The process router serves
the ``agent_app`` argument, else the one named by the ``AGENT_APP`` setting (imported here,
not at import time). Services are built from settings (or taken from the agent app) and
started in the application's lifespan, which Mangum also runs in Lambda.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from fastapi import FastAPI

from agentscope_serverless import __version__
from agentscope_serverless.app import AgentApp, load_agent_app
from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.factory import create_key_store
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.errors import install_error_handlers
from agentscope_serverless.http.middleware import BodySizeLimitMiddleware, RequestContextMiddleware
from agentscope_serverless.http.routers import health
from agentscope_serverless.services.container import Services
from agentscope_serverless.settings import Settings

ROUTERS = ("process", "sessions", "memory", "state", "sandbox")

_SERVICE_OF_ROUTER = {
    "sessions": "session_history",
    "memory": "memory",
    "state": "state",
    "sandbox": "sandbox",
}

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def create_app(
    routers: Iterable[str] | None = None,
    *,
    settings: Settings,
    agent_app: AgentApp | None = None,
    key_store: KeyStore | None = None,
) -> FastAPI:
    """A FastAPI application with ``routers`` (all of them by default) and ``/health``.

    ``settings`` come from the process's composition root (the CLI, a Lambda entry point, an
    archive's entry command), secrets included; everything below reads them from here.
    ``key_store`` defaults to the one selected by settings (``AUTH_KEYS_BACKEND``).
    """
    names = _router_names(routers, settings)
    if "process" in names and agent_app is None:
        agent_app = load_agent_app(settings.agent_app)
    runner = None
    if agent_app is not None:
        services = agent_app.build_services(settings)
        if "sandbox" in names and services.sandbox is None:
            services = dataclasses.replace(services, sandbox=_build_service("sandbox", settings))
        if "process" in names:
            runner = agent_app.create_runner(services, settings=settings)
    else:
        services = _services_for(names, settings)
    context = AppContext(
        settings=settings,
        key_store=key_store or create_key_store(settings),
        services=services,
        lifecycle=services.manager(),
        agent_app=agent_app,
        runner=runner,
    )
    title = f"AgentScope Serverless: {agent_app.app_name}" if agent_app else "AgentScope Serverless"
    app = new_application(
        context,
        title=title,
        description=(agent_app.app_description if agent_app else "") or "Agents as HTTP APIs.",
        lifespan=_lifespan(context),
    )
    # Router modules are imported only when mounted: a function serving one router does
    # not pay for defining the others at cold start.
    if agent_app is not None and "process" in names:
        process = importlib.import_module(f"{__package__}.routers.process")
        app.include_router(process.build_router(agent_app.endpoint_path, agent_app.request_model))
    for name in ("sessions", "memory", "state", "sandbox"):
        if name in names:
            app.include_router(importlib.import_module(f"{__package__}.routers.{name}").router)
    if settings.web_ui:
        app.include_router(importlib.import_module(f"{__package__}.routers.web").router)
    return app


def new_application(
    context: AppContext, *, title: str, description: str, lifespan: Lifespan
) -> FastAPI:
    """An application with the shared plumbing: errors, request ids, body limit, ``/health``."""
    app = FastAPI(
        title=title,
        description=description,
        version=__version__,
        lifespan=lifespan,
        redoc_url=None,
    )
    app.state.context = context
    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=context.settings.max_request_bytes)
    app.add_middleware(RequestContextMiddleware)
    app.include_router(health.router)
    return app


def _router_names(routers: Iterable[str] | None, settings: Settings) -> tuple[str, ...]:
    if routers is None:
        if settings.sandbox_base_url:
            return ROUTERS
        return tuple(name for name in ROUTERS if name != "sandbox")
    names = tuple(dict.fromkeys(routers))
    unknown = [n for n in names if n not in ROUTERS and n != "health"]
    if unknown:
        raise ConfigurationError(
            f"unknown router(s) {', '.join(unknown)}; choose from {', '.join(ROUTERS)}"
        )
    return names


def _build_service(name: str, settings: Settings) -> Any:
    """The service ``name`` built from settings (not started)."""
    if name == "sandbox":
        from agentscope_serverless.services.sandbox.service import SandboxService

        return SandboxService.from_settings(settings)
    from agentscope_serverless.services import factory

    builders = {
        "session_history": factory.create_session_history_service,
        "memory": factory.create_memory_service,
        "state": factory.create_state_service,
    }
    return builders[name](settings)


def _services_for(names: tuple[str, ...], settings: Settings) -> Services:
    built = {
        _SERVICE_OF_ROUTER[name]: _build_service(_SERVICE_OF_ROUTER[name], settings)
        for name in names
        if name in _SERVICE_OF_ROUTER
    }
    return Services(**built)


async def call_hook(hook: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> None:
    """Call a before-start/after-finish hook, sync or async."""
    if hook is not None:
        result = hook(*args, **kwargs)
        if inspect.isawaitable(result):
            await result


def _lifespan(context: AppContext) -> Lifespan:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(context.lifecycle)
            await stack.enter_async_context(context.key_store)
            if context.runner is not None and context.agent_app is not None:
                await call_hook(context.agent_app.before_start, app)
                stack.push_async_callback(call_hook, context.agent_app.after_finish, app)
                await stack.enter_async_context(context.runner)
            # What start-up built lives as long as the process: keep it out of every later
            # garbage collection, whose pauses would otherwise grow with it.
            gc.collect()
            gc.freeze()
            yield

    return lifespan


__all__ = ["ROUTERS", "call_hook", "create_app", "new_application"]
