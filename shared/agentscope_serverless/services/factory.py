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
from agentscope_serverless.services.idempotency import IdempotencyStore, InMemoryIdempotencyStore
from agentscope_serverless.services.manager import ServiceManager
from agentscope_serverless.services.memory.base import MemoryService
from agentscope_serverless.services.runs.base import RunsService
from agentscope_serverless.services.session_history.base import SessionHistoryService
from agentscope_serverless.settings import Settings

Builder = Callable[[Settings], Any]


def _import(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _no_arguments(path: str) -> Builder:
    return lambda settings: _import(path)()


def _redis_options(settings: Settings) -> dict[str, Any]:
    password = settings.redis_password
    return {
        "redis_url": settings.redis_url.get_secret_value(),
        "password": password.get_secret_value() if password is not None else None,
        "cluster": settings.redis_cluster,
        "key_prefix": settings.redis_key_prefix,
    }


def _dynamodb_options(settings: Settings) -> dict[str, Any]:
    return {"endpoint_url": settings.dynamodb_endpoint_url, "region_name": settings.aws_region}


def _in_memory_session_history(settings: Settings) -> Any:
    return _import(
        "agentscope_serverless.services.session_history.in_memory:InMemorySessionHistoryService"
    )(max_messages_per_session=settings.max_messages_per_session)


def _redis_session_history(settings: Settings) -> Any:
    return _import(
        "agentscope_serverless.services.session_history.redis:RedisSessionHistoryService"
    )(
        **_redis_options(settings),
        ttl_seconds=settings.session_ttl_seconds,
        max_messages_per_session=settings.max_messages_per_session,
    )


def _dynamodb_session_history(settings: Settings) -> Any:
    return _import(
        "agentscope_serverless.services.session_history.dynamodb:DynamoDBSessionHistoryService"
    )(
        settings.dynamodb_sessions_table,
        **_dynamodb_options(settings),
        ttl_seconds=settings.session_ttl_seconds,
        max_messages_per_session=settings.max_messages_per_session,
    )


def _redis_memory(settings: Settings) -> Any:
    return _import("agentscope_serverless.services.memory.redis:RedisMemoryService")(
        **_redis_options(settings),
        ttl_seconds=settings.memory_ttl_seconds,
        max_messages_per_session=settings.memory_redis_max_messages_per_session,
    )


def _redis_state(settings: Settings) -> Any:
    return _import("agentscope_serverless.services.agent_state.redis:RedisStateService")(
        **_redis_options(settings), ttl_seconds=settings.state_ttl_seconds
    )


def _dynamodb_state(settings: Settings) -> Any:
    return _import("agentscope_serverless.services.agent_state.dynamodb:DynamoDBStateService")(
        settings.dynamodb_state_table,
        **_dynamodb_options(settings),
        ttl_seconds=settings.state_ttl_seconds,
    )


def _redis_runs(settings: Settings) -> Any:
    runs = _import("agentscope_serverless.services.runs.redis:RedisRunsService")(
        **_redis_options(settings), ttl_seconds=settings.runs_ttl_seconds
    )
    runs.poll_seconds = settings.runs_cancel_poll_seconds
    return runs


def _dynamodb_runs(settings: Settings) -> Any:
    runs = _import("agentscope_serverless.services.runs.dynamodb:DynamoDBRunsService")(
        settings.dynamodb_runs_table,
        **_dynamodb_options(settings),
        ttl_seconds=settings.runs_ttl_seconds,
    )
    runs.poll_seconds = settings.runs_cancel_poll_seconds
    return runs


def _in_memory_runs(settings: Settings) -> Any:
    runs = _import("agentscope_serverless.services.runs.in_memory:InMemoryRunsService")(
        ttl_seconds=settings.runs_ttl_seconds
    )
    runs.poll_seconds = settings.runs_cancel_poll_seconds
    return runs


# kind -> backend -> builder. Backends are imported only when selected.
_BUILDERS: dict[str, dict[str, Builder]] = {
    "session_history": {
        "in_memory": _in_memory_session_history,
        "redis": _redis_session_history,
        "dynamodb": _dynamodb_session_history,
    },
    "memory": {
        "in_memory": _no_arguments(
            "agentscope_serverless.services.memory.in_memory:InMemoryMemoryService"
        ),
        "redis": _redis_memory,
    },
    "state": {
        "in_memory": _no_arguments(
            "agentscope_serverless.services.agent_state.in_memory:InMemoryStateService"
        ),
        "redis": _redis_state,
        "dynamodb": _dynamodb_state,
    },
    "runs": {"in_memory": _in_memory_runs, "redis": _redis_runs, "dynamodb": _dynamodb_runs},
}


def _build(kind: str, backend: str, settings: Settings) -> Any:
    builders = _BUILDERS[kind]
    if backend not in builders:
        raise ConfigurationError(
            f"{kind.upper()}_BACKEND={backend!r} is not available; "
            f"choose one of: {', '.join(builders)}"
        )
    return builders[backend](settings)


def create_session_history_service(settings: Settings) -> SessionHistoryService:
    """The session history service selected by ``SESSION_HISTORY_BACKEND``."""
    service: SessionHistoryService = _build(
        "session_history", settings.session_history_backend, settings
    )
    return service


def create_memory_service(settings: Settings) -> MemoryService:
    """The memory service selected by ``MEMORY_BACKEND``."""
    service: MemoryService = _build("memory", settings.memory_backend, settings)
    return service


def create_state_service(settings: Settings) -> StateService:
    """The state service selected by ``STATE_BACKEND``."""
    service: StateService = _build("state", settings.state_backend, settings)
    return service


def create_runs_service(settings: Settings) -> RunsService:
    """The runs service selected by ``RUNS_BACKEND`` (by default, the session history's)."""
    backend = settings.runs_backend or settings.session_history_backend
    service: RunsService = _build("runs", backend, settings)
    return service


def create_idempotency_store(settings: Settings) -> IdempotencyStore:
    """Idempotency records in the store of the session history (``SESSION_HISTORY_BACKEND``)."""
    timing: dict[str, Any] = {
        "expiry_seconds": settings.idempotency_expiry_seconds,
        "lease_seconds": settings.idempotency_lease_seconds,
    }
    backend = settings.session_history_backend
    store: IdempotencyStore
    if backend == "redis":
        store = _import("agentscope_serverless.services.idempotency.redis:RedisIdempotencyStore")(
            **_redis_options(settings), **timing
        )
    elif backend == "dynamodb":
        store = _import(
            "agentscope_serverless.services.idempotency.dynamodb:DynamoDBIdempotencyStore"
        )(settings.dynamodb_sessions_table, **_dynamodb_options(settings), **timing)
    else:
        store = InMemoryIdempotencyStore(**timing)
    return store


def create_service_manager(settings: Settings) -> ServiceManager:
    """A manager holding ``session_history``, ``memory`` and ``state`` built from settings."""
    return (
        ServiceManager()
        .register_service("session_history", create_session_history_service(settings))
        .register_service("memory", create_memory_service(settings))
        .register_service("state", create_state_service(settings))
    )


__all__ = [
    "create_idempotency_store",
    "create_memory_service",
    "create_runs_service",
    "create_service_manager",
    "create_session_history_service",
    "create_state_service",
]
