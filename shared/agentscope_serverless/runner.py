"""The Runner: one request through an agent handler, streamed as the events of a run.

The handler is called like AgentScope Runtime's query handlers::

    async def query(self, msgs, request=None, **kwargs): ...

where ``self`` is the Runner, ``msgs`` the request's input messages, and ``kwargs`` carry
``request``, ``response`` (the :class:`AgentResponse` being built; a handler may set its
``usage``), ``session`` (the :class:`Session` with the last ``history_window`` messages of its
history, loaded before the call: page through older ones with ``list_messages``) and
``memories`` (long-term memories matching the input; ``[]`` without a memory service). A
handler without ``**kwargs`` gets only those it names (``async def q(self, request,
response)``, as AgentScope Runtime called them, works as written).

An input message whose ``metadata`` holds ``"turn_only": true`` (a responses request's
``instructions``) reaches the handler but is not stored: it is for this turn alone, so a
client sending it with every turn does not pile copies of it up in the session.

A handler may be an async (or plain) generator yielding text pieces, :class:`Message`\\ s or
content parts (``TextContent(text=..., delta=True)`` for a streamed piece; a message yielded
``in_progress`` stays open for the deltas its ``add_delta_content`` returns, until it is
yielded again with another status), a coroutine
returning text or a :class:`Message`, or, with ``framework="agentscope"``, a generator of
AgentScope-style ``(msg, last)`` pairs whose cumulative thinking and text are streamed as
suffixes, and whose tool uses and results become messages of their own (``_Turn.snapshot``).

>>> async def echo(self, msgs, request=None, **kwargs):
...     yield "You said: "
...     yield msgs[-1].get_text_content()
>>> runner = Runner(echo)

Run it with ``async with runner: await runner.query({"input": [...]})``, or stream the
events of CONTRACT §7 with ``runner.stream_query(...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import json
import logging
import sys
import time
import types
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from agentscope_serverless.adapters.agentscope.blocks import block_content
from agentscope_serverless.cancellation import CLEANUP_SECONDS, cancelled_from_outside
from agentscope_serverless.deployers.adapter.protocol_adapter import ProtocolAdapter
from agentscope_serverless.deployers.base import DeployManager
from agentscope_serverless.errors import (
    AgentError,
    AgentScopeServerlessError,
    ConfigurationError,
    InvalidInputError,
    ServiceNotStartedError,
    ShutdownError,
    StartupError,
    StoreUnavailableError,
    hook_name,
)
from agentscope_serverless.log import logger, redact, redacted
from agentscope_serverless.schemas._build import built, set_field
from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Content,
    DataContent,
    Error,
    Event,
    FunctionCall,
    FunctionCallOutput,
    McpCall,
    McpCallOutput,
    Message,
    MessageType,
    Role,
    RunStatus,
    SequenceNumberGenerator,
    TextContent,
    said,
)
from agentscope_serverless.schemas.exception import AppBaseException, UnknownAgentException
from agentscope_serverless.schemas.session import Session
from agentscope_serverless.services._stored import EncodedMessages
from agentscope_serverless.services._turn import AgentWrites, agent_turn, take_repeated
from agentscope_serverless.services._validation import (
    new_or_clean_session_id,
    require_input_ids,
    to_encoded_messages,
    valid_streamed_text,
)
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.base import ServiceLifecycleManagerMixin
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MAX_TOP_K, MemoryService
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.settings import Settings
from agentscope_serverless.threads import ThreadWorker, stepped

FRAMEWORKS = ("text", "agentscope")
# What a run gives its query handler, by name (each only to a handler that takes it).
HANDLER_ARGUMENTS = ("msgs", "request", "response", "session", "memories")
# How many of a session's last messages a run hands to the agent, unless told otherwise.
DEFAULT_HISTORY_WINDOW = 100
AGENT_UNKNOWN_ERROR = "AGENT_UNKNOWN_ERROR"
# The message of the CancelledError that cancels a run (``task.cancel(RUN_CANCELED)``): the
# stream then ends with a ``canceled`` response instead of propagating the cancellation.
RUN_CANCELED = "run canceled"
# The metadata key marking an input message for its turn alone (never stored).
TURN_ONLY = "turn_only"

QueryHandler = Callable[..., Any]
LifecycleHandler = Callable[..., Any]
TurnEnd = Callable[[SessionHistoryService, Session, list[Message], AgentResponse], Awaitable[None]]
"""Saves a turn that completed: appends its messages to the session (raising when they
could not be), and may store the run's final event (the last argument, not sent yet) in
the same write."""
TurnKept = Callable[[], Awaitable[bool]]
"""Says, as a run ends, whether its turn is still to be stored at all."""

FirstTextHeld = Callable[[float], None]
"""Told the ``time.monotonic()`` at which the agent's first piece of text came, in a run
that holds its text back (not streamed: see :data:`GATHERED_TEXT_SECONDS`)."""

# The turn end the next run started in this context saves its turn with, and what says
# whether it keeps its turn at all (taken once).
# Set while a runner's init handler runs (what it calls is not run on a started runner).
_in_init: ContextVar[bool] = ContextVar("in_init", default=False)


def in_init_handler() -> bool:
    """Whether this is called (directly or not) from a runner's init handler (``@app.init``)."""
    return _in_init.get()


_turn_end: ContextVar[list[tuple[TurnEnd, TurnKept]] | None] = ContextVar("turn_end", default=None)
# What the next run started in this context tells of its first text held back (taken once).
_first_text_held: ContextVar[list[FirstTextHeld] | None] = ContextVar(
    "first_text_held", default=None
)

_ROLES = (Role.ASSISTANT, Role.USER, Role.SYSTEM, Role.TOOL)
EventT = TypeVar("EventT", bound=Event)
# A text delta's fields (each delta sets its index, msg_id and text) and the names of those
# given: each delta is built from them, twice as fast as validating its values again.
_delta = TextContent(text="", delta=True, index=0, msg_id="", status=RunStatus.InProgress)
_TEXT_DELTA: dict[str, Any] = dict(_delta.__dict__)
_TEXT_DELTA_SET = frozenset(_delta.model_fields_set)
del _delta
# A run not streamed to its client (``"stream": false``) gathers the agent's pieces of text
# into one delta for at most this long: its events are stored (and followed) all the same,
# in a few deltas rather than one per token.
GATHERED_TEXT_SECONDS = 0.25
# How long the shutdown handler (``@app.shutdown``) may take as the runner stops: one still
# going is cancelled (a WARNING names it), and the stop goes on, so a hook that hangs does not
# keep a stopped server from exiting.
SHUTDOWN_HANDLER_SECONDS = 10.0


