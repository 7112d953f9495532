"""``ServiceManager``: register services, start them together, reach them by name.

>>> from agentscope_serverless.services.memory import InMemoryMemoryService
>>> manager = ServiceManager().register(InMemoryMemoryService, name="memory")
>>> manager.list_services()
['memory']
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

from agentscope_serverless.services.base import Service

# The longest a health check may take: one that takes longer counts as unhealthy, so that a
# store that does not answer (rather than refusing at once) never holds the caller, a
# load balancer's or a Kubernetes probe, beyond its own timeout.
HEALTH_TIMEOUT_SECONDS = 3.0


async def check_health(service: Any, *, limit: float | None = HEALTH_TIMEOUT_SECONDS) -> bool:
    """``await service.health()`` as a bool: False when it raises or takes longer than
    ``limit`` seconds (None: no limit)."""
    try:
        async with asyncio.timeout(limit):
            return bool(await service.health())
    except Exception:
        return False


def default_service_name(service_class: type) -> str:
    """The class name without ``Service``, lower-cased: ``RedisMemoryService`` → ``redismemory``."""
    return service_class.__name__.replace("Service", "").lower()


class ServiceManager:
    """A named set of services with one lifecycle.

    ``async with manager:`` starts the services in registration order and stops them in
    reverse; when one fails to start, those already started are stopped again.
    """

    def __init__(self) -> None:
        self._services: dict[str, Service] = {}
        self._exit_stack: AsyncExitStack | None = None

    def register(
        self, service_class: type[Service], *args: Any, name: str | None = None, **kwargs: Any
    ) -> Self:
        """Create ``service_class(*args, **kwargs)`` and register it under ``name``."""
        return self.register_service(
            name or default_service_name(service_class), service_class(*args, **kwargs)
        )

    def register_service(self, name: str, service: Service) -> Self:
        """Register an existing service instance under ``name``."""
        if not name or not isinstance(name, str):
            raise ValueError("service name must be a non-empty string")
        if name in self._services:
            raise ValueError(f"a service named {name!r} is already registered")
        self._services[name] = service
        return self

    def assign(self, name: str, service: Service | None) -> Self:
        """Use ``service`` as ``name`` from now on (None: remove it).

        Unlike :meth:`register_service` it replaces what was there, and the manager does
        not start or stop the assigned service: whoever assigns it does (AgentScope's
        ``self.state_service = ...`` in an init handler).
        """
        if service is None:
            self._services.pop(name, None)
            return self
        if not name or not isinstance(name, str):
            raise ValueError("service name must be a non-empty string")
        self._services[name] = service
        return self

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        try:
            for service in self._services.values():
                await service.start()
                stack.push_async_callback(service.stop)
        except BaseException:
            await stack.aclose()
            raise
        self._exit_stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        stack, self._exit_stack = self._exit_stack, None
        if stack is not None:
            await stack.aclose()

    def __getattr__(self, name: str) -> Service:
        services = self.__dict__.get("_services", {})
        if name in services:
            return services[name]  # type: ignore[no-any-return]
        raise AttributeError(
            f"no service named {name!r}; registered: {', '.join(services) or 'none'}"
        )

    def __getitem__(self, name: str) -> Service:
        try:
            return self._services[name]
        except KeyError:
            raise KeyError(
                f"no service named {name!r}; registered: {', '.join(self._services) or 'none'}"
            ) from None

    def get(self, name: str, default: Any = None) -> Any:
        """The service named ``name``, or ``default``."""
        return self._services.get(name, default)

    def has_service(self, name: str) -> bool:
        """Whether a service is registered under ``name``."""
        return name in self._services

    def list_services(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._services)

    @property
    def all_services(self) -> dict[str, Service]:
        """A copy of the name → service mapping."""
        return dict(self._services)

    async def health_check(
        self, *, limit: float | None = HEALTH_TIMEOUT_SECONDS
    ) -> dict[str, bool]:
        """``{name: healthy}`` for every service, checked together; a health check that
        raises, or takes longer than ``limit`` seconds (None: no limit), counts as False."""
        services = list(self._services.items())
        healthy = await asyncio.gather(*(check_health(s, limit=limit) for _, s in services))
        return {name: ok for (name, _), ok in zip(services, healthy, strict=True)}


__all__ = ["HEALTH_TIMEOUT_SECONDS", "ServiceManager", "check_health", "default_service_name"]
