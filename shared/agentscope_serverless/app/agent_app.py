"""``AgentApp``: an agent as an application, in the style of AgentScope Runtime.

>>> app = AgentApp(app_name="echo")
>>> @app.query(framework="text")
... async def query(self, msgs, request=None, **kwargs):
...     yield "You said: " + (msgs[-1].get_text_content() or "")

Then ``app.run(port=8090)`` serves it over HTTP (``/process``, the OpenAI-compatible
endpoints and the service routes), or, in a test or a notebook::

    response = await app.query("hello", user_id="u1", session_id="s1")
    async for event in app.stream_query("hello"):
        ...

Services passed to the constructor are used as they are; the others are built from
settings by the factory (in-memory by default). A ``sandbox_service`` is registered as the
``sandbox`` service, started and stopped with the others (handlers reach it as
``self.services.get("sandbox")``); ``with_sandbox=True`` builds one from settings
(``SANDBOX_BASE_URL``...) when none is given.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import difflib
import importlib
import importlib.util
import os
import pkgutil
import sys
import sysconfig
import traceback
import types
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterator,
    Mapping,
)
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from pydantic import ValidationError

from agentscope_serverless.deployers.adapter.a2a import (
    AgentCardWithRuntimeConfig,
    extract_a2a_config,
)
from agentscope_serverless.deployers.base import DeployManager, DeploymentMode
from agentscope_serverless.errors import (
    ConfigurationError,
    InvalidInputError,
    PermissionDeniedError,
)
from agentscope_serverless.log import logger, redacted
from agentscope_serverless.not_offered import missing_name
from agentscope_serverless.runner import (
    FRAMEWORKS,
    LifecycleHandler,
    QueryHandler,
    Runner,
    handler_name,
    in_init_handler,
)
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Event,
    Message,
    Role,
    TextContent,
)
from agentscope_serverless.services._turn import turn_user_id
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.base import ServiceLifecycleManagerMixin
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.session_history.base import (
    MAX_PAGE_SIZE,
    SessionHistoryService,
)
from agentscope_serverless.settings import Settings, environment_port, port_number, secret_values
from agentscope_serverless.tasks import TaskDefinition

if TYPE_CHECKING:
    from agentscope_serverless.recorder import RecordedRun, RunRecorder
    from agentscope_serverless.services.sandbox.service import SandboxService

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])
T = TypeVar("T")
# The keyword arguments of FastAPI an AgentApp takes, as AgentScope's passes them on: the
# fields of the API's documentation (the rest of the application is this package's).
FASTAPI_METADATA = (
    "title",
    "summary",
    "description",
    "version",
    "terms_of_service",
    "contact",
    "license_info",
    "openapi_tags",
)
# Every framework name AgentScope Runtime knows: one of these registers a handler (and is
# refused when it is not one of ours) rather than being run as a request's text.
_FRAMEWORK_NAMES = (*FRAMEWORKS, "autogen", "langgraph", "agno", "ms_agent_framework")
Hook = Callable[..., Any]


class AgentApp(ServiceLifecycleManagerMixin):
    """An agent's handlers and services, and the ways to run them.

    ``before_start(app)`` and ``after_finish(app)`` (sync or async) run around the HTTP
    server's lifetime, with the web application as argument, while the runner is started
    (after its init handler, before its shutdown handler; ``app.state.runner`` holds it, as
    in AgentScope Runtime). ``endpoint_path`` is where the
    process endpoint is served, and ``request_model`` (an :class:`AgentRequest` subclass)
    validates its body. ``history_window`` is how many of the session's last messages a run
    hands to the handler (default: the ``AGENT_HISTORY_WINDOW`` setting, 100). Other keyword
    arguments are FastAPI's fields of the API's documentation (``title``, ``version``...:
    :data:`FASTAPI_METADATA`), as AgentScope's AgentApp passes them on; any other is refused.
    """

    def __init__(
        self,
        app_name: str = "",
        app_description: str = "",
        endpoint_path: str = "/process",
        request_model: type[AgentRequest] = AgentRequest,
        before_start: Hook | None = None,
        after_finish: Hook | None = None,
        *,
        response_type: str = "sse",
        stream: bool = True,
        runner: Runner | None = None,
        session_history_service: SessionHistoryService | None = None,
        memory_service: MemoryService | None = None,
        state_service: StateService | None = None,
        sandbox_service: SandboxService | None = None,
        with_sandbox: bool = False,
        history_window: int | None = None,
        broker_url: str | None = None,
        backend_url: str | None = None,
        enable_embedded_worker: bool = False,
        a2a_config: Any = None,
        agui_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if not endpoint_path.startswith("/"):
            raise ValueError(f"endpoint_path must start with '/', got {endpoint_path!r}")
        if not (isinstance(request_model, type) and issubclass(request_model, AgentRequest)):
            raise TypeError("request_model must be AgentRequest or a subclass of it")
        if response_type != "sse":
            raise ValueError("response_type must be 'sse' (add \"stream\": false for JSON)")
        if not stream:
            raise ValueError(
                "stream must be True: the process endpoint streams SSE, and a request asks for "
                'the final response as JSON with "stream": false'
            )
        if broker_url or backend_url or enable_embedded_worker:
            raise ConfigurationError(
                "Celery task queues (broker_url, backend_url, enable_embedded_worker) are not "
                "supported: a function's work ends with its request"
            )
        if agui_config is not None:
            raise ConfigurationError(
                "the AG-UI protocol adapter (agui_config) is not supported: an app serves "
                "/process (SSE), the OpenAI Responses and Chat Completions APIs and A2A itself"
            )
        if runner is not None and not isinstance(runner, Runner):
            raise TypeError("runner must be a Runner (or a subclass of it)")
        unknown = sorted(set(kwargs) - set(FASTAPI_METADATA))
        if unknown:
            raise TypeError(
                f"AgentApp() got keyword arguments it does not take: {', '.join(unknown)} "
                f"(of FastAPI's, it takes {', '.join(FASTAPI_METADATA)})"
            )
        self.app_name = app_name
        self.app_description = app_description
        self.endpoint_path = endpoint_path
        self.request_model = request_model
        self.response_type = response_type
        self.stream = stream
        self.before_start = before_start
        self.after_finish = after_finish
        self.a2a_config = None if a2a_config is None else extract_a2a_config(a2a_config)
        self.agui_config = agui_config
        self.fastapi_kwargs = kwargs
        self.framework = runner.framework_type if runner is not None else "text"
        self.with_sandbox = with_sandbox or sandbox_service is not None
        self.custom_endpoints: list[dict[str, Any]] = []
        self._web_applications: list[Any] = []
        self._runner = runner
        if history_window is not None and (
            isinstance(history_window, bool)
            or not isinstance(history_window, int)
            or not 0 <= history_window <= MAX_PAGE_SIZE
        ):
            raise ValueError(f"history_window must be an integer from 0 to {MAX_PAGE_SIZE}")
        self.history_window = history_window
        self._given_services: dict[str, Any] = {
            name: service
            for name, service in (
                ("session_history", session_history_service),
                ("memory", memory_service),
                ("state", state_service),
                ("sandbox", sandbox_service),
            )
            if service is not None
        }
        self.tasks: list[TaskDefinition] = []
        # The skills of the A2A agent card: dicts with name, description, tags, examples.
        self.a2a_skills: list[dict[str, Any]] = []
        self._query_handler: QueryHandler | None = None
        self._init_handler: LifecycleHandler | None = None
        self._shutdown_handler: LifecycleHandler | None = None
        self._local: tuple[ServiceManager, Runner] | None = None
        # The runners of the servers serving this app, each with its event loop and the
        # recorder of its runs.
        self._served: list[tuple[Runner, asyncio.AbstractEventLoop, RunRecorder | None]] = []
        #: The settings of in-process runs (``await app.query(...)``); None: the environment's.
        self.settings: Settings | None = None
        self._local_lock = asyncio.Lock()

    def run_request(self, **fields: Any) -> AgentRequest:
        """The request of a run made from a call of another protocol than the process
        endpoint's (OpenAI-compatible, A2A), as the app's ``request_model``: its handler gets
        the model it declared, with its fields' defaults. A model whose fields the call cannot
        fill (one without a default) is refused, naming them."""
        if self.request_model is AgentRequest:
            return AgentRequest(**fields)
        try:
            return self.request_model(**fields)
        except ValidationError as exc:
            missing = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
            raise InvalidInputError(
                f"the agent's request model {self.request_model.__name__} needs "
                f"{', '.join(missing)}, which this route cannot give: call the process "
                f"endpoint ({self.endpoint_path}) instead",
                field=missing[0] if missing else None,
            ) from None

    def a2a_card(self, base_url: str) -> Any:
        """The A2A agent card of this app served at ``base_url``: its name, description and
        ``a2a_skills``, or what ``a2a_config`` gives of them."""
        from agentscope_serverless.a2a_server import agent_card

        fields = self.a2a_config.card_fields() if self.a2a_config is not None else {}
        return agent_card(
            fields.get("name", self.app_name),
            fields.get("description", self.app_description),
            base_url,
            skills=fields.get("skills", self.a2a_skills),
            version=fields.get("version", "1.0.0"),
        )

    @property
    def runner(self) -> Runner | None:
        """The runner given with ``runner=``, if any."""
        return self._runner

    def endpoint(
        self, path: str, methods: list[str] | None = None
    ) -> Callable[[HandlerT], HandlerT]:
        """Serve the decorated function at ``path`` (``methods`` default: ``["POST"]``).

        The handler is a FastAPI endpoint (its parameters are read from the request), sync
        or async; a generator or async generator streams its items as SSE ``data:`` lines.
        Custom routes need a key like every other route.

        >>> app = AgentApp()
        >>> @app.endpoint("/echo", methods=["POST"])
        ... async def echo(body: dict) -> dict:
        ...     return body
        """
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")

        def register(func: HandlerT) -> HandlerT:
            self.custom_endpoints.append(
                {"path": path, "handler": func, "methods": list(methods or ["POST"])}
            )
            return func

        return register

    def get_fastapi_app(self, **kwargs: Any) -> Any:
        """The web application serving this app (``create_app`` arguments in ``kwargs``; the
        settings default to the app's, else the environment's). Without a ``key_store``, on
        the embedded in-memory one, it prints a development key as it starts, as :meth:`run`
        does.

        What is added to it (middleware, routes, mounts, exception handlers) is served by
        every application built later for this app: ``agentscope-serverless serve``,
        :meth:`run`, a local deployment, the process function on Lambda."""
        # The HTTP layer builds on this one: imported when serving, never at module import.
        from agentscope_serverless.http import create_app

        kwargs.setdefault("settings", self.settings or _root_settings())
        announces = kwargs.get("key_store") is None
        if announces:
            from agentscope_serverless.auth.factory import create_key_store

            kwargs["key_store"] = create_key_store(kwargs["settings"])
        # Commonly called before the handlers below it are registered: the application
        # checks the app as it starts, not here.
        web_app: Any = create_app(agent_app=self, check_agent=False, **kwargs)
        web_app.announces_development_key = announces
        self._web_applications.append(web_app)
        return web_app

    @property
    def web_applications(self) -> list[Any]:
        """The applications :meth:`get_fastapi_app` returned, whose additions every
        application built later for this app serves too."""
        return list(self._web_applications)

    async def deploy(self, deployer: Any, **kwargs: Any) -> dict[str, Any]:
        """Deploy with ``deployer`` (a :class:`DeployManager`): ``deployer.deploy(app=self)``."""
        result: dict[str, Any] = await deployer.deploy(app=self, **kwargs)
        return result

    def init(self, func: HandlerT) -> HandlerT:
        """Register ``func(self)`` (``self`` is the Runner) to run when the app starts."""
        self._init_handler = _replacing("init", self._init_handler, func)
        return func

    def shutdown(self, func: HandlerT) -> HandlerT:
        """Register ``func(self)`` to run when the app stops."""
        self._shutdown_handler = _replacing("shutdown", self._shutdown_handler, func)
        return func

    def task(self, path: str, queue: str = "default") -> Callable[[HandlerT], HandlerT]:
        """Register ``func(payload)`` (sync or async) as a background task served at ``path``.

        ``POST path`` with a JSON body submits it and answers at once with a ``task_id``;
        ``GET /tasks/{task_id}`` gives its status and result. ``queue`` is kept for
        compatibility (there is no broker: tasks run in the server, or as asynchronous
        invocations of the function on Lambda).
        """
        if not path.startswith("/"):
            raise ValueError(f"a task path must start with '/', got {path!r}")

        def register(func: HandlerT) -> HandlerT:
            self.tasks.append(TaskDefinition(path=path, function=func, queue=queue))
            return func

        return register

    @overload
    def query(  # type: ignore[overload-overlap]  # a framework name registers
        self, framework: str | None = "agentscope"
    ) -> Callable[[HandlerT], HandlerT]: ...

    @overload
    def query(
        self,
        request: AgentRequest | Mapping[str, Any] | str,
        /,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> Coroutine[Any, Any, AgentResponse]: ...

    def query(
        self,
        *given: AgentRequest | Mapping[str, Any] | str | None,
        framework: str | None = None,
        request: AgentRequest | Mapping[str, Any] | str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> Callable[[HandlerT], HandlerT] | Coroutine[Any, Any, AgentResponse]:
        """Register the query handler, or run a request in process.

        ``@app.query(framework="text")`` (or ``"agentscope"``, the default as in AgentScope
        Runtime: ``@app.query()`` hands the handler AgentScope ``Msg`` objects) decorates the
        handler; ``await app.query("hello", user_id=..., session_id=...)`` runs a request
        (text, a dict or an :class:`AgentRequest`; ``request=`` also works) and returns the
        final :class:`AgentResponse`. ``framework=`` always registers (a misspelt one is
        refused, not run as a request's text), and so does a lone framework name. In a server
        serving the app, a request runs on the served runner, for the caller's user (see
        :meth:`serving`).
        """
        if len(given) > 1:
            raise TypeError(f"query() takes one request, got {len(given)} arguments")
        first = given[0] if given else None
        if callable(first):  # @app.query without its parentheses, given the handler
            raise TypeError(
                "@app.query takes parentheses: @app.query(framework='text') above a handler "
                "of protocol Messages, or @app.query() for AgentScope Msgs"
            )
        # The one positional argument is AgentScope's framework name or a request's text;
        # framework= is only a framework, so that a misspelt one is refused, not run as text.
        if framework is not None:
            if first is not None or request is not None:
                raise TypeError("pass either framework= (to register) or a request (to run)")
            if user_id is not None or session_id is not None:
                raise TypeError(
                    "framework= registers the query handler, which each run calls for its "
                    "own user and session: user_id and session_id name a run's, given with "
                    "its request, as in await app.query('hello', user_id=..., session_id=...)"
                )
            return self._register(framework)
        if request is None:
            if first is None:
                return self._register("agentscope")
            return _PositionalQuery(self, first, user_id=user_id, session_id=session_id)
        if first is not None:
            raise TypeError("pass the request once: as the argument or as request=")
        return self._query(_to_request(request, user_id=user_id, session_id=session_id))

    async def stream_query(
        self,
        request: AgentRequest | Mapping[str, Any] | str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[Event]:
        """The events of one run in process (starting the app on first use; in a server
        serving the app, on its runner: see :meth:`serving`)."""
        request = _to_request(request, user_id=user_id, session_id=session_id)
        served_loop = self._served_loop_elsewhere()
        if served_loop is not None:
            async for event in _across_loops(served_loop, self.stream_query(request)):
                yield event
            return
        runner, run, recorder = await self._runner_for(request)
        if recorder is None:
            async for event in runner.stream_query(run):
                yield event
            return
        recorded = await _recorded(runner, recorder, run)
        async with contextlib.aclosing(recorded.events()) as events:
            async for event in events:
                yield event

    @contextlib.contextmanager
    def serving(self, runner: Runner, recorder: RunRecorder | None = None) -> Iterator[None]:
        """While a server has ``runner`` started for this app (its lifespan), ``app.query``
        and ``app.stream_query`` called in that server's event loop (an ``@app.endpoint``
        running the agent, as AgentScope's streaming pattern does) run on it, on the served
        services: no second runner is started (nor ``@app.init`` run again), and the turn
        is stored where the server's routes read it. Called for a caller (an endpoint's, a
        run's), the run is that caller's user's: a request naming no user is given theirs,
        and one naming another user is refused (:class:`PermissionDeniedError`), as the
        process endpoint refuses it. With ``recorder`` (the server's), such a run for a
        caller is one of the caller's runs, as a ``/process`` run is: it ends at the time
        limit of the invocation serving it (on Lambda), and is listed and stopped as runs
        are."""
        entry = (runner, asyncio.get_running_loop(), recorder)
        self._served.append(entry)
        try:
            yield
        finally:
            self._served.remove(entry)

    def _served_loop_elsewhere(self) -> asyncio.AbstractEventLoop | None:
        """The event loop of the server serving this app, when called for a caller of it
        from another loop (a sync ``@app.endpoint``'s ``asyncio.run(app.query(...))``, in
        its worker thread): the run is made there, on the served runner, for the caller.
        Refused in ``@app.init``: its runner is not started yet (and a runner started for
        the call would run the same init again, waiting on itself)."""
        if in_init_handler():
            raise RuntimeError(
                "app.query and app.stream_query cannot run in @app.init: the runner is still "
                "starting; run a warm-up turn in a before_start hook (it runs once the runner "
                "is ready)"
            )
        if turn_user_id() is None or not self._served:
            return None
        loop = asyncio.get_running_loop()
        if any(entry[1] is loop for entry in self._served):
            return None
        served_loop = self._served[-1][1]
        return None if served_loop.is_closed() else served_loop

    async def _runner_for(
        self, request: AgentRequest | dict[str, Any]
    ) -> tuple[Runner, AgentRequest | dict[str, Any], RunRecorder | None]:
        """The runner to run ``request`` on, the request as it runs there, and the recorder
        of the run (None: the runner's stream as it is): the served runner of this event
        loop, for the caller's user (recorded when there is a caller), else the in-process
        one."""
        loop = asyncio.get_running_loop()
        served = [entry for entry in self._served if entry[1] is loop]
        if not served:
            return await self._local_runner(), request, None
        runner, _, recorder = served[-1]
        for_caller = _for_caller(request)
        return runner, for_caller, recorder if turn_user_id() is not None else None

    def build_services(self, settings: Settings) -> Services:
        """The services a runner of this app uses: those passed in, the rest from ``settings``."""
        from agentscope_serverless.services.factory import (
            create_memory_service,
            create_runs_service,
            create_session_history_service,
            create_state_service,
        )

        given = self._given_services
        sandbox = given.get("sandbox")
        if self.with_sandbox and sandbox is None:
            from agentscope_serverless.services.sandbox.service import SandboxService

            sandbox = SandboxService.from_settings(settings)
        return Services(
            session_history=given.get("session_history")
            or create_session_history_service(settings),
            memory=given.get("memory") or create_memory_service(settings),
            state=given.get("state") or create_state_service(settings),
            runs=given.get("runs")
            or (create_runs_service(settings) if settings.runs_backend != "none" else None),
            sandbox=sandbox if self.with_sandbox else None,
        )

    def create_runner(
        self,
        services: Services | ServiceManager,
        *,
        settings: Settings,
        memory_top_k: int | None = None,
        history_window: int | None = None,
    ) -> Runner:
        """A runner of this app's handlers on ``services`` (started and stopped by the caller),
        with the ``settings`` its handlers read (``self.settings`` in a handler).

        The app's own ``history_window``, when set, wins over the one passed here, which wins
        over the settings' ``AGENT_HISTORY_WINDOW``. The settings' secret values are scrubbed
        from the error messages of failed runs. With ``runner=`` given to the constructor,
        that runner is used, running the handlers registered with the decorators, if any.
        """
        window = (
            self.history_window
            if self.history_window is not None
            else history_window
            if history_window is not None
            else settings.agent_history_window
        )
        secrets = secret_values(settings)
        if self._runner is not None:
            runner = self._given_runner()
            runner.use_settings(
                settings, memory_top_k=memory_top_k, history_window=window, secrets=secrets
            )
            runner.use_services(services)
            return runner
        return Runner(
            self._query_handler,
            framework=self.framework,
            init_handler=self._init_handler,
            shutdown_handler=self._shutdown_handler,
            services=services,
            memory_top_k=memory_top_k,
            settings=settings,
            secrets=secrets,
            history_window=window,
        )

    def check(self) -> None:
        """Raise :class:`ConfigurationError` when this app cannot serve: no query handler, a
        handler that cannot be called as runs call it, its framework's package missing (see
        :meth:`Runner.check`). Packaging checks it before an archive or a layer is built."""
        runner = (
            self._given_runner()
            if self._runner is not None
            else Runner(
                self._query_handler,
                framework=self.framework,
                init_handler=self._init_handler,
                shutdown_handler=self._shutdown_handler,
            )
        )
        runner.check()

    async def start(self) -> None:
        """Start the in-process runner and its services (done on first query anyway)."""
        await self._local_runner()

    async def stop(self) -> None:
        """Stop the in-process runner and its services."""
        async with self._local_lock:
            local, self._local = self._local, None
        if local is not None:
            services, runner = local
            try:
                await runner.stop()
            finally:
                await services.__aexit__(None, None, None)

    def run(
        self,
        host: str | None = None,
        port: int | None = None,
        web_ui: bool = False,
        *,
        settings: Settings | None = None,
        **kwargs: Any,
    ) -> None:
        """Serve the app over HTTP with every router, until interrupted (Ctrl-C).

        As AgentScope Runtime's ``run()``, ``host`` and ``port`` default to the ``HOST`` and
        ``PORT`` environment variables (what a platform running the script sets), else port
        8080, on the loopback interface (``host="0.0.0.0"`` or ``HOST=0.0.0.0`` in a
        container).

        The composition root of a script: ``settings`` default to the environment's.
        ``kwargs`` go to ``uvicorn.run`` (AgentScope's ``mode`` is taken and has no effect;
        its ``http`` defaults to a protocol closing a connection whose request head is not
        whole within ``request_head_timeout_seconds`` or whose body stalls for
        ``request_body_timeout_seconds``); the chat page is served when
        ``web_ui`` is true.
        """
        if _importing is not None:  # app.run() at the top of a module a server imports
            path, module_name = _importing, _importing.partition(":")[0]
            raise ConfigurationError(
                f"AGENT_APP={path!r}: {module_name!r} calls app.run() as it is imported, which "
                "would serve it apart from this server: call app.run() only under "
                'if __name__ == "__main__":'
            )
        from agentscope_serverless import stopping_server
        from agentscope_serverless.auth.factory import create_key_store
        from agentscope_serverless.head_timeout import head_timeout_protocol
        from agentscope_serverless.http import create_app
        from agentscope_serverless.serve import STOP_GRACE_SECONDS, announce_development_key

        kwargs.pop("mode", None)
        host = host or os.environ.get("HOST") or "127.0.0.1"
        port = port_number(port) if port is not None else environment_port()
        root = settings or _root_settings()
        if web_ui:
            root = root.model_copy(update={"web_ui": True})
        key_store = create_key_store(root)
        served = create_app(settings=root, agent_app=self, key_store=key_store)
        # Every route but /health needs a key: the embedded store has none.
        announce_development_key(key_store)
        kwargs.setdefault(
            "http",
            head_timeout_protocol(
                root.request_head_timeout_seconds, root.request_body_timeout_seconds
            ),
        )
        # Stopped, it waits this long for requests still open (as `serve` does), not for ever.
        kwargs.setdefault("timeout_graceful_shutdown", STOP_GRACE_SECONDS)
        stopping_server.run(served, host=host, port=port, **kwargs)

    def _given_runner(self) -> Runner:
        """The runner given with ``runner=``, running the handlers registered with this app's
        decorators (and their framework) in place of its own, as AgentScope's AgentApp binds
        them onto it."""
        runner = self._runner
        assert runner is not None
        self.bind_handlers(runner)
        return runner

    def bind_handlers(self, runner: Runner) -> None:
        """Have ``runner`` (of :meth:`create_runner`) run the handlers registered with this
        app's decorators: those registered after it was made too (an application built by
        :meth:`get_fastapi_app` before ``@app.query``) as it starts."""
        if self._query_handler is not None:
            runner.query_handler = types.MethodType(self._query_handler, runner)  # type: ignore[method-assign]
            runner.framework_type = self.framework
        if self._init_handler is not None:
            runner.init_handler = types.MethodType(self._init_handler, runner)  # type: ignore[method-assign]
        if self._shutdown_handler is not None:
            runner.shutdown_handler = types.MethodType(self._shutdown_handler, runner)  # type: ignore[method-assign]

    def _register(self, framework: str) -> Callable[[HandlerT], HandlerT]:
        def register(func: HandlerT) -> HandlerT:
            if framework not in FRAMEWORKS:
                raise ValueError(
                    f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}"
                )
            self._query_handler = _replacing("query", self._query_handler, func)
            self.framework = framework
            return func

        return register

    async def _query(self, request: AgentRequest | dict[str, Any]) -> AgentResponse:
        served_loop = self._served_loop_elsewhere()
        if served_loop is not None:
            return await _on_loop(served_loop, self._query(request), contextvars.copy_context())
        runner, run, recorder = await self._runner_for(request)
        if recorder is None:
            return await runner.query(run)
        # Like a /process run, it goes on to its end when its caller is gone.
        return await (await _recorded(runner, recorder, run)).final()

    async def _local_runner(self) -> Runner:
        async with self._local_lock:
            if self._local is None:
                # In process (a test, a notebook) this app is the composition root.
                settings = self.settings or _root_settings()
                services = self.build_services(settings).manager()
                await services.__aenter__()
                runner = self.create_runner(services, settings=settings)
                try:
                    await runner.start()
                except BaseException:
                    await services.__aexit__(None, None, None)
                    raise
                self._local = (services, runner)
            return self._local[1]


class FastAPIAppFactory:
    """AgentScope's name for building the web application of an app."""

    @staticmethod
    def create_app(app: AgentApp | None = None, runner: Runner | None = None, **kwargs: Any) -> Any:
        """The FastAPI application serving ``app`` (or ``runner``, wrapped in an AgentApp)."""
        if app is None:
            if runner is None:
                raise TypeError("create_app() needs an app or a runner")
            app = AgentApp(runner=runner)
        return app.get_fastapi_app(**kwargs)