class Runner(ServiceLifecycleManagerMixin):
    """Runs requests through a query handler, with session history, memory and state.

    ``services`` (:class:`Services`, or AgentScope's :class:`ServiceManager`) has a
    ``session_history`` service and optionally ``memory`` and ``state``; whoever passes it
    starts and stops it. Without it, the runner builds the services from ``settings`` (read
    from the environment at start when none are given) and manages them itself.
    ``async with runner:`` (or ``start()``/``stop()``) also runs the init and shutdown
    handlers.
    """

    # Whether a reply was empty already (said once at WARNING); a class default, for the
    # subclasses of ported runners that do not call __init__.
    _warned_empty_reply = False

    def __init__(
        self,
        query_handler: QueryHandler | None = None,
        *,
        framework: str = "text",
        init_handler: LifecycleHandler | None = None,
        shutdown_handler: LifecycleHandler | None = None,
        services: ServiceManager | Services | None = None,
        memory_top_k: int | None = None,
        secrets: Iterable[str] = (),
        history_window: int = DEFAULT_HISTORY_WINDOW,
        settings: Settings | None = None,
    ) -> None:
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
        typed = _typed(services)
        if services is not None and typed is not None and typed.session_history is None:
            raise ConfigurationError("the runner needs a 'session_history' service")
        # Handlers given as functions take the runner as first argument, like methods of a
        # subclass; they are bound here so both are called the same way.
        if query_handler is not None:
            self.query_handler = types.MethodType(query_handler, self)  # type: ignore[method-assign]
        if init_handler is not None:
            self.init_handler = types.MethodType(init_handler, self)  # type: ignore[method-assign]
        if shutdown_handler is not None:
            self.shutdown_handler = types.MethodType(shutdown_handler, self)  # type: ignore[method-assign]
        self.framework_type = framework
        self.secrets = [secret for secret in secrets if secret]
        redact(self.secrets)  # from the log lines too: an agent's traceback may quote one
        self._settings = settings
        self._memory_top_k = _memory_top_k(memory_top_k)
        self.history_window = history_window
        self._services = services.manager() if isinstance(services, Services) else services
        self._typed = typed
        self._owns_services = services is None
        self._to_agentscope_msgs: Callable[[list[Message]], list[Any]] | None = None
        # The handler function last called, the keywords it takes and whether it is async.
        self._handler_shape: tuple[object, frozenset[str] | None, bool] | None = None
        self._started = False

    async def query_handler(self, *args: Any, **kwargs: Any) -> Any:
        """The agent: override it in a subclass, or pass a function to the constructor.

        Called with keywords, as AgentScope's: ``query_handler(msgs=..., request=...,
        response=..., session=..., memories=...)``; see the module's documentation for what
        it may produce.
        """
        raise ConfigurationError("no query handler: register one with @app.query(...)")

    async def init_handler(self, *args: Any, **kwargs: Any) -> None:
        """Runs at ``start()``, after the services started (override or pass one)."""

    async def shutdown_handler(self, *args: Any, **kwargs: Any) -> None:
        """Runs at ``stop()``, before the services stop (override or pass one)."""

    @property
    def settings(self) -> Settings:
        """The settings this runner was given by the process's composition root.

        A runner made without settings (in a notebook or a test) reads them from the
        environment when it starts; handlers read them here (the LLM agent's API key...).
        """
        if self._settings is None:
            raise ServiceNotStartedError(type(self).__name__)
        return self._settings

    @property
    def memory_top_k(self) -> int:
        """How many long-term memories a run hands to the handler."""
        if self._memory_top_k is not None:
            return self._memory_top_k
        return self._settings.agent_memory_top_k if self._settings is not None else 5

    @property
    def services(self) -> ServiceManager:
        """The services the runner uses, as AgentScope's :class:`ServiceManager` facade
        (built at ``start()`` when none were passed)."""
        if self._services is None:
            raise ServiceNotStartedError(type(self).__name__)
        return self._services

    @property
    def typed_services(self) -> Services:
        """The same services, typed."""
        if self._typed is None:
            raise ServiceNotStartedError(type(self).__name__)
        return self._typed

    @property
    def session_history_service(self) -> SessionHistoryService:
        """Where conversations are kept (assignable, e.g. in an init handler)."""
        service = self.typed_services.session_history
        assert service is not None  # checked when the services were given or built
        return service

    @session_history_service.setter
    def session_history_service(self, service: SessionHistoryService) -> None:
        self._assign("session_history", service)

    @property
    def session_service(self) -> SessionHistoryService:
        """The session history service, under the name AgentScope Runtime's quickstart gives
        it (``self.session_service = ...`` in an init handler assigns it)."""
        return self.session_history_service

    @session_service.setter
    def session_service(self, service: SessionHistoryService) -> None:
        self.session_history_service = service

    @property
    def memory_service(self) -> MemoryService | None:
        """Long-term memory, when configured (assignable)."""
        return self.typed_services.memory

    @memory_service.setter
    def memory_service(self, service: MemoryService | None) -> None:
        self._assign("memory", service)

    @property
    def state_service(self) -> StateService | None:
        """Agent state, when configured (assignable)."""
        return self.typed_services.state

    @state_service.setter
    def state_service(self, service: StateService | None) -> None:
        self._assign("state", service)

    @property
    def sandbox_service(self) -> Any:
        """The sandbox service, when configured (assignable)."""
        return self.services.get("sandbox")

    @sandbox_service.setter
    def sandbox_service(self, service: Any) -> None:
        self._assign("sandbox", service)

    async def deploy(
        self,
        deploy_manager: DeployManager | None = None,
        endpoint_path: str = "/process",
        stream: bool = True,
        protocol_adapters: list[ProtocolAdapter] | None = None,
        requirements: str | list[str] | None = None,
        extra_packages: list[str] | None = None,
        base_image: str = "python:3.9-slim",
        environment: dict[str, str] | None = None,
        runtime_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Deploy this runner in an AgentApp (default: :class:`LocalDeployManager`).

        ``requirements``, ``extra_packages``, ``base_image`` and ``runtime_config`` are
        AgentScope's image-building inputs, which these deployers do not take. An archive
        (AgentRun, ModelStudio) serves an AgentApp of a module: deploy that instead.
        """
        from agentscope_serverless.app.agent_app import AgentApp

        if requirements or extra_packages or runtime_config:
            raise TypeError("requirements, extra_packages and runtime_config are not supported")
        from agentscope_serverless.deployers.adapter.protocol_adapter import (
            refuse_protocol_adapters,
        )

        refuse_protocol_adapters(protocol_adapters)
        if deploy_manager is None:
            from agentscope_serverless.deployers.local_deployer import LocalDeployManager

            deploy_manager = LocalDeployManager()
        from agentscope_serverless.deployers.archive import (
            ArchiveDeployManager,
            refuse_image_inputs,
        )

        if isinstance(deploy_manager, ArchiveDeployManager):
            refuse_image_inputs(runner=self)
        app = AgentApp(runner=self, endpoint_path=endpoint_path, stream=stream)
        options = {"environment": environment} if environment else {}
        result: dict[str, Any] = await deploy_manager.deploy(app=app, **options, **kwargs)
        return result

    def use_services(self, services: ServiceManager | Services) -> None:
        """Run on ``services`` (started and stopped by the caller) from the next ``start()``."""
        if self._started:
            raise ConfigurationError("the runner is running: stop it before changing services")
        typed = _typed(services)
        if typed is None or typed.session_history is None:
            raise ConfigurationError("the runner needs a 'session_history' service")
        self._services = services.manager() if isinstance(services, Services) else services
        self._typed, self._owns_services = typed, False

    def use_settings(
        self,
        settings: Settings,
        *,
        memory_top_k: int | None = None,
        history_window: int = DEFAULT_HISTORY_WINDOW,
        secrets: Iterable[str] = (),
    ) -> None:
        """Run with ``settings`` from the composition root (what ``AgentApp`` does for a
        runner given to it)."""
        self._memory_top_k = _memory_top_k(memory_top_k)
        self._settings = settings
        self.history_window = history_window
        self.secrets = [secret for secret in secrets if secret]
        redact(self.secrets)  # from the log lines too: an agent's traceback may quote one

    def _assign(self, name: str, service: Any) -> None:
        """Use ``service`` as the ``name`` service from now on.

        As in AgentScope Runtime, whoever assigns a service starts and stops it (typically
        the init and shutdown handlers), so the runner's services no longer manage it.
        """
        if self._services is None:
            from agentscope_serverless.services.factory import create_service_manager

            self._services = create_service_manager(self._root_settings())
        self._services.assign(name, service)
        self._typed = Services.of(self._services)

    def _root_settings(self) -> Settings:
        """The runner's settings; a runner made without them (used on its own, in a notebook
        or a test) is its process's composition root and reads them from the environment."""
        if self._settings is None:
            from agentscope_serverless.settings import get_settings

            self._settings = get_settings()
        return self._settings

    @property
    def is_started(self) -> bool:
        """Whether ``start()`` completed and ``stop()`` was not called since."""
        return self._started

    def check(self) -> None:
        """Raise :class:`ConfigurationError` when this runner cannot serve: no query handler, a
        framework it cannot run, the package of its framework missing, or a handler that needs
        an argument it is not given. A server checks before it serves, so the mistake is one
        line at start-up rather than a failed start or failed runs."""
        self._check_startable()
        problem = _handler_signature_problem(self.query_handler, HANDLER_ARGUMENTS)
        if problem is not None:
            raise ConfigurationError(
                f"the query handler {problem}: it is called with the runner first (self), "
                f"then by name with {', '.join(HANDLER_ARGUMENTS)}, e.g. "
                "async def query(self, msgs, request=None, **kwargs)"
            )
        for kind, handler in (("init", self.init_handler), ("shutdown", self.shutdown_handler)):
            problem = _handler_signature_problem(handler, ())
            if problem is not None:
                raise ConfigurationError(
                    f"the {kind} handler {problem}: it is called with the runner alone, e.g. "
                    f"async def {kind}(self)"
                )

    def _check_startable(self) -> None:
        if "query_handler" not in vars(self) and type(self).query_handler is Runner.query_handler:
            raise ConfigurationError("no query handler: register one with @app.query(...)")
        if self.framework_type not in FRAMEWORKS:
            # A subclass may set it after __init__, as AgentScope's runners do: a framework
            # whose messages are not given to the handler must not run on ours unnoticed.
            raise ConfigurationError(
                f"framework_type must be one of {', '.join(FRAMEWORKS)}, got "
                f"{self.framework_type!r} (AgentScope Runtime's other framework adapters are "
                "not available)"
            )
        if self.framework_type == "agentscope":
            _agentscope_msg_converter()

    async def start(self) -> None:
        """Start owned services and run the init handler (a no-op when already started)."""
        if self._started:
            return
        self._check_startable()
        if self.framework_type == "agentscope":
            self._to_agentscope_msgs = _agentscope_msg_converter()
        # Handlers read ``self.settings`` whether or not the services were given.
        settings = self._root_settings()
        if self._services is None:
            from agentscope_serverless.services.factory import create_service_manager

            self._services = create_service_manager(settings)
            self._typed = Services.of(self._services)
        if self._owns_services:
            await self._services.__aenter__()
        token = _in_init.set(True)
        try:
            await _maybe_await(self.init_handler())
        except BaseException as exc:
            if self._owns_services:
                await self._services.__aexit__(None, None, None)
            if isinstance(exc, Exception):
                raise StartupError("@app.init", self.init_handler, exc) from exc
            raise
        finally:
            _in_init.reset(token)
        self._started = True

    async def stop(self) -> None:
        """Run the shutdown handler and stop owned services."""
        if not self._started:
            return
        self._started = False
        limit = asyncio.timeout(SHUTDOWN_HANDLER_SECONDS)
        try:
            async with limit:
                await _maybe_await(self.shutdown_handler())
        except Exception as exc:
            if not (isinstance(exc, TimeoutError) and limit.expired()):
                raise ShutdownError("@app.shutdown", self.shutdown_handler, exc) from exc
            logger.warning(
                "the @app.shutdown hook %s() did not end within %g s: it was cancelled",
                hook_name(self.shutdown_handler),
                SHUTDOWN_HANDLER_SECONDS,
            )
        finally:
            if self._owns_services and self._services is not None:
                await self._services.__aexit__(None, None, None)

    async def query(
        self,
        request: AgentRequest | Mapping[str, Any],
        *,
        user_id: str | None = None,
        session_id: str | None = None,
    ) -> AgentResponse:
        """Run a request to the end and return the final response (completed or failed)."""
        final: Event | None = None
        async for event in self.stream_query(request, user_id=user_id, session_id=session_id):
            final = event
        assert isinstance(final, AgentResponse)
        return final

    async def stream_query(
        self,
        request: AgentRequest | Mapping[str, Any],
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Event, None]:
        """The events of one run, in the order of CONTRACT §7.

        The session (``session_id``, else ``request.session_id``, else a new uuid) is created
        if new and its last ``history_window`` messages loaded before the agent is called; the
        user is ``user_id``, else ``request.user_id``, else the session id (the handler's
        ``request`` names both).
        Input refused (a message id empty, longer than 512 characters, or given twice; one
        already in the session for a message saying something else: 409) and problems
        loading the session raise before the first event; an agent error ends the
        stream with a ``failed`` response event. Afterwards the input and the agent's messages
        are appended to the history (the input alone when the agent failed; before the agent
        is called when the sender gave an id: see ``_claim_given_ids``) and, with a memory
        service, added to memory. Other ``kwargs`` are passed to the query handler.
        """
        end_turn, keeping = _take_turn_end()
        first_text_held = _take_first_text_held()
        if not self._started:
            raise ServiceNotStartedError(type(self).__name__)
        request = _as_request(request)
        require_input_ids(request.input)
        session_id = new_or_clean_session_id(session_id or request.session_id)
        user = user_id or request.user_id or session_id
        # The input the session holds already (sent again: a retry, or a conversation
        # resent whole) was added to memory when first stored.
        held = await self.session_history_service.refuse_changed_messages(
            user, session_id, request.input, field="input", made_too=take_repeated()
        )
        session = await self.session_history_service.open_session(
            user, session_id, recent=self.history_window
        )
        # The handler's request names the run's session and user, as AgentScope's did.
        request = request.model_copy(update={"session_id": session.id, "user_id": session.user_id})
        memories = await self._recall(user, request.input)
        kept = _stored_input(request.input, session)
        held |= await self._claim_given_ids(session, kept)
        turn = _Turn(
            AgentResponse(session_id=session.id),
            gather=not request.stream,
            first_text_held=first_text_held,
        )
        for event in turn.start():
            yield event
        # What the agent stores itself (as agents written for AgentScope Runtime do) is not
        # stored again: see _turn.
        writes = AgentWrites(session.user_id, session.id)
        # Whether the run's reader closed it (a GeneratorExit at one of its events), as
        # opposed to the agent raising GeneratorExit.
        closed = False
        try:
            try:
                with agent_turn(writes):
                    async with contextlib.aclosing(
                        self._handler_items(turn, request, session, memories, kwargs)
                    ) as items:
                        async for item in items:
                            for event in _fed(turn, item, self.query_handler, items):
                                try:
                                    yield event
                                except GeneratorExit:
                                    closed = True
                                    raise
            except asyncio.CancelledError as exc:
                if cancelled_from_outside():
                    raise
                raise _CancelledWithin() from exc
            except (Exception, SystemExit):
                raise
            except BaseException as exc:
                if closed:
                    raise
                # The agent's KeyboardInterrupt, GeneratorExit or BaseException of its own
                # fails its turn: leaving the run, the first would end the process serving
                # it, the others the run without its end.
                raise _RaisedByAgent() from exc
            for event in turn.end():
                yield event
            if not turn.outputs:  # legitimate at times, but mostly a forgotten return
                # Once a WARNING: an agent that means it would fill the log with them.
                warned, self._warned_empty_reply = self._warned_empty_reply, True
                logger.log(
                    logging.DEBUG if warned else logging.WARNING,
                    f"the query handler {handler_name(self.query_handler)} yielded or "
                    "returned nothing: the reply is empty"
                    + ("" if warned else " (said once; next times at DEBUG)"),
                    extra={"session_id": session.id, "run_id": turn.response.id},
                )
        # sys.exit() in an agent (a script's habit, a CLI library's) fails its turn: it would
        # end the process serving it, and every run in it.
        except (Exception, SystemExit) as exc:
            logged = {
                "session_id": session.id,
                "run_id": turn.response.id,
                "user_id": session.user_id,
            }
            logger.exception("the agent failed", extra=logged)
            if await keeping():
                await self._record_quietly(session, writes, kept, held=held)
            for event in turn.unsent():  # the reply so far, as a streamed run sent it
                yield event
            wrapped = isinstance(exc, _CancelledWithin | _RaisedByAgent)
            failure = exc.__cause__ if wrapped else exc
            yield turn.fail(self._error_of(failure or exc))
            return
        except (asyncio.CancelledError, GeneratorExit) as exc:
            # What was produced so far is kept, the open message as it is.
            partial = [*kept, *turn.interrupt()]
            if await keeping():
                recording = self._record_quietly(session, writes, partial, kept, held=held)
                await asyncio.shield(recording)
            if isinstance(exc, asyncio.CancelledError) and exc.args == (RUN_CANCELED,):
                for event in turn.unsent():
                    yield event
                yield turn.cancel()
                return
            raise
        messages = [*kept, *turn.outputs]
        final = turn.finish()
        try:
            # The agent has finished: a cancellation now comes too late, and cutting the
            # save short (a store's append may take several requests) would lose the turn.
            if await keeping():
                saving = self._save_turn(session, writes, messages, final, end_turn, held)
                await _despite_run_cancel(saving)
        except Exception as exc:
            logged = {
                "session_id": session.id,
                "run_id": turn.response.id,
                "user_id": session.user_id,
            }
            logger.exception("could not save the session history", extra=logged)
            turn.retract(final)
            yield turn.fail(self._error_of(exc))
            return
        yield final

    async def _claim_given_ids(self, session: Session, kept: list[Message]) -> set[str]:
        """Store the input ``kept`` before the agent is called when its sender gave one of
        its ids, refusing (409) one the session holds for a message saying something else:
        runs sent at once, each with its own text for one id, would otherwise all call the
        agent, and the history keep one of their texts. ``session`` (what the agent reads)
        is left as loaded; the turn's append finds the input stored, and stores it once.

        Returns the ids of ``kept`` another run stored since the session was looked up
        (the same input sent twice at once: a retry racing its first try), which this run
        leaves out of memory: the run whose append stored them adds them."""
        if not any("id" in m.model_fields_set for m in kept):
            return set()
        claiming = Session(id=session.id, user_id=session.user_id)
        # Refused as changed before the session was opened: checked here only for another
        # run that stored one of the ids since.
        stored = await self.session_history_service.append_new_messages(
            claiming, kept, field="input", checked=True
        )
        return {m.id for m in kept} - stored

    async def _save_turn(
        self,
        session: Session,
        writes: AgentWrites,
        messages: list[Message],
        final: AgentResponse,
        end_turn: TurnEnd | None,
        held: set[str],
    ) -> None:
        """Append a completed turn's messages to the session (raising when they could not
        be), then add them to memory but those the session ``held`` before the turn; either
        is left to an agent that did it itself. The messages are checked and encoded once,
        for both."""
        if writes.history:
            pass  # the agent stored its turn: the run is stored at its end, on its own
        elif end_turn is None:
            messages = EncodedMessages(to_encoded_messages(messages))
            await self.session_history_service.append_message(session, messages)
        else:
            messages = EncodedMessages(to_encoded_messages(messages))
            await end_turn(self.session_history_service, session, messages, final)
        await self._remember_quietly(session, writes, messages, held)

    def _handler_items(
        self,
        turn: _Turn,
        request: AgentRequest,
        session: Session,
        memories: list[Message],
        extra: dict[str, Any],
    ) -> AsyncGenerator[Any, None]:
        """What the query handler produces, as an async generator: the handler's own when
        it is one (each piece then passes through one generator less)."""
        msgs: list[Any] = list(request.input)
        if self._to_agentscope_msgs is not None:
            msgs = self._to_agentscope_msgs(msgs)
        arguments = dict(
            zip(HANDLER_ARGUMENTS, (msgs, request, turn.response, session, memories), strict=True)
        )
        handler = self.query_handler
        taken, is_async = self._shape_of(handler)
        if taken is not None:
            # A handler written for AgentScope Runtime without **kwargs names only what it
            # was given there (request and response; msgs for AgentScope's framework).
            arguments = {name: value for name, value in arguments.items() if name in taken}
        if is_async:
            return items_of(handler(**arguments, **extra))
        return _items_in_a_thread(functools.partial(handler, **arguments, **extra))

    def _shape_of(self, handler: Callable[..., Any]) -> tuple[frozenset[str] | None, bool]:
        """The keyword arguments ``handler`` takes by name (None when it takes any:
        ``**kwargs``), and whether it runs on the loop (a coroutine or async generator
        function). Read once per handler function."""
        function = getattr(handler, "__func__", handler)
        if self._handler_shape is None or self._handler_shape[0] is not function:
            self._handler_shape = (function, keywords_taken(handler), _is_async(handler))
        return self._handler_shape[1], self._handler_shape[2]

    def _error_of(self, exc: BaseException) -> Error:
        """The ``error`` of a failed event, with every configured secret scrubbed out."""
        error = _error_of(exc)
        # Every secret of the process: the runner's, and the agent's own (AGENT_SECRETS_ARN).
        return error.model_copy(update={"message": redacted(error.message)})

    async def _recall(self, user_id: str, messages: list[Message]) -> list[Message]:
        memory = self.memory_service
        if memory is None or not messages:
            return []
        try:
            return await memory.search_memory(
                user_id, messages, filters={"top_k": self.memory_top_k}
            )
        except StoreUnavailableError:
            # Memory is best effort, as its writes are: a memory store that is down (memory
            # on Redis, the history on DynamoDB) leaves the agent without its memories, not
            # the user without an answer.
            logger.warning("could not search memory: the run goes on without memories")
            return []

    async def _record_quietly(
        self,
        session: Session,
        writes: AgentWrites,
        messages: list[Message],
        turn_input: list[Message] | None = None,
        *,
        held: set[str],
    ) -> None:
        """Keep the input of a run that did not finish, with what the agent produced so far
        when ``turn_input`` is given (``messages`` then starts with it); when the agent's
        part cannot be stored (it is not valid), the input alone; nothing an agent that
        stores its turn itself has stored. Errors here are only logged."""
        if writes.history:
            await self._remember_quietly(session, writes, messages, held)
            return
        try:
            await self.session_history_service.append_message(session, list(messages))
        except InvalidInputError:
            if turn_input is None or len(turn_input) == len(messages):
                logger.exception("could not save the input of a failed run")
                return
            logger.warning(
                "the agent's partial reply could not be saved: keeping the input alone",
                extra={"session_id": session.id},
            )
            await self._record_quietly(session, writes, turn_input, held=held)
            return
        except Exception:
            logger.exception("could not save the input of a failed run")
        await self._remember_quietly(session, writes, messages, held)

    async def _remember_quietly(
        self, session: Session, writes: AgentWrites, messages: list[Message], held: set[str]
    ) -> None:
        """Add a run's messages to memory, each id once and none the session ``held`` before
        the run (remembered as they were first stored), unless its agent added memories
        itself; memory is best effort, so errors are only logged."""
        memory = self.memory_service
        if memory is None or writes.memory:
            return
        try:
            remembered = _new_to_memory(messages, held)
            if not remembered:
                return
            await memory.add_memory(session.user_id, remembered, session_id=session.id)
        except Exception:
            logger.exception("could not add the run to memory", extra={"session_id": session.id})


