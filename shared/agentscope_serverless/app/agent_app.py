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
import importlib
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.runner import (
    FRAMEWORKS,
    LifecycleHandler,
    QueryHandler,
    Runner,
)
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Event,
    Message,
    Role,
    TextContent,
)
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.base import ServiceLifecycleManagerMixin
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.session_history.base import (
    MAX_PAGE_SIZE,
    SessionHistoryService,
)
from agentscope_serverless.settings import Settings

if TYPE_CHECKING:
    from agentscope_serverless.services.sandbox.service import SandboxService

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])
Hook = Callable[..., Any]


class AgentApp(ServiceLifecycleManagerMixin):
    """An agent's handlers and services, and the ways to run them.

    ``before_start(app)`` and ``after_finish(app)`` (sync or async) run around the HTTP
    server's lifetime, with the web application as argument. ``endpoint_path`` is where the
    process endpoint is served, and ``request_model`` (an :class:`AgentRequest` subclass)
    validates its body. ``history_window`` is how many of the session's last messages a run
    hands to the handler (default: the ``AGENT_HISTORY_WINDOW`` setting, 100).
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
        session_history_service: SessionHistoryService | None = None,
        memory_service: MemoryService | None = None,
        state_service: StateService | None = None,
        sandbox_service: SandboxService | None = None,
        with_sandbox: bool = False,
        history_window: int | None = None,
    ) -> None:
        if not endpoint_path.startswith("/"):
            raise ValueError(f"endpoint_path must start with '/', got {endpoint_path!r}")
        if not (isinstance(request_model, type) and issubclass(request_model, AgentRequest)):
            raise TypeError("request_model must be AgentRequest or a subclass of it")
        self.app_name = app_name
        self.app_description = app_description
        self.endpoint_path = endpoint_path
        self.request_model = request_model
        self.before_start = before_start
        self.after_finish = after_finish
        self.framework = "text"
        self.with_sandbox = with_sandbox or sandbox_service is not None
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
        self._query_handler: QueryHandler | None = None
        self._init_handler: LifecycleHandler | None = None
        self._shutdown_handler: LifecycleHandler | None = None
        self._local: tuple[ServiceManager, Runner] | None = None
        #: The settings of in-process runs (``await app.query(...)``); None: the environment's.
        self.settings: Settings | None = None
        self._local_lock = asyncio.Lock()

    def init(self, func: HandlerT) -> HandlerT:
        """Register ``func(self)`` (``self`` is the Runner) to run when the app starts."""
        self._init_handler = func
        return func

    def shutdown(self, func: HandlerT) -> HandlerT:
        """Register ``func(self)`` to run when the app stops."""
        self._shutdown_handler = func
        return func

    @overload
    def query(self, *, framework: str = "text") -> Callable[[HandlerT], HandlerT]: ...

    @overload
    def query(
        self,
        request: AgentRequest | Mapping[str, Any] | str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> Coroutine[Any, Any, AgentResponse]: ...

    def query(
        self,
        request: AgentRequest | Mapping[str, Any] | str | None = None,
        *,
        framework: str | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> Callable[[HandlerT], HandlerT] | Coroutine[Any, Any, AgentResponse]:
        """Register the query handler, or run a request in process.

        ``@app.query(framework="text")`` (or ``"agentscope"``) decorates the handler;
        ``await app.query("hello", user_id=..., session_id=...)`` runs a request (text, a
        dict or an :class:`AgentRequest`) and returns the final :class:`AgentResponse`.
        """
        if request is None:
            return self._register(framework or "text")
        if framework is not None:
            raise TypeError("pass either framework= (to register) or a request (to run)")
        return self._query(_to_request(request, user_id=user_id, session_id=session_id))

    async def stream_query(
        self,
        request: AgentRequest | Mapping[str, Any] | str,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[Event]:
        """The events of one run in process (starting the app on first use)."""
        runner = await self._local_runner()
        async for event in runner.stream_query(
            _to_request(request, user_id=user_id, session_id=session_id)
        ):
            yield event

    def build_services(self, settings: Settings) -> Services:
        """The services a runner of this app uses: those passed in, the rest from ``settings``."""
        from agentscope_serverless.services.factory import (
            create_memory_service,
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
        over the settings' ``AGENT_HISTORY_WINDOW``.
        """
        return Runner(
            self._query_handler,
            framework=self.framework,
            init_handler=self._init_handler,
            shutdown_handler=self._shutdown_handler,
            services=services,
            memory_top_k=memory_top_k,
            settings=settings,
            history_window=(
                self.history_window
                if self.history_window is not None
                else history_window
                if history_window is not None
                else settings.agent_history_window
            ),
        )

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
        self, host: str = "127.0.0.1", port: int = 8090, *, settings: Settings | None = None
    ) -> None:
        """Serve the app over HTTP with every router, until interrupted (Ctrl-C).

        The composition root of a script: ``settings`` default to the environment's.
        """
        import uvicorn

        # The HTTP layer builds on this one: imported when serving, never at module import.
        from agentscope_serverless.http.app import create_app

        uvicorn.run(
            create_app(settings=settings or _root_settings(), agent_app=self), host=host, port=port
        )

    def _register(self, framework: str) -> Callable[[HandlerT], HandlerT]:
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")

        def register(func: HandlerT) -> HandlerT:
            self._query_handler = func
            self.framework = framework
            return func

        return register

    async def _query(self, request: AgentRequest | dict[str, Any]) -> AgentResponse:
        runner = await self._local_runner()
        return await runner.query(request)

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


def _root_settings() -> Settings:
    from agentscope_serverless.settings import get_settings

    return get_settings()


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


def load_agent_app(path: str) -> AgentApp:
    """The :class:`AgentApp` at the import path ``module:attribute``.

    >>> load_agent_app("agentscope_serverless.agents.demo:app").app_name
    'demo'
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"AGENT_APP={path!r} must look like 'module:attribute'")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"AGENT_APP={path!r}: cannot import {module_name!r}: {exc}"
        ) from None
    for name in attribute.split("."):
        found = getattr(found, name, None)
    if not isinstance(found, AgentApp):
        raise ConfigurationError(f"AGENT_APP={path!r} is not an AgentApp")
    return found


__all__ = ["AgentApp", "load_agent_app"]
