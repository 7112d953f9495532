"""``create_app``: the one factory of the web application, for any subset of routers::

    settings = load_settings(agent_app="mypkg.agent:app")  # once, where the process starts
    app = create_app(["sessions"], settings=settings)   # one Lambda function per router...
    app = create_app(settings=settings)                 # ...or every router in one server

Routers: ``process`` (``/process`` and ``/compatible-mode/v1/{chat/completions,responses}``),
``sessions``, ``memory``, ``state``, ``sandbox`` (``/sandboxes``), ``runs`` (``/runs``, stored
runs: mounted with ``process`` too, as are A2A and the app's background tasks), ``users``
(``DELETE /users/me/data``); ``/health`` is always there, and the chat page at ``/`` when
the ``WEB_UI`` setting is on. Without a ``routers`` argument every router is mounted,
except ``sandbox`` when no sandbox server is configured (``SANDBOX_BASE_URL``): an embedded
sandbox starts a local server and needs bubblewrap, so it is mounted only when named. The
process router serves
the ``agent_app`` argument, else the one named by the ``AGENT_APP`` setting (imported here,
not at import time). Services are built from settings (or taken from the agent app) and
started in the application's lifespan, which Mangum also runs in Lambda. The agent app's own
routes (``@app.endpoint``, ``@app.task``) come first: on a path and method a router serves
too, the app's answers (a warning names the route it hides), but ``GET /health`` and the
process endpoint are the runtime's alone (such a route is refused). What a user adds to an
application of ``AgentApp.get_fastapi_app()`` (middleware, routes, mounts, exception
handlers) is served by every application built later for that app, and kept inside the
runtime's request context and behind the key: see :class:`RuntimeApplication`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import re
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import fastapi.routing
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, WebSocketRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentscope_serverless import __version__
from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.auth.factory import create_key_store
from agentscope_serverless.collector import keep_pauses_short, stop_keeping_pauses_short
from agentscope_serverless.errors import ConfigurationError, ShutdownError, StartupError
from agentscope_serverless.http.auth import CurrentCaller, KeyedRoute, require_key
from agentscope_serverless.http.context import AppContext
from agentscope_serverless.http.docs import docs_page
from agentscope_serverless.http.errors import error_response, install_error_handlers
from agentscope_serverless.http.guards import guard_added_request, guard_request, install_guards
from agentscope_serverless.http.idempotency import (
    REPLAYED_HEADER,
    install_idempotency,
    only_reads,
)
from agentscope_serverless.http.middleware import (
    BodySizeLimitMiddleware,
    HeadMiddleware,
    RequestContextMiddleware,
    RevokedKeyMiddleware,
    StartupFailureMiddleware,
    WebSocketOriginMiddleware,
)
from agentscope_serverless.http.openapi import (
    ERROR_RESPONSES,
    DocumentationRoute,
    complete_document,
)
from agentscope_serverless.http.routers import health
from agentscope_serverless.log import logger, redact, redact_aws_credentials
from agentscope_serverless.metrics import RunMetrics, run_metrics
from agentscope_serverless.services.container import Services
from agentscope_serverless.settings import Settings, secret_values

if TYPE_CHECKING:
    from agentscope_serverless.app import AgentApp
    from agentscope_serverless.http.routers.a2a import A2AApplication

ROUTERS = ("process", "sessions", "memory", "state", "sandbox", "runs", "users")
# The response headers a page of another origin may read (CORS_ALLOW_ORIGINS).
EXPOSED_HEADERS = (
    "X-Run-Id",
    "X-Session-Id",
    "X-Request-Id",
    "Retry-After",
    "X-Should-Retry",
    REPLAYED_HEADER,
)

_SERVICE_OF_ROUTER = {
    "sessions": "session_history",
    "memory": "memory",
    "state": "state",
    "sandbox": "sandbox",
    "runs": "runs",
}

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]


def create_app(
    routers: Iterable[str] | None = None,
    *,
    settings: Settings,
    agent_app: AgentApp | None = None,
    key_store: KeyStore | None = None,
    check_agent: bool = True,
) -> FastAPI:
    """A FastAPI application with ``routers`` (all of them by default) and ``/health``.

    ``settings`` come from the process's composition root (the CLI, a Lambda entry point, an
    archive's entry command), secrets included; everything below reads them from here.
    ``key_store`` defaults to the one selected by settings (``AUTH_KEYS_BACKEND``).
    ``agent_app`` is checked (:meth:`AgentApp.check`) here unless ``check_agent`` is False
    (an app still being defined): then as the application starts, with the handlers
    registered by then.
    """
    names = _router_names(routers, settings)
    if "process" in names and agent_app is None:
        # The runtime is imported only by an application serving an agent.
        from agentscope_serverless.app import load_agent_app

        agent_app = load_agent_app(settings.agent_app)
    runner = None
    # Deleting a session, or all of a user's data, releases their sandboxes on the sandbox
    # server too (their workspaces hold what their agent wrote), wherever they were made.
    releasing = bool(settings.sandbox_base_url and {"sessions", "users"} & {*names})
    if agent_app is not None:
        services = agent_app.build_services(settings)
    else:
        services = _services_for(names, settings)
    if ("sandbox" in names or releasing) and services.sandbox is None:
        services = dataclasses.replace(services, sandbox=_build_service("sandbox", settings))
    if agent_app is not None and "process" in names:
        runner = agent_app.create_runner(services, settings=settings)
        if check_agent:
            runner.check()
    # The process router records its runs, so it serves the runs routes too.
    if settings.runs_backend == "none":
        names = tuple(name for name in names if name != "runs")
    elif "process" in names and "runs" not in names:
        names = (*names, "runs")
    # Deleting a session, or all of a user's data, deletes their stored runs too.
    erasing = {"runs", "sessions", "users"} & {*names}
    if services.runs is None and settings.runs_backend != "none" and erasing:
        services = dataclasses.replace(services, runs=_build_service("runs", settings))
    recorder = task_executor = None
    if services.runs is not None and "runs" in names:
        from agentscope_serverless.metrics import run_metrics
        from agentscope_serverless.recorder import RunRecorder

        recorder = RunRecorder(services.runs, metrics=run_metrics(settings.metrics_namespace))
        if agent_app is not None and "process" in names:
            task_executor = _task_executor(services.runs, settings)

    from agentscope_serverless.services.factory import create_idempotency_store

    context = AppContext(
        settings=settings,
        key_store=key_store or create_key_store(settings),
        services=services,
        lifecycle=services.manager(),
        agent_app=agent_app,
        runner=runner,
        recorder=recorder,
        task_executor=task_executor,
        idempotency=create_idempotency_store(settings),
    )
    title = f"AgentScope Serverless: {agent_app.app_name}" if agent_app else "AgentScope Serverless"
    description = (agent_app.app_description if agent_app else "") or "Agents as HTTP APIs."
    # An app's FastAPI keyword arguments (AgentScope's): the fields of its documentation.
    metadata = dict(agent_app.fastapi_kwargs) if agent_app is not None else {}
    app = new_application(
        context,
        title=metadata.pop("title", title),
        description=metadata.pop("description", description),
        lifespan=_lifespan(context),
        **metadata,
    )
    # Router modules are imported only when mounted: a function serving one router does
    # not pay for defining the others at cold start.
    if agent_app is not None and "process" in names:
        process = importlib.import_module(f"{__package__}.routers.process")
        include_api_router(
            app, process.build_router(agent_app.endpoint_path, agent_app.request_model)
        )
    for name in ("sessions", "memory", "state", "sandbox", "runs", "users"):
        if name in names:
            include_api_router(app, importlib.import_module(f"{__package__}.routers.{name}").router)
    if agent_app is not None and "process" in names and recorder is not None and _a2a_installed():
        a2a = importlib.import_module(f"{__package__}.routers.a2a")
        app.state.a2a_handler = a2a.mount(app, context)
    if context.task_executor is not None and agent_app is not None:
        tasks = importlib.import_module(f"{__package__}.routers.tasks")
        include_api_router(app, tasks.router)
    if settings.web_ui:
        web = importlib.import_module(f"{__package__}.routers.web")
        app.include_router(web.router)
        app.router.routes.append(web.RootPathRedirect())
    if getattr(app.state, "a2a_handler", None) is not None:
        _refuse_a_taken_card_path(app.router.routes, app.state.a2a_handler)
    if agent_app is not None:
        runtime_routes = list(app.router.routes)
        if context.task_executor is not None:
            tasks = importlib.import_module(f"{__package__}.routers.tasks")
            include_api_router(app, tasks.build_router(agent_app.tasks, context.task_executor))
        if agent_app.custom_endpoints:
            custom = importlib.import_module(f"{__package__}.custom_endpoints")
            include_api_router(app, custom.build_router(agent_app.custom_endpoints))
        kept = {("GET", "/health")}
        if "process" in names:
            kept.add(("POST", agent_app.endpoint_path))
        _warn_of_hidden(app.router.routes[len(runtime_routes) :], runtime_routes, kept)
        app.router.routes[:] = [*app.router.routes[len(runtime_routes) :], *runtime_routes]
        app.kept_routes = kept
    app.runtime_routes = list(app.router.routes)
    if agent_app is not None:
        for source in agent_app.web_applications:
            if isinstance(source, RuntimeApplication):
                source.copy_additions_to(app)
    app.serve_added_routes_first()
    app.mark_built()
    return app


def include_api_router(app: FastAPI, router: APIRouter) -> None:
    """Mount an API router with what every route shares: the request guards (Unicode,
    users, ``Idempotency-Key``) and the documented error answers. Its routes must be keyed
    (``APIRouter(route_class=KeyedRoute)``): the caller is authenticated before the body is
    read."""
    unkeyed = [
        route.path
        for route in router.routes
        if isinstance(route, APIRoute) and not isinstance(route, KeyedRoute)
    ]
    if unkeyed:
        raise TypeError(f"routes that read their body before the key: {', '.join(unkeyed)}")
    app.include_router(router, dependencies=[Depends(guard_request)], responses=ERROR_RESPONSES)


def _warn_of_hidden(
    app_routes: list[BaseRoute], runtime_routes: list[BaseRoute], kept: set[tuple[str, str]]
) -> None:
    """Log each of ``runtime_routes`` that ``app_routes`` (the app's, ``@app.endpoint``,
    ``@app.task``, or a user's, served first) hide: a request both could answer reaches the
    app's. A route hiding one of ``kept`` (method and path: what the runtime cannot do
    without) is refused."""
    served = _paths_and_methods(runtime_routes)
    for path, methods in _paths_and_methods(app_routes):
        for runtime_path, runtime_methods in served:
            shared = _shared_methods(methods, runtime_methods)
            if not shared or not _paths_overlap(path, runtime_path):
                continue
            ours, theirs = f"{', '.join(shared)} {path}", f"{', '.join(shared)} {runtime_path}"
            if any((method, runtime_path) in kept for method in shared):
                raise ConfigurationError(
                    f"the app's route {ours} clashes with the runtime's {theirs}, which "
                    "cannot be replaced: pick another path for it"
                )
            logger.warning(
                "the app's route %s is served in place of the runtime's %s (pick another "
                "path to keep it)",
                ours,
                theirs,
            )


def _refuse_a_taken_card_path(routes: list[BaseRoute], a2a: A2AApplication) -> None:
    """Refuse an ``a2a_config.wellknown_path`` where another of the runtime's ``routes``
    answers ``GET`` (the A2A card's are ``a2a.card_routes``): one before the card's answered
    there, the card silently not served, and one after was hidden. Under ``/a2a/``, the
    HTTP+JSON binding's route stands for the paths the A2A SDK serves there (``/a2a/card`` is
    free, ``/a2a/tasks`` is not); ``/a2a`` itself is the card's (A2A's route there takes
    ``POST``)."""
    agent_app = a2a.context.agent_app
    path = agent_app.a2a_config.wellknown_path if agent_app and agent_app.a2a_config else None
    if not path:
        return
    others: list[BaseRoute] = []
    for route in routes:
        if getattr(route, "a2a", None) is a2a:  # the binding's: the SDK's routes behind it
            if _paths_overlap(path, getattr(route, "path", "")):  # built only then
                others.extend(a2a.router.routes)
        elif route not in a2a.card_routes and not isinstance(route, DocumentationRoute):
            others.append(route)
    for route_path, methods in _paths_and_methods(others):
        if (methods is None or "GET" in methods) and _paths_overlap(path, route_path):
            raise ConfigurationError(
                f"a2a_config.wellknown_path {path!r} is the path of the runtime's route GET "
                f"{route_path}, where the agent card would not be served: pick another path"
            )


# The libraries uvicorn serves WebSocket routes with (either will do).
WEBSOCKET_LIBRARIES = ("websockets", "wsproto")


def _warn_of_unserved_websockets(routes: list[BaseRoute]) -> None:
    """Log, in one line, that the WebSocket routes among ``routes`` cannot be served when no
    WebSocket library is installed: uvicorn would answer each handshake as a plain GET (a
    404), saying only "Unsupported upgrade request" as each comes."""
    flattened: Iterable[Any] = getattr(fastapi.routing, "iter_route_contexts", iter)(routes)
    paths = [
        route.path
        for route in flattened
        if isinstance(getattr(route, "original_route", route), WebSocketRoute)
    ]
    if not paths:
        return
    for library in WEBSOCKET_LIBRARIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(library)
            return
    logger.warning(
        "the app's WebSocket routes (%s) are not served: no WebSocket library is installed, so "
        "the server answers their handshakes 404 (pip install websockets); WebSocket routes "
        "are served by a local server only, Lambda carries no WebSocket",
        ", ".join(paths),
    )


def _paths_and_methods(routes: list[BaseRoute]) -> list[tuple[str, set[str] | None]]:
    """Each route's path and methods (None: every method), an included router's one by one
    (FastAPI's ``iter_route_contexts``; an older FastAPI copied them in, flat)."""
    flattened: Iterable[Any] = getattr(fastapi.routing, "iter_route_contexts", iter)(routes)
    return [
        (route.path, getattr(route, "methods", None))
        for route in flattened
        if isinstance(getattr(route, "path", None), str)
    ]


def _reading_operations(routes: list[BaseRoute]) -> set[tuple[str, str]]:
    """The path and (lowercase) method of each operation whose endpoint only reads (see
    :func:`~agentscope_serverless.http.idempotency.reads_only`), an included router's too."""
    flattened: Iterable[Any] = getattr(fastapi.routing, "iter_route_contexts", iter)(routes)
    return {
        (route.path, method.lower())
        for route in flattened
        if only_reads(getattr(getattr(route, "original_route", route), "endpoint", None))
        for method in getattr(route, "methods", None) or ()
    }


def _shared_methods(methods: set[str] | None, other: set[str] | None) -> list[str]:
    """The methods both routes answer."""
    if methods is None or other is None:
        return sorted(methods or other or {"*"})
    return sorted(methods & other)


def _paths_overlap(path: str, other: str) -> bool:
    """Whether a request path may match both route paths (``{name}`` standing for a
    segment, ``{name:path}`` for the rest of the path)."""
    segments, other_segments = path.split("/"), other.split("/")
    for segment, other_segment in zip(segments, other_segments, strict=False):
        if _REST_OF_PATH.fullmatch(segment) or _REST_OF_PATH.fullmatch(other_segment):
            return True
        if not _segments_overlap(segment, other_segment):
            return False
    return len(segments) == len(other_segments)


# A path parameter matching the rest of a path, slashes included.
_REST_OF_PATH = re.compile(r"\{\w+:path\}")


def _segments_overlap(segment: str, other: str) -> bool:
    if "{" in segment and "{" in other:
        return True
    if "{" in other:
        segment, other = other, segment
    if "{" in segment:
        return compile_path(f"/{segment}")[0].match(f"/{other}") is not None
    return segment == other


class RuntimeApplication(FastAPI):
    """The runtime's FastAPI application, which keeps its own layers around what a user adds
    to it (``add_middleware``, ``include_router``, ``mount``, ``add_exception_handler``...).

    Whatever is added, and whenever, the runtime's request context (request ids, the log
    line, typed errors, secrets masked) stays outermost, with CORS; a user's middleware runs
    just inside it. A user's handler of ``Exception`` (or 500) answers an error no other
    handler maps. A route or mount a user adds needs a key (but one left open with
    :func:`~agentscope_serverless.http.auth.public`), its requests checked as the runtime's
    are (:mod:`~agentscope_serverless.http.guards`), and is matched before the runtime's,
    a warning naming each runtime route it hides; one hiding ``GET /health`` or the process
    endpoint is refused as the application starts.

    What a user adds to an application of ``AgentApp.get_fastapi_app()`` is copied to every
    application built later for that AgentApp (see :meth:`copy_additions_to`).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: The runtime's outermost middleware, outermost first (CORS, start-up failures),
        #: around the request context.
        self.outer_middleware: list[Middleware] = []
        #: Where the request context writes the metric of a request failed (a 5xx).
        self.request_metrics: RunMetrics | None = None
        #: The runtime's routes, once built; routes beyond them are a user's.
        self.runtime_routes: list[BaseRoute] | None = None
        #: The methods and paths no route of a user may hide.
        self.kept_routes: set[tuple[str, str]] = {("GET", "/health")}
        #: Whether the application prints a development key as it starts (its key store
        #: being the embedded one, which has none).
        self.announces_development_key = False
        self._built: tuple[set[int], set[int], dict[Any, Any]] | None = None
        self._settled: set[int] = set()

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document of the application, completed (the headers of each answer, see
        :func:`complete_document`)."""
        if self.openapi_schema is None:
            reads = _reading_operations(self.routes)
            self.openapi_schema = complete_document(super().openapi(), reads=reads)
        return self.openapi_schema

    def mark_built(self) -> None:
        """Record what the application holds now as built for it: what comes later is a
        user's addition (see :meth:`copy_additions_to`)."""
        self._built = (
            {id(route) for route in self.router.routes},
            {id(middleware) for middleware in self.user_middleware},
            dict(self.exception_handlers),
        )

    def copy_additions_to(self, other: FastAPI) -> None:
        """Add to ``other`` what a user added to this application since it was built: its
        routes and mounts, its middleware (in the order added, outside ``other``'s own), its
        exception handlers and its dependency overrides."""
        if self._built is None:
            return
        routes, middleware, handlers = self._built
        other.router.routes.extend(r for r in self.router.routes if id(r) not in routes)
        other.user_middleware[0:0] = [m for m in self.user_middleware if id(m) not in middleware]
        other.exception_handlers.update(
            (kind, handler)
            for kind, handler in self.exception_handlers.items()
            if handlers.get(kind) is not handler
        )
        other.dependency_overrides.update(self.dependency_overrides)

    def serve_added_routes_first(self) -> None:
        """Put the routes a user added before the runtime's, each behind the key unless left
        open (:func:`~agentscope_serverless.http.auth.public`) and its requests checked as the
        runtime's are (:func:`~agentscope_serverless.http.guards.guard_added_request`); a
        warning names each runtime
        route one hides, and one hiding a route the runtime keeps raises
        :class:`ConfigurationError` (the routes left as they were, the runtime's first)."""
        if self.runtime_routes is None:
            return
        runtime = {id(route) for route in self.runtime_routes}
        added = [route for route in self.router.routes if id(route) not in runtime]
        new = [route for route in added if id(route) not in self._settled]
        for route in new:
            require_key(route, guard_added_request)
        served = [route for route in self.router.routes if id(route) in runtime]
        if new:
            _warn_of_hidden(new, served, self.kept_routes)
            self._settled.update(id(route) for route in new)
        self.router.routes[:] = [*added, *served]

    def build_middleware_stack(self) -> ASGIApp:
        # Built once, as the first request or the start of the application comes: whatever
        # the user added by then sits inside the runtime's outermost layers.
        with contextlib.suppress(ConfigurationError):  # raised as the application starts
            self.serve_added_routes_first()
        error_handler = self.exception_handlers.get(Exception) or self.exception_handlers.get(500)
        context = Middleware(
            RequestContextMiddleware, metrics=self.request_metrics, error_handler=error_handler
        )
        outer = [*self.outer_middleware, context]
        inner = self.user_middleware
        self.user_middleware = [*outer, *inner]
        try:
            return super().build_middleware_stack()
        finally:
            self.user_middleware = inner

    def build_middleware(self) -> None:
        """Build the middleware stack now rather than at the first request: a server calls it
        before it serves, so a middleware added with a wrong argument is
        :class:`ConfigurationError` naming it at start-up, not a 500 at every request (and a
        lifespan left unrun)."""
        try:
            self.middleware_stack = self.build_middleware_stack()
        except Exception as exc:
            raise ConfigurationError(
                f"the middleware {_failing_middleware(self.user_middleware)}could not be "
                f"built: {type(exc).__name__}: {exc}"
            ) from exc


def _failing_middleware(added: list[Middleware]) -> str:
    """The name (and a space) of the first of ``added`` that cannot be built, else ''."""

    async def innermost(scope: Any, receive: Any, send: Any) -> None:
        """Never called: what a middleware built to find the failing one wraps."""

    for middleware in added:
        factory = middleware.cls
        try:
            factory(innermost, *middleware.args, **middleware.kwargs)
        except Exception:
            return f"{getattr(factory, '__name__', repr(factory))} "
    return ""


def new_application(
    context: AppContext,
    *,
    title: str,
    description: str,
    lifespan: Lifespan,
    **metadata: Any,
) -> RuntimeApplication:
    """An application with the shared plumbing: errors, request ids, body limit, ``/health``.

    ``metadata`` are FastAPI's fields of the API's documentation (``version``, ``summary``,
    ``openapi_tags``...)."""
    settings = context.settings
    # Kept out of every log line of the application, whatever it serves.
    redact(secret_values(settings))
    redact_aws_credentials()
    open_docs = not settings.docs_require_key
    metadata.setdefault("version", __version__)
    app = RuntimeApplication(
        title=title,
        description=description,
        **metadata,
        lifespan=lifespan,
        redoc_url=None,
        # "/sessions/" is no session id: 404, not a redirect to the listing.
        redirect_slashes=False,
        docs_url=None,  # its own page (see .docs), open or keyed
        openapi_url="/openapi.json" if open_docs else None,
    )
    app.state.context = context
    install_error_handlers(app)
    install_guards(app)
    app.add_middleware(HeadMiddleware)
    install_idempotency(app)
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_bytes=settings.max_request_bytes,
        timeout=settings.request_body_timeout_seconds,
    )
    if settings.auth_mode == "keys":
        app.add_middleware(RevokedKeyMiddleware, key_store=context.key_store)
    app.add_middleware(WebSocketOriginMiddleware, allow_origins=settings.cors_allow_origins)
    # Outside whatever a user adds (see RuntimeApplication), outermost first.
    if settings.cors_allow_origins:
        # Outermost: preflights are answered before anything else, and errors (a 401, a
        # 413) carry the headers a page needs to read them.
        cors = Middleware(
            _CORSMiddleware,
            served_by=app.router,
            allow_origins=list(settings.cors_allow_origins),
            allow_headers=["*"],
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )
        app.outer_middleware.append(cors)
    app.outer_middleware.append(Middleware(StartupFailureMiddleware))
    app.request_metrics = run_metrics(settings.metrics_namespace)
    app.include_router(health.router)
    if open_docs:
        _add_open_docs(app)
    else:
        _add_keyed_docs(app)
    return app