def _new_to_memory(messages: list[Message], held: set[str]) -> list[Message]:
    """``messages`` without those whose id is ``held`` or came earlier in them, as the
    history stores them: one message per id (the JSON of :class:`EncodedMessages` kept)."""
    seen = set(held)
    new: list[Message] = []
    for message in messages:
        if message.id not in seen:
            seen.add(message.id)
            new.append(message)
    if isinstance(messages, EncodedMessages):
        return messages if len(new) == len(messages) else messages.subset(new)
    return new


def _stored_input(messages: list[Message], session: Session) -> list[Message]:
    """The input messages a turn stores: all but those for the turn alone (:data:`TURN_ONLY`),
    and a system message the same as the last one of the session's history (clients resend
    their system message with each turn: stored every time, it would fill the session)."""
    kept = [m for m in messages if not for_turn_only(m)]
    if any(m.role == Role.SYSTEM for m in kept):
        # Only then is the history read: an agent that does not read it costs no read.
        history = [m for m in session.messages if isinstance(m, Message)]
        standing = next((said(m) for m in reversed(history) if m.role == Role.SYSTEM), None)
        if standing is not None:
            kept = [m for m in kept if m.role != Role.SYSTEM or said(m) != standing]
    return kept if len(kept) < len(messages) else messages


