"""The service lifecycle: ``start()``, ``stop()``, ``health()``, and ``async with``.

>>> class Clock(ServiceWithLifecycleManager):
...     async def start(self) -> None: ...
...     async def stop(self) -> None: ...
...     async def health(self) -> bool: return True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, Self

from agentscope_serverless.errors import ServiceNotStartedError


class Service(ABC):
    """Something with a lifecycle: started before use, stopped after, and health-checked."""

    @abstractmethod
    async def start(self) -> None:
        """Initialise resources and connections."""

    @abstractmethod
    async def stop(self) -> None:
        """Release what ``start()`` acquired."""

    @abstractmethod
    async def health(self) -> bool:
        """True when the service can serve requests (remote backends really ping)."""


class ServiceLifecycleManagerMixin:
    """``async with service:`` starts it on entry and stops it on exit."""

    async def __aenter__(self) -> Self:
        await self.start()  # type: ignore[attr-defined]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.stop()  # type: ignore[attr-defined]


class ServiceWithLifecycleManager(Service, ServiceLifecycleManagerMixin):
    """Base class of every service: the lifecycle methods plus ``async with`` support."""


class StartedGuard:
    """Tracks whether a service is started, so data methods fail clearly when it is not."""

    _started: bool = False

    def _set_started(self, started: bool) -> None:
        self._started = started

    def _ensure_started(self) -> None:
        if not self._started:
            raise ServiceNotStartedError(type(self).__name__)


class PreparedWrite(ABC):
    """A write of a service, prepared but not sent, so that writes of several services on
    one store can go in one atomic request (on Redis, one script).

    >>> async def both(first: PreparedWrite, second: PreparedWrite) -> None:
    ...     if first.joins(second):
    ...         history_result, run_result = await first.apply(second)
    """

    @abstractmethod
    def joins(self, other: PreparedWrite) -> bool:
        """Whether ``other`` can be applied with this write, in one request."""

    @abstractmethod
    async def apply(self, *others: PreparedWrite) -> list[Any]:
        """Apply this write and ``others`` (each joining this one) in one request, in that
        order, and return their results. When one fails, those after it are not applied,
        and its error is raised."""


__all__ = [
    "PreparedWrite",
    "Service",
    "ServiceLifecycleManagerMixin",
    "ServiceWithLifecycleManager",
    "StartedGuard",
]