def _root_settings() -> Settings:
    from agentscope_serverless.settings import get_settings

    return get_settings()


class _PositionalQuery(Coroutine[Any, Any, AgentResponse]):
    """What ``app.query(given)`` gives: awaited (or run as a coroutine), the run of ``given``
    as a request; above a handler, the registration of the framework ``given`` names
    (``@app.query("text")``, as AgentScope Runtime takes it), else a TypeError there and then
    (``@app.query("txt")``: the framework is a keyword, ``framework="text"``). The run starts
    only once awaited, so a mistaken decorator leaves no coroutine never awaited."""

    def __init__(
        self,
        app: AgentApp,
        given: AgentRequest | Mapping[str, Any] | str,
        *,
        user_id: str | None,
        session_id: str | None,
    ) -> None:
        self._app, self._given = app, given
        self._request = _to_request(given, user_id=user_id, session_id=session_id)
        self._named_run = user_id is not None or session_id is not None
        self._run: Coroutine[Any, Any, AgentResponse] | None = None

    def __call__(self, func: HandlerT) -> HandlerT:
        given = self._given
        if isinstance(given, str) and given in _FRAMEWORK_NAMES and not self._named_run:
            return self._app._register(given)(func)
        shown = repr(given) if isinstance(given, str) else f"<{type(given).__name__}>"
        raise TypeError(
            f"@app.query({shown}) runs {shown} as a request: it is not a framework "
            f"({', '.join(FRAMEWORKS)}); framework= is a keyword, as in "
            "@app.query(framework='text') above a handler of protocol Messages"
        )

    def _started(self) -> Coroutine[Any, Any, AgentResponse]:
        if self._run is None:
            self._run = self._app._query(self._request)
        return self._run

    def send(self, value: Any) -> Any:
        return self._started().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._started().throw(typ)
        return self._started().throw(typ, val, tb)

    def close(self) -> None:
        if self._run is not None:
            self._run.close()

    def __await__(self) -> Generator[Any, None, AgentResponse]:
        return self._started().__await__()