def for_turn_only(message: Message) -> bool:
    """Whether ``message`` is for its turn alone (:data:`TURN_ONLY`), not stored."""
    return bool(message.metadata) and message.metadata.get(TURN_ONLY) is True  # type: ignore[union-attr]


def _handler_signature_problem(handler: Callable[..., Any], given: Iterable[str]) -> str | None:
    """What keeps ``handler`` (a runner's bound handler) from being called with the runner
    first and the arguments named ``given`` by name, if anything."""
    function = getattr(handler, "__func__", handler)
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    given = frozenset(given)
    name = getattr(function, "__name__", "handler")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if inspect.ismethod(handler):
        if not parameters or parameters[0].kind is inspect.Parameter.KEYWORD_ONLY:
            return f"{name}() takes no parameter for the runner"
        if parameters[0].kind in positional:
            if parameters[0].name in given:
                return f"{name}() takes {parameters[0].name} where the runner comes"
            parameters = parameters[1:]
    for parameter in parameters:
        required = parameter.default is inspect.Parameter.empty
        if not required or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.kind is parameter.POSITIONAL_ONLY:
            return f"{name}() takes {parameter.name!r} by position only"
        if parameter.name not in given:
            return f"{name}() needs {parameter.name!r}, which it is not given"
    return None


def keywords_taken(function: Callable[..., Any]) -> frozenset[str] | None:
    """The names ``function`` takes as keyword arguments; None when it takes any
    (``**kwargs``) or its signature cannot be read."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(parameter.name for parameter in parameters if parameter.kind in named)


def _is_async(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` is a coroutine or async generator function, called on the loop."""
    function = getattr(handler, "__func__", handler)
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


