"""The service lifecycle: ``start()``, ``stop()``, ``health()``, and ``async with``.

>>> class Clock(ServiceWithLifecycleManager):
...     async def start(self) -> None: ...
...     async def stop(self) -> None: ...
...     async def health(self) -> bool: return True
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from agentscope_serverless.errors import ServiceNotStartedError, StoreUnavailableError

# How long ``stop()`` of a service on a store lets the calls under way finish before it
# closes the store all the same.
STOP_GRACE_SECONDS = 5.0

# The service whose call is under way here: a call of its own other methods is part of
# that call (``list_sessions`` reading page after page), not a new one to refuse once
# ``stop()`` began.
_calling: ContextVar[object | None] = ContextVar("calling", default=None)

# Guards every service's count of calls under way, and the stops waiting for it to reach 0:
# a service may be shared by threads, each running an event loop of its own.
_counting = threading.Lock()

P = ParamSpec("P")
R = TypeVar("R")
GuardT = TypeVar("GuardT", bound="StartedGuard")


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
    """Tracks whether a service is started, so data methods fail clearly when it is not,
    and counts its calls under way (see :func:`service_call`), so ``stop()`` lets them
    finish."""

    _started: bool = False
    # Calls under way (in any thread), and the stops waiting for them to end: a future of
    # each stop's event loop.
    _under_way: int = 0
    _stops_waiting: tuple[asyncio.Future[None], ...] = ()
    # How many times stop() closed the store under calls still under way.
    _cut_short: int = 0

    # The lifecycle of a service holding nothing to open or close (the in-memory ones): a
    # backend on a store opens it in start() and closes it in stop(), after _finish_calls().
    async def start(self) -> None:
        self._set_started(True)

    async def stop(self) -> None:
        await self._finish_calls()

    async def health(self) -> bool:
        return self._started

    def _set_started(self, started: bool) -> None:
        self._started = started

    def _ensure_started(self) -> None:
        if not self._started and _calling.get() is not self:
            raise ServiceNotStartedError(type(self).__name__)

    async def _finish_calls(self) -> None:
        """Refuse new calls, and wait for those under way to finish (up to
        :data:`STOP_GRACE_SECONDS`): called by ``stop()`` before it closes the store.
        Calls still under way then get :class:`ServiceNotStartedError` once the store
        closes under them."""
        with _counting:
            self._set_started(False)
            if not self._under_way:
                return
            idle = asyncio.get_running_loop().create_future()
            self._stops_waiting = (*self._stops_waiting, idle)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STOP_GRACE_SECONDS):
                    await idle
        finally:
            with _counting:
                self._stops_waiting = tuple(f for f in self._stops_waiting if f is not idle)
        with _counting:
            if self._under_way:
                self._cut_short += 1


def _wake(stop: asyncio.Future[None]) -> None:
    """End the wait of a stop, from any thread (its event loop may be another's)."""
    with contextlib.suppress(RuntimeError):  # its loop is closed: nothing waits any more
        stop.get_loop().call_soon_threadsafe(_set_done, stop)


def _set_done(stop: asyncio.Future[None]) -> None:
    if not stop.done():  # not timed out meanwhile
        stop.set_result(None)


def service_call(
    method: Callable[Concatenate[GuardT, P], Awaitable[R]],
) -> Callable[Concatenate[GuardT, P], Awaitable[R]]:
    """A data method of a service: refused (:class:`ServiceNotStartedError`) unless the
    service is started, and counted while under way, so that ``stop()`` lets it finish.

    A call that ``stop()`` cut short (it closed the store after waiting) raises
    :class:`ServiceNotStartedError` saying so, rather than the store's error.

    >>> class Clock(StartedGuard):
    ...     @service_call
    ...     async def now(self) -> float: ...
    """

    @functools.wraps(method)
    async def call(self: GuardT, /, *args: P.args, **kwargs: P.kwargs) -> R:
        # acquire() and release(): a `with` costs twice as much, on every call.
        _counting.acquire()
        try:
            self._ensure_started()
            cut_short = self._cut_short
            self._under_way += 1
        finally:
            _counting.release()
        token = _calling.set(self)
        try:
            return await method(self, *args, **kwargs)
        except (StoreUnavailableError, asyncio.CancelledError):
            task = asyncio.current_task()
            if self._cut_short == cut_short or (task is not None and task.cancelling()):
                raise
            raise ServiceNotStartedError(type(self).__name__, stopped=True) from None
        finally:
            _calling.reset(token)
            _counting.acquire()
            self._under_way -= 1
            stops = () if self._under_way else self._stops_waiting
            if stops:
                self._stops_waiting = ()
            _counting.release()
            for stop in stops:
                _wake(stop)

    return call


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
    "STOP_GRACE_SECONDS",
    "PreparedWrite",
    "Service",
    "ServiceLifecycleManagerMixin",
    "ServiceWithLifecycleManager",
    "StartedGuard",
    "service_call",
]