# Why Starlette's CORS refuses a preflight, by the word it names it with.
_PREFLIGHT_FAILURES = {
    "origin": "its origin is not one CORS_ALLOW_ORIGINS allows",
    "method": "its method is not one of {methods}",
    "headers": "it asks for headers not allowed",
    "private-network": "it asks for private network access",
}
# The methods a page may send to a mount whose application lists no routes (any ASGI one).
_ANY_METHOD = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"))


def served_methods(routes: list[BaseRoute]) -> list[str]:
    """The methods ``routes`` take, sorted: each route's, a mounted application's routes'
    (every method a page sends, for one listing none), and ``HEAD`` beside ``GET`` (answered
    on every GET route). A route taking any method (A2A's binding, whose methods its
    documentation routes declare; a redirect) adds none."""
    methods: set[str] = set()
    flattened: Iterable[Any] = getattr(fastapi.routing, "iter_route_contexts", iter)(routes)
    for route in flattened:
        original = getattr(route, "original_route", route)
        if isinstance(original, Mount):
            mounted = original.routes
            methods.update(served_methods(mounted) if mounted else _ANY_METHOD)
        else:
            methods.update(getattr(route, "methods", None) or ())
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


# The header saying how long a browser keeps an allowed preflight.
_MAX_AGE = "access-control-max-age"