async def _items_in_a_thread(call: Callable[[], Any]) -> AsyncGenerator[Any, None]:
    """The items of a plain function's or generator's ``call``, which runs in a worker thread
    (each of a generator's steps too, in the same thread): a handler that blocks (a sync HTTP
    client, a sleep) holds no other run, nor the server's answers, while it works. The
    thread is a daemon one (see :mod:`~agentscope_serverless.threads`): a handler that never
    returns does not keep the server from exiting."""
    worker = ThreadWorker("agentscope-handler")
    try:
        result = await worker.run(call)
        if not inspect.isgenerator(result):
            async with contextlib.aclosing(items_of(result)) as items:
                async for item in items:
                    yield item
            return
        # Ended early (the run canceled, its reader gone, an item refused): the generator is
        # closed in its thread, in the run's context (its user and request), within
        # CLEANUP_SECONDS (or until the run's cleanup is cut short).
        async with contextlib.aclosing(stepped(worker, result, CLEANUP_SECONDS)) as items:
            async for item in items:
                yield item
    finally:
        worker.close()


def items_of(result: Any) -> AsyncGenerator[Any, None]:
    """The items of a handler's result as an async generator: the result itself when it
    is one (each item then passes through no generator of ours), else those of a generator,
    or the value (awaited first when awaitable)."""
    if inspect.isasyncgen(result):
        return cast(AsyncGenerator[Any, None], result)
    return _other_items(result)


async def _other_items(result: Any) -> AsyncGenerator[Any, None]:
    if inspect.isgenerator(result):
        with contextlib.closing(result) as items:
            for item in items:
                yield item
    else:
        yield await result if inspect.isawaitable(result) else result


def _fed(turn: _Turn, item: Any, handler: Callable[..., Any], items: object) -> list[Event]:
    """The events of ``item``, which ``handler`` produced (``items`` gives them): one the
    turn refuses fails it naming where the handler gave it, in the logged traceback, whose
    frames are the runtime's alone."""
    try:
        return turn.feed(item)
    except AgentError as exc:
        exc.add_note(f"given by the query handler {handler_name(handler)} at {_at(handler, items)}")
        raise


def _at(handler: Callable[..., Any], items: object) -> str:
    """Where ``handler`` gave its last item: the line of its generator (``items`` itself, an
    async generator, waits at that ``yield``), else where its function starts."""
    code = getattr(getattr(handler, "__func__", handler), "__code__", None)
    if not isinstance(code, types.CodeType):
        return "a line unknown"
    frame = getattr(items, "ag_frame", None)
    line = frame.f_lineno if frame is not None and frame.f_code is code else code.co_firstlineno
    return f"{code.co_filename}:{line}"


