"""What the routes of one web application share: settings, key store, services, runner."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request

from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.errors import ConfigurationError, ConflictError
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.container import Services
from agentscope_serverless.services.idempotency import IdempotencyStore
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.runs.base import (
    FIRST_WRITE_DELAY,
    STOP_TIMEOUT_SECONDS,
    RunsService,
)
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    # The runtime of an agent: a function serving none (sessions, memory...) never imports it.
    from agentscope_serverless.app import AgentApp
    from agentscope_serverless.recorder import RunRecorder
    from agentscope_serverless.runner import Runner
    from agentscope_serverless.services.sandbox.service import SandboxService
    from agentscope_serverless.tasks import TaskExecutor


# How many times an erase (of a user's data, of a session) goes over the stores while runs
# keep starting during it (see AppContext.erase_while_runs_start).
ERASE_ROUNDS = 3


@dataclass(frozen=True)
class AppContext:
    """The objects built by ``create_app`` for one web application."""

    settings: Settings
    key_store: KeyStore
    services: Services
    lifecycle: ServiceManager
    agent_app: AgentApp | None = None
    runner: Runner | None = None
    recorder: RunRecorder | None = None
    task_executor: TaskExecutor | None = None
    idempotency: IdempotencyStore | None = None

    @property
    def current(self) -> Services:
        """The services the routes use now: the runner's when the app serves an agent (its
        init handler may have assigned one, as in AgentScope), else the application's."""
        return self.runner.typed_services if self.runner is not None else self.services

    @property
    def session_history(self) -> SessionHistoryService:
        """The session history service (the routes that need it are mounted with it)."""
        return _present(self.current.session_history, "session_history")

    @property
    def memory(self) -> MemoryService:
        """The long-term memory service."""
        return _present(self.current.memory, "memory")

    @property
    def state(self) -> StateService:
        """The agent state service."""
        return _present(self.current.state, "state")

    @property
    def runs(self) -> RunsService:
        """The stored runs."""
        return _present(self.current.runs, "runs")

    @property
    def sandbox(self) -> SandboxService:
        """The sandbox service."""
        return _present(self.current.sandbox, "sandbox")

    def executing(self) -> bool:
        """Whether runs or background tasks of this application execute in this process:
        its services must not be closed under them (its requests are not counted)."""
        runs = self.recorder is not None and self.recorder.executing()
        return runs or (self.task_executor is not None and self.task_executor.executing())

    async def stop_runs(self, user_id: str, session_id: str | None = None) -> None:
        """Stop the runs of ``user_id`` in progress (of ``session_id``, when given) and wait
        for their ends, before erasing: else a run would store its turn, and its events, once
        they are gone. This process's runs go first, even those not stored yet; then, through
        the store, those of other processes, listed again once a run started before the call
        is stored (see :meth:`RunsService.stop_runs`)."""
        if self.recorder is not None:
            await self.recorder.stop_local(user_id, session_id, wait=STOP_TIMEOUT_SECONDS)
        if self.current.runs is not None:
            await self.current.runs.stop_runs(user_id, session_id, wait=STOP_TIMEOUT_SECONDS)
        if self.recorder is not None:
            # Those still going (their agents did not stop in time) store nothing more; one
            # running elsewhere stops once it finds its record deleted.
            self.recorder.erase_local(user_id, session_id)

    async def erase_while_runs_start(
        self, erase: Callable[[], Awaitable[None]], user_id: str, session_id: str | None, what: str
    ) -> None:
        """``erase()`` (which stops the runs first), then again while runs of ``user_id``
        (of ``session_id``) are found after it (see :meth:`runs_started`), up to
        :data:`ERASE_ROUNDS` times in all; runs still starting after that are a 409
        (``what``: what was erased, as the error names it)."""
        for _ in range(ERASE_ROUNDS):
            await erase()
            if not await self.runs_started(user_id, session_id):
                return
        raise ConflictError(
            f"runs kept starting while {what} ({ERASE_ROUNDS} times): what they store comes "
            "after it; try again once they have ended"
        )

    async def runs_started(self, user_id: str, session_id: str | None = None) -> bool:
        """Whether runs of ``user_id`` (of ``session_id``, when given) are there after an
        erase deleted their runs: started while it erased (a client sending its next turn at
        once), such a run read what was being erased, and would store its turn after it.
        This process's are seen at once; those of others once stored (a run is stored
        ``FIRST_WRITE_DELAY`` after its start: waited for)."""
        if self.recorder is not None and self.recorder.has_local(user_id, session_id):
            return True
        runs = self.current.runs
        if runs is None:
            return False
        await asyncio.sleep(FIRST_WRITE_DELAY + runs.write_seconds)
        if session_id is None:
            return bool(await runs.recent_runs(user_id, 0.0))
        return bool(await runs.list_runs(user_id, session_id))

    def require_recorder(self) -> RunRecorder:
        """The recorder of this application's runs."""
        if self.recorder is None:
            raise ConfigurationError("this application stores no runs")
        return self.recorder

    def require_runner(self) -> Runner:
        """The runner of the served agent."""
        if self.runner is None:
            raise ConfigurationError("this application serves no agent")
        return self.runner


ServiceT = TypeVar("ServiceT")


def _present(service: ServiceT | None, name: str) -> ServiceT:
    if service is None:
        raise ConfigurationError(f"this application has no {name!r} service")
    return service


async def get_context(request: Request) -> AppContext:
    """The :class:`AppContext` of the application serving ``request``.

    A coroutine, like every dependency here: FastAPI runs plain functions in a thread pool.
    """
    context: AppContext = request.app.state.context
    return context


__all__ = ["ERASE_ROUNDS", "AppContext", "get_context"]
