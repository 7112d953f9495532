"""Build services from settings: the one place that picks and imports a backend.

>>> from agentscope_serverless.settings import load_settings
>>> service = create_session_history_service(load_settings(session_history_backend="in_memory"))
>>> type(service).__name__
'InMemorySessionHistoryService'

Services come back **not started**; start them (or the :class:`ServiceManager` from
:func:`create_service_manager`) before use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agentscope_serverless.errors import ConfigurationError
from agentscope_serverless.services.agent_state.base import StateService
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.settings import Settings, get_settings

Builder = Callable[[Settings], Any]


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _no_arguments(path: str) -> Builder:
    return lambda settings: _import(path)()


# kind -> backend -> builder. Backends are imported only when selected.
_BUILDERS: dict[str, dict[str, Builder]] = {
    "session_history": {
        "in_memory": _no_arguments(
            "agentscope_serverless.services.session_history.in_memory:InMemorySessionHistoryService"
        ),
    },
    "memory": {
        "in_memory": _no_arguments(
            "agentscope_serverless.services.memory.in_memory:InMemoryMemoryService"
        ),
    },
    "state": {
        "in_memory": _no_arguments(
            "agentscope_serverless.services.agent_state.in_memory:InMemoryStateService"
        ),
    },
}


def _build(kind: str, backend: str, settings: Settings) -> Any:
    builders = _BUILDERS[kind]
    if backend not in builders:
        raise ConfigurationError(
            f"{kind.upper()}_BACKEND={backend!r} is not available; "
            f"choose one of: {', '.join(builders)}"
        )
    return builders[backend](settings)


def create_session_history_service(settings: Settings | None = None) -> SessionHistoryService:
    """The session history service selected by ``SESSION_HISTORY_BACKEND``."""
    settings = settings or get_settings()
    service: SessionHistoryService = _build(
        "session_history", settings.session_history_backend, settings
    )
    return service


def create_memory_service(settings: Settings | None = None) -> MemoryService:
    """The memory service selected by ``MEMORY_BACKEND``."""
    settings = settings or get_settings()
    service: MemoryService = _build("memory", settings.memory_backend, settings)
    return service


def create_state_service(settings: Settings | None = None) -> StateService:
    """The state service selected by ``STATE_BACKEND``."""
    settings = settings or get_settings()
    service: StateService = _build("state", settings.state_backend, settings)
    return service


def create_service_manager(settings: Settings | None = None) -> ServiceManager:
    """A manager holding ``session_history``, ``memory`` and ``state`` built from settings."""
    settings = settings or get_settings()
    return (
        ServiceManager()
        .register_service("session_history", create_session_history_service(settings))
        .register_service("memory", create_memory_service(settings))
        .register_service("state", create_state_service(settings))
    )


__all__ = [
    "create_memory_service",
    "create_service_manager",
    "create_session_history_service",
    "create_state_service",
]