class _Turn:
    """Turns what a handler produces into the events of one run, numbering them.

    Pieces of text and content deltas go into the open assistant message (opened on the
    first piece); a whole :class:`Message` closes it and is emitted as a message of its own.
    A message the handler streams itself (yielded ``in_progress``, or announced by a part
    naming it) is not closed by another: it stays open, set aside, and a part naming it
    (its ``msg_id``) goes back into it, so messages streamed at once keep their own parts.
    Streamed text is gathered in a list and joined into its content part when the part is
    read (completed, or before any other change), so each piece costs one small event. With
    ``gather``, pieces of text that come one after another are sent as one delta (within
    :data:`GATHERED_TEXT_SECONDS`, and before any other event); ``first_text_held`` is then
    told when the first of them came, which the delta's event does not say.
    """

    def __init__(
        self,
        response: AgentResponse,
        *,
        gather: bool = False,
        first_text_held: FirstTextHeld | None = None,
    ) -> None:
        self.response = response
        self._gather = gather
        self._first_text_held = first_text_held
        # The pieces of text gathered and not yet sent as a delta, where they go (the index
        # of their part, and its message's id), and when the first of them came.
        self._unsent: list[str] = []
        self._unsent_to: tuple[int | None, str] = (None, "")
        self._unsent_since = 0.0
        self.outputs: list[Message] = []
        self._sequence = 0
        self._open: Message | None = None
        # Whether the open message is one the handler streams itself; such messages it
        # left for another (their parts interleaved), open still, by id.
        self._open_own = False
        self._set_aside: dict[str, Message] = {}
        # Of the AgentScope Msg being streamed (``snapshot``): its key, its thinking and text
        # so far, and the message types of its tool calls, by call id.
        self._msg_key: object = None
        self._thought = ""
        self._snapshot = ""
        self._tool_kinds: dict[str, str] = {}
        self._media_sent = 0
        self._text_part: TextContent | None = None
        self._text: list[str] = []
        # The first half of a UTF-16 surrogate pair ending the last piece of text, waiting
        # for its second half in the next piece; of a message set aside, its text part and
        # the half it holds, by the message's id (its next piece brings the second half).
        self._held = ""
        self._held_aside: dict[str, tuple[TextContent, str]] = {}

    def start(self) -> list[Event]:
        return [
            self._emit(self.response.created().model_copy()),
            self._emit(self.response.in_progress().model_copy()),
        ]

    def feed(self, item: Any) -> list[Event]:
        if item is None:
            return []
        if isinstance(item, str):
            return self._gathered(item) if self._gather else self.text(item)
        events = self.unsent()
        if isinstance(item, Message):
            return events + self.message(item)
        if isinstance(item, Content):
            return events + self.content(item)
        kind = type(item).__name__
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bool):
            if _is_agentscope_msg(item[0]):
                return events + self.snapshot(item[0], item[1])
            kind = f"({type(item[0]).__name__}, bool)"
        raise AgentError(
            f"the agent produced a value of unsupported type {kind}: a handler "
            "yields (or returns) text, Messages or content (TextContent...), or AgentScope "
            "(msg, last) pairs"
        )

    def _gathered(self, text: str) -> list[Event]:
        """A piece of text, gathered: its delta is sent with the next pieces."""
        if not text:
            return []
        message, events = self._ensure_open()
        part, piece = self._join_text(message, text)
        if not piece:
            return events
        if not self._unsent:
            self._unsent_to, self._unsent_since = (part.index, message.id), time.monotonic()
            if self._first_text_held is not None:
                self._first_text_held(self._unsent_since)
                self._first_text_held = None
        self._unsent.append(piece)
        if time.monotonic() - self._unsent_since >= GATHERED_TEXT_SECONDS:
            events += self.unsent()
        return events

    def unsent(self) -> list[Event]:
        """The delta of the gathered pieces not sent yet (none when there are none)."""
        if not self._unsent:
            return []
        text = "".join(self._unsent)
        self._unsent = []
        return [self._delta(*self._unsent_to, text)]

    def text(self, text: str) -> list[Event]:
        if not text:
            return []
        message, events = self._ensure_open()
        events += self._stream_text(message, text)
        return events

    def content(self, part: Content) -> list[Event]:
        message, events = self._ensure_open(part.msg_id)
        if isinstance(part, TextContent) and part.delta and part.index is None:
            events += self._stream_text(message, part.text or "")
            return events
        events += self._flush_text()
        if (
            not part.delta
            and part.msg_id == message.id
            and part.index is not None
            and 0 <= part.index < len(message.content or [])
        ):
            # A part of the open message, whole: what ``msg.content_completed(index)``
            # gives back to a handler streaming its own message.
            return events + self._complete_part(message, part)
        if part.delta:
            events.append(self._emit(message.add_delta_content(part.model_copy())))
            return events
        events += self._complete_parts(message)
        if isinstance(part, TextContent):
            events += self._stream_text(message, part.text or "")
            events += self._complete_parts(message)
        else:
            events.append(self._emit(message.add_content(part)))
        return events

    def message(self, message: Message) -> list[Event]:
        """A whole message; or, with ``status`` ``in_progress``, a message the handler
        streams itself as AgentScope's protocol does (``yield msg.in_progress()``, the
        deltas ``msg.add_delta_content(...)`` returns, ``msg.content_completed(i)``, then
        ``yield msg.completed()``): it stays open until it comes back with another status."""
        open_message = self._open
        if (open_message is not None and open_message.id == message.id) or (
            message.id in self._set_aside
        ):
            open_message, events = self._ensure_open(message.id)
            return events + self._update_open(open_message, message)
        try:
            opened = Message(
                id=message.id,
                type=message.type,
                role=message.role or Role.ASSISTANT,
                code=message.code,
                message=message.message,
                usage=message.usage,
                metadata=message.metadata if message.metadata is not None else {},
            )
        except ValidationError as exc:  # a field set by assignment, which pydantic lets by
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            raise AgentError(
                f"the Message the agent yielded is not valid: {field}: {first['msg']}"
            ) from None
        events = self._leave_open()
        events += self._open_message(opened, own=message.status == RunStatus.InProgress)
        for part in message.content or []:
            fresh = {"delta": False, "index": None, "msg_id": None, "status": None}
            events += self.content(part.model_copy(update=fresh))
        if message.status != RunStatus.InProgress:
            events += self.close()
        return events

    def _update_open(self, open_message: Message, message: Message) -> list[Event]:
        """The open message, yielded again by the handler: parts it holds that were not
        streamed join it, and any status but ``in_progress`` completes it."""
        events: list[Event] = []
        for part in (message.content or [])[len(open_message.content or []) :]:
            fresh = {"delta": False, "index": None, "msg_id": None, "status": None}
            events += self.content(part.model_copy(update=fresh))
        if message.status == RunStatus.InProgress:
            return events
        for name in ("code", "message", "usage"):
            value = getattr(message, name)
            if value is not None:
                setattr(open_message, name, value)
        if message.metadata:
            open_message.metadata = {**(open_message.metadata or {}), **message.metadata}
        return events + self.close()

    def _complete_part(self, message: Message, part: Content) -> list[Event]:
        """Complete the part of ``message`` at ``part.index`` with ``part``'s value."""
        assert message.content is not None and part.index is not None
        target = message.content[part.index]
        if target.status == RunStatus.Completed:
            return []
        if type(target) is type(part):
            for name in type(part).model_fields:
                if name not in Content.model_fields:
                    setattr(target, name, getattr(part, name))
        completed = message.content_completed(part.index)
        return [] if completed is None else [self._emit(completed)]

    def snapshot(self, msg: Any, last: bool) -> list[Event]:
        """An AgentScope-style ``(msg, last)`` pair, ``msg`` holding its blocks so far, as
        AgentScope Runtime's adapter streams it: thinking as a ``reasoning`` message, text as
        a message, each streamed as the suffix it grew by; once ``last``, its tool uses as
        ``plugin_call`` (``mcp_call``) messages and its tool results as ``plugin_call_output``
        (``mcp_call_output``) messages of the tool. The ``Msg``'s usage goes with them."""
        key = getattr(msg, "id", None) or id(msg)
        events: list[Event] = []
        if key != self._msg_key:
            events += self.close()
            self._msg_key, self._thought, self._snapshot, self._media_sent = key, "", "", 0
        blocks = _agentscope_blocks(msg)
        usage = getattr(msg, "usage", None)
        usage = dict(usage) if isinstance(usage, Mapping) and usage else None
        role = getattr(msg, "role", None)
        role = role if role in _ROLES else Role.ASSISTANT
        thought = "".join(str(b.get("thinking", "")) for b in blocks if b["type"] == "thinking")
        events += self._grow(MessageType.REASONING, Role.ASSISTANT, self._thought, thought, usage)
        self._thought = thought
        text = "".join(str(b.get("text", "")) for b in blocks if b["type"] == "text")
        events += self._grow(MessageType.MESSAGE, role, self._snapshot, text, usage)
        self._snapshot = text
        media = [block for block in blocks if block["type"] in _MEDIA_BLOCKS]
        if len(media) > self._media_sent:
            events += self._open_kind(MessageType.MESSAGE, role, usage)
            for block in media[self._media_sent :]:
                events += self.content(block_content(block))
            self._media_sent = len(media)
        if last:
            events += self.close()
            for block in blocks:
                tool_message = _tool_message(block, self._tool_kinds, usage)
                if tool_message is not None:
                    events += self.message(tool_message)
            self._msg_key, self._thought, self._snapshot, self._media_sent = None, "", "", 0
        return events

    def _grow(
        self, kind: str, role: str, before: str, now: str, usage: dict[str, Any] | None
    ) -> list[Event]:
        """Stream what ``now`` adds to ``before`` in the open message of ``kind`` (opened
        when another kind, or none, is open).

        A ``now`` that does not extend ``before`` (the ``Msg``'s text rewritten, not grown:
        a model's answer cleaned up in its last snapshot, say) is the text from then on, as
        AgentScope Runtime 1.0.5 ends the message with its last snapshot's text: the
        message's last text part takes it, sent whole as that part's ``completed`` event
        (the deltas sent before cannot be taken back: a client shows a part's completed
        text in place of its deltas, as the message completed holds it), and what ``now``
        grows by later streams in a new part. So the message never holds the text before
        and after, one after the other.

        A message opened again for the same ``Msg`` (its thinking grew after its text, say)
        holds what was added since: what the one closed before it streamed is not sent
        twice."""
        if now == before:
            return []
        events = self._open_kind(kind, role, usage)
        message = self._open
        assert message is not None
        if not now.startswith(before):
            return events + self._rewrite(message, before, now)
        return events + self._stream_text(message, now[len(before) :])

    def _rewrite(self, message: Message, before: str, now: str) -> list[Event]:
        """The events of ``message``'s text, ``before``, rewritten as ``now`` (see
        :meth:`_grow`): its last text part completed with what ``now`` says past the text
        of the parts (and messages) before that one, when ``now`` keeps that; else with
        ``now`` whole."""
        events = self._flush_text()
        texts = [(i, p) for i, p in enumerate(message.content or []) if isinstance(p, TextContent)]
        if not texts:
            return [*events, self._emit(message.add_content(TextContent(text=now)))]
        position, last = texts[-1]
        earlier = before[: len(before) - len(last.text or "")]
        last.text = now[len(earlier) :] if now.startswith(earlier) else now
        completed = message.content_completed(position)
        return events + ([] if completed is None else [self._emit(completed)])

    def _open_kind(self, kind: str, role: str, usage: dict[str, Any] | None) -> list[Event]:
        """Have a message of ``kind`` open (a new one, closing another kind's), with
        ``usage`` when given."""
        events: list[Event] = []
        message = self._open
        if message is None or message.type != kind:
            events += self.close()
            message = Message(type=kind, role=role, metadata={})
            events += self._open_message(message)
        if usage is not None:
            message.usage = usage
        return events

    def end(self) -> list[Event]:
        """Close every message still open: the open one, then those the handler streams
        itself and left open for another, in the order it left them."""
        events = self.close()
        for message in self._set_aside.values():
            self._resume(message)
            events += self.close()
        self._set_aside.clear()
        return events

    def close(self) -> list[Event]:
        message = self._open
        if message is None:
            return []
        events = self.unsent()
        events += self._complete_parts(message)
        events.append(self._emit(message.completed()))
        self.outputs.append(message)
        self._open = None
        return events

    def finish(self) -> AgentResponse:
        response = self.response
        response.output = list(self.outputs)
        if response.usage is None:
            response.usage = next((m.usage for m in reversed(self.outputs) if m.usage), None)
        response.completed_at = int(time.time())
        return self._emit(response.completed())

    def retract(self, final: AgentResponse) -> None:
        """``final`` (from :meth:`finish`) was not sent: the next event takes its place."""
        assert final.sequence_number is not None
        self._sequence = final.sequence_number
        final.completed_at = None

    def interrupt(self) -> list[Message]:
        """The messages so far, the open one included with what it holds, ``incomplete``
        (it and its parts still open: the turn ends here; no events are emitted)."""
        if self._open is not None:
            self._held = ""  # not streamed: the turn ends here
            self._flush_text()
            for model in (self._open, *(self._open.content or ())):
                if model.status == RunStatus.InProgress:
                    set_field(model, "status", RunStatus.Incomplete)
            self.outputs.append(self._open)
            self._open = None
        self.outputs += self._set_aside.values()
        self._set_aside.clear()
        self._held_aside.clear()
        return self.outputs

    def cancel(self) -> AgentResponse:
        response = self.response
        response.output = list(self.outputs) or None
        response.completed_at = int(time.time())
        return self._emit(response.canceled())

    def fail(self, error: Error) -> AgentResponse:
        response = self.response
        response.output = list(self.outputs) or None
        return self._emit(response.failed(error))

    def _emit(self, event: EventT) -> EventT:
        set_field(event, "sequence_number", self._sequence)
        self._sequence += 1
        return event

    def _open_message(self, message: Message, *, own: bool = False) -> list[Event]:
        message.in_progress()
        self._open, self._open_own = message, own
        return [self._emit(message.model_copy())]

    def _ensure_open(self, message_id: str | None = None) -> tuple[Message, list[Event]]:
        """The open message, or the one ``message_id`` names: one the handler streams
        itself and left open for another, or a new one when a part of that message comes
        before the message itself, so the message, yielded later, is the same one."""
        open_message = self._open
        if open_message is not None and (not message_id or message_id == open_message.id):
            return open_message, []
        events = self._leave_open()
        message = self._set_aside.pop(message_id, None) if message_id else None
        if message is not None:
            self._resume(message)
            return message, events
        message = Message(role=Role.ASSISTANT, metadata={})
        if message_id:
            message.id = message_id
        return message, events + self._open_message(message, own=bool(message_id))

    def _leave_open(self) -> list[Event]:
        """Leave the open message for another: one the handler streams itself stays open
        (set aside until its parts come again, or it ends); any other is closed."""
        message = self._open
        if message is None or not self._open_own:
            return self.close()
        # A half of a surrogate pair it holds stays its own, for its next piece.
        part, held, self._held = self._text_part, self._held, ""
        events = self._flush_text()
        if part is not None and held:
            self._held_aside[message.id] = (part, held)
        self._set_aside[message.id] = message
        self._open = None
        return events

    def _resume(self, message: Message) -> None:
        """Open again ``message``, set aside, with the half of a surrogate pair it held."""
        self._open, self._open_own = message, True
        aside = self._held_aside.pop(message.id, None)
        if aside is not None:
            part, self._held = aside
            self._text_part, self._text = part, [part.text or ""]

    def _stream_text(self, message: Message, text: str) -> list[Event]:
        """The delta event of ``text``, whose piece joins the open text part of ``message``
        (none while the piece is only half of a surrogate pair)."""
        part, piece = self._join_text(message, text)
        return [self._delta(part.index, message.id, piece)] if piece else []

    def _join_text(self, message: Message, text: str) -> tuple[TextContent, str]:
        """The open text part of ``message`` (a new one when none is open), and the piece of
        ``text`` joined to its pieces: valid Unicode (a model's cut emoji must not end the
        run), a first half of a surrogate pair ending it held for the next piece."""
        part = self._text_part
        if part is None:
            if message.content is None:
                message.content = []
            last = message.content[-1] if message.content else None
            if isinstance(last, TextContent) and last.status != RunStatus.Completed:
                part, self._text = last, [last.text or ""]
            else:
                part = TextContent(
                    text="",
                    index=len(message.content),
                    msg_id=message.id,
                    status=RunStatus.InProgress,
                )
                message.content.append(part)
                self._text = []
            self._text_part = part
        if type(text) is not str:
            text = str.__str__(text)  # a str subclass's value, as validation gives it
        if self._held or not text.isascii():
            text, self._held = valid_streamed_text(self._held + text)
            if not text:
                return part, text
        self._text.append(text)
        return part, text

    def _delta(self, index: int | None, msg_id: str, text: str) -> TextContent:
        fields = _TEXT_DELTA.copy()
        fields["index"], fields["msg_id"], fields["text"] = index, msg_id, text
        return self._emit(built(TextContent, fields, _TEXT_DELTA_SET))

    def _flush_text(self) -> list[Event]:
        """Join the streamed pieces into their content part (before it is read or changed):
        a half of a surrogate pair still held, whose second half never came, ends it as
        U+FFFD, in the delta returned."""
        part = self._text_part
        if part is None:
            return []
        events: list[Event] = []
        if self._held:
            self._held = ""
            self._text.append("\ufffd")
            events.append(self._delta(part.index, part.msg_id or "", "\ufffd"))
        part.text = "".join(self._text)
        self._text_part, self._text = None, []
        return events

    def _complete_parts(self, message: Message) -> list[Event]:
        events = self._flush_text()
        for index, part in enumerate(message.content or []):
            if part.status != RunStatus.Completed:
                completed = message.content_completed(index)
                if completed is not None:
                    events.append(self._emit(completed))
        return events