class _CORSMiddleware(CORSMiddleware):
    """Starlette's CORS, a refused preflight answered in the error shape, saying why (its
    own answer is the only one in plain text). Preflights are answered here, before the
    middleware giving every other answer ``Cache-Control: no-store``: an allowed one is kept
    by the browser for its ``Access-Control-Max-Age``, and says so to caches too (``private,
    max-age`` of as long: it mirrors the headers its request asked for); a refused one is
    kept by none (``no-store``, without a max age).

    A preflight gets a request context of its own (a request id, its log line), as every
    other answer gets one from the context inside: CORS stays outside that one, whose 500s
    must pass through CORS for a page to read them. An error that context answers a
    preflight with (its path not UTF-8, a failure) carries the headers of a refused
    preflight. The methods allowed are those the routes of ``served_by`` take as the
    middleware is built (the application starts)."""

    def __init__(self, app: ASGIApp, /, *, served_by: APIRouter, **options: Any) -> None:
        super().__init__(app, allow_methods=served_methods(served_by.routes), **options)
        self.preflight_context = RequestContextMiddleware(self.answer_preflight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "OPTIONS":
            headers = Headers(scope=scope)
            if "origin" in headers and "access-control-request-method" in headers:
                cors = _refusal_headers(super().preflight_response(headers))
                await self.preflight_context(scope, receive, _carrying(send, cors))
                return
        await super().__call__(scope, receive, send)

    async def answer_preflight(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.preflight_response(Headers(scope=scope))(scope, receive, send)

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            max_age = response.headers[_MAX_AGE]
            response.headers["Cache-Control"] = f"private, max-age={max_age}"
            return response
        failed = bytes(response.body).decode().removeprefix("Disallowed CORS ").split(", ")
        methods = ", ".join(self.allow_methods)
        why = "; ".join(
            _PREFLIGHT_FAILURES.get(word, word).format(methods=methods) for word in failed
        )
        refused = error_response(400, "BAD_REQUEST", f"this preflight is refused: {why}")
        for name, value in _refusal_headers(response):
            refused.headers[name] = value
        refused.headers["Cache-Control"] = "no-store"
        return refused


def _refusal_headers(preflight: Response) -> list[tuple[str, str]]:
    """The CORS headers of Starlette's answer to a preflight a refusal of it carries (the
    origin allowed, if it is; the methods and headers allowed): all but its max age."""
    return [
        (name, value)
        for name, value in preflight.headers.items()
        if name == "vary" or (name.startswith("access-control-") and name != _MAX_AGE)
    ]


def _carrying(send: Send, cors: list[tuple[str, str]]) -> Send:
    """``send`` giving an answer to a preflight without CORS headers (an error answered
    before the preflight was: its path not UTF-8, a failure) the ``cors`` headers: without
    them, a browser reports a CORS failure, not the error."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            if not any(name.startswith("access-control-") for name in headers):
                for name, value in cors:
                    headers.append(name, value)
        await send(message)

    return sending


def _docs(app: FastAPI, request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")  # an API Gateway stage
    return docs_page(f"{root}/openapi.json", f"{app.title} - docs")


def _openapi(app: FastAPI, request: Request) -> dict[str, Any]:
    """The app's OpenAPI document naming the request's root path (an API Gateway stage) as
    its first server, as FastAPI's own ``/openapi.json`` does: without it, the docs page's
    "Try it out" sent its requests outside the stage."""
    root = request.scope.get("root_path", "").rstrip("/")
    schema = app.openapi()
    servers = schema.get("servers", [])
    if root and app.root_path_in_servers and root not in {s.get("url") for s in servers}:
        schema = {**schema, "servers": [{"url": root}, *servers]}  # the cached one unchanged
    return schema


def _add_open_docs(app: FastAPI) -> None:
    """``/docs``, open as ``/openapi.json`` is."""

    async def docs(request: Request) -> HTMLResponse:
        return _docs(app, request)

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)


def _add_keyed_docs(app: FastAPI) -> None:
    """``/openapi.json`` and ``/docs`` behind the API key, like every other route."""

    async def openapi(caller: CurrentCaller, request: Request) -> JSONResponse:
        return JSONResponse(_openapi(app, request))

    async def docs(caller: CurrentCaller, request: Request) -> HTMLResponse:
        return _docs(app, request)

    app.add_api_route("/openapi.json", openapi, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)


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
        "runs": factory.create_runs_service,
    }
    return builders[name](settings)


# Routers that use several services (the erase route reaches every store of the user;
# deleting a session deletes its agent state too).
_SERVICES_OF_ROUTER = {
    "users": ("session_history", "memory", "state"),
    "sessions": ("session_history", "state"),
}


def _a2a_installed() -> bool:
    """Whether the ``a2a`` extra (the A2A SDK) is installed: A2A is served only then."""
    return importlib.util.find_spec("a2a") is not None


def _task_executor(runs: Any, settings: Settings) -> Any:
    """Where background tasks run: Lambda invocations when ``TASKS_FUNCTION_NAME`` is set."""
    if settings.tasks_function_name:
        from agentscope_serverless.tasks_lambda import LambdaTaskExecutor

        return LambdaTaskExecutor(
            runs,
            settings.tasks_function_name,
            region_name=settings.aws_region,
            endpoint_url=settings.lambda_endpoint_url,
        )
    from agentscope_serverless.tasks import LocalTaskExecutor

    return LocalTaskExecutor(
        runs,
        max_running=settings.tasks_max_running,
        max_per_user=settings.tasks_max_running_per_user,
    )


def _services_for(names: tuple[str, ...], settings: Settings) -> Services:
    built: dict[str, Any] = {}
    for name in names:
        single = _SERVICE_OF_ROUTER.get(name)
        for service in _SERVICES_OF_ROUTER.get(name, (single,) if single else ()):
            if service not in built:
                built[service] = _build_service(service, settings)
    return Services(**built)


async def call_hook(hook: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> None:
    """Call a before-start/after-finish hook, sync or async."""
    if hook is not None:
        result = hook(*args, **kwargs)
        if inspect.isawaitable(result):
            await result


async def _after_finish(hook: Callable[..., Any] | None, app: FastAPI) -> None:
    try:
        await call_hook(hook, app)
    except Exception as exc:
        raise ShutdownError("after_finish", hook, exc) from exc


def _lifespan(context: AppContext) -> Lifespan:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if isinstance(app, RuntimeApplication):
            # A route a user added that the runtime refuses fails the start.
            app.serve_added_routes_first()
            _warn_of_unserved_websockets(app.router.routes)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(context.lifecycle)
            await stack.enter_async_context(context.key_store)
            if context.idempotency is not None:
                await stack.enter_async_context(context.idempotency)
            if context.runner is not None and context.agent_app is not None:
                # As AgentScope Runtime's: the hooks run while the runner is started (its
                # init handler has run), and find it as app.state.runner.
                app.state.runner = context.runner
                context.agent_app.bind_handlers(context.runner)
                context.runner.check()
                await stack.enter_async_context(context.runner)
                # app.query/app.stream_query (an endpoint running the agent) run on it.
                # Recorded as /process runs are (without storing them when runs are not).
                from agentscope_serverless.recorder import RunRecorder

                recorder = context.recorder or RunRecorder(
                    None, metrics=run_metrics(context.settings.metrics_namespace)
                )
                stack.enter_context(context.agent_app.serving(context.runner, recorder))
                before_start = context.agent_app.before_start
                try:
                    await call_hook(before_start, app)
                except Exception as exc:
                    raise StartupError("before_start", before_start, exc) from exc
                stack.push_async_callback(_after_finish, context.agent_app.after_finish, app)
            if context.task_executor is not None:
                stack.push_async_callback(context.task_executor.aclose)
            a2a_handler = getattr(app.state, "a2a_handler", None)
            if a2a_handler is not None:
                stack.push_async_callback(a2a_handler.aclose)
            if context.recorder is not None:
                # Closed first: no agent runs on while the rest waits for its own.
                stack.push_async_callback(context.recorder.aclose)
            # What start-up built lives as long as the process, and what survives a full
            # collection lives long too: later full collections walk only newer objects.
            keep_pauses_short()
            stack.callback(stop_keeping_pauses_short)
            if isinstance(app, RuntimeApplication) and app.announces_development_key:
                from agentscope_serverless.serve import issue_development_key

                # Every route but /health needs a key: the embedded store has none. Issued
                # once the start succeeded: a start that fails prints no key to call it with.
                await issue_development_key(context.key_store)
            yield

    return lifespan


__all__ = [
    "ROUTERS",
    "RuntimeApplication",
    "call_hook",
    "create_app",
    "include_api_router",
    "new_application",
]
