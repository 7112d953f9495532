"""What the routes of one web application share: settings, key store, services, runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from agentscope_serverless.app import AgentApp
from agentscope_serverless.auth.base import KeyStore
from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.recorder import RunRecorder
from agentscope_serverless.runner import Runner
from agentscope_serverless.services.idempotency import IdempotencyStore
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.settings import Settings
from agentscope_serverless.tasks import TaskExecutor


@dataclass(frozen=True)
class AppContext:
    """The objects built by ``create_app`` for one web application."""

    settings: Settings
    key_store: KeyStore
    services: ServiceManager
    agent_app: AgentApp | None = None
    runner: Runner | None = None
    recorder: RunRecorder | None = None
    task_executor: TaskExecutor | None = None
    idempotency: IdempotencyStore | None = None

    def service(self, name: str) -> Any:
        """The service registered as ``name``."""
        service = self.services.get(name)
        if service is None:
            raise ConfigurationError(f"this application has no {name!r} service")
        return service

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


async def get_context(request: Request) -> AppContext:
    """The :class:`AppContext` of the application serving ``request``.

    A coroutine, like every dependency here: FastAPI runs plain functions in a thread pool.
    """
    context: AppContext = request.app.state.context
    return context


__all__ = ["AppContext", "get_context"]