async def _despite_run_cancel(saving: Awaitable[None]) -> None:
    """Await ``saving`` to its end: the run's cancellation (:data:`RUN_CANCELED`) meanwhile
    is dropped. Any other cancellation cancels ``saving`` too."""
    task = asyncio.ensure_future(saving)
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if exc.args != (RUN_CANCELED,) or current is None:
                task.cancel()
                raise
            current.uncancel()
    task.result()


def end_turns_with(end: TurnEnd, kept: TurnKept | None = None) -> None:
    """Have the next run started in the current context save its turn with ``end`` instead
    of appending to the session history itself (for the recorder storing that run, which
    may then store the run's end in the same write), if ``await kept()`` (when given) holds
    as the run ends: else (its session or its user's data was erased while it ran) nothing of its
    turn is stored. Runs started after it, inside it or in the same context, save their
    own."""
    _turn_end.set([(end, kept or _always)])


def tell_first_text_held(told: FirstTextHeld) -> None:
    """Have the next run started in the current context tell ``told`` when its agent's
    first piece of text came, if the run holds its text back (it is not streamed): the
    recorder measures the time to the first token from it, not from when the text is sent.
    Runs started after it, inside it or in the same context, tell nothing."""
    _first_text_held.set([told])


def _take_first_text_held() -> FirstTextHeld | None:
    told = _first_text_held.get()
    return told.pop() if told else None