def _replacing(kind: str, registered: Hook | None, func: HandlerT) -> HandlerT:
    """``func``, to register in place of ``registered``: a second ``@app.<kind>`` replaces
    the first, as in AgentScope Runtime, and is warned of (a leftover replacing the agent)."""
    if registered is not None:
        logger.warning(
            f"@app.{kind} {handler_name(func)} replaces {handler_name(registered)}, registered "
            f"before it: an app has one {kind} handler"
        )
    return func


def _to_request(
    request: AgentRequest | Mapping[str, Any] | str,
    *,
    user_id: str | None,
    session_id: str | None,
) -> AgentRequest | dict[str, Any]:
    """The request with ``user_id``/``session_id`` applied (the runner validates dicts)."""
    updates = {k: v for k, v in (("user_id", user_id), ("session_id", session_id)) if v}
    if isinstance(request, str):
        text = Message(role=Role.USER, content=[TextContent(text=request)])
        return AgentRequest(input=[text], **updates)
    if isinstance(request, AgentRequest):
        return request.model_copy(update=updates)
    return {**request, **updates}


async def _on_loop(
    loop: asyncio.AbstractEventLoop, call: Coroutine[Any, Any, T], context: contextvars.Context
) -> T:
    """What ``call`` returns, run as a task of ``loop`` (another thread's) in ``context``;
    cancelled with its caller."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def settle(task: asyncio.Task[T]) -> None:
        if done.cancelled():
            return
        if task.cancelled():
            done.cancel()
        elif (error := task.exception()) is not None:
            done.set_exception(error)
        else:
            done.set_result(task.result())

    def start() -> None:
        if done.cancelled():
            call.close()
            return
        task = loop.create_task(call, context=context)
        task.add_done_callback(settle)
        done.add_done_callback(lambda _: loop.call_soon_threadsafe(task.cancel))

    loop.call_soon_threadsafe(start)
    return await asyncio.wrap_future(done)


async def _across_loops(
    loop: asyncio.AbstractEventLoop, events: AsyncIterator[Event]
) -> AsyncIterator[Event]:
    """The items of ``events``, an async generator stepped on ``loop`` (another thread's),
    each step in the caller's context as it was when the first was asked."""
    context = contextvars.copy_context()

    async def step() -> Event | None:
        return await anext(events, None)  # None: the end (no event is None)

    async def close() -> None:
        await cast(AsyncGenerator[Event, None], events).aclose()

    try:
        while (event := await _on_loop(loop, step(), context)) is not None:
            yield event
    finally:
        await _on_loop(loop, close(), context)


async def _recorded(
    runner: Runner, recorder: RunRecorder, request: AgentRequest | dict[str, Any]
) -> RecordedRun:
    """The run of ``request`` (for its caller's user) on ``runner``, started as a recorded
    ``process`` run."""
    run = request if isinstance(request, AgentRequest) else AgentRequest.model_validate(request)
    assert run.user_id is not None
    return await recorder.start(
        runner.stream_query(run), user_id=run.user_id, kind="process", session_id=run.session_id
    )


def _for_caller(request: AgentRequest | dict[str, Any]) -> AgentRequest | dict[str, Any]:
    """``request`` as run for the user the current caller acts as (an ``@app.endpoint``'s,
    a run's), if any: given that user when it names none; refused when it names another."""
    caller = turn_user_id()
    if caller is None:
        return request
    named = request.user_id if isinstance(request, AgentRequest) else request.get("user_id")
    if named is None or named == "":
        if isinstance(request, AgentRequest):
            return request.model_copy(update={"user_id": caller})
        return {**request, "user_id": caller}
    if str(named) != caller:
        raise PermissionDeniedError(
            f"app.query/app.stream_query named user_id {str(named)!r}, but the call it runs "
            f"for acts as user {caller!r}: a run acts only as its caller's user (leave "
            "user_id out to run for them)"
        )
    return request


# The AGENT_APP whose module a server is importing, if any: an app.run() then is refused.
_importing: str | None = None


@contextlib.contextmanager
def importing_agent(path: str) -> Iterator[None]:
    """While the agent ``path`` (``module:attribute``) is imported to be served by another
    server (``serve``, a function, a build's check), its module's ``app.run()`` (a script's,
    outside ``if __name__ == "__main__":``) raises :class:`ConfigurationError` rather than
    serving, and blocking the import, on a port of its own."""
    global _importing
    previous, _importing = _importing, path
    try:
        yield
    finally:
        _importing = previous


def load_agent_app(path: str) -> AgentApp:
    """The :class:`AgentApp` at the import path ``module:attribute``.

    >>> load_agent_app("agentscope_serverless.agents.demo:app").app_name
    'demo'
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"AGENT_APP={path!r} must look like 'module:attribute'")
    try:
        with importing_agent(path):
            found: Any = importlib.import_module(module_name)
    except ConfigurationError:
        raise  # the module's import said what is wrong (app.run() in it...)
    except SyntaxError as exc:
        if exc.filename is not None:
            where = f" ({exc.filename}, line {exc.lineno})"
        elif "null bytes" in exc.msg:  # Python names no file for these
            where = (
                " (a Python file it imports is not UTF-8 text: saved as UTF-16, say; "
                "save it as UTF-8)"
            )
        else:
            where = ""
        raise ConfigurationError(
            f"AGENT_APP={path!r}: cannot import {module_name!r}: {exc.msg}{where}"
        ) from None
    except ImportError as exc:
        raise ConfigurationError(
            f"AGENT_APP={path!r}: cannot import {module_name!r}: {redacted(str(exc))}"
            f"{_where_raised(exc)}" + _import_hint(exc, module_name, attribute)
        ) from None
    except SystemExit as exc:  # a script's habit: the process serving the agent goes on
        raise ConfigurationError(
            f"AGENT_APP={path!r}: importing {module_name!r} called "
            f"sys.exit({redacted(repr(exc.code))})"
        ) from None
    except Exception as exc:  # the module's own code failed (a missing variable, say)
        # Its message may quote a secret it read (an API key refused), as a run's error may.
        raise ConfigurationError(
            f"AGENT_APP={path!r}: importing {module_name!r} raised "
            f"{type(exc).__name__}: {redacted(str(exc))}{_where_raised(exc)}"
        ) from None
    module = found
    missing = object()
    for name in attribute.split("."):
        found = getattr(found, name, missing)
        if found is missing:
            raise ConfigurationError(
                f"AGENT_APP={path!r}: module {module_name!r} has no attribute {attribute!r}"
                + (_shadowed(module_name) or _apps_of(module, module_name))
            )
    if not isinstance(found, AgentApp):
        if isinstance(found, type):
            kind = f"the class {found.__name__}"
        else:
            kind = "None" if found is None else f"a {type(found).__name__}"
        raise ConfigurationError(
            f"AGENT_APP={path!r} is {kind}, not an AgentApp: name the AgentApp object "
            "(app in app = AgentApp(...))" + _apps_of(module, module_name)
        )
    return found


def _apps_of(module: Any, module_name: str) -> str:
    """The AgentApps ``module`` holds, as ``--agent`` names them (a name mistyped: App)."""
    names = [name for name, value in vars(module).items() if isinstance(value, AgentApp)]
    if not names:
        return ""
    return f" (the module's AgentApp: {', '.join(f'{module_name}:{n}' for n in names[:5])})"


def _import_hint(exc: ImportError, module_name: str, attribute: str) -> str:
    """How to make the agent's module import: serve it from its project's folder (a module of
    the project's package imported from inside the package), or install a package it imports
    for the Python serving it (pip may have installed it for another Python)."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing and f"{module_name}.".startswith(f"{missing}."):
        return _own_module_hint(missing, module_name)  # the agent's own module is missing
    origin = _origin(module_name)
    if missing is None:
        # A relative import, in a package's module imported on its own (from inside it).
        package = origin.parent if origin is not None else None
        if "relative import" in str(exc) and package and (package / "__init__.py").is_file():
            return _serve_from(package.parent, origin, attribute)
        return ""
    top = missing.partition(".")[0]
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / top).is_dir() or (folder / f"{top}.py").is_file():  # the project's own
            return _serve_from(folder, origin, attribute)
    return (
        f" (not installed for the Python serving the agent, {sys.executable}: install the "
        f"package providing it with {sys.executable} -m pip install, and list it in the "
        "project's requirements.txt)"
    )


def _own_module_hint(missing: str, module_name: str) -> str:
    """Where the agent's own module ``module_name`` is, Python having found no ``missing``: a
    module of its package misspelt, or a project folder near the working directory (above
    it: served from inside the project; below it: from the folder holding the project)."""
    parent, _, name = missing.rpartition(".")
    package = sys.modules.get(parent) if parent else None
    if package is not None:
        names = [info.name for info in pkgutil.iter_modules(getattr(package, "__path__", []))]
        close = difflib.get_close_matches(name, names, n=1)
        return f" (the package {parent} has no module {name}" + (
            f": {parent}.{close[0]}?)" if close else ")"
        )
    here = Path.cwd()
    below: list[Path] = []
    with contextlib.suppress(OSError):
        below = sorted(path for path in here.iterdir() if path.is_dir())
    module = Path(*module_name.split("."))
    for folder in (here, *here.parents, *below):
        if (folder / f"{module}.py").is_file() or (folder / module / "__init__.py").is_file():
            return _serve_from(folder, None, "")
    return ""


def _serve_from(folder: Path, origin: Path | None, attribute: str) -> str:
    """Serve from ``folder``, naming the module at ``origin`` as imported from there."""
    agent = ""
    if origin is not None and origin.is_relative_to(folder):
        module = origin.parent if origin.name == "__init__.py" else origin.with_suffix("")
        agent = f" as --agent {'.'.join(module.relative_to(folder).parts)}:{attribute}"
    return f" (serve it{agent} from {folder}, or with --app-dir {folder})"


def _origin(module_name: str) -> Path | None:
    """The file of the module ``module_name``, if found."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def _shadowed(module_name: str) -> str:
    """Why a module of the user's is not the one imported, when it is named as one of
    Python's (``calendar.py``: Python's calendar comes first, often imported already)."""
    top = module_name.partition(".")[0]
    if top not in sys.stdlib_module_names:
        return ""
    return (
        f" ({top!r} is Python's own module, imported instead of a module of yours of that "
        f"name: rename yours, {top}_agent.py say)"
    )


def _where_raised(exc: BaseException) -> str:
    """`` (file, line N)``: the last line of the user's own code that ``exc`` went through
    (not Python's, an installed package's or this package's), if any."""
    paths = sysconfig.get_paths()
    package = os.path.dirname(os.path.dirname(__file__))
    others = [
        os.path.realpath(folder) + os.sep
        for folder in (paths["stdlib"], paths["purelib"], paths["platlib"], package)
    ]
    where = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        real = os.path.realpath(filename)
        if not filename.startswith("<") and not real.startswith(tuple(others)):
            where = f" ({filename}, line {line})"
    return where


def __getattr__(name: str) -> Any:
    # AgentScope's module re-exports these; the adapter is imported on first use.
    if name == "ResponseAPIDefaultAdapter":
        from agentscope_serverless.deployers.adapter.responses import ResponseAPIDefaultAdapter

        return ResponseAPIDefaultAdapter
    raise missing_name(__name__, name)


__all__ = [
    "AgentApp",
    "AgentCardWithRuntimeConfig",
    "AgentRequest",
    "DeployManager",
    "DeploymentMode",
    "FastAPIAppFactory",
    "ResponseAPIDefaultAdapter",  # noqa: F822 - imported on first use
    "Runner",
    "extract_a2a_config",
    "load_agent_app",
]