def _take_turn_end() -> tuple[TurnEnd | None, TurnKept]:
    ends = _turn_end.get()
    return ends.pop() if ends else (None, _always)


async def _always() -> bool:
    return True


def _as_request(request: AgentRequest | Mapping[str, Any]) -> AgentRequest:
    if isinstance(request, AgentRequest):
        return request
    try:
        return AgentRequest.model_validate(dict(request))
    except ValidationError as exc:
        raise InvalidInputError(
            f"not a valid request: {exc.errors()[0]['msg']}",
            errors=[{"loc": list(err["loc"]), "msg": err["msg"]} for err in exc.errors()],
        ) from None


def _memory_top_k(value: int | None) -> int | None:
    """``value`` when it is None or a number of memories a search takes; refused otherwise,
    as the runner is built: taken, every run failed at its search, answered as the client's
    mistake (422)."""
    if value is None or (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_TOP_K
    ):
        return value
    raise ConfigurationError(
        f"memory_top_k must be an integer from 1 to {MAX_TOP_K} (as AGENT_MEMORY_TOP_K), "
        f"got {value!r:.40}"
    )


def _typed(services: ServiceManager | Services | None) -> Services | None:
    if services is None or isinstance(services, Services):
        return services
    try:
        return Services.of(services)
    except ConfigurationError:
        raise ConfigurationError("the runner needs a 'session_history' service") from None


class _CancelledWithin(Exception):
    """A ``CancelledError`` of the agent's own (a step it awaited was cancelled apart from
    it, see :mod:`~agentscope_serverless.cancellation`), carried out as the failure it is:
    nothing canceled the run."""


class _RaisedByAgent(Exception):
    """An exception of the agent's that is no ``Exception`` (``KeyboardInterrupt``,
    ``GeneratorExit``, a ``BaseException`` subclass of its own; ``SystemExit`` is taken as
    it is), carried out as the failure it is."""


def _error_of(exc: BaseException) -> Error:
    """The ``error`` of a failed event: our errors keep their code and (safe) message."""
    if isinstance(exc, AgentScopeServerlessError):
        return Error(code=exc.code, message=exc.message, retry_after=exc.retry_after)
    unknown = UnknownAgentException(exc)
    return Error(code=AGENT_UNKNOWN_ERROR, message=unknown.message)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _agentscope_msg_converter() -> Callable[[list[Message]], list[Any]]:
    """The adapters' ``message_to_agentscope_msg``: every content part of the input becomes
    a block of the ``Msg`` (text, images, audio), as AgentScope's handlers receive them."""
    try:
        importlib.import_module("agentscope.message")
    except ImportError:
        raise ConfigurationError(
            "framework='agentscope' (the default of @app.query()) needs the agentscope "
            "package: pip install 'agentscope-serverless[agentscope]', or register the "
            "handler with @app.query(framework='text') to get protocol Messages"
        ) from None
    version = str(getattr(sys.modules["agentscope"], "__version__", ""))
    if version and version.split(".")[0] != "1":
        # Its Msg and memory differ: every run would fail, or lose what it stores.
        raise ConfigurationError(
            f"agentscope {version[:40]} is installed; framework='agentscope' needs agentscope "
            "1.x, as AgentScope Runtime 1.0.5: pip install 'agentscope>=1.0,<2'"
        )
    module = importlib.import_module("agentscope_serverless.adapters.agentscope.message")
    return cast(Callable[[list[Message]], list[Any]], module.message_to_agentscope_msg)


# The blocks of an AgentScope ``Msg`` streamed as whole content parts of its message.
_MEDIA_BLOCKS = ("image", "audio", "video")


def _agentscope_blocks(msg: Any) -> list[dict[str, Any]]:
    """The blocks of an AgentScope ``Msg`` (duck-typed: text content is one text block)."""
    content = getattr(msg, "content", None)
    if isinstance(content, list):
        return [
            {**block, "type": str(block.get("type", ""))}
            for block in content
            if isinstance(block, Mapping)
        ]
    return [{"type": "text", "text": _agentscope_text(msg)}]


def _tool_message(
    block: dict[str, Any], kinds: dict[str, str], usage: dict[str, Any] | None
) -> Message | None:
    """The message of a ``tool_use`` block (a call) or a ``tool_result`` block (its
    output), as AgentScope Runtime's adapter makes them; None for other blocks. ``kinds``
    keeps the message type of each call, so that its result is of the matching type."""
    call_id = str(block.get("id") or "")
    name = block.get("name") if isinstance(block.get("name"), str) else None
    if block["type"] == "tool_use":
        arguments = _json_text(block.get("input"))
        call: FunctionCall | McpCall
        if block.get("tool_type") == "mcp":
            kind = MessageType.MCP_TOOL_CALL
            label = block.get("server_label")
            server_label = label if isinstance(label, str) else None
            call = McpCall(
                call_id=call_id, name=name, arguments=arguments, server_label=server_label
            )
        else:
            kind = MessageType.PLUGIN_CALL
            call = FunctionCall(call_id=call_id, name=name, arguments=arguments)
        kinds[call_id] = kind
        content = [DataContent(data=call.model_dump())]
        return Message(type=kind, role=Role.ASSISTANT, content=content, usage=usage)
    if block["type"] == "tool_result":
        output = _json_text(block.get("output"))
        result: FunctionCallOutput | McpCallOutput
        if kinds.get(call_id) == MessageType.MCP_TOOL_CALL:
            kind = MessageType.MCP_TOOL_CALL_OUTPUT
            result = McpCallOutput(call_id=call_id, name=name, output=output)
        else:
            kind = MessageType.PLUGIN_CALL_OUTPUT
            result = FunctionCallOutput(call_id=call_id, name=name, output=output)
        content = [DataContent(data=result.model_dump())]
        return Message(type=kind, role=Role.TOOL, content=content, usage=usage)
    return None


def _json_text(value: Any) -> str:
    """``value`` as JSON text (its ``str()`` when it is not JSON)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def handler_name(handler: Callable[..., Any]) -> str:
    """A handler as logs name it, ``module.qualname`` (of the function a method binds)."""
    function = getattr(handler, "__func__", handler)
    qualname = getattr(function, "__qualname__", type(function).__name__)
    return f"{getattr(function, '__module__', None)}.{qualname}"


def _is_agentscope_msg(value: Any) -> bool:
    """Whether ``value`` reads as an AgentScope ``Msg`` (duck-typed, as
    :func:`_agentscope_text` reads it): text, say, is not one."""
    return hasattr(value, "content") or callable(getattr(value, "get_text_content", None))


def _agentscope_text(msg: Any) -> str:
    """The text of an AgentScope ``Msg`` (duck-typed: ``get_text_content()`` or ``content``)."""
    get_text = getattr(msg, "get_text_content", None)
    if callable(get_text):
        text = get_text()
        return text if isinstance(text, str) else ""
    content = getattr(msg, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        )
    return ""


def __getattr__(name: str) -> Any:
    # AgentScope's runner module re-exports these; they are imported on first use.
    if name == "LocalDeployManager":
        from agentscope_serverless.deployers.local_deployer import LocalDeployManager

        return LocalDeployManager
    if name in ("TraceType", "trace", "merge_agent_response", "get_agent_response_finish_reason"):
        return getattr(importlib.import_module("agentscope_serverless.tracing"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AGENT_UNKNOWN_ERROR",
    "DEFAULT_HISTORY_WINDOW",
    "FRAMEWORKS",
    "RUN_CANCELED",
    "AgentRequest",
    "AgentResponse",
    "AppBaseException",
    "DeployManager",
    "Error",
    "Event",
    "LocalDeployManager",  # noqa: F822 - imported on first use
    "ProtocolAdapter",
    "RunStatus",
    "Runner",
    "SequenceNumberGenerator",
    "TraceType",  # noqa: F822 - imported on first use
    "UnknownAgentException",
    "get_agent_response_finish_reason",  # noqa: F822 - imported on first use
    "merge_agent_response",  # noqa: F822 - imported on first use
    "trace",  # noqa: F822 - imported on first use
]
